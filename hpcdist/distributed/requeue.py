"""Step 3 of the requeue protocol (``hpcdist.facts.protocol``), once for every job.

The script's runner (``hpcdist.distributed.jobstep run``) ends here once the training has
checkpointed, whether the script was queued by ``hpcdist submit`` or by ``sbatch``:

- ``refusal`` and ``ending`` are the decision, pure: a job ended by TERM is requeued only if
  SLURM picked it for preemption (never the user's scancel or the time limit), only while it
  has restarts left, and only while the controller still runs it: a ``scancel`` turns the job
  ``COMPLETING`` before its TERM reaches anyone (and ``scontrol requeue`` would bring even a
  cancelled job back), and a job the command requeued itself (Lightning's auto-requeue) is
  not requeued a second time (nor submitted again);
- ``requeue_job`` carries it out: ``scontrol requeue`` (an array task alone), else, where
  scontrol is missing or the site refuses, the script submitted again with ``sbatch``
  without this job's ``SLURM_*`` variables (the SLURM calls: ``hpcdist.slurm.control``);
- ``SignalRelay`` passes a warning signal on to the process that runs the ranks.

Standard library only: the batch script runs it before anything else of the job.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpcdist.distributed import badnodes
from hpcdist.facts.protocol import (
    LOCAL_FOLDER_VAR,
    MARKER_VAR,
    REQUEUE_EXIT_CODE,
    RESTARTS_VAR,
    RUN_DIR_VAR,
    SIGNAL_VAR,
    WARNING_KILLED,
    is_inherited,
)
from hpcdist.facts.runs import RUNS_DIR, run_name
from hpcdist.facts.warning import parse_warning
from hpcdist.slurm import control


def checkpointed(status: int, marker: Path | None) -> bool:
    """Whether rank 0 asked for a requeue: by the marker file (srun and torchrun report
    whichever rank they killed last) or by the exit code."""
    return status == REQUEUE_EXIT_CODE or (marker is not None and marker.exists())


def restarts_so_far(env: Mapping[str, str]) -> int:
    """Requeues (SLURM counts them) plus resubmissions as new jobs (the script counts them)."""
    return sum(
        int(env.get(name, "").strip() or 0) for name in ("SLURM_RESTART_COUNT", RESTARTS_VAR)
    )


def refusal(
    job: str, restarts: int, max_restarts: int | None, terminated: bool, preempted: bool
) -> str:
    """Why a job that checkpointed is not requeued; "" if it is. Pure."""
    if terminated and not preempted:
        return f"job {job} was ended (TERM) without a preemption"
    if max_restarts is not None and restarts >= max_restarts:
        return f"restart {restarts} reached --max-restarts {max_restarts}"
    return ""


def ending(job: str, view: control.JobView | None, run_restarts: int) -> str:
    """Why the controller's view forbids a requeue now; "" if it allows one. Pure.

    ``run_restarts``: this run's ``SLURM_RESTART_COUNT``. A job requeued since it started
    (by anyone: the command itself) counts more; a job SLURM is ending and did not preempt
    was cancelled by its user or reached its time limit."""
    if view is None:
        return ""
    if view.restarts is not None and view.restarts > run_restarts:
        return (
            f"job {job} was requeued already while it ran (restart {view.restarts}: by "
            "scontrol requeue, the command's own, e.g. Lightning's auto-requeue, or by "
            "hand); not a second time"
        )
    if view.state and view.state != "RUNNING" and not view.preempted:
        return f"job {job} is {view.state}: cancelled (scancel) or at its time limit"
    return ""


def _decided(
    env: Mapping[str, str], job: str, restarts: int, max_restarts: int | None, terminated: bool
) -> bool | None:
    """True: SLURM requeues the job itself; False: it is not requeued (said why); None: go
    on. Asked right before the requeue: a scancel may have come while the ranks
    checkpointed, its TERM not yet here."""
    view = control.show_job(job) if control.has_scontrol() else None
    preempted = terminated and view is not None and view.preempted
    run_restarts = int(env.get("SLURM_RESTART_COUNT", "").strip() or 0)
    if terminated and not preempted and view is not None and (view.restarts or 0) > run_restarts:
        # SLURM counts the restart as it ends the job (JobState COMPLETING, Restarts ahead of
        # this run's SLURM_RESTART_COUNT in the TERM trap of a first run, on 22.05).
        say(
            f"job {job} is requeued by SLURM itself (scontrol requeue, or a node that "
            "failed): it resumes from its checkpoint"
        )
        return True
    why = ending(job, view, run_restarts) or refusal(
        job, restarts, max_restarts, terminated, preempted
    )
    if why:
        say(f"not requeueing: {why}")
        return False
    return None


def array_task(env: Mapping[str, str]) -> str | None:
    """``<array job>_<task>`` for an array task, which is requeued alone; else None."""
    task = env.get("SLURM_ARRAY_TASK_ID", "").strip()
    return f"{env.get('SLURM_ARRAY_JOB_ID', '')}_{task}" if task else None


def resubmit_env(env: Mapping[str, str], restarts: int) -> dict[str, str]:
    """The environment of the job submitted in this one's place: none of this job's
    ``SLURM_*`` variables (the new job would believe it runs in this allocation), this job's
    run folder to resume from, and one resubmission more."""
    kept = {name: value for name, value in env.items() if not is_inherited(name)}
    kept[RUN_DIR_VAR] = env.get(RUN_DIR_VAR) or f"{RUNS_DIR}/{run_name(env) or ''}"
    kept[RESTARTS_VAR] = str(restarts + 1)
    return kept


def requeue_job(
    env: Mapping[str, str],
    max_restarts: int | None,
    terminated: bool,
    resubmit: str | None = None,
    cause: str = "checkpoint written",
) -> bool:
    """Requeue this job (or submit ``resubmit``, its script, again); whether it was done.

    ``terminated``: the job got SIGTERM (requeued only if preempted). Without ``resubmit``
    a refused ``scontrol requeue`` leaves the job to SLURM. ``cause``: for the log line."""
    job = env.get("SLURM_JOB_ID", "")
    if not job:
        return False
    if env.get(LOCAL_FOLDER_VAR):
        # A job of this machine (``--executor local``): no queue to go back to. Its
        # checkpoint stays; `submit --resume` starts from it.
        say("a local job is not requeued; its checkpoint is kept for --resume")
        return False
    restarts = restarts_so_far(env)
    decided = _decided(env, job, restarts, max_restarts, terminated)
    if decided is not None:
        return decided
    task = array_task(env)
    # Nodes a failure of this run named, still held back: the next piece runs elsewhere.
    exclude = badnodes.for_next_piece(env)
    if control.has_scontrol():
        say(f"{cause}, requeueing {f'array task {task}' if task else f'job {job}'}")
        if control.requeue(task or job):
            if exclude and not control.exclude_nodes(task or job, exclude):
                say(f"could not exclude {','.join(exclude)} from the requeued job")
            return True
    if resubmit is None:
        return False
    # The site refuses the requeue (a preemption that cancels) or has no scontrol here: a new
    # job resumes from this one's run folder; an array task again as a one-task array with
    # the same task id, so the same point of a sweep.
    say(f"no requeue (scontrol missing or refused), resubmitting {resubmit} with sbatch")
    task_id = env.get("SLURM_ARRAY_TASK_ID", "").strip()
    # sbatch's --exclude replaces the script's own: that one is kept beside the bad nodes.
    exclude = [*control.excluded_nodes(job), *exclude] if exclude else []
    why_not = control.resubmit(resubmit, task_id, resubmit_env(env, restarts), exclude)
    if why_not:
        say(f"cannot resubmit: {why_not}")
    return not why_not


def warning_signal(given: str | None) -> signal.Signals | None:
    """The signal of a ``--signal`` value in any spelling SLURM takes (``B:USR1@60``,
    ``rb:sigusr1``, ``10`` -> SIGUSR1); None for none."""
    parsed = parse_warning(given) if given else None
    if parsed is None:
        return None
    try:
        return signal.Signals(parsed.number)
    except ValueError:
        return None


def warning_death(status: int, given: str | None, step_log: str = "") -> str:
    """What the runner says of a command that the warning signal killed, with the settings
    that make it checkpoint instead; "" for any other end. Pure.

    Killed: the step exited as bash reports a death by that signal (128 + its number), or
    srun's report in ``step_log`` (what the step wrote to the job's log) says a task ended
    so, where srun's own status is another task's (``--kill-on-bad-exit`` ended it)."""
    warning = warning_signal(given)
    if warning is None or status == 0:
        return ""
    report = re.compile(
        rf"^srun: error: \S+: tasks? [0-9,-]+: (?:Exited with exit code {128 + warning}|"
        rf"{re.escape(signal.strsignal(warning) or warning.name)})\s*$",
        re.M,
    )
    if status != 128 + warning and not report.search(step_log):
        return ""
    name = warning.name
    lightning = (
        "Lightning checkpoints and requeues itself on SIGUSR1 under the srun launcher "
        "(SLURMEnvironment's auto-requeue; under torchrun it has none)"
        if warning == signal.SIGUSR1
        else "Lightning (srun launcher) checkpoints and requeues itself on SLURMEnvironment's "
        "requeue_signal, SIGUSR1 by default: submit with --signal USR1@<seconds>, or give "
        f"Trainer(plugins=[SLURMEnvironment(requeue_signal=signal.{name})])"
    )
    return (
        f"{WARNING_KILLED} {name} (--signal {given}): it does not catch it, so it wrote no "
        f"checkpoint and hpcdist does not requeue it. To checkpoint on the warning: {lightning}; "
        f"other code: catch {name} (named in ${SIGNAL_VAR}), save, then exit "
        f"{REQUEUE_EXIT_CODE} or create the file ${MARKER_VAR}, and hpcdist requeues the job"
    )


def requeued_by_command(env: Mapping[str, str]) -> str:
    """After a TERM: whether the command requeued this job itself (Lightning's auto-requeue
    runs ``scontrol requeue``, which TERMs the job), said in a line; "" if not."""
    job = env.get("SLURM_JOB_ID", "")
    view = control.show_job(job) if job and control.has_scontrol() else None
    run_restarts = int(env.get("SLURM_RESTART_COUNT", "").strip() or 0)
    if view is None or view.restarts is None or view.restarts <= run_restarts:
        return ""
    return (
        f"job {job} was requeued by scontrol requeue (restart {view.restarts}): by the "
        "command itself (e.g. Lightning's auto-requeue) or by hand; it resumes from its "
        "checkpoint, and hpcdist does not requeue it again"
    )


class SignalRelay:
    """Passes a signal on to a child process: at once while it runs, or, caught before the
    child exists, a moment after it has started (srun needs that moment to set up its own
    forwarding to the tasks)."""

    def __init__(self, received: signal.Signals, sent: signal.Signals | None = None) -> None:
        self.received = received
        self.sent = sent or received
        self.pid: int | None = None
        self.pending = False

    def install(self) -> SignalRelay:
        signal.signal(self.received, self._on_signal)
        return self

    def attach(self, pid: int, pending: bool = False, settle_s: float = 1.0) -> None:
        """The child now runs as ``pid``; ``pending``: a signal came before (in the shell)."""
        self.pid = pid
        if pending or self.pending:
            time.sleep(settle_s)
            self.forward()

    def forward(self) -> None:
        if self.pid is None:
            self.pending = True
            return
        with contextlib.suppress(ProcessLookupError):  # it has just ended: nothing to warn
            os.kill(self.pid, self.sent)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.forward()


def say(line: str) -> None:
    print(f"hpcdist: {line}", file=sys.stderr, flush=True)
