"""What a submitit task runs: the job's command as a child process, with its exit recorded.

This module is imported inside the job (by submitit unpickling a CommandJob), never by the
CLI's render path; it imports neither torch nor anything heavy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from submitit.helpers import Checkpointable, DelayedSubmission

from hpcdist.distributed.protocol import (
    MARKER_VAR,
    SIGNAL_VAR,
    SUBMITIT_WARNING_SIGNAL,
    submitit_marker_name,
)
from hpcdist.distributed.requeue import checkpointed, ignoring, requeue_job
from hpcdist.jobs.localjob import process_exited
from hpcdist.state.fileutil import write_atomic

# How long the warning-signal handler waits for the child to write its checkpoint.
CHECKPOINT_GRACE_S = 60.0
# The signal submitit warns this task with, forwarded to the child (the protocol's name).
WARNING_SIGNAL = signal.Signals[f"SIG{SUBMITIT_WARNING_SIGNAL}"]


class CommandFailed(RuntimeError):
    """The job's command exited non-zero; submitit marks the job FAILED."""


@dataclass
class CommandJob(Checkpointable):
    """Run ``argv`` in every task; the env holds extra variables from the JobSpec.

    With ``torchrun_nproc`` set, each task (one per node) runs ``argv`` under a torchrun
    that starts that many ranks on its node, meeting at the first node of the job.
    """

    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    record_dir: str | None = None
    torchrun_nproc: int | None = None
    requeue: bool = True  # --no-requeue: the user's word; a warned job ends instead
    # The user's umask at submission: submit hands submitit a strict one (its pickles and
    # folders are private), which sbatch and the local executor would pass on to the job.
    umask: int | None = None
    max_restarts: int | None = None  # None: no limit of ours (submitit's still holds)
    workdir: str | None = None  # the folder the command starts in (None: submitit's)
    _child: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)
    _terminated: bool = field(default=False, repr=False, compare=False)

    def __call__(self) -> int:
        if self.umask is not None:
            os.umask(self.umask)
        env = dict(os.environ)
        env.update(self.env)
        env["PYTHONUNBUFFERED"] = "1"
        self._note_termination()
        warning = _warning_signal(env)
        if warning != WARNING_SIGNAL:
            # submitit's own handler answers USR2 only: the job's other warning signal
            # (--signal USR1@120) is answered here in the same way.
            with contextlib.suppress(ValueError):
                signal.signal(warning, self._on_own_warning)
        marker: Path | None = None
        if self.torchrun_nproc is None:
            self._child = subprocess.Popen(list(self.argv), env=env, cwd=self.workdir)
        else:
            # torchrun reports rank 0's exit 85 as its own failure (1): rank 0 says that it
            # checkpointed for a requeue with this file instead, one name per restart.
            restart = env.get("SLURM_RESTART_COUNT", "0")
            marker = self._folder() / submitit_marker_name(restart)
            env[MARKER_VAR] = str(marker)
            # torchrun's ranks get as long to checkpoint after its SIGTERM as we wait.
            env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(int(CHECKPOINT_GRACE_S)))
            # SLURM signals every process of the step: torchrun ignores the warning (its
            # ranks inherit that and set their own handler) instead of dying of it.
            ignored = [number.name.removeprefix("SIG") for number in (WARNING_SIGNAL, warning)]
            self._child = subprocess.Popen(
                ignoring(list(dict.fromkeys(ignored)), self.torchrun_argv(env)),
                env=env,
                cwd=self.workdir,
            )
        code = self._child.wait()
        self._record(code)
        asked = checkpointed(code, marker)
        if asked and not self.requeue:
            raise CommandFailed(
                f"{' '.join(self.argv)} checkpointed after the warning signal; "
                "not requeued (--no-requeue)"
            )
        if asked and self._terminated:
            # SLURM ended the step (a preemption, the time limit, scancel) and the child has
            # saved its state: nothing is left to do here, and waiting would hold the nodes
            # until SLURM's grace time ends while a preempting job waits for them. A
            # preemption in REQUEUE mode requeues the job by itself.
            # One task asks (the first); the others end as theirs did.
            requeued = (
                self.requeue
                and _task_rank() == 0
                and requeue_job(os.environ, self.max_restarts, terminated=True)
            )
            print(
                "hpcdist: checkpoint written after SIGTERM; "
                + ("job requeued, " if requeued else "")
                + "giving the nodes back now",
                file=sys.stderr,
                flush=True,
            )
            os._exit(0 if requeued else code)  # as if SLURM had ended us: no result recorded
        if asked:
            # The child checkpointed after the warning signal; submitit's handler requeues.
            time.sleep(CHECKPOINT_GRACE_S)
        if code != 0:
            raise CommandFailed(f"{' '.join(self.argv)} exited with code {code}")
        return code

    def _note_termination(self) -> None:
        """Remember a SIGTERM (then pass it to submitit's own handler, which only logs it):
        SLURM's end of the step, not the warning signal submitit requeues on."""
        self._terminated = False
        previous = signal.getsignal(signal.SIGTERM)

        def on_term(signum: int, frame: Any) -> None:
            self._terminated = True
            if callable(previous):
                previous(signum, frame)

        # Not the main thread (ValueError): no handler of ours, the old wait stays.
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGTERM, on_term)

    def _on_own_warning(self, signum: int, frame: Any) -> None:
        """The job's warning signal where it is not submitit's: the child checkpoints (as
        submitit's handler has it do), then the first task requeues the job and every task
        exits; with --no-requeue the child's exit ends the job as on USR2."""
        if self.checkpoint() is None:
            return
        requeued = _task_rank() == 0 and requeue_job(
            os.environ, self.max_restarts, terminated=False
        )
        print(
            f"hpcdist: checkpoint written after {signal.Signals(signum).name}"
            + ("; job requeued" if requeued else ""),
            file=sys.stderr,
            flush=True,
        )
        os._exit(0)

    # submitit reads a None from checkpoint() as "do not requeue" (its _checkpoint helper),
    # although Checkpointable's annotation names DelayedSubmission only.
    def checkpoint(  # type: ignore[override]
        self, *args: Any, **kwargs: Any
    ) -> DelayedSubmission | None:
        """Called by submitit on the warning signal: let the child checkpoint, then requeue
        (None: submitit does not requeue)."""
        child = self._child
        if child is not None and not process_exited(child.pid):
            # torchrun passes SIGTERM on to its ranks, which checkpoint on it as on USR2.
            child.send_signal(WARNING_SIGNAL if self.torchrun_nproc is None else signal.SIGTERM)
            if not _wait_exited(child.pid, CHECKPOINT_GRACE_S):
                print("hpcdist: child did not exit after the warning signal", file=sys.stderr)
        if not self.requeue:
            print("hpcdist: warned, not requeued (--no-requeue)", file=sys.stderr, flush=True)
            return None
        # The same job, with no process of this run's: what submitit pickles for the rerun.
        fresh = dataclasses.replace(self, _child=None, _terminated=False)
        return DelayedSubmission(fresh)

    def torchrun_argv(self, env: Mapping[str, str]) -> list[str]:
        """torchrun for this task's node: the rendezvous is rank 0's host and port of the
        srun layout (one task per node), as DistEnv resolves them for any SLURM step."""
        from hpcdist.distributed import resolve_env
        from hpcdist.render.directives import torchrun_command, torchrun_flags

        step = resolve_env(env)
        flags = torchrun_flags(
            str(step.world_size),
            str(self.torchrun_nproc),
            str(step.node_rank),
            f"{step.master_addr}:{step.master_port}",
            env.get("SLURM_JOB_ID", "hpcdist"),
        )
        return torchrun_command(
            [sys.executable, "-m", "torch.distributed.run", *flags], list(self.argv)
        )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_child"] = None
        return state

    def _folder(self) -> Path:
        """The job's submitit folder (its logs), unless a record folder was given."""
        if self.record_dir is not None:
            return Path(self.record_dir)
        from submitit import JobEnvironment

        return Path(JobEnvironment().paths.folder)

    def _record(self, code: int) -> None:
        """Leave the exit code beside submitit's logs: how `hpcdist status` reads local jobs."""
        rank = _task_rank()
        record = {"rank": rank, "returncode": code, "finished": time.time()}
        write_atomic(self._folder() / f"exit_{rank}.json", json.dumps(record))


def _warning_signal(env: Mapping[str, str]) -> signal.Signals:
    """The job's warning signal (``HPCDIST_SIGNAL``), submitit's USR2 where none is named."""
    name = env.get(SIGNAL_VAR, "").strip() or SUBMITIT_WARNING_SIGNAL
    try:
        return signal.Signals[f"SIG{name}"]
    except KeyError:
        return WARNING_SIGNAL


def _wait_exited(pid: int, timeout_s: float) -> bool:
    # Not Popen.wait: this runs in a signal handler that interrupted Popen.wait in __call__.
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process_exited(pid):
            return True
        time.sleep(0.1)
    return process_exited(pid)


def _task_rank() -> int:
    for name in ("SLURM_PROCID", "SUBMITIT_LOCAL_GLOBALID", "RANK"):
        if name in os.environ:
            return int(os.environ[name])
    return 0
