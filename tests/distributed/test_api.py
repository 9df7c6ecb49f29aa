"""``hpcdist.distributed``'s public API: listed once (its ``__all__``), loaded on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

import hpcdist.distributed as api
from hpcdist.distributed import group


@pytest.mark.parametrize("name", api.__all__)
def test_every_public_name_is_the_group_modules_or_a_shared_fact(name: str) -> None:
    facts = {"MARKER_VAR", "REQUEUE_EXIT_CODE", "RESULTS_FILE", "RUNS_DIR", "RUN_DIR_VAR"}
    facts |= {"SIGNAL_VAR", "run_name", "RUN_ID_VAR"}
    # Rank 0's heartbeat and run record: their own module, no process group.
    beat = {"HeartbeatWriter", "heartbeat_for", "record_piece", "continue_run", "foreign_heartbeat"}
    lead = {"CheckpointTiming", "last_checkpoint_time", "record_checkpoint_time", "watch_job_end"}
    if name in {"RollCall", "name_the_missing"}:
        from hpcdist.distributed import rollcall

        assert getattr(api, name) is getattr(rollcall, name)
    elif name in facts:
        from hpcdist.facts import protocol, runs

        assert getattr(api, name) is getattr(protocol, name, getattr(runs, name, None))
    elif name in beat:
        from hpcdist.distributed import heartbeat

        assert getattr(api, name) is getattr(heartbeat, name)
    elif name in lead:
        from hpcdist.distributed import warnlead

        assert getattr(api, name) is getattr(warnlead, name)
    else:
        assert getattr(api, name) is getattr(group, name)


def test_the_protocol_names_do_not_load_the_group_module() -> None:
    code = (
        "import sys\n"
        "from hpcdist.distributed import SIGNAL_VAR, run_name, HeartbeatWriter\n"
        "print(SIGNAL_VAR, 'hpcdist.distributed.group' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "HPCDIST_SIGNAL False"


def test_an_unknown_name_says_so() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        api.nope  # noqa: B018


def test_the_protocol_and_the_job_step_do_not_load_the_group_module() -> None:
    code = (
        "import sys\n"
        "from hpcdist.facts import protocol\n"
        "import hpcdist.distributed.jobstep\n"
        "print('hpcdist.distributed.group' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
