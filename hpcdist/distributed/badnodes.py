"""The node that broke a job, and the run's next pieces kept off it.

When a job step fails, the runner (``hpcdist.distributed.jobstep run``) reads what srun and
the ranks wrote to the job's log since the step started (``LogMark``) and looks for a node
named by the failure (``named_nodes``, pure): srun's report of a node failure, of the first
task killed by a signal that suggests its node (``srun: error: node2: task 1: Bus error``;
the tasks srun ends after it say ``Terminated``, a program's own error ``Exited with exit
code``, a task that ended itself ``Aborted``, one the out-of-memory killer ended
``Killed``: hpcdist.distributed.rankdeath says so, and no other node would cure it), of the
rank that
torchrun's agent saw die first of such a signal (``hpcdist.facts.launch.RANK_DEATH_LINE``),
the ranks the communication check or the training found missing after a collective failed
(``rollcall.blame_lines``), and any
of the job's nodes named in an NCCL or gloo error line. Each is recorded for the run in the
private state (``hpcdist.state.badnodes``) for ``--bad-node-hold`` seconds; the requeue or
the resubmission of the run (``hpcdist.distributed.requeue``) leaves every node still held
out (``for_next_piece``). ``--no-exclude-bad-nodes`` leaves ``$HPCDIST_BAD_NODE_HOLD``
unset, and nothing here runs.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path

from hpcdist.distributed.rollcall import BLAME_LINE
from hpcdist.errors import UserError
from hpcdist.facts.badnodes import BAD_NODE_HOLD_VAR, BadNode
from hpcdist.facts.launch import NODE_SIGNALS, RANK_DEATH_LINE
from hpcdist.facts.protocol import RUN_DIR_VAR
from hpcdist.facts.runs import run_name
from hpcdist.slurm.nodelist import expand_nodelist
from hpcdist.state.badnodes import add_bad_nodes, read_bad_nodes

_NODE_FAILURE = re.compile(r"^srun: error: Node failure on (\S+)", re.M)
_TORCHRUN_DEATH = re.compile(rf"^(?:\d+: )?{RANK_DEATH_LINE}\s*$", re.M)
_OOM = re.compile(r"oom[-_ ]kill|Out Of Memory", re.I)
_TASK = re.compile(r"^srun: error: ([^\s:]+): tasks? ([0-9,\-]+): (.+?)\s*$", re.M)
# How srun says a task died of a signal that suggests its node ("Bus error", "Segmentation
# fault", ...: the C library's names of NODE_SIGNALS, which srun prints). Not "Aborted": a
# process aborts itself (an assertion, NCCL's watchdog on a rank that waited for a hung one);
# not "Killed": the out-of-memory killer's signal (the job's own memory).
_NODE_DEATHS = tuple(
    signal.strsignal(getattr(signal, f"SIG{name}")) or name for name in NODE_SIGNALS
)
# A line of an NCCL or gloo error, naming the peer it lost after "peer" or "remote" (a
# rank's own host, or the master's, named elsewhere in a line says nothing of the peer).
_NETWORK = re.compile(r"nccl|gloo|socket", re.I)
_FAILED = re.compile(r"error|fail|closed|reset|timed? ?out|abort", re.I)
# How much of the log a failed step is searched for (its end: the failure is there).
_LOG_TAIL = 4 << 20


def hold_s(env: Mapping[str, str]) -> int | None:
    """``--bad-node-hold`` of the job's script; None: bad nodes are not excluded."""
    text = env.get(BAD_NODE_HOLD_VAR, "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def named_nodes(log: str, nodes: Sequence[str]) -> list[tuple[str, str]]:
    """(node, what named it) for each of the job's ``nodes`` that the failure in ``log``
    names, once each, in the order found. Pure."""
    found: dict[str, str] = {}
    for node in _NODE_FAILURE.findall(log):
        found.setdefault(node, "a node failure")
    first = _TASK.search(log)
    if first is not None:
        node, tasks, how = first.groups()
        # Only a death by a node's signal: Terminated and "Exited with exit code" name tasks
        # srun ended or that failed by themselves, "Aborted" a task that ended itself; "Out
        # Of Memory" (the cgroup counted the kill) is the job's own memory, which another
        # node would not cure.
        if how.startswith(_NODE_DEATHS):
            found.setdefault(node, f"task {tasks} {how}")
    # torchrun's agent names its rank that died of a signal suggesting its node; a kill
    # that the step's memory limit made (SLURM reports an oom-kill event) is not the node's.
    if not _OOM.search(log):
        for rank, node, name in _TORCHRUN_DEATH.findall(log):
            if name in NODE_SIGNALS:  # a script rendered before KILL left the list names it
                found.setdefault(node, f"rank {rank} SIG{name}")
    # Ranks the communication check or the training found missing after a collective
    # failed (hpcdist.distributed.rollcall).
    for rank, node, what in BLAME_LINE.findall(log):
        found.setdefault(node, f"rank {rank} {what}")
    words = {
        node: re.compile(rf"\b(?:peer|remote)\b.*?(?<![\w.-]){re.escape(node)}(?![\w-])", re.I)
        for node in nodes
    }
    for line in log.splitlines():
        if _NETWORK.search(line) and _FAILED.search(line) and not line.startswith("srun: "):
            for node, word in words.items():
                if word.search(line):
                    found.setdefault(node, f"a network error: {line.strip()[:160]}")
    return [(node, why) for node, why in found.items() if node in nodes]


class LogMark:
    """Where the job's log files (this process's stdout and stderr) end now, so that what
    a step writes after it can be read back (srun and the ranks inherit both)."""

    def __init__(self, fds: tuple[int, ...] = (1, 2)) -> None:
        self.marks: list[tuple[str, int]] = []
        seen = set()
        for fd in fds:
            try:
                info = os.fstat(fd)
                path = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if path.startswith("/") and (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                self.marks.append((path, info.st_size))

    def written_since(self) -> str:
        texts = []
        for path, start in self.marks:
            try:
                with open(path, "rb") as log:
                    end = log.seek(0, os.SEEK_END)
                    log.seek(max(start, end - _LOG_TAIL))
                    texts.append(log.read().decode(errors="replace"))
            except OSError:
                continue
        return "\n".join(texts)


def run_key(env: Mapping[str, str]) -> str:
    """The run's name: its folder's (a resubmitted job's is the first job's), else the job's."""
    folder = env.get(RUN_DIR_VAR, "").strip()
    return Path(folder).name if folder else (run_name(env) or "")


def _project(env: Mapping[str, str]) -> Path | None:
    # The submit folder's private state, as the job's other state (jobstep prepare).
    if env.get("HPCDIST_HOME", "").strip():
        return None
    return Path(env.get("SLURM_SUBMIT_DIR") or os.getcwd())


def after_failure(env: Mapping[str, str], mark: LogMark, now: float | None = None) -> list[str]:
    """Record the nodes the failed step's log names for the run; the nodes recorded."""
    hold = hold_s(env)
    if hold is None or not run_key(env):
        return []
    try:
        nodes = expand_nodelist(env.get("SLURM_JOB_NODELIST", ""), "SLURM_JOB_NODELIST")
    except ValueError:
        nodes = []
    found = named_nodes(mark.written_since(), nodes) if nodes else []
    if not found:
        return []
    now = time.time() if now is None else now
    records = [BadNode(node, why, now, now + hold) for node, why in found]
    try:
        add_bad_nodes(run_key(env), records, now, _project(env))
    except (UserError, OSError) as exc:
        _say(f"cannot record the bad node(s) {', '.join(n for n, _ in found)}: {exc}")
        return []
    for record in records:
        _say(
            f"node {record.node} named by {record.reason}: this run's next pieces are kept "
            f"off it until {_clock(record.until)} (--bad-node-hold {hold} s; "
            "--no-exclude-bad-nodes turns this off)"
        )
    return [record.node for record in records]


def _held(env: Mapping[str, str], now: float | None) -> list[BadNode]:
    if hold_s(env) is None or not run_key(env):
        return []
    try:
        return read_bad_nodes(run_key(env), time.time() if now is None else now, _project(env))
    except (UserError, OSError) as exc:
        _say(f"bad-node record not read: {exc}")
        return []


def for_next_piece(env: Mapping[str, str], now: float | None = None) -> list[str]:
    """The nodes the run's next piece must stay off (their hold not yet run out)."""
    held = _held(env, now)
    for record in held:
        _say(
            f"excluding node {record.node} from the next piece ({record.reason}, until "
            f"{_clock(record.until)})"
        )
    return [record.node for record in held]


def say_held(env: Mapping[str, str], now: float | None = None) -> None:
    """One line, as a piece starts, for each node the run is kept off."""
    for record in _held(env, now):
        until = _clock(record.until)
        _say(f"this run is kept off node {record.node} ({record.reason}, until {until})")


def _clock(seconds: float) -> str:
    return datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M")


def _say(line: str) -> None:
    print(f"hpcdist: {line}", file=sys.stderr, flush=True)
