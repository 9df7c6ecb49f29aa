"""Local jobs (submitit's local executor) as processes with an identity that survives pid reuse.

A local job's id is the process id of submitit's controller. A pid alone names whatever
process holds that number now: after the job ended, the kernel may hand it to an unrelated
process. So the record also keeps the controller's start time (clock ticks since boot, from
``/proc/<pid>/stat``), and a process is the job only while both match. Nothing is signalled
unless they do.

Cancelling stops the whole tree: the controller, the batch shell it runs
(``hpcdist.distributed.localstep``) and the ranks and commands they started. Every
process gets SIGTERM first, then SIGKILL after a grace period.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProcessIdentity:
    pid: int
    start_ticks: int  # field 22 of /proc/<pid>/stat: when the process started

    def is_running(self) -> bool:
        """This very process is alive (not exited, not a zombie, not a reused pid)."""
        stat = _stat(self.pid)
        return stat is not None and stat.start_ticks == self.start_ticks and not stat.finished


@dataclass(frozen=True)
class _Stat:
    ppid: int
    start_ticks: int
    finished: bool  # zombie or dead, waiting to be reaped


def _stat(pid: int) -> _Stat | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = text.rsplit(")", 1)[-1].split()
    return _Stat(ppid=int(fields[1]), start_ticks=int(fields[19]), finished=fields[0] in "ZX")


def identify(pid: int) -> ProcessIdentity | None:
    """The identity of a live process, or None if there is none with that pid."""
    if pid < 2:
        return None
    stat = _stat(pid)
    if stat is None or stat.finished:
        return None
    return ProcessIdentity(pid, stat.start_ticks)


def process_tree(root: ProcessIdentity) -> list[ProcessIdentity]:
    """The root and every live descendant, parents before children; empty if the root is
    not running any more."""
    if not root.is_running():
        return []
    children: dict[int, list[ProcessIdentity]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = _stat(int(entry.name))
        if stat is not None and not stat.finished:
            children.setdefault(stat.ppid, []).append(
                ProcessIdentity(int(entry.name), stat.start_ticks)
            )
    tree, queue = [], [root]
    while queue:
        process = queue.pop(0)
        tree.append(process)
        queue.extend(children.get(process.pid, []))
    return tree


def stop_tree(root: ProcessIdentity, grace_s: float = 3.0) -> int:
    """SIGTERM to every process of the tree, SIGKILL to what is left after ``grace_s``;
    returns how many processes were signalled. A reused pid is never signalled."""
    tree = process_tree(root)
    _signal_all(tree, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(p.is_running() for p in tree):
        time.sleep(0.1)
    # Children started during the grace period are caught by walking the tree again.
    remaining = {p.pid: p for p in [*tree, *process_tree(root)] if p.is_running()}
    _signal_all(list(remaining.values()), signal.SIGKILL)
    return len(tree)


def _signal_all(processes: list[ProcessIdentity], signum: signal.Signals) -> None:
    for process in processes:
        if process.is_running():  # checked again just before each signal
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(process.pid, signum)
