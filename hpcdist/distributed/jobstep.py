"""What a rendered batch script asks of hpcdist: ``python3 -m hpcdist.distributed.jobstep``.

    prepare   the job's private state: its folders checked (``hpcdist.state``), a new
              secret, the log record, the requeue marker's path, the run it is a piece
              of (``hpcdist.distributed.runpiece``); prints the shell lines
              (``export HPCDIST_SECRET_FILE=...``) the script evaluates
    gpus      this node's GPUs (``hpcdist.distributed.gpus``), as shell lines, or one line
              saying there are none
    run       started with ``exec`` in the script's place, so that SLURM's TERM and the
              ``B:`` warning reach it: runs srun, passes a ``B:`` warning on to it, waits,
              then requeues the job if rank 0 asked for it (``hpcdist.distributed.requeue``),
              or says that the warning killed the command, or that the command requeued
              the job itself

``hpcdist submit`` queues the same script, so there is one job protocol, run here.
Standard library only: it runs before anything else of the job.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hpcdist.distributed.badnodes import LogMark, after_failure, say_held
from hpcdist.distributed.gpus import count_gpus, listed_gpus
from hpcdist.distributed.jobsecret import create_secret_file
from hpcdist.distributed.rankdeath import report
from hpcdist.distributed.requeue import (
    SignalRelay,
    checkpointed,
    requeue_job,
    requeued_by_command,
    say,
    warning_death,
    warning_signal,
)
from hpcdist.distributed.runpiece import start_piece
from hpcdist.errors import UserError
from hpcdist.facts.cpulayout import cpus_per_task
from hpcdist.facts.protocol import (
    LOG_DIR,
    MARKER_DIR,
    MARKER_VAR,
    REQUEUE_EXIT_CODE,
    SECRET_DIR,
    SECRET_VAR,
    derive_port,
    port_seed,
)
from hpcdist.facts.runs import RUN_STATE_DIR
from hpcdist.state.folders import jobs_root, state_dir
from hpcdist.state.private import write_private
from hpcdist.state.statehome import shared_reason
from hpcdist.state.workfolder import check_working_folder


def prepare(
    env: Mapping[str, str], log_record: str, marker: bool, torchrun_port: bool
) -> list[str]:
    """Create this job's private state; the shell lines that tell the script where it is."""
    job = env.get("SLURM_JOB_ID", "")
    if not job:
        raise UserError("SLURM_JOB_ID is not set; expected to run inside a SLURM job")
    # First of all: the ranks start in this folder, and Python imports from it.
    refused = check_working_folder(Path.cwd())
    if refused:
        raise UserError(refused)
    # The submit folder's .hpcdist, as `hpcdist submit` and `logs` run there would find it:
    # $HPCDIST_HOME's if set, else, for a folder others can write or own, the user's own.
    submit_dir = Path(env.get("SLURM_SUBMIT_DIR") or os.getcwd())
    project = None if env.get("HPCDIST_HOME", "").strip() else submit_dir
    reason = "" if project is None else shared_reason(submit_dir.resolve())
    if reason:
        print(
            f"hpcdist: note: {reason}: this job's secret and markers are kept in "
            f"{jobs_root(project)}",
            file=sys.stderr,
        )

    def below(folder: str) -> Path:
        return state_dir(*Path(folder).parts[1:], project_dir=project) / job

    # The job's secret, new for every run: the ranks prove they hold it before they exchange
    # anything, and the rendezvous port is derived from it (not from the public job id).
    secret_file = below(SECRET_DIR)
    secret_file.unlink(missing_ok=True)
    secret = create_secret_file(secret_file)
    lines = [f"export {SECRET_VAR}={shlex.quote(str(secret_file))}"]
    # Where this job's logs go, for `hpcdist logs` and `status` once SLURM has forgotten it.
    write_private(below(LOG_DIR), log_record + "\n")
    # Which run this job is a piece of (HPCDIST_RUN_ID, its run folder), recorded for
    # `hpcdist status RUN`.
    lines += start_piece(env, state_dir(*Path(RUN_STATE_DIR).parts[1:], project_dir=project))
    if marker:
        marker_file = below(MARKER_DIR)
        marker_file.unlink(missing_ok=True)
        lines.append(f"export {MARKER_VAR}={shlex.quote(str(marker_file))}")
    if torchrun_port:
        # The port srun's first step derives from the secret, as hpcdist's submit path does.
        lines.append(f"MASTER_PORT={derive_port(port_seed(secret), 0)}")
    return lines


def node_gpus(env: Mapping[str, str], listed: int, cpus: int | None = None) -> list[str]:
    """Shell lines naming this node's GPUs (``gpus``, ``counted``, srun's ``gpu_request``)
    and each task's CPUs (``cpus``: the given count, else the node's shared by its GPUs);
    UserError, in one line, where it has none."""
    found = count_gpus(env, listed, whole_node=True)
    if found.count < 1:
        node = env.get("SLURMD_NODENAME") or socket.gethostname()
        raise UserError(
            f"no GPU on node {node} ({found.seen}); --mode nccl needs one GPU per task: "
            "submit to a GPU partition or render with --gpus-per-node N"
        )
    # Job steps do not inherit GRES from --exclusive: srun asks for the GPUs again, or its
    # tasks get no CUDA_VISIBLE_DEVICES. GPUs SLURM does not hand out (no gres/gpu) it would
    # refuse to give.
    request = f"--gpus-per-node={found.count}" if found.granted else ""
    if cpus is None:
        on_node = env.get("SLURM_CPUS_ON_NODE", "").strip()
        cores = int(on_node) if on_node.isdigit() else (os.cpu_count() or 1)
        cpus = cpus_per_task(cores, found.count)
    lines = [f"gpus={found.count}", f"cpus={cpus}", f"counted={shlex.quote(found.seen)}"]
    lines.append(f"gpu_request={shlex.quote(request)}")
    if not found.granted and "CUDA_VISIBLE_DEVICES" not in env:
        # Nothing else tells the tasks that the node's GPUs are theirs: say it as SLURM would.
        devices = ",".join(str(n) for n in range(found.count))
        lines.append(f"export CUDA_VISIBLE_DEVICES={devices}")
    return lines


def run(args: argparse.Namespace) -> int:
    """srun (``args.command``) with the warning passed on, then the requeue decision."""
    terminated = args.terminated == 1
    requeueing = threading.Event()  # set as this process asks for the requeue itself

    def on_term(signum: int, frame: Any) -> None:
        nonlocal terminated
        terminated = True
        # Said now: a command that requeued the job itself (Lightning) may outlast SLURM's
        # KillWait, which then ends this process too. The TERM of this process's own
        # requeue is not the command's.
        said = "" if requeueing.is_set() else requeued_by_command(os.environ)
        if said:
            say(said)

    narrow_logs()
    if args.requeue:
        # A preemption sends TERM here as well as to the ranks: caught, this process outlives
        # srun, whose ranks checkpoint on it, and can requeue the job.
        signal.signal(signal.SIGTERM, on_term)
    warning = warning_signal(args.warning)
    relay = SignalRelay(warning).install() if args.relay and warning is not None else None
    # Where the job's log ends now: a failed step's lines after it name a killed rank, or
    # a bad node, or say that the warning ended a task.
    mark = LogMark()
    say_held(os.environ)
    child = subprocess.Popen(args.command, env=safe_python_env(os.environ))
    if relay is not None:
        relay.attach(child.pid, pending=args.warned == 1)
    code = child.wait()
    status = 128 - code if code < 0 else code  # as bash reports a death by signal
    return _after_step(args, status, mark, lambda: terminated, requeueing)


def _after_step(
    args: argparse.Namespace,
    status: int,
    mark: LogMark,
    terminated: Callable[[], bool],
    requeueing: threading.Event,
) -> int:
    """The step ended with ``status``: say that the warning killed the command, or requeue
    the job (rank 0 asked, or a node broke the step; ``requeueing`` set first); the
    runner's exit status."""
    marker = Path(os.environ[MARKER_VAR]) if os.environ.get(MARKER_VAR) else None
    asked = checkpointed(status, marker)
    step_log = mark.written_since() if status and not asked else ""
    killed = "" if asked else warning_death(status, args.warning, step_log)
    warning = warning_signal(args.warning)
    if killed and warning is not None:
        # The command's own end (it did not catch the warning), not a node's failure; the
        # job's exit code names the warning even where srun's was another task's.
        say(killed)
        return 128 + warning
    left_behind = []
    if status != 0 and not asked:
        left_behind = after_failure(os.environ, mark)
    if not args.requeue:
        return report(mark, status, os.environ)
    if not asked:
        if not left_behind:
            return report(mark, status, os.environ)
        # A node broke the step: the run goes on from its last checkpoint, elsewhere.
        cause = "a node failed the step"
        requeueing.set()
        requeued = requeue_job(os.environ, args.max_restarts, terminated(), args.script, cause)
        return 0 if requeued else report(mark, status, os.environ)
    if marker is not None:
        marker.unlink(missing_ok=True)
    requeueing.set()
    requeued = requeue_job(os.environ, args.max_restarts, terminated(), resubmit=args.script)
    return 0 if requeued else _not_requeued(mark, status)


def _not_requeued(mark: LogMark, status: int) -> int:
    """Rank 0 checkpointed and asked for a requeue that hpcdist did not make. SLURM may
    have requeued the job since (an ``scontrol requeue`` whose restart it counts as the
    job ends): then it resumes as the next restart, and no other route is said. Else the
    request's exit code is said to be one, with the route to resume."""
    requeued = requeued_by_command(os.environ)
    if requeued:
        say(requeued)
        return status
    if status == REQUEUE_EXIT_CODE:
        say(
            f"exit code {REQUEUE_EXIT_CODE}: the command checkpointed and asked for a "
            "requeue, which was not made (why: above)"
        )
    return report(mark, status, os.environ)


def narrow_logs(fds: tuple[int, ...] = (1, 2)) -> None:
    """The job's logs (this process's stdout and stderr, opened by SLURM under the umask
    the job was submitted with) made writable by nobody else."""
    for fd in fds:
        try:
            info = os.fstat(fd)
        except OSError:
            continue
        mine = stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()
        if mine and info.st_mode & 0o022:
            os.fchmod(fd, stat.S_IMODE(info.st_mode) & ~0o022)


def safe_python_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for the ranks: no Python import path entry that names the working folder
    (an empty or relative ``PYTHONPATH`` entry, as ``export PYTHONPATH=$PYTHONPATH:/x``
    leaves), and the working folder itself kept off (``PYTHONSAFEPATH``, Python 3.11+)."""
    safe = dict(env)
    entries = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p.startswith("/")]
    if entries:
        safe["PYTHONPATH"] = os.pathsep.join(entries)
    else:
        safe.pop("PYTHONPATH", None)
    safe["PYTHONSAFEPATH"] = "1"
    return safe


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python3 -m hpcdist.distributed.jobstep")
    steps = parser.add_subparsers(dest="step", required=True)
    ready = steps.add_parser("prepare", help="create the job's private state")
    ready.add_argument("--log-record", required=True, help="the job's log patterns, JSON")
    ready.add_argument("--marker", action="store_true", help="the job may ask for a requeue")
    ready.add_argument("--torchrun-port", action="store_true", help="print MASTER_PORT")
    count = steps.add_parser("gpus", help="count this node's GPUs")
    count.add_argument("--cpus-per-task", type=int, help="each task's CPUs (default: shared)")
    launch = steps.add_parser("run", help="run srun, pass the warning on, requeue")
    launch.add_argument("--warning", help="the job's --signal, e.g. USR2@90 or B:USR1@60")
    launch.add_argument("--relay", action="store_true", help="pass the warning on to srun")
    launch.add_argument(
        "--warned", type=int, choices=(0, 1), default=0, help="1: the warning came before srun"
    )
    launch.add_argument("--requeue", action="store_true", help="requeue on rank 0's request")
    launch.add_argument(
        "--terminated", type=int, choices=(0, 1), default=0, help="1: TERM came before srun"
    )
    launch.add_argument("--max-restarts", type=int, help="requeue at most this many times")
    launch.add_argument("--script", help="the batch script, submitted again without scontrol")
    launch.add_argument("command", nargs=argparse.REMAINDER, help="-- srun ...")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.step == "prepare":
            lines = prepare(os.environ, args.log_record, args.marker, args.torchrun_port)
        elif args.step == "gpus":
            lines = node_gpus(os.environ, listed_gpus(), args.cpus_per_task)
        else:
            if args.command[:1] == ["--"]:
                args.command = args.command[1:]
            if not args.command:
                raise UserError("run needs a command after --, e.g. -- srun python3 train.py")
            return run(args)
    except (UserError, OSError) as exc:
        print(f"hpcdist: {exc}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
