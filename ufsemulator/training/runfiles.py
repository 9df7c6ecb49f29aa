"""The run folder and the data cache: where a training reads and writes its files.

    runs/<job id>/checkpoint.pt        every epoch (and at a preemption), atomically
                  best_model.pt        the epoch with the lowest validation loss
                  model.pt             TorchScript export of best_model.pt
                  loss_curves.svg
                  training_results.json

Only rank 0 writes here: the helpers that take a DistContext see to it; the others
leave it to their callers.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist

from hpcdist.distributed import DistContext
from hpcdist.distributed.protocol import RUN_DIR_VAR
from hpcdist.state.digests import default_book
from hpcdist.state.fileutil import write_atomic
from hpcdist.state.private import PrivacyError, path_problem
from ufsemulator.config import Config
from ufsemulator.data.sources import PathSpec, expand_paths
from ufsemulator.data.synthfiles import make_synthetic
from ufsemulator.training.losscurve import loss_curves_svg

# In order of preference: one folder per job, shared by all ranks and by a requeued job.
_JOB_ID_VARS = ("SLURM_JOB_ID", "SUBMITIT_LOCAL_JOB_ID")


def data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$HPCDIST_DATA_DIR``, else ``~/.cache/ufsemulator``: synthetic files and array caches."""
    env = os.environ if environ is None else environ
    configured = env.get("HPCDIST_DATA_DIR", "").strip()
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "ufsemulator"


def synthetic_path(ni: int, nj: int, seed: int, environ: Mapping[str, str] | None = None) -> Path:
    return data_dir(environ) / f"synthetic_{ni}x{nj}_seed{seed}.nc"


def default_run_dir(environ: Mapping[str, str] | None = None, base: Path | None = None) -> Path:
    """``runs/<SLURM_JOB_ID | SUBMITIT_LOCAL_JOB_ID | timestamp>`` under ``base`` (cwd);
    an array task's is ``runs/<SLURM_ARRAY_JOB_ID>_<SLURM_ARRAY_TASK_ID>``.

    ``HPCDIST_RUN_DIR`` wins: a job script resubmitted as a new job (no scontrol on the
    compute node) sets it to the first job's folder, so the new job resumes there."""
    env = os.environ if environ is None else environ
    if env.get(RUN_DIR_VAR, "").strip():
        return (base if base is not None else Path.cwd()) / env[RUN_DIR_VAR].strip()
    name = next((env[var].strip() for var in _JOB_ID_VARS if env.get(var, "").strip()), None)
    array, task = env.get("SLURM_ARRAY_JOB_ID", "").strip(), env.get("SLURM_ARRAY_TASK_ID", "")
    if array and task.strip():
        # An array task (a sweep's point): runs/<array job id>_<task id>, the name squeue and
        # `hpcdist report` use, rather than the task's own job id.
        name = f"{array}_{task.strip()}"
    if name is None:
        name = time.strftime("%Y%m%d-%H%M%S")
    return (base if base is not None else Path.cwd()) / "runs" / name


def resolve_run_dir(
    ctx: DistContext, config: Config, given: str | Path | None, resume: str | Path | None
) -> Path:
    """Explicit argument > config > the resumed checkpoint's folder > runs/<job id>.

    Decided on rank 0 and broadcast: a timestamp may differ between ranks. The folder must
    be this user's and writable by nobody else (job ids are public: another user could
    have made ``runs/<job id>`` first to plant a checkpoint or read the results); every
    rank raises the same one-line error otherwise."""
    chosen: list[object] = [None, ""]
    if ctx.is_main:
        if given is not None:
            path = Path(given)
        elif config.output.run_dir is not None:
            path = Path(config.output.run_dir)
        elif resume is not None:
            path = Path(resume).resolve().parent
        else:
            path = default_run_dir()
        # 0o755 under the umask: never group-writable, whatever the umask allows.
        path.mkdir(parents=True, exist_ok=True, mode=0o755)
        problem = path_problem(path)
        chosen = [str(path), f"run folder {str(path)!r} {problem}" if problem else ""]
    if dist.is_initialized():  # else one process: nothing to agree on
        dist.broadcast_object_list(chosen, src=0)
    if chosen[1]:
        raise PrivacyError(
            f"{chosen[1]}; refusing to write or resume there (remove it, or chmod go-w it "
            "if it is yours)"
        )
    return Path(str(chosen[0]))


CHECKPOINT_NAME = "checkpoint.pt"


def trusted_resume(ctx: DistContext, run_dir: Path) -> Path | None:
    """The run folder's checkpoint if this user's private state recorded its digest when
    it was written (a requeued job picks up where it stopped); None otherwise, with one
    line saying why it starts fresh. Rank 0 decides; every rank gets the answer."""
    chosen: list[object] = [None]
    if ctx.is_main:
        candidate = run_dir / CHECKPOINT_NAME
        if candidate.is_file():
            problem = default_book().problem(candidate)
            if problem:
                print(f"Not resuming {candidate}: {problem}; starting fresh", flush=True)
            else:
                chosen = [str(candidate)]
    if dist.is_initialized():  # else one process: nothing to agree on
        dist.broadcast_object_list(chosen, src=0)
    return None if chosen[0] is None else Path(str(chosen[0]))


def ensure_data(ctx: DistContext, config: Config, data_path: PathSpec | None) -> PathSpec:
    """The data files (a file, a glob or a list; checked here, so a typo fails before
    anything else); without any, the synthetic file, generated on first use."""
    given = data_path if data_path is not None else config.data.path
    if given is not None:
        expand_paths(given)  # raises DataError naming what does not exist
        return given
    syn = config.data.synthetic
    path = synthetic_path(syn.ni, syn.nj, syn.seed)
    # Rank 0 writes; then the first rank of each node checks again, for nodes that do not
    # share the cache directory. make_synthetic writes atomically, so racing writers on a
    # shared file system each leave a complete, identical file.
    for writer in (ctx.is_main, ctx.env.local_rank == 0):
        if writer and not path.is_file():
            print(
                f"[Rank {ctx.env.rank}] Generating synthetic data {syn.ni}x{syn.nj} "
                f"(seed {syn.seed}) at {path}",
                flush=True,
            )
            make_synthetic(path, ni=syn.ni, nj=syn.nj, seed=syn.seed)
        if dist.is_initialized():
            dist.barrier()
    return path


def write_results(path: Path, results: Mapping[str, Any]) -> None:
    write_atomic(path, json.dumps(results, indent=2, sort_keys=False) + "\n")


def plot_loss_curves(
    path: Path,
    train_loss: Sequence[float],
    val_loss: Sequence[float],
    best_epoch: int | None,
    title: str,
) -> None:
    """Train and validation loss per epoch (log scale), written atomically as an SVG."""
    write_atomic(path, loss_curves_svg(train_loss, val_loss, best_epoch, title))
