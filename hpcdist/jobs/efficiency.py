"""How well an ended job used what it asked for, as ``seff`` reports it.

CPU efficiency is TotalCPU / (Elapsed x AllocCPUS); memory is the peak MaxRSS of any step
(one task's resident set) against the request per node; wall time against the limit.
Pure functions of sacct's rows; the numbers SLURM did not record stay None.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpcdist.slurm.parse import (
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


@dataclass(frozen=True)
class Efficiency:
    state: str
    elapsed_s: float
    limit_s: float | None
    alloc_cpus: int
    cpu_used_s: float | None  # None: SLURM gathered no CPU time (JobAcctGather none)
    peak_rss_mb: float | None  # None: no step recorded a MaxRSS
    mem_request_mb: float | None  # per node; None: no request known

    @property
    def cpu_fraction(self) -> float | None:
        core_s = self.elapsed_s * self.alloc_cpus
        if self.cpu_used_s is None or core_s <= 0:
            return None
        return self.cpu_used_s / core_s

    @property
    def memory_fraction(self) -> float | None:
        if self.peak_rss_mb is None or not self.mem_request_mb:
            return None
        return self.peak_rss_mb / self.mem_request_mb

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


def _max_rss_mb(rows: Sequence[Mapping[str, str]]) -> float | None:
    peaks = [_memory_or_none(row.get("MaxRSS", ""), "K") for row in rows]
    values = [mb for mb, _ in (p for p in peaks if p is not None)]
    return max(values) if values else None


def efficiency(rows: Sequence[Mapping[str, str]], job_id: str) -> Efficiency | None:
    """The efficiency of ``job_id`` from its sacct rows (job row and step rows); None
    when sacct has no row for it yet."""
    jobs = [row for row in rows if row.get("JobID") == job_id]
    if not jobs:
        return None
    job = jobs[-1]  # the last attempt of a requeued job
    steps = [row for row in rows if row.get("JobID", "").startswith(job_id + ".")]
    cpus = int(job.get("AllocCPUS") or 0)
    nodes = int(job.get("NNodes") or 1)
    peak = _max_rss_mb(steps)
    total_cpu = parse_duration(job.get("TotalCPU", ""))
    # Without job accounting gathered (MaxRSS empty everywhere), TotalCPU reads 0 for a job
    # that surely used some CPU: unknown, not 0%.
    if peak is None and not total_cpu:
        total_cpu = None
    return Efficiency(
        state=job.get("State", "").split(" ")[0].upper(),
        elapsed_s=parse_duration(job.get("Elapsed", "")) or 0.0,
        limit_s=parse_duration(job.get("Timelimit", "")),
        alloc_cpus=cpus,
        cpu_used_s=total_cpu,
        peak_rss_mb=peak,
        mem_request_mb=_per_node_mb(job.get("ReqMem", ""), nodes, cpus),
    )


def _percent(fraction: float | None) -> str:
    return "?" if fraction is None else f"{fraction * 100:.1f}%"


def _mb(value: float) -> str:
    return f"{value / 1024:.2f} GB" if value >= 1024 else f"{value:.0f} MB"


def summary(eff: Efficiency) -> str:
    """One line: CPU, memory and wall time against what the job asked for."""
    core_s = eff.elapsed_s * eff.alloc_cpus
    if eff.cpu_used_s is None:
        cpu = "CPU not recorded"
    else:
        cpu = (
            f"CPU {_percent(eff.cpu_fraction)} ({format_duration(eff.cpu_used_s)} of "
            f"{format_duration(core_s)} core-time on {eff.alloc_cpus} CPUs)"
        )
    if eff.peak_rss_mb is None:
        memory = "memory not recorded"
    elif eff.mem_request_mb is None:
        memory = f"memory peak {_mb(eff.peak_rss_mb)} (no request)"
    else:
        memory = (
            f"memory {_percent(eff.memory_fraction)} (peak {_mb(eff.peak_rss_mb)} of "
            f"{_mb(eff.mem_request_mb)} per node)"
        )
    if eff.limit_s is None:
        wall = f"wall time {format_duration(eff.elapsed_s)} (no limit)"
    else:
        wall = (
            f"wall time {_percent(eff.time_fraction)} ({format_duration(eff.elapsed_s)} of "
            f"{format_duration(eff.limit_s)})"
        )
    return f"{cpu}, {memory}, {wall}"


def _suggest_mem(peak_mb: float) -> str:
    mb = max(100, math.ceil(peak_mb * MEMORY_HEADROOM / 100) * 100)
    return f"{mb // 1024}G" if mb % 1024 == 0 else f"{mb}M"


def _suggest_time(elapsed_s: float) -> str:
    minutes = max(1, math.ceil(elapsed_s * TIME_HEADROOM / 60))
    return format_duration(minutes * 60)


def advice(eff: Efficiency) -> str | None:
    """One line when a completed job used under half of its memory or time; else None.

    Only for COMPLETED jobs: one that failed early says nothing about what it needed."""
    if eff.state != "COMPLETED":
        return None
    tips = []
    memory = eff.memory_fraction
    if memory is not None and memory < ADVICE_BELOW and eff.peak_rss_mb is not None:
        suggested = _suggest_mem(eff.peak_rss_mb)
        tips.append(f"it used {_percent(memory)} of its memory: --mem={suggested} would do")
    time = eff.time_fraction
    if time is not None and time < ADVICE_BELOW:
        tips.append(
            f"it used {_percent(time)} of its time limit: --time="
            f"{_suggest_time(eff.elapsed_s)} would do and starts sooner (backfill)"
        )
    return "; ".join(tips) if tips else None
