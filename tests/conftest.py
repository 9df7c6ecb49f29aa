"""Settings for the whole test session.

Parallel runs (pytest-xdist, ``scripts/run-tests``): every worker gets a SLURM testbed of its
own, so that tests on different workers never share a controller, a queue or a port. Worker
``gwK`` takes the base directory ``$HPCDIST_TESTBED_DIR-wK`` and the port offset
``$HPCDIST_TESTBED_PORT_OFFSET + K * WORKER_PORT_STEP``; worker ``gw0`` (and a run without
workers) keeps the testbed the environment names, the one ``scripts/run-tests`` started. A
testbed's side testbeds (``tests/integration/sidebed.py``) lie 50-95 above its offset, and
the other SLURM versions' passes 100 and 200 above the first's, so a step of 300 keeps every
testbed of every pass apart.
"""

from __future__ import annotations

import os
import re

import pytest

WORKER_PORT_STEP = 300
DEFAULT_TESTBED_DIR = "/tmp/hpcdist-testbed"


def worker_testbed(worker: str, environ: dict[str, str]) -> dict[str, str]:
    """The testbed settings of xdist worker ``worker`` ("gw3"): {} for gw0 and no worker."""
    found = re.fullmatch(r"gw(\d+)", worker)
    if found is None or found[1] == "0":
        return {}
    index = int(found[1])
    base = environ.get("HPCDIST_TESTBED_DIR") or DEFAULT_TESTBED_DIR
    offset = int(environ.get("HPCDIST_TESTBED_PORT_OFFSET") or 0)
    return {
        "HPCDIST_TESTBED_DIR": f"{base}-w{index}",
        "HPCDIST_TESTBED_PORT_OFFSET": str(offset + index * WORKER_PORT_STEP),
    }


def pytest_configure(config: pytest.Config) -> None:
    settings = worker_testbed(os.environ.get("PYTEST_XDIST_WORKER", ""), dict(os.environ))
    if settings:
        os.environ.update(settings)
        # SLURM_CONF of the testbed run-tests started belongs to gw0; this worker's own
        # testbed sets it when its first integration test starts it.
        os.environ.pop("SLURM_CONF", None)


# Tests that share something expensive run on one worker (``--dist loadgroup``): the C++
# example's build and AOTInductor package (a cache folder two builds would write at once), and
# the modules whose module-scoped fixture starts a side testbed or trains once for every test.
SHARED_BY_MODULE = (
    "tests/integration/test_attacks_outputs.py",  # one training, attacked by every test
    "tests/integration/test_follow.py",  # one job that runs into its time limit
    "tests/integration/test_grammar_slurm.py",  # one held job every value is tried on
    "tests/integration/test_preemption.py",  # two side testbeds (requeue, cancel)
    "tests/integration/test_site_slurm.py",  # a GPU side testbed
    "tests/integration/test_sweep_arrays.py",  # a side testbed with a small MaxArraySize
    "tests/integration/test_training_slurm.py",  # the trainings every test reads
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    # The longest first: the integration tests (jobs of seconds to minutes) and the C++
    # build, then the many short tests, which fill the workers' gaps until the end.
    items.sort(key=lambda item: 0 if _runs_long(item) else 1)
    for item in items:
        module = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else ""
        if item.get_closest_marker("cxx") is not None:
            item.add_marker(pytest.mark.xdist_group("cxx"))
        elif module in SHARED_BY_MODULE:
            item.add_marker(pytest.mark.xdist_group(module))


def _runs_long(item: pytest.Item) -> bool:
    return "integration" in item.path.parts or item.get_closest_marker("cxx") is not None
