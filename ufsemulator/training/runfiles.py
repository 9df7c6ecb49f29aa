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

import contextlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist

from hpcdist.distributed import RUN_DIR_VAR, DistContext, foreign_heartbeat
from hpcdist.state import (
    PrivacyError,
    Refused,
    TrustedBytes,
    book_for,
    default_book,
    read_at,
    run_folder_fd,
    start_of,
    write_output,
)
from ufsemulator.config import Config
from ufsemulator.data.arraycache import folder_problem
from ufsemulator.data.sources import PathSpec, data_dir, expand_paths
from ufsemulator.data.synthfiles import make_synthetic
from ufsemulator.errors import DataError
from ufsemulator.training.losscurve import loss_curves_svg

# In order of preference: one folder per job, shared by all ranks and by a requeued job.
_JOB_ID_VARS = ("SLURM_JOB_ID", "SUBMITIT_LOCAL_JOB_ID")


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


def run_anchor(run_dir: Path) -> Path:
    """Where the walk to a run folder starts (``hpcdist.state.runroot``): the deepest root
    the user trusts above it (the working folder, the home folder, ``HPCDIST_RUN_ROOTS``),
    else ``/``, from where every folder on the way is checked."""
    return Path(start_of(Path(run_dir)) or "/")


RUN_DIR_MODE = 0o755


def make_run_dir(path: Path) -> None:
    """Every missing folder down to ``path``, each created 0755 under the umask: never
    group-writable, whatever the umask's group bits allow (``mkdir -p`` would make the
    parents 0775 under a umask of 002)."""
    path = Path(os.path.abspath(path))
    missing = [folder for folder in (path, *path.parents) if not os.path.lexists(folder)]
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, RUN_DIR_MODE)


def resolve_run_dir(
    ctx: DistContext, config: Config, given: str | Path | None, resume: str | Path | None
) -> Path:
    """Explicit argument > config > the resumed checkpoint's folder > runs/<job id>.

    Decided on rank 0 and broadcast: a timestamp may differ between ranks. The folder and
    the folders between it and the working folder (``runs/``) must be this user's and
    writable by nobody else, checked on what was opened (job ids are public: another user
    could have made ``runs/`` or ``runs/<job id>`` first, to plant a checkpoint, read the
    results or swap the folder while the job reads it); every rank raises the same
    one-line error otherwise."""
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
        chosen = [str(path), run_dir_problem(path)]
    if dist.is_initialized():  # else one process: nothing to agree on
        dist.broadcast_object_list(chosen, src=0)
    if chosen[1]:
        raise PrivacyError(
            f"{chosen[1]}; refusing to write or resume there (remove it, or chmod go-w it "
            "if it is yours)"
        )
    return Path(str(chosen[0]))


def run_dir_source(config: Config, given: str | Path | None, resume: str | Path | None) -> str:
    """What :func:`resolve_run_dir` takes the folder from: "argument", "config" (the
    config file or ``--set output.run_dir=``), "checkpoint" or "job"."""
    if given is not None:
        return "argument"
    if config.output.run_dir is not None:
        return "config"
    return "checkpoint" if resume is not None else "job"


def run_dir_problem(path: Path) -> str:
    """Create the run folder if need be and say why it cannot be trusted ("" if it can).
    A folder that cannot be made is named by the check where it can: ``runs/`` of another
    user refuses the mkdir, and the check then says whose it is."""
    made = ""
    try:
        make_run_dir(path)
    except OSError as exc:
        made = exc.strerror or type(exc).__name__
    try:
        with run_folder_fd(path) as fd:
            return foreign_heartbeat(fd, path)
    except Refused as exc:
        hint = f" ({exc.hint})" if exc.hint else ""
        return f"run folder {str(exc.path)!r} {exc.problem}{hint}"
    except OSError as exc:
        return f"run folder {str(path)!r} cannot be made or opened ({made or exc.strerror})"


CHECKPOINT_NAME = "checkpoint.pt"


def read_run_file(path: Path) -> TrustedBytes:
    """A file of a run folder, reached from a root the user trusts and read once (see
    ``hpcdist.state.runroot``)."""
    path = Path(os.path.abspath(path))
    with run_folder_fd(path.parent) as fd:
        return read_at(fd, path, "checkpoint", pause_label="resume-read")


def trusted_resume(ctx: DistContext, run_dir: Path) -> tuple[Path, bytes] | None:
    """The run folder's checkpoint, as the bytes that were checked, if this user's private
    state recorded their digest when it was written (a requeued job picks up where it
    stopped); None otherwise, with one line saying why it starts fresh. Rank 0 decides;
    every other rank reads the file once itself and loads it only if its bytes have the
    digest rank 0 accepted; where one cannot, every rank ends with its one line
    (``_agree_on_resume``)."""
    chosen, data = _main_choice(run_dir) if ctx.is_main else ([None, ""], b"")
    if dist.is_initialized():  # else one process: nothing to agree on
        dist.broadcast_object_list(chosen, src=0)
    if chosen[0] is None:
        return None
    path = Path(str(chosen[0]))
    problem = ""
    if not ctx.is_main:
        data, problem = _read_as_accepted(path, str(chosen[1]), ctx.env.rank)
    _agree_on_resume(problem)
    return path, data


def _main_choice(run_dir: Path) -> tuple[list[object], bytes]:
    """Rank 0's choice: ``[path, digest]`` of the run folder's checkpoint and its bytes
    where the private state recorded that digest; ``[None, ""]`` otherwise (one line says
    why, where there is a checkpoint)."""
    candidate = run_dir / CHECKPOINT_NAME
    problem = ""
    try:
        found = read_run_file(candidate)
    except FileNotFoundError:
        return [None, ""], b""
    except Refused as exc:
        problem = f"{str(exc.path)!r} {exc.problem}"
    else:
        problem = default_book().problem(candidate, found.sha256)
        if not problem:
            return [str(candidate), found.sha256], found.data
    print(f"Not resuming {candidate}: {problem}; starting fresh", flush=True)
    return [None, ""], b""


def _read_as_accepted(path: Path, digest: str, rank: int) -> tuple[bytes, str]:
    """Another rank's own read of the checkpoint rank 0 accepted: its bytes, and "" or why
    they are not the bytes rank 0 accepted."""
    try:
        found = read_run_file(path)
    except Refused as exc:
        return (
            b"",
            f"checkpoint {str(path)!r} refused by rank {rank}: {str(exc.path)!r} {exc.problem}",
        )
    except OSError as exc:
        return b"", f"checkpoint {str(path)!r} cannot be read by rank {rank}: {exc.strerror}"
    if found.sha256 != digest:
        return found.data, (
            f"checkpoint {str(path)!r} read by rank {rank} has SHA-256 {found.sha256[:12]}..., "
            f"not the {digest[:12]}... rank 0 accepted: it was replaced meanwhile; refusing "
            "to resume"
        )
    return found.data, ""


def _agree_on_resume(problem: str) -> None:
    """Every rank learns whether any rank refused the checkpoint, and all end with the first
    refusal's line (PrivacyError): a rank that ended alone would leave the others waiting
    in their next collective for a peer that is gone, to end in a traceback of it."""
    problems = [problem]
    if dist.is_initialized():
        problems = [""] * dist.get_world_size()
        dist.all_gather_object(problems, problem)
    refused = next((one for one in problems if one), "")
    if refused:
        raise PrivacyError(refused)


def ensure_data(ctx: DistContext, config: Config, data_path: PathSpec | None) -> PathSpec:
    """The data files (a file, a glob or a list; checked here, so a typo fails before
    anything else); without any, the synthetic file, generated on first use."""
    given = data_path if data_path is not None else config.data.path
    if given is not None:
        expand_paths(given)  # raises DataError naming what does not exist
        return given
    syn = config.data.synthetic
    path = synthetic_path(syn.ni, syn.nj, syn.seed)
    # A synthetic file is found by its name: in a folder others can write, theirs.
    problem = folder_problem(path.parent)
    if problem:
        raise DataError(
            f"the synthetic data's folder {problem}: another user could put their data in "
            "its place; set HPCDIST_DATA_DIR to a folder only you can write"
        )
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
    """``training_results.json``: not writable by others, its digest in the private state
    (``hpcdist report`` shows only what the training wrote)."""
    text = json.dumps(results, indent=2, sort_keys=False) + "\n"
    write_output(path, text.encode("utf-8"), book_for())


def plot_loss_curves(
    path: Path,
    train_loss: Sequence[float],
    val_loss: Sequence[float],
    best_epoch: int | None,
    title: str,
) -> None:
    """Train and validation loss per epoch (log scale), written atomically as an SVG."""
    svg = loss_curves_svg(train_loss, val_loss, best_epoch, title)
    write_output(path, svg.encode("utf-8"), book_for())
