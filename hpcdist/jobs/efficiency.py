"""How well an ended job used what it asked for, as ``seff`` reports it.

CPU efficiency is TotalCPU / (Elapsed x AllocCPUS); wall time is against the limit.
Memory is per node, against the request per node: sacct's MaxRSS of a step is its largest
task's peak (sacct(1); every version from 22.05 prints it on the step rows only, the job's
own row leaves it empty), so a node holding k of the step's tasks used up to k x MaxRSS,
besides the batch and extern steps that run beside it on a node. AveRSS x NTasks is the
step's sum, spread evenly; the bound is what a request must cover on the fullest node.
Pure functions of sacct's rows; the numbers SLURM did not record stay None.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hpcdist.slurm.parse import (
    FINAL_STATES,
    MemoryPer,
    SlurmOutputError,
    format_duration,
    parse_duration,
    parse_memory_mb,
)

# Under this share of the memory or time asked for, the job gets one line of advice.
ADVICE_BELOW = 0.5
# Headroom added to what a job used when suggesting a smaller request.
MEMORY_HEADROOM = 1.25
TIME_HEADROOM = 1.5


# hpcdist's default warning comes this long before the limit (--signal USR2@90): a --time
# at or under it is refused, and a job whose run ends inside it is warned before it ends.
WARNING_LEAD_S = 90
# Steps that run beside the job's own steps for its whole life (the batch shell on the first
# node, the extern step on every node): their memory adds to a node's, not competes with it.
_BESIDE_STEPS = ("batch", "extern", "interactive")


@dataclass(frozen=True)
class Efficiency:
    state: str
    elapsed_s: float
    limit_s: float | None
    alloc_cpus: int
    cpu_used_s: float | None  # None: SLURM gathered no CPU time (JobAcctGather none)
    node_memory_mb: float | None  # the fullest node's; None: no step recorded a MaxRSS
    mem_request_mb: float | None  # per node; None: no request known
    ran: bool = True  # False: the job never started (cancelled or failed while pending)
    task_peak_mb: float | None = None  # MaxRSS: the largest task of the step that counted
    tasks_per_node: int = 1  # that step's tasks on its fullest node
    nodes: int = 1

    @property
    def cpu_fraction(self) -> float | None:
        core_s = self.elapsed_s * self.alloc_cpus
        if self.cpu_used_s is None or core_s <= 0:
            return None
        return self.cpu_used_s / core_s

    @property
    def memory_fraction(self) -> float | None:
        if self.node_memory_mb is None or not self.mem_request_mb:
            return None
        return self.node_memory_mb / self.mem_request_mb

    @property
    def time_fraction(self) -> float | None:
        if not self.limit_s:
            return None
        return self.elapsed_s / self.limit_s


def _per_node_mb(req_mem: str, nodes: int, cpus: int) -> float | None:
    parsed = _memory_or_none(req_mem, "M")
    if parsed is None or parsed[0] <= 0:
        return None
    mb, per = parsed
    if per == "node":
        return mb
    if per == "cpu":
        return mb * cpus / max(nodes, 1)
    return mb / max(nodes, 1)  # SLURM >= 21.08 prints the whole job's request


def _memory_or_none(text: str, bare_unit: str) -> tuple[float, MemoryPer] | None:
    """A size sacct printed, or None where it printed one without a known unit: SLURM
    22.05 showed ReqMem '16?' for a job submitted without --mem (seen on the testbed).
    Efficiency is an extra; a size it cannot read is "not recorded", never an error."""
    try:
        return parse_memory_mb(text, bare_unit=bare_unit)
    except SlurmOutputError:
        return None


def _mb_of(row: Mapping[str, str], field: str) -> float | None:
    parsed = _memory_or_none(row.get(field, ""), "K")
    return None if parsed is None else parsed[0]


@dataclass(frozen=True)
class _NodeMemory:
    total_mb: float
    task_peak_mb: float
    tasks_per_node: int


def _node_memory(steps: Sequence[Mapping[str, str]]) -> _NodeMemory | None:
    """The fullest node's memory: the largest of the job's steps (its MaxRSS times its
    tasks on the fullest node) plus the steps that run beside it; None when no step
    recorded a MaxRSS."""
    beside = 0.0
    largest: _NodeMemory | None = None
    for row in steps:
        peak = _mb_of(row, "MaxRSS")
        if peak is None:
            continue
        if row.get("JobID", "").rpartition(".")[2] in _BESIDE_STEPS:
            beside += peak
            continue
        tasks, nodes = _int(row.get("NTasks"), 1), _int(row.get("NNodes"), 1)
        per_node = max(1, math.ceil(tasks / max(nodes, 1)))
        if largest is None or peak * per_node > largest.total_mb:
            largest = _NodeMemory(peak * per_node, peak, per_node)
    if largest is None:
        return None if not beside else _NodeMemory(beside, beside, 1)
    return _NodeMemory(largest.total_mb + beside, largest.task_peak_mb, largest.tasks_per_node)


def _int(text: str | None, default: int) -> int:
    return int(text) if text is not None and text.strip().isdigit() else default


def efficiency(rows: Sequence[Mapping[str, str]], job_id: str) -> Efficiency | None:
    """The efficiency of ``job_id`` from its sacct rows (job row and step rows); None
    when sacct has no row for it yet."""
    jobs = [row for row in rows if row.get("JobID") == job_id]
    if not jobs:
        return None
    job = jobs[-1]  # the last attempt of a requeued job
    steps = [row for row in rows if row.get("JobID", "").startswith(job_id + ".")]
    cpus = _int(job.get("AllocCPUS"), 0)
    nodes = _int(job.get("NNodes"), 1)
    memory = _node_memory(steps)
    total_cpu = parse_duration(job.get("TotalCPU", ""))
    # Without job accounting gathered (MaxRSS empty everywhere), TotalCPU reads 0 for a job
    # that surely used some CPU: unknown, not 0%.
    if memory is None and not total_cpu:
        total_cpu = None
    # A job cancelled (or failed) while it waited has no nodes: it used nothing.
    ran = job.get("NodeList", "").strip() not in ("", "None assigned", "(null)") or bool(steps)
    return Efficiency(
        state=job.get("State", "").split(" ")[0].upper(),
        elapsed_s=parse_duration(job.get("Elapsed", "")) or 0.0,
        limit_s=parse_duration(job.get("Timelimit", "")),
        alloc_cpus=cpus,
        cpu_used_s=total_cpu,
        node_memory_mb=None if memory is None else memory.total_mb,
        mem_request_mb=_per_node_mb(job.get("ReqMem", ""), nodes, cpus),
        ran=ran,
        task_peak_mb=None if memory is None else memory.task_peak_mb,
        tasks_per_node=1 if memory is None else memory.tasks_per_node,
        nodes=max(nodes, 1),
    )


def record_final(rows: Sequence[Mapping[str, str]], job_id: str) -> bool:
    """Whether sacct's rows of ``job_id`` are its final record: the job's (last attempt's)
    row ended, its end written, and every step's row ended. A row read while the job ran,
    or as it ended, lacks the CPU time its steps add when they end."""
    jobs = [row for row in rows if row.get("JobID") == job_id]
    steps = [row for row in rows if row.get("JobID", "").startswith(job_id + ".")]
    return (
        bool(jobs)
        and jobs[-1].get("End", "Unknown").strip() not in ("", "Unknown", "None")
        and all(_ended(row) for row in (jobs[-1], *steps))
    )


def _ended(row: Mapping[str, str]) -> bool:
    words = row.get("State", "").split()
    return bool(words) and words[0].upper() in FINAL_STATES


def final_rows(
    fetch: Callable[[bool], Sequence[Mapping[str, str]]],
    job_ids: Sequence[str],
    wait_s: float,
    sleep: Callable[[float], None] = time.sleep,
    poll_s: float = 1.0,
) -> Sequence[Mapping[str, str]] | None:
    """sacct's rows once they are the final record of every job of ``job_ids`` (ended
    jobs): ``fetch(fresh)`` asked again each ``poll_s`` up to ``wait_s`` (the database
    writes the record seconds after the end); None if it is not final by then."""
    rows = fetch(False)  # the user's view may already hold the final record
    waited = 0.0
    while not all(record_final(rows, one) for one in job_ids):
        if waited >= wait_s:
            return None
        sleep(poll_s)
        waited += poll_s
        rows = fetch(True)
    return rows


def _percent(fraction: float | None) -> str:
    return "?" if fraction is None else f"{fraction * 100:.1f}%"


def _mb(value: float) -> str:
    return f"{value / 1024:.2f} GB" if value >= 1024 else f"{value:.0f} MB"


def _memory_text(eff: Efficiency) -> str:
    if eff.node_memory_mb is None:
        return "memory not recorded"
    peak = f"peak {_mb(eff.node_memory_mb)} a node"
    if eff.tasks_per_node > 1 and eff.task_peak_mb is not None:
        peak += f" ({eff.tasks_per_node} tasks of up to {_mb(eff.task_peak_mb)} each)"
    if eff.mem_request_mb is None:
        return f"memory {peak} (no request)"
    return f"memory {_percent(eff.memory_fraction)} ({peak}, of {_mb(eff.mem_request_mb)} asked)"


def summary(eff: Efficiency) -> str:
    """One line: CPU, memory and wall time against what the job asked for."""
    if not eff.ran:
        return "never ran: no CPU, memory or time used"
    core_s = eff.elapsed_s * eff.alloc_cpus
    if eff.cpu_used_s is None:
        cpu = "CPU not recorded"
    else:
        cpu = (
            f"CPU {_percent(eff.cpu_fraction)} ({format_duration(eff.cpu_used_s)} of "
            f"{format_duration(core_s)} core-time on {eff.alloc_cpus} CPUs)"
        )
    if eff.limit_s is None:
        wall = f"wall time {format_duration(eff.elapsed_s)} (no limit)"
    else:
        wall = (
            f"wall time {_percent(eff.time_fraction)} ({format_duration(eff.elapsed_s)} of "
            f"{format_duration(eff.limit_s)})"
        )
    return f"{cpu}, {_memory_text(eff)}, {wall}"


def _suggest_mem(mb_used: float) -> str:
    mb = max(100, math.ceil(mb_used * MEMORY_HEADROOM / 100) * 100)
    return f"{mb // 1024}G" if mb % 1024 == 0 else f"{mb}M"


def suggest_time_s(elapsed_s: float, lead_s: int = WARNING_LEAD_S) -> int:
    """Whole minutes that hold the run with headroom and the warning's lead after it, and
    always more than the lead: a job given less is warned (and checkpoints, or is
    requeued) before it ends, and ``--time`` at or under the lead is refused."""
    return max(1, math.ceil((elapsed_s * TIME_HEADROOM + lead_s + 1) / 60)) * 60


@dataclass(frozen=True)
class Request:
    """How the job asked for what the advice changes, from its log record (a script
    hpcdist rendered): the warning's lead (None: no warning), the sbatch option of its
    memory request and its GPUs a node. ``known`` False: a job of another tool, told in
    sbatch's own options, its lead taken to be hpcdist's default."""

    lead_s: int | None = WARNING_LEAD_S
    memory: str | None = None
    gpus_per_node: int | None = None
    known: bool = False

    @classmethod
    def from_record(cls, record: Mapping[str, object] | None) -> Request:
        if record is None or "lead" not in record:
            return cls()
        lead, memory, gpus = record.get("lead"), record.get("memory"), record.get("gpus_per_node")
        return cls(
            lead_s=lead if isinstance(lead, int) else None,
            memory=memory if memory in ("mem", "mem-per-cpu", "mem-per-gpu") else None,
            gpus_per_node=gpus if isinstance(gpus, int) and gpus > 0 else None,
            known=True,
        )


def _memory_tip(eff: Efficiency, request: Request, node_mb: float) -> str | None:
    """The smaller request in the option the job used: hpcdist refuses --mem beside
    --mem-per-gpu, and sbatch --mem beside --mem-per-cpu."""
    cpus = max(1, eff.alloc_cpus // max(eff.nodes, 1))
    per_cpu = _suggest_mem(node_mb / cpus)
    on = f"its {cpus} CPU{'s' if cpus > 1 else ''} a node"
    if request.memory == "mem-per-gpu":
        if request.gpus_per_node is None:
            return None
        return f"--mem-per-gpu={_suggest_mem(node_mb / request.gpus_per_node)}"
    if request.memory == "mem-per-cpu":
        option = "--sbatch mem-per-cpu=" if request.known else "--mem-per-cpu="
        return f"{option}{per_cpu} ({on})"
    if request.memory == "mem" or request.known:
        return f"--mem={_suggest_mem(node_mb)}"
    return f"--mem={_suggest_mem(node_mb)} (or --mem-per-cpu={per_cpu}: {on})"


def advice(eff: Efficiency, request: Request | None = None) -> str | None:
    """One line when a completed job used under half of its memory or time; else None.

    Only for COMPLETED jobs that ran: one that failed early says nothing about what it
    needed. A smaller --time is advised only where it is smaller than the limit it had,
    each value in the option the job used (``request``), one that hpcdist and sbatch take."""
    if eff.state != "COMPLETED" or not eff.ran:
        return None
    request = request or Request()
    tips = []
    memory = eff.memory_fraction
    if memory is not None and memory < ADVICE_BELOW and eff.node_memory_mb is not None:
        tip = _memory_tip(eff, request, eff.node_memory_mb)
        if tip is not None:
            tips.append(f"it used {_percent(memory)} of its memory: {tip} would do")
    time = eff.time_fraction
    seconds = suggest_time_s(eff.elapsed_s, request.lead_s or 0)
    if time is not None and time < ADVICE_BELOW and eff.limit_s and seconds < eff.limit_s:
        tips.append(
            f"it used {_percent(time)} of its time limit: --time="
            f"{format_duration(seconds)} would do and starts sooner (backfill)"
        )
    return "; ".join(tips) if tips else None
