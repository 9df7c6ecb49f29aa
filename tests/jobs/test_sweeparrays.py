"""A sweep split into the arrays a site's MaxArraySize/MaxJobCount require: every point
once, in order, both sides of the limit; each array queued with its first point."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpcdist.errors import UserError
from hpcdist.facts.protocol import SWEEP_OFFSET_VAR
from hpcdist.jobs.arrays import summary
from hpcdist.jobs.records import load_record
from hpcdist.jobs.report import task_ids
from hpcdist.jobs.submit import submit
from hpcdist.jobs.sweeparrays import array_args, export_value
from hpcdist.render.script import render
from hpcdist.slurm.limits import ArrayLimits, parse_limits, split_points
from hpcdist.spec.options import spec_from_options

CONFIG = """Configuration data as of 2026-11-27T18:00:00
MailProg                = /bin/true
MaxArraySize            = 3
MaxJobCount             = 10000
MaxJobId                = 67043328
"""


def test_limits_are_read_from_scontrol_show_config_with_slurms_defaults() -> None:
    assert parse_limits(CONFIG) == ArrayLimits(3, 10000)
    assert parse_limits("MaxJobCount = 500\n") == ArrayLimits(1001, 500)
    assert parse_limits("") == ArrayLimits(1001, 10000)


@pytest.mark.parametrize(
    ("count", "limits", "expected"),
    [
        (1000, ArrayLimits(1001, 10000), [(0, 1000)]),
        (1001, ArrayLimits(1001, 10000), [(0, 1001)]),
        (1002, ArrayLimits(1001, 10000), [(0, 1001), (1001, 1)]),
        (3, ArrayLimits(3, 10000), [(0, 3)]),
        (4, ArrayLimits(3, 10000), [(0, 3), (3, 1)]),
        (5, ArrayLimits(1001, 6), [(0, 5)]),
        (5, ArrayLimits(1001, 4), None),
        (5, ArrayLimits(1001, 5), None),
        (5, ArrayLimits(2, 10000), [(0, 2), (2, 2), (4, 1)]),
    ],
)
def test_a_sweep_is_split_at_the_sites_limit(
    count: int, limits: ArrayLimits, expected: list[tuple[int, int]] | None
) -> None:
    if expected is None:  # the controller would refuse the tasks (MaxJobCount)
        with pytest.raises(UserError, match=f"the sweep has {count} points; .*MaxJobCount="):
            split_points(count, limits)
    else:
        assert split_points(count, limits) == expected


def test_ten_thousand_points_take_ten_arrays_every_point_once() -> None:
    parts = split_points(10_000, ArrayLimits(1001, 20000))
    assert len(parts) == 10 and parts[-1] == (9009, 991)
    assert [p for first, size in parts for p in range(first, first + size)] == list(range(10_000))


def test_a_site_without_arrays_is_one_line() -> None:
    with pytest.raises(UserError, match="MaxArraySize=0"):
        split_points(5, ArrayLimits(0, 10000))


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, f"ALL,{SWEEP_OFFSET_VAR}=1001"),
        ("ALL", f"ALL,{SWEEP_OFFSET_VAR}=1001"),
        ("NONE", f"{SWEEP_OFFSET_VAR}=1001"),
        ("PATH,HOME", f"PATH,HOME,{SWEEP_OFFSET_VAR}=1001"),
    ],
)
def test_each_array_keeps_the_jobs_export_and_adds_its_first_point(
    given: str | None, expected: str
) -> None:
    options = [("comment", "x")] + ([("export", given)] if given is not None else [])
    assert export_value(options, 1001) == expected


def test_with_max_parallel_each_array_waits_for_the_one_before() -> None:
    spec = spec_from_options(
        {"profile": None, "sweep": ("training.seed=1,2,3,4",), "max_parallel": 2, "after": ("7",)}
    )
    assert array_args(spec, 0, 3, None) == ("--array=0-2%2", f"--export=ALL,{SWEEP_OFFSET_VAR}=0")
    assert array_args(spec, 3, 1, "100")[2] == "--dependency=afterok:7,afterany:100"
    free = spec_from_options({"profile": None, "sweep": ("training.seed=1,2,3,4",)})
    assert array_args(free, 3, 1, "100") == ("--array=0-0", f"--export=ALL,{SWEEP_OFFSET_VAR}=3")


def _fake_slurm(bindir: Path, max_array_size: int) -> Path:
    """sbatch that logs its options and answers ids 500, 501, ...; scontrol with a limit."""
    bindir.mkdir()
    (bindir / "sbatch").write_text(
        "#!/bin/bash\n"
        f"n=$(wc -l < {bindir}/calls 2>/dev/null || echo 0)\n"
        f'echo "${{@:1:$#-1}}" >> {bindir}/calls\n'
        'echo "Submitted batch job $((500 + n))"\n'
    )
    (bindir / "scontrol").write_text(f"#!/bin/sh\necho 'MaxArraySize = {max_array_size}'\n")
    (bindir / "srun").write_text("#!/bin/sh\nexit 0\n")
    for tool in bindir.iterdir():
        tool.chmod(0o755)
    return bindir


@pytest.mark.parametrize(("count", "arrays"), [(3, 1), (4, 2), (7, 3)])
def test_submit_queues_one_script_as_the_arrays_the_site_takes(
    count: int, arrays: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir = _fake_slurm(tmp_path / "bin", max_array_size=3)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("HPCDIST_SLURM_VIEW", "off")
    project = tmp_path / "project"
    project.mkdir()
    seeds = ",".join(str(i) for i in range(count))
    spec = spec_from_options({"profile": None, "sweep": (f"training.seed={seeds}",)})
    record = submit(spec, "slurm", project_dir=project, preflight_check=False).record
    calls = (bindir / "calls").read_text().splitlines()
    if arrays == 1:
        assert calls == [""]  # plain sbatch FILE: the script's own --array line
    else:
        assert calls == [
            f"--array=0-{min(3, count - first) - 1} --export=ALL,{SWEEP_OFFSET_VAR}={first}"
            for first in range(0, count, 3)
        ]
    assert record.job_id == "500"
    assert record.arrays == [[str(500 + k), 3 * k, min(3, count - 3 * k)] for k in range(arrays)]
    tasks = [task for task, _ in task_ids(load_record("500", project))]
    assert tasks == [f"{500 + i // 3}_{i % 3}" for i in range(count)]
    assert [p for _, p in task_ids(record)] == [[f"training.seed={i}"] for i in range(count)]
    for k in range(arrays):  # every array queued the very script render prints
        queued = project / ".hpcdist" / "submitit" / str(500 + k) / f"{500 + k}_submission.sh"
        assert queued.read_text() == render(spec)


def test_a_big_arrays_status_counts_states_and_names_the_failed_tasks() -> None:
    states = [(f"9_{i}", "COMPLETED", "") for i in range(30)]
    states += [(f"9_{30 + i}", "FAILED", "exit code 3") for i in range(12)]
    states += [("9_42", "RUNNING", ""), ("9_43", "PENDING", "")]
    lines = summary(states)
    assert lines[0] == "44 tasks: 30 COMPLETED, 12 FAILED, 1 PENDING, 1 RUNNING"
    assert lines[1:11] == [f"  9_{30 + i} FAILED: exit code 3" for i in range(10)]
    assert lines[11:] == ["  ... and 2 more that did not complete"]
