"""seff-style efficiency of an ended job, from sacct rows as SLURM prints them."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdist.jobs.efficiency import Efficiency, advice, efficiency, summary
from hpcdist.slurm.parse import parse_sacct

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
HEADER = "JobID|State|Elapsed|Timelimit|TotalCPU|AllocCPUS|MaxRSS|ReqMem|NNodes"


def _rows(*lines: str) -> list[dict[str, str]]:
    return parse_sacct("\n".join([HEADER, *lines]))


def test_cpu_memory_and_time_of_a_two_node_job() -> None:
    # 2 nodes x 4 CPUs for 100 s = 800 core-seconds; 6:40 of CPU time = 400 s: 50%.
    rows = _rows(
        "5|COMPLETED|00:01:40|00:10:00|06:40.000|8||8000M|2",
        "5.batch|COMPLETED|00:01:40||00:00.100|4|2048K||1",
        "5.0|COMPLETED|00:01:39||06:39.900|8|1536000K||2",
    )
    eff = efficiency(rows, "5")
    assert eff is not None
    assert eff.cpu_fraction == pytest.approx(0.5)
    assert eff.peak_rss_mb == pytest.approx(1500.0)  # the largest step, in MB
    assert eff.mem_request_mb == pytest.approx(4000.0)  # 8000M for the job = 4000M per node
    assert eff.memory_fraction == pytest.approx(0.375)
    assert eff.time_fraction == pytest.approx(100 / 600)
    assert summary(eff) == (
        "CPU 50.0% (0:06:40 of 0:13:20 core-time on 8 CPUs), memory 37.5% "
        "(peak 1.46 GB of 3.91 GB per node), wall time 16.7% "
        "(0:01:40 of 0:10:00)"
    )


@pytest.mark.parametrize(
    ("req_mem", "nodes", "cpus", "per_node_mb"),
    [
        ("2000Mn", 2, 8, 2000.0),
        ("500Mc", 2, 8, 2000.0),
        ("4000M", 2, 8, 2000.0),
        ("4G", 1, 1, 4096.0),
        ("0", 1, 1, None),
        ("", 1, 1, None),
        ("16?", 2, 4, None),  # sacct of SLURM 22.05, a job submitted without --mem
    ],
    ids=["per-node", "per-cpu", "whole-job", "gigabytes", "all-of-node", "none", "unknown-unit"],
)
def test_memory_request_per_node(
    req_mem: str, nodes: int, cpus: int, per_node_mb: float | None
) -> None:
    eff = efficiency(_rows(f"7|COMPLETED|00:01:00|00:02:00|00:30|{cpus}||{req_mem}|{nodes}"), "7")
    assert eff is not None and eff.mem_request_mb == per_node_mb


def _eff(memory: float | None, time: float | None, state: str = "COMPLETED") -> Efficiency:
    """A job that used ``memory`` of its 1000 MB and ``time`` of its 1000 s."""
    return Efficiency(
        state=state,
        elapsed_s=(time or 0) * 1000,
        limit_s=None if time is None else 1000.0,
        alloc_cpus=1,
        cpu_used_s=None,
        peak_rss_mb=None if memory is None else memory * 1000,
        mem_request_mb=1000.0,
    )


@pytest.mark.parametrize(
    ("memory", "time", "expected"),
    [
        (0.49, 0.9, "it used 49.0% of its memory: --mem=700M would do"),
        (0.50, 0.9, None),
        (0.51, 0.9, None),
        (
            0.9,
            0.49,
            "it used 49.0% of its time limit: --time=0:13:00 would do and starts sooner (backfill)",
        ),
        (0.9, 0.50, None),
        (0.9, 0.51, None),
        (
            0.2,
            0.2,
            "it used 20.0% of its memory: --mem=300M would do; it used 20.0% of its "
            "time limit: --time=0:05:00 would do and starts sooner (backfill)",
        ),
        (None, None, None),
    ],
    ids=["mem-49", "mem-50", "mem-51", "time-49", "time-50", "time-51", "both", "unknown"],
)
def test_advice_below_half_of_memory_or_time(
    memory: float | None, time: float | None, expected: str | None
) -> None:
    assert advice(_eff(memory, time)) == expected


@pytest.mark.parametrize("state", ["FAILED", "TIMEOUT", "CANCELLED"])
def test_no_advice_for_a_job_that_did_not_complete(state: str) -> None:
    assert advice(_eff(0.1, 0.1, state)) is None


def test_testbed_without_accounting_gather_says_not_recorded() -> None:
    # jobacct_gather/none: TotalCPU 00:00:00 and no MaxRSS, whatever the job did.
    rows = parse_sacct((FIXTURES / "sacct_9569844.txt").read_text())
    eff = efficiency(rows, "9569844")
    assert eff is not None and (eff.cpu_used_s, eff.peak_rss_mb) == (None, None)
    assert summary(eff) == (
        "CPU not recorded, memory not recorded, wall time 0.2% (0:00:04 of 0:30:00)"
    )
    assert advice(eff) == (
        "it used 0.2% of its time limit: --time=0:01:00 would do and starts sooner (backfill)"
    )


def test_requeued_job_is_judged_by_its_last_attempt() -> None:
    rows = _rows(
        "8|REQUEUED|00:00:10|00:10:00|00:05|1||1000M|1",
        "8|COMPLETED|00:08:00|00:10:00|07:00|1||1000M|1",
        "8.batch|COMPLETED|00:08:00||07:00|1|900000K||1",
    )
    eff = efficiency(rows, "8")
    assert eff is not None and (eff.state, eff.elapsed_s) == ("COMPLETED", 480.0)
    assert advice(eff) is None  # 88% of memory, 80% of time
    assert efficiency(rows, "9") is None
