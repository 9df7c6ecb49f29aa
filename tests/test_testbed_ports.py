"""No two testbeds of one `scripts/run-tests` run listen on the same port: the session's of
every worker (tests/conftest.py), the other SLURM versions' passes (100 and 200 above), each
one's side testbeds (``side_testbed(NAME, OFFSET)`` in tests/integration; in the versions'
passes those of modules that mark any test ``slurm_versions``), and the testbeds tests start
at an offset of their own. A side testbed at 70 once put the 26.05 pass's controller
(16817 + 270) on the 22.05 arrays testbed's second node (17001 + 85 + 1): the run failed."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import MAX_WORKERS, WORKER_PORT_STEP
from tests.test_testbed_shapes import tb

INTEGRATION = Path(__file__).resolve().parent / "integration"
VERSION_STEPS = (100, 200)  # scripts/run-tests: each newer release's pass
SIDE_NODES = 2  # tests/integration/sidebed.py's shape
MAIN_NODES = 4


def ports(offset: int, nodes: int, accounting: bool, restd: bool) -> set[int]:
    found = {
        tb.CTLD_PORT + offset,
        *range(tb.NODE_PORT_BASE + offset, tb.NODE_PORT_BASE + offset + nodes),
    }
    if accounting:
        found |= {tb.DBD_PORT + offset, tb.MYSQL_PORT + offset}
    if restd:
        found.add(tb.SLURMRESTD_PORT + offset)
    return found


def side_beds() -> list[tuple[int, bool, bool]]:
    """(offset, in the versions' passes, with slurmrestd) of every side testbed."""
    beds = {}
    for path in sorted(INTEGRATION.glob("test_*.py")):
        text = path.read_text()
        for match in re.finditer(r'side_testbed\(\s*"([^"]+)",\s*(\d+)([^)]*)\)', text):
            restd = "slurmrestd" in match[3]
            beds[match[1]] = (int(match[2]), "slurm_versions" in text, restd)
    return list(beds.values())


def own_offsets() -> list[int]:
    """Offsets tests give a testbed of their own (``HPCDIST_TESTBED_PORT_OFFSET``)."""
    found = set()
    for path in sorted(INTEGRATION.glob("test_*.py")):
        text = path.read_text()
        found |= {int(m) for m in re.findall(r'"HPCDIST_TESTBED_PORT_OFFSET": "(\d+)"', text)}
        found |= {int(m) for m in re.findall(r"^(?:PORT_)?OFFSET = (\d+)$", text, re.M)}
    return sorted(found)


def processes() -> dict[str, list[tuple[int, set[int]]]]:
    """The testbeds each process of a run may hold at once, by offset: a worker's (the
    session's and its side testbeds), each versions' pass's, each of the tests' own."""
    sides = side_beds()
    found: dict[str, list[tuple[int, set[int]]]] = {}
    for worker in range(MAX_WORKERS):
        base = worker * WORKER_PORT_STEP
        beds = [(base, ports(base, MAIN_NODES, True, False))]
        beds += [(base + o, ports(base + o, SIDE_NODES, False, r)) for o, _, r in sides]
        found[f"worker {worker}"] = beds
    for step in VERSION_STEPS:
        beds = [(step, ports(step, MAIN_NODES, True, False))]
        beds += [(step + o, ports(step + o, SIDE_NODES, False, r)) for o, v, r in sides if v]
        found[f"pass +{step}"] = beds
    for offset in own_offsets():
        found[f"own {offset}"] = [(offset, ports(offset, MAIN_NODES, True, False))]
    return found


def shared_ports() -> list[tuple[str, int, str, int, list[int]]]:
    """Ports two testbeds share: of two processes, or of one (two side testbeds at one
    offset are two modules' of one process: one after the other, never at once)."""
    beds = [(name, offset, used) for name, held in processes().items() for offset, used in held]
    return [
        (name, offset, other, other_offset, sorted(used & other_used))
        for index, (name, offset, used) in enumerate(beds)
        for other, other_offset, other_used in beds[index + 1 :]
        if used & other_used and not (name == other and offset == other_offset)
    ]


def test_the_side_testbeds_are_found() -> None:
    offsets = {offset for offset, _, _ in side_beds()}
    assert {50, 60, 85} <= offsets and any(restd for _, _, restd in side_beds())


def test_no_two_testbeds_of_a_run_share_a_port() -> None:
    assert shared_ports() == []


def test_the_check_finds_the_collision_that_failed_a_run() -> None:
    # 26.05's pass (+200) with a slurmrestd side testbed at 70, the 22.05 arrays one at 85.
    assert ports(200 + 70, SIDE_NODES, False, True) & ports(85, SIDE_NODES, False, False) == {17087}
