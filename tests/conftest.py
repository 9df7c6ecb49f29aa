"""Settings for the whole test session.

Parallel runs (pytest-xdist, ``scripts/run-tests``): every worker gets a SLURM testbed of its
own, so that tests on different workers never share a controller, a queue or a port. Worker
``gwK`` takes the base directory ``$HPCDIST_TESTBED_DIR-wK`` and the port offset
``$HPCDIST_TESTBED_PORT_OFFSET + K * WORKER_PORT_STEP``; worker ``gw0`` (and a run without
workers) keeps the testbed the environment names, the one ``scripts/run-tests`` started.

Within a step: a testbed's side testbeds (``tests/integration/sidebed.py``) lie 50-95 above its
offset, the other SLURM versions' passes 100 and 200 above the first's: offsets 0-295. A
testbed at offset O listens on 3307+O (MariaDB), 16817+O and 16819+O (slurmctld, slurmdbd) and
17001+O onwards (one port a node): two offsets 182-251 apart would put one testbed's
controller on another's node port. A step of 550 keeps every pair of offsets of two workers
more than 251 apart, and five workers' ports below 20000, where jobs' rendezvous ports begin.
"""

from __future__ import annotations

import os
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

WORKER_PORT_STEP = 550
MAX_WORKERS = 5
DEFAULT_TESTBED_DIR = "/tmp/hpcdist-testbed"

# The tests' profiles: `local` (the testbed, written out), and the example site profiles of
# examples/profiles under their names. A job with no profile asks the cluster it talks to,
# so tests that render a script name one (HPCDIST_PROFILE below) and render the same bytes
# whether or not a testbed answers; tests of the cluster's own description unset it.
TEST_CONFIG_HOME = Path(__file__).resolve().parent / "fixtures" / "config"
os.environ.setdefault("XDG_CONFIG_HOME", str(TEST_CONFIG_HOME))
os.environ.setdefault("HPCDIST_PROFILE", "local")


def worker_testbed(worker: str, environ: dict[str, str]) -> dict[str, str]:
    """The testbed settings of xdist worker ``worker`` ("gw3"): {} for gw0 and no worker."""
    found = re.fullmatch(r"gw(\d+)", worker)
    if found is None or found[1] == "0":
        return {}
    index = int(found[1])
    if index >= MAX_WORKERS:
        raise pytest.UsageError(
            f"at most {MAX_WORKERS} workers (-n): worker {worker}'s testbed ports would reach "
            "the jobs' rendezvous ports (tests/conftest.py)"
        )
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Tests that share something expensive carry ``xdist_group`` marks (``--dist loadgroup``
    # keeps each group on one worker): the C++ example's build, and the integration modules
    # whose module-scoped fixture trains once or starts a side testbed.
    # The longest first: the integration tests (jobs of seconds to minutes) and the C++
    # build, then the many short tests, which fill the workers' gaps until the end.
    items.sort(key=lambda item: 0 if _runs_long(item) else 1)


def _runs_long(item: pytest.Item) -> bool:
    return "integration" in item.path.parts or item.get_closest_marker("cxx") is not None


# Signals whose handling code under test changes in the test's own process (a warning's
# handler, SIGINT ignored while a local job's controller starts). A change that outlived its
# test was inherited by every process that the worker's later tests started: a waiter
# started with SIGINT ignored never saw the Ctrl-C its test sent.
_KEPT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)


@pytest.fixture(autouse=True)
def _signal_handlers_as_they_were() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {signum: signal.getsignal(signum) for signum in _KEPT_SIGNALS}
    yield
    for signum, handler in before.items():
        if handler is not None and signal.getsignal(signum) is not handler:
            signal.signal(signum, handler)
