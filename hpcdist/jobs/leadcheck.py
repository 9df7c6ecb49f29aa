"""Is the warning lead long enough for the run's checkpoint? Said before the job is queued.

A run folder the job continues in (its command's ``--run-dir`` or ``--resume``, ``--set
output.run_dir=...``, ``--env HPCDIST_RUN_DIR=...``) holds the time its last checkpoint took
(``checkpoint_timing.json``, written by the training). Where ``--signal``'s lead is shorter
than that plus a margin (``hpcdist.facts.leads``), ``render`` and ``submit`` say so on
stderr: not an error, the job checkpoints early on its own, but the lead could be longer.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

from hpcdist.facts.leads import (
    CHECKPOINT_TIMING_FILE,
    CheckpointTiming,
    margin_s,
    needed_lead_s,
    signal_lead_s,
)
from hpcdist.facts.protocol import RUN_DIR_VAR
from hpcdist.spec.jobspec import JobSpec
from hpcdist.state import book_for, read_output

# The command's words that name a run folder, or a file in one (a checkpoint).
_FOLDER_WORDS = {"--run-dir": False, "--resume": True}


def run_folders(spec: JobSpec) -> list[Path]:
    """The run folders the job will continue in, as far as its spec names them; a relative
    one from the job's working folder (its --chdir), where the training reads it."""
    named = list(_from_command(spec.command))
    named += [
        Path(v) for k, v in (o.partition("=")[::2] for o in spec.overrides) if k == "output.run_dir"
    ]
    named += [Path(value) for key, value in spec.env if key == RUN_DIR_VAR]
    workdir = Path(spec.workdir) if spec.workdir else None
    found = [workdir / path if workdir and not path.is_absolute() else path for path in named]
    found += _continued(spec.continue_run)
    return list(dict.fromkeys(found))


def _continued(run_or_job: str | None) -> list[Path]:
    """The folder a ``--continue RUN`` (or ``--continue JOB``) job trains in, where this
    folder's run records know it already."""
    if not run_or_job:
        return []
    from hpcdist.jobs.runs import load_run, run_of_job

    try:
        run = load_run(run_or_job) or run_of_job(run_or_job)
    except (OSError, ValueError):
        return []
    if run is None or not run.pieces or not run.last.run_dir:
        return []
    return [Path(run.last.run_dir)]


def _from_command(words: tuple[str, ...]) -> Iterator[Path]:
    for n, word in enumerate(words):
        name, eq, value = word.partition("=")
        if name not in _FOLDER_WORDS:
            continue
        value = value if eq else (words[n + 1] if n + 1 < len(words) else "")
        if value:
            yield Path(value).parent if _FOLDER_WORDS[name] else Path(value)


def recorded_timing(folder: Path) -> CheckpointTiming | None:
    """The folder's last checkpoint time, if this user's training recorded it there."""
    try:
        found = read_output(folder / CHECKPOINT_TIMING_FILE, book_for(), "checkpoint timing")
    except (OSError, ValueError):
        return None
    return CheckpointTiming.from_json(found.text())


def lead_warning(spec: JobSpec) -> str:
    """One line for stderr where the lead is shorter than a recorded checkpoint needs."""
    lead = signal_lead_s(spec.signal)
    if lead is None:
        return ""
    for folder in run_folders(spec):
        timing = recorded_timing(folder)
        if timing is None or lead >= needed_lead_s(timing.seconds):
            continue
        asked = math.ceil(needed_lead_s(timing.seconds))
        return (
            f"hpcdist: warning: --signal {spec.signal}: the lead of {lead} s is shorter than "
            f"the last checkpoint in {folder} ({timing.seconds:.1f} s) plus a margin "
            f"({margin_s(timing.seconds):.1f} s); the job will checkpoint early on its own, "
            f"before SLURM's end time; --signal=...@{asked} or more warns in time"
        )
    return ""
