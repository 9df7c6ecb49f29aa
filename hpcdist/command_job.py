"""What a submitit task runs: the job's command as a child process, with its exit recorded.

This module is imported inside the job (by submitit unpickling a CommandJob), never by the
CLI's render path; it imports neither torch nor anything heavy.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from submitit.helpers import Checkpointable, DelayedSubmission

from hpcdist.exitcodes import REQUEUE_EXIT_CODE
from hpcdist.fileutil import write_atomic
from hpcdist.jobs import process_exited

# How long the warning-signal handler waits for the child to write its checkpoint.
CHECKPOINT_GRACE_S = 60.0


class CommandFailed(RuntimeError):
    """The job's command exited non-zero; submitit marks the job FAILED."""


@dataclass
class CommandJob(Checkpointable):
    """Run ``argv`` in every task; the env holds extra variables from the JobSpec."""

    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    record_dir: str | None = None
    threads: int | None = None
    _child: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    def __call__(self) -> int:
        env = dict(os.environ)
        env.update(self.env)
        if self.threads is not None:
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(self.threads)
        env["PYTHONUNBUFFERED"] = "1"
        self._child = subprocess.Popen(list(self.argv), env=env)
        code = self._child.wait()
        self._record(code)
        if code == REQUEUE_EXIT_CODE:
            # The child checkpointed after the warning signal; submitit's handler requeues.
            time.sleep(CHECKPOINT_GRACE_S)
        if code != 0:
            raise CommandFailed(f"{' '.join(self.argv)} exited with code {code}")
        return code

    def checkpoint(self, *args: Any, **kwargs: Any) -> DelayedSubmission:
        """Called by submitit on the warning signal: let the child checkpoint, then requeue."""
        child = self._child
        if child is not None and not process_exited(child.pid):
            child.send_signal(signal.SIGUSR2)
            if not _wait_exited(child.pid, CHECKPOINT_GRACE_S):
                print("hpcdist: child did not exit after the warning signal", file=sys.stderr)
        fresh = CommandJob(self.argv, self.env, self.record_dir, self.threads)
        return DelayedSubmission(fresh)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_child"] = None
        return state

    def _record(self, code: int) -> None:
        """Leave the exit code beside submitit's logs: how `hpcdist status` reads local jobs."""
        folder = self.record_dir
        if folder is None:
            from submitit import JobEnvironment

            folder = str(JobEnvironment().paths.folder)
        rank = _task_rank()
        record = {"rank": rank, "returncode": code, "finished": time.time()}
        write_atomic(Path(folder) / f"exit_{rank}.json", json.dumps(record))


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
