"""The testbed of each parallel test worker (tests/conftest.py): its own folder and ports."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

import pytest

from tests.conftest import MAX_WORKERS, WORKER_PORT_STEP, worker_testbed

REPO = Path(__file__).resolve().parents[1]


def _testbed_module() -> object:
    loader = importlib.machinery.SourceFileLoader(
        "slurm_testbed", str(REPO / "scripts/slurm-testbed")
    )
    spec = importlib.util.spec_from_loader("slurm_testbed", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("slurm_testbed", module)  # its dataclasses look themselves up there
    loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("worker", "environ", "expected"),
    [
        ("", {}, {}),  # no workers: the testbed the environment names
        ("gw0", {"HPCDIST_TESTBED_DIR": "/tmp/tb"}, {}),
        ("gw1", {}, {"HPCDIST_TESTBED_DIR": "/tmp/hpcdist-testbed-w1",
                     "HPCDIST_TESTBED_PORT_OFFSET": "550"}),
        ("gw4", {"HPCDIST_TESTBED_DIR": "/tmp/tb", "HPCDIST_TESTBED_PORT_OFFSET": "7"},
         {"HPCDIST_TESTBED_DIR": "/tmp/tb-w4", "HPCDIST_TESTBED_PORT_OFFSET": "2207"}),
        ("master", {}, {}),
    ],
)  # fmt: skip
def test_each_worker_gets_its_own_folder_and_offset(
    worker: str, environ: dict[str, str], expected: dict[str, str]
) -> None:
    assert worker_testbed(worker, environ) == expected


def test_a_worker_past_the_last_is_refused() -> None:
    assert worker_testbed(f"gw{MAX_WORKERS - 1}", {})
    with pytest.raises(pytest.UsageError, match=f"at most {MAX_WORKERS} workers"):
        worker_testbed(f"gw{MAX_WORKERS}", {})


def _ports(tb: object, offset: int, nodes: int) -> set[int]:
    settings = tb.Settings.from_environ(  # type: ignore[attr-defined]
        {"HPCDIST_TESTBED_PORT_OFFSET": str(offset), "HPCDIST_TESTBED_NODES": str(nodes)}
    )
    return {settings.mysql_port, settings.ctld_port, settings.dbd_port, *settings.node_ports}


def test_no_two_workers_testbeds_share_a_port_or_reach_the_rendezvous_ports() -> None:
    """Every testbed a worker may start: its own (offset 0), its side testbeds (50-95), and
    the 24.11 / 26.05 passes' (100, 200) with theirs, 4 nodes each: no port of one worker's
    is another worker's, and all lie below the jobs' rendezvous ports."""
    tb = _testbed_module()
    block = [v * 100 + s for v in range(3) for s in (0, 50, 60, 80, 85, 90, 95)]
    owner: dict[int, int] = {}
    for worker in range(MAX_WORKERS):
        for offset in block:
            for port in _ports(tb, worker * WORKER_PORT_STEP + offset, 4):
                assert owner.setdefault(port, worker) == worker, (port, worker, offset)
    from hpcdist.facts.protocol import PORT_LOW

    assert max(owner) < PORT_LOW
