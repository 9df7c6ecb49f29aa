"""A job of ``hpcdist submit --executor local``: the rendered script's own steps, run here.

submitit's local executor starts ``python3 -m hpcdist.distributed.localstep batch ...`` as
the job's one task. ``batch`` gives the script what SLURM gives a batch shell (the job's id,
a node list of this host, the submit folder), puts a stand-in for srun first on ``PATH``,
and runs the very script ``hpcdist render`` prints with bash: the same prepare step,
runner, warning and requeue protocol as on a cluster.

``srun`` is that stand-in. It reads the options the script gives srun (nodes, tasks per
node, CPUs per task), starts every rank on this machine with submitit's local variables
(``SUBMITIT_LOCAL_GLOBALID``, ...; ``DistEnv`` reads them) and the node's id
(``SLURM_NODEID``, 0), shares this machine's cores between them by the one CPU rule
(``cpulayout``), passes signals on, ends every rank when
one fails (``--kill-on-bad-exit``) and leaves each rank's log and exit code in the job's
folder, where ``hpcdist status`` and ``logs`` read them. Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcdist.facts.cpulayout import CPUS_VAR, cpu_layout, cpus_per_task
from hpcdist.facts.protocol import (
    LOCAL_BATCH_EXIT,
    LOCAL_FOLDER_VAR,
    is_inherited,
    local_exit_name,
    local_log_name,
)
from hpcdist.facts.warning import parse_warning
from hpcdist.state.fileutil import write_atomic

# Where a local job's ranks leave their logs and exit codes (the job's submitit folder).
FOLDER_VAR = LOCAL_FOLDER_VAR
# Signals the stand-in and the batch task pass on to what they started.
_RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
# How long ranks have after a TERM before they are killed (SLURM's KillWait).
KILL_WAIT_S = 5.0


def rank_log(folder: Path, job_id: str, rank: int, stream: str = "out") -> Path:
    """A local rank's log, as submitit names its tasks' logs (rank 0's holds the batch's)."""
    return folder / local_log_name(job_id, rank, stream)


def exit_record(folder: Path, rank: int) -> Path:
    return folder / local_exit_name(rank)


def batch_environ(env: Mapping[str, str], folder: Path, bindir: Path) -> dict[str, str]:
    """What the batch shell gets, as SLURM's batch shell would: this job's id and host."""
    job = env.get("SUBMITIT_LOCAL_JOB_ID", str(os.getpid()))
    out = {k: v for k, v in env.items() if not is_inherited(k)}
    out.update(
        SLURM_JOB_ID=job,
        SLURM_JOB_NODELIST="localhost",
        SLURM_JOB_NUM_NODES="1",
        SLURM_NODEID="0",
        SLURM_SUBMIT_DIR=os.getcwd(),
        SLURM_CPUS_ON_NODE=str(os.cpu_count() or 1),
        PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}",
    )
    out[FOLDER_VAR] = str(folder)
    return out


# The script's warning, as SLURM reads it: ``#SBATCH --signal="[{B,R}...:]SIG[@SECONDS]"``.
_WARNING = re.compile(r'^#SBATCH --signal=(?:"([^"]*)"|(\S+))\s*$', re.M)
# What submitit's local controller sends at (time limit - signal_delay_s): its USR2.
CONTROLLER_WARNING = signal.SIGUSR2
SRUN_PID = "srun.pid"  # the running stand-in's pid, in the job's folder


def script_warning(text: str) -> tuple[signal.Signals, bool] | None:
    """The warning signal a script asks for, and whether SLURM sends it to the batch
    shell alone (``B:``) rather than to the step's tasks; None if it asks for none."""
    found = _WARNING.search(text)
    parsed = None if found is None else parse_warning(found.group(1) or found.group(2))
    if parsed is None:
        return None
    try:
        return signal.Signals(parsed.number), parsed.batch_shell
    except ValueError:
        return None


def _deliver_warning(
    warning: tuple[signal.Signals, bool], shell: subprocess.Popen[bytes], folder: Path
) -> None:
    """The controller's warning, delivered where SLURM delivers the script's: to the batch
    shell for ``B:``, else to the step's tasks (through the running srun stand-in)."""
    sent, batch_only = warning
    if batch_only:
        _signal_all([shell], sent)
        return
    try:
        pid = int((folder / SRUN_PID).read_text().strip())
        os.kill(pid, sent)
    except (OSError, ValueError):
        pass  # no step runs: SLURM's warning would reach no task either


def _leave_terminal() -> None:
    """The job leaves the process group of the terminal that submitted it, as a SLURM job
    runs apart from it: a Ctrl-C there (``submit --wait``) stops the following, never the
    job. SIGINT is the job's own again (its controller started with it ignored)."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def batch(folder: Path, script: Path, workdir: str | None) -> int:
    """Run ``script`` with bash as a batch shell of this machine; its exit code.
    ``folder`` may name the job by ``%j``, as submitit's folders do."""
    folder = Path(str(folder).replace("%j", os.environ.get("SUBMITIT_LOCAL_JOB_ID", "0")))
    folder.mkdir(parents=True, exist_ok=True)
    bindir = Path(tempfile.mkdtemp(prefix="hpcdist-srun-"))
    stand_in = bindir / "srun"
    module = "hpcdist.distributed.localstep"
    stand_in.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m {module} srun "$@"\n')
    stand_in.chmod(0o700)
    env = batch_environ(os.environ, folder, bindir)
    _leave_terminal()
    child = subprocess.Popen(["bash", str(script)], env=env, cwd=workdir)
    _relay_to([child])
    warning = script_warning(script.read_text(errors="replace"))
    if warning is not None:
        signal.signal(
            CONTROLLER_WARNING, lambda signum, frame: _deliver_warning(warning, child, folder)
        )
    code = _status(child.wait())
    write_atomic(
        folder / LOCAL_BATCH_EXIT, json.dumps({"returncode": code, "finished": time.time()})
    )
    stand_in.unlink(missing_ok=True)
    bindir.rmdir()
    return code


@dataclass(frozen=True)
class Step:
    """What the script asked srun for, as far as one machine can honour it."""

    tasks: int
    cpus: int | None
    command: tuple[str, ...]
    kill_on_bad_exit: bool


def parse_srun(argv: Sequence[str]) -> Step:
    """srun's options (``--name=value`` or a flag) up to the command. Options that only a
    cluster honours (binding, containers, GPUs by request, --label) change nothing here."""
    values: dict[str, str] = {}
    index = 0
    while index < len(argv) and argv[index].startswith("-"):
        name, _, value = argv[index].lstrip("-").partition("=")
        values[name] = value
        index += 1
    if index == len(argv):
        raise ValueError(f"srun {' '.join(argv)}: no command to run")
    nodes = int(values.get("nodes") or 1)
    per_node = int(values.get("ntasks-per-node") or 1)
    cpus = values.get("cpus-per-task")
    ntasks = values.get("ntasks")
    return Step(
        tasks=int(ntasks) if ntasks else nodes * per_node,
        cpus=int(cpus) if cpus else None,
        command=tuple(argv[index:]),
        kill_on_bad_exit=values.get("kill-on-bad-exit", "0") not in ("0", ""),
    )


def task_environ(env: Mapping[str, str], step: Step, rank: int, cores: int) -> dict[str, str]:
    """A rank's environment: submitit's local variables, none of the batch shell's SLURM_*
    (no srun made them), and its share of this machine's cores."""
    out = {k: v for k, v in env.items() if not is_inherited(k) and k != FOLDER_VAR}
    out.update(
        SUBMITIT_LOCAL_GLOBALID=str(rank),
        SUBMITIT_LOCAL_LOCALID=str(rank),
        SUBMITIT_LOCAL_NTASKS=str(step.tasks),
        SUBMITIT_LOCAL_NODEID="0",
        SUBMITIT_LOCAL_JOB_NUM_NODES="1",
        SUBMITIT_LOCAL_JOB_ID=env.get("SLURM_JOB_ID", ""),
        # As srun gives it to each task: a torchrun launch line takes its node's rank from it.
        SLURM_NODEID="0",
        PYTHONUNBUFFERED="1",
    )
    if CPUS_VAR in env:  # a CPU job's layout: the cluster's numbers, within this machine's
        cpus = min(step.cpus or cores, cpus_per_task(cores, step.tasks))
        threads = cpu_layout(cpus, step.tasks).threads
        given = out.get("OMP_NUM_THREADS", "")
        if given.isdigit():
            threads = max(1, min(threads, int(given)))
        out.update(cpu_layout(cpus, step.tasks, threads).env())
    return out


def srun(argv: Sequence[str]) -> int:
    """Start the step's ranks here, wait for them, and exit as srun would."""
    step = parse_srun(argv)
    folder = Path(os.environ[FOLDER_VAR])
    job = os.environ.get("SLURM_JOB_ID", "0")
    cores = os.cpu_count() or 1
    children = []
    for rank in range(step.tasks):
        with (
            rank_log(folder, job, rank).open("ab") as out,
            rank_log(folder, job, rank, "err").open("ab") as err,
        ):
            env = task_environ(os.environ, step, rank, cores)
            children.append(subprocess.Popen(step.command, env=env, stdout=out, stderr=err))
    _relay_to(children)
    write_atomic(folder / SRUN_PID, f"{os.getpid()}\n")  # where the batch sends the warning
    codes = _wait_all(children, step.kill_on_bad_exit)
    (folder / SRUN_PID).unlink(missing_ok=True)
    for rank, code in enumerate(codes):
        record = {"rank": rank, "returncode": code, "finished": time.time()}
        write_atomic(exit_record(folder, rank), json.dumps(record))
    return max(codes, default=0)


def _wait_all(children: list[subprocess.Popen[bytes]], kill_on_bad_exit: bool) -> list[int]:
    """Every rank's status; one that fails ends the others (TERM, then KILL)."""
    stopping_since: float | None = None
    while any(child.poll() is None for child in children):
        failed = any(child.returncode not in (None, 0) for child in children)
        if kill_on_bad_exit and failed and stopping_since is None:
            stopping_since = time.monotonic()
            _signal_all(children, signal.SIGTERM)
        if stopping_since is not None and time.monotonic() - stopping_since > KILL_WAIT_S:
            _signal_all(children, signal.SIGKILL)
        time.sleep(0.05)
    return [_status(child.wait()) for child in children]


def _status(code: int) -> int:
    return 128 - code if code < 0 else code  # as bash reports a death by signal


def _signal_all(children: Sequence[subprocess.Popen[bytes]], signum: int) -> None:
    for child in children:
        if child.poll() is None:
            child.send_signal(signum)


def _relay_to(children: Sequence[subprocess.Popen[bytes]]) -> None:
    """Pass the signals SLURM would deliver to a step on to ``children``."""

    def relay(signum: int, frame: Any) -> None:
        _signal_all(children, signum)

    for signum in _RELAYED:
        signal.signal(signum, relay)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python3 -m hpcdist.distributed.localstep")
    steps = parser.add_subparsers(dest="step", required=True)
    run = steps.add_parser("batch", help="run a rendered script as this machine's batch shell")
    run.add_argument("folder", type=Path, help="the job's folder: its logs and exit codes")
    run.add_argument("script", type=Path, help="the rendered script")
    run.add_argument("--chdir", help="the folder the script runs in")
    steps.add_parser("srun", help="srun's stand-in: srun OPTIONS COMMAND, ranks started here")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["srun"]:  # srun's own options follow: not ours to parse
            return srun(argv[1:])
        args = _parser().parse_args(argv)
        return batch(args.folder, args.script, args.chdir)
    except (ValueError, OSError, KeyError) as exc:
        print(f"hpcdist: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
