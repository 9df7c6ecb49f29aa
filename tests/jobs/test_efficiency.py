"""seff-style efficiency of an ended job, from sacct rows as SLURM prints them."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from hpcdist.errors import SpecError
from hpcdist.jobs.efficiency import (
    WARNING_LEAD_S,
    Efficiency,
    Request,
    advice,
    efficiency,
    suggest_time_s,
    summary,
)
from hpcdist.slurm.parse import format_duration, parse_duration, parse_sacct
from hpcdist.spec.options import spec_from_options

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
    # One task a node (no NTasks column): the step's 1500 MB plus the batch shell's 2 MB.
    assert eff.node_memory_mb == pytest.approx(1502.0)
    assert eff.mem_request_mb == pytest.approx(4000.0)  # 8000M for the job = 4000M per node
    assert eff.memory_fraction == pytest.approx(1502 / 4000)
    assert eff.time_fraction == pytest.approx(100 / 600)
    assert summary(eff) == (
        "CPU 50.0% (0:06:40 of 0:13:20 core-time on 8 CPUs), memory 37.5% "
        "(peak 1.47 GB a node, of 3.91 GB asked), wall time 16.7% "
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
        node_memory_mb=None if memory is None else memory * 1000,
        mem_request_mb=1000.0,
    )


@pytest.mark.parametrize(
    ("memory", "time", "expected"),
    [
        (
            0.49,
            0.9,
            "it used 49.0% of its memory: --mem=700M (or --mem-per-cpu=700M: its 1 CPU a "
            "node) would do",
        ),
        (0.50, 0.9, None),
        (0.51, 0.9, None),
        (
            0.9,
            0.49,
            "it used 49.0% of its time limit: --time=0:14:00 would do and starts sooner (backfill)",
        ),
        (0.9, 0.50, None),
        (0.9, 0.51, None),
        (
            0.2,
            0.2,
            "it used 20.0% of its memory: --mem=300M (or --mem-per-cpu=300M: its 1 CPU a "
            "node) would do; it used 20.0% of its "
            "time limit: --time=0:07:00 would do and starts sooner (backfill)",
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
    assert eff is not None and (eff.cpu_used_s, eff.node_memory_mb) == (None, None)
    assert summary(eff) == (
        "CPU not recorded, memory not recorded, wall time 0.2% (0:00:04 of 0:30:00)"
    )
    # 4 s and the 90 s warning lead: 2 minutes (0:01:00 would be refused by hpcdist).
    assert advice(eff) == (
        "it used 0.2% of its time limit: --time=0:02:00 would do and starts sooner (backfill)"
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


# sacct -P of SLURM 22.05 on the testbed: 2 nodes x 2 ranks (--mem=1000M), ranks holding
# 100/150/200/250 MB; the job row leaves MaxRSS and NTasks empty, the steps carry them.
TWO_A_NODE = """\
JobID|State|NNodes|NTasks|MaxRSS|AveRSS|ReqMem|AllocCPUS|Elapsed|Timelimit|TotalCPU|NodeList
344|COMPLETED|2||||2000M|4|00:00:12|00:10:00|00:02.500|node[1-2]
344.batch|COMPLETED|1|1|12456K|12456K||2|00:00:12||00:00.100|node1
344.0|COMPLETED|2|4|269544K|192720K||4|00:00:12||00:02.400|node[1-2]
"""


def test_memory_is_summed_per_node_from_the_steps_tasks() -> None:
    eff = efficiency(parse_sacct(TWO_A_NODE), "344")
    assert eff is not None
    # 2 tasks of up to 263.2 MB on the fullest node, and the batch shell's 12.2 MB.
    assert (eff.task_peak_mb, eff.tasks_per_node) == (pytest.approx(263.2, abs=0.1), 2)
    assert eff.node_memory_mb == pytest.approx(2 * 269544 / 1024 + 12456 / 1024)
    assert eff.mem_request_mb == 1000.0  # 2000M for the job over 2 nodes
    assert "memory 53.9% (peak 539 MB a node (2 tasks of up to 263 MB each), of 1000 MB" in (
        summary(eff)
    )
    tip = advice(eff)  # over half of the request per node was used: time advice only
    assert tip is not None and "--mem" not in tip and "--time=0:02:00" in tip


@pytest.mark.parametrize("tasks_per_node", [1, 2, 4, 8])
def test_advised_memory_covers_every_task_of_the_fullest_node(tasks_per_node: int) -> None:
    # Each rank peaks at ~297 MB; the request is 4000M a node.
    nodes = 2
    rows = parse_sacct(
        "JobID|State|NNodes|NTasks|MaxRSS|ReqMem|AllocCPUS|Elapsed|Timelimit|NodeList\n"
        f"9|COMPLETED|{nodes}|||8000M|16|00:10:00|00:20:00|node[1-2]\n"
        f"9.0|COMPLETED|{nodes}|{nodes * tasks_per_node}|304128K||16|00:10:00||node[1-2]\n"
    )
    eff = efficiency(rows, "9")
    assert eff is not None and eff.tasks_per_node == tasks_per_node
    used = tasks_per_node * 304128 / 1024
    tip = advice(eff)
    if used >= 2000:  # half of the request or more: no advice
        assert tip is None
        return
    assert tip is not None
    advised = int(tip.split("--mem=")[1].split("M")[0])
    assert used < advised < 4000


def test_time_advice_is_a_value_hpcdist_accepts_and_leaves_room_for_the_warning() -> None:
    for elapsed in (0.0, 4.0, 59.0, 61.0, 600.0):
        seconds = suggest_time_s(elapsed)
        assert seconds % 60 == 0 and seconds >= elapsed * 1.5 + WARNING_LEAD_S
        spec = spec_from_options({"profile": "local", "time": format_duration(seconds)})
        assert spec.time == format_duration(seconds)  # accepted, with the default warning
    with pytest.raises(SpecError):  # what was advised before: refused
        spec_from_options({"profile": "local", "time": "0:01:00"})


def test_no_time_advice_that_is_not_shorter_than_the_limit() -> None:
    # 10 s of 0:02:00: 8% used, but 1.5 x 10 s + the 90 s lead is 0:02:00 already.
    eff = dataclasses.replace(_eff(None, None), elapsed_s=10.0, limit_s=120.0)
    assert eff.time_fraction is not None and eff.time_fraction < 0.5
    assert advice(eff) is None
    assert advice(dataclasses.replace(eff, limit_s=181.0)) is not None


def test_a_job_that_never_ran_gets_no_advice_and_no_usage() -> None:
    rows = parse_sacct(
        "JobID|State|Elapsed|Timelimit|TotalCPU|AllocCPUS|MaxRSS|ReqMem|NNodes|NodeList\n"
        "12|CANCELLED by 0|00:00:00|00:30:00|00:00:00|2||4000M|1|None assigned\n"
    )
    eff = efficiency(rows, "12")
    assert eff is not None and not eff.ran
    assert summary(eff) == "never ran: no CPU, memory or time used"
    assert advice(eff) is None
    assert advice(dataclasses.replace(eff, state="COMPLETED")) is None
    assert advice(dataclasses.replace(eff, state="COMPLETED", ran=True)) is not None


FINAL_HEADER = "JobID|State|End|TotalCPU"


@pytest.mark.parametrize(
    ("lines", "final"),
    [
        (
            ["5|COMPLETED|2026-12-07T12:04:05|02:07.000", "5.batch|COMPLETED|2026-12-07T12:04:05|"],
            True,
        ),
        (["5|RUNNING|Unknown|00:00:00", "5.batch|RUNNING|Unknown|"], False),  # read as it ran
        (["5|COMPLETED|2026-12-07T12:04:05|00:00:00", "5.batch|RUNNING|Unknown|"], False),
        (["5|COMPLETED|Unknown|00:00:00"], False),
        (["5|CANCELLED by 0|2026-12-07T12:04:05|00:00:00"], True),  # ended while it waited
        (["5|FAILED|2026-12-07T12:01:00|", "5|RUNNING|Unknown|"], False),  # requeued: the last
        ([], False),
    ],
)
def test_only_an_ended_jobs_whole_record_is_final(lines: list[str], final: bool) -> None:
    from hpcdist.jobs.efficiency import record_final

    assert record_final(parse_sacct("\n".join([FINAL_HEADER, *lines])), "5") is final


def test_efficiency_waits_for_the_final_record_and_no_longer() -> None:
    from hpcdist.jobs.efficiency import final_rows

    running = parse_sacct(f"{FINAL_HEADER}\n5|RUNNING|Unknown|00:00:00\n")
    ended = parse_sacct(f"{FINAL_HEADER}\n5|COMPLETED|2026-12-07T12:04:05|02:07.000\n")
    answers = [running, running, ended]
    asked: list[bool] = []
    slept: list[float] = []

    def fetch(fresh: bool) -> list[dict[str, str]]:
        asked.append(fresh)
        return answers.pop(0)

    assert final_rows(fetch, ["5"], wait_s=5.0, sleep=slept.append) == ended
    assert (asked, slept) == ([False, True, True], [1.0, 1.0])  # the kept answer, then anew
    answers[:] = [running] * 4
    assert final_rows(fetch, ["5"], wait_s=2.0, sleep=slept.append) is None
    assert answers == [running]  # asked three times: at once, after 1 s and after 2 s


def _without(argv: list[str], option: str) -> list[str]:
    """``argv`` without the flag (and its value) that ``option`` sets: ``--time`` or
    ``--sbatch mem-per-cpu``."""
    out, skip = [], False
    for n, word in enumerate(argv):
        if skip:
            skip = False
            continue
        flag, _, key = option.partition(" ")
        value = argv[n + 1] if n + 1 < len(argv) else ""
        if word == flag and (not key or value.startswith(f"{key}=")):
            skip = True
            continue
        out.append(word)
    return out


def advised_flags(
    flags: list[str], cpus: int, profile: str = "generic", used_mb: float = 3200.0
) -> tuple[str, list[str]]:
    """The advice to a job rendered with ``flags`` that used ``used_mb`` a node, a tenth of
    its memory, and 10 s of its time (its own log record read as status reads it), and
    ``flags`` changed as it says."""
    from click.testing import CliRunner

    from hpcdist.cli.main import cli

    rendered = CliRunner().invoke(cli, ["render", "--profile", profile, *flags])
    assert rendered.exit_code == 0, rendered.output
    record = json.loads(re.findall(r"--log-record '(\{.*?\})'", rendered.stdout)[0])
    eff = Efficiency(
        state="COMPLETED",
        elapsed_s=10.0,
        limit_s=float(parse_duration(flags[flags.index("--time") + 1]) or 0),
        alloc_cpus=cpus,
        cpu_used_s=None,
        node_memory_mb=used_mb,
        mem_request_mb=10 * used_mb,
    )
    tip = advice(eff, Request.from_record(record))
    assert tip is not None
    advised = re.findall(r"--sbatch [a-z-]+=[0-9A-Z]+|--[a-z-]+=[0-9A-Z:]+", tip)
    assert len(advised) == 2 and advised[-1].startswith("--time="), tip
    again = flags
    for option in advised:
        again = [*_without(again, option.partition("=")[0]), *option.split(" ")]
    return tip, again


ADVISED_JOBS = [
    pytest.param(["--signal", "USR2@600", "--time", "2:00:00", "--mem", "4000M"], 1, id="lead"),
    pytest.param(["--signal", "B:USR1@3000", "--time", "3:00:00", "--mem", "4000M"], 1, id="B:"),
    pytest.param(
        ["--mode", "nccl", "--gpus-per-node", "4", "--mem-per-gpu", "8G", "--time", "2:00:00"],
        4,
        id="mem-per-gpu",
    ),
    pytest.param(
        ["--sbatch", "mem-per-cpu=1000M", "--cpus-per-task", "2", "--time", "2:00:00"],
        2,
        id="mem-per-cpu",
    ),
]


@pytest.mark.parametrize(("flags", "cpus"), ADVISED_JOBS)
def test_each_piece_of_advice_is_taken_when_fed_back(flags: list[str], cpus: int) -> None:
    """The advice names values in the options the job used, and hpcdist renders the job
    again with them (the testbed's sbatch takes them: tests/integration/test_advice_slurm)."""
    from click.testing import CliRunner

    from hpcdist.cli.main import cli

    tip, again = advised_flags(flags, cpus)
    taken = CliRunner().invoke(cli, ["render", "--profile", "generic", *again])
    assert taken.exit_code == 0, f"{tip}\n{again}\n{taken.output}"
