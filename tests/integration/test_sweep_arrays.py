"""A sweep larger than the site's MaxArraySize is queued as several arrays of its one script,
every point run once, on a testbed whose MaxArraySize is 3 (task ids 0-2)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import slurm_env
from tests.integration.sidebed import SideBed, side_testbed

# On one xdist worker: a side testbed with a small MaxArraySize, made once for the module.
pytestmark = pytest.mark.xdist_group("test_sweep_arrays")

HPCDIST = [sys.executable, "-m", "hpcdist.cli.main"]
MAX_ARRAY_SIZE = 3
# Every task fails at once, after the script has said which point it runs: no training.
MISSING = ["--set", "data.path=/nonexistent/hpcdist-sweep-arrays.nc"]


@pytest.fixture(scope="module")
def small_arrays() -> Iterator[SideBed]:
    with side_testbed("arrays", 85, max_array_size=str(MAX_ARRAY_SIZE)) as bed:
        yield bed


@pytest.mark.parametrize(
    ("count", "arrays"),
    [(MAX_ARRAY_SIZE, [(0, 3)]), (MAX_ARRAY_SIZE + 1, [(0, 3), (3, 1)])],
)
def test_a_sweep_takes_as_many_arrays_as_max_array_size_requires_every_point_once(
    count: int,
    arrays: list[tuple[int, int]],
    small_arrays: SideBed,
    tmp_path: Path,
) -> None:
    seeds = ",".join(str(10 + i) for i in range(count))
    env = slurm_env({"SLURM_CONF": str(small_arrays.slurm_conf)})
    argv = ["submit", "--mode", "threads", "--sweep", f"training.seed={seeds}", *MISSING]
    proc = subprocess.run(
        [*HPCDIST, *argv, "--no-preflight", "--wait"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "tasks COMPLETED" in proc.stdout, proc.stdout + proc.stderr
    sweep_id = re.findall(r"Submitted job (\d+)", proc.stdout)[0]
    record = json.loads((tmp_path / ".hpcdist" / "jobs" / f"{sweep_id}.json").read_text())
    assert [(first, tasks) for _, first, tasks in record["arrays"]] == arrays
    assert record["arrays"][0][0] == sweep_id
    # The controller took each array with the tasks asked of it.
    for array_id, _, tasks in record["arrays"]:
        shown = subprocess.run(
            ["squeue", "-h", "-r", "-t", "all", "-j", array_id, "-o", "%i"],
            env=env,
            capture_output=True,
            text=True,
        ).stdout.split()
        assert sorted(shown) == [f"{array_id}_{i}" for i in range(tasks)]
    # Each task's log says which point it ran: every point once, with its own seed.
    said = [
        (int(m["point"]), m["seed"])
        for log in tmp_path.glob("*.out")
        for m in re.finditer(
            r"array task \d+_\d+ \(point (?P<point>\d+)\): --set training.seed=(?P<seed>\d+)",
            log.read_text(errors="replace"),
        )
    ]
    assert sorted(said) == [(i, str(10 + i)) for i in range(count)]
