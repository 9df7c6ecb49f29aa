"""A rank that hangs mid-training (SIGSTOP: alive and silent, as on a sick node) is named
with its node by the ranks whose collective timed out, once, within the job's
``--collective-timeout`` (``HPCDIST_COLLECTIVE_TIMEOUT``) and the roll call's wait; rank 0,
whose process holds the group's store, too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcdist.distributed.badnodes import named_nodes
from hpcdist.distributed.rollcall import ANSWER_WAIT_S, NEVER_ANSWERED, SILENT_S
from tests.distributed.test_commcheck import free_port, rank_env

REPO = Path(__file__).resolve().parents[3]
CONFIG = """\
data: {mask: ocean}
training: {epochs: 400, lr: 1.0e-3, early_stopping_patience: 0, checkpoint_every: 10}
"""
TIMEOUT_S = 15  # well above the slowest step or checkpoint write of a loaded 2-core host


# The rank stopped, and how long the others wait after their collective timed out: for the
# answers of the others (rank 2), or for the store that rank 0 holds (rank 0).
@pytest.mark.parametrize(("hung", "then_s"), [(2, ANSWER_WAIT_S), (0, SILENT_S)])
@pytest.mark.slow
def test_a_rank_that_hangs_in_training_is_named_with_its_node(
    tmp_path: Path, hung: int, then_s: float
) -> None:
    (tmp_path / "c.yaml").write_text(CONFIG)
    port, world, procs = free_port(), 3, []
    for rank in range(world):
        env = rank_env(rank, world, "127.0.0.1", port)
        env.update(
            SLURMD_NODENAME=f"node{rank + 1}",
            HPCDIST_COLLECTIVE_TIMEOUT=str(TIMEOUT_S),
            HPCDIST_DATA_DIR=str(tmp_path / "data"),
            PYTHONPATH=str(REPO),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "ufsemulator", "train", "--config", "c.yaml"],
                env=env,
                cwd=tmp_path,
                stdout=(tmp_path / f"rank{rank}.log").open("w"),
                stderr=subprocess.STDOUT,
            )
        )
    try:
        deadline = time.monotonic() + 240
        while not list(tmp_path.glob("runs/*/checkpoint.pt")):
            assert time.monotonic() < deadline, "no checkpoint within 240 s"
            assert all(p.poll() is None for p in procs), "a rank ended before the stop"
            time.sleep(0.2)
        os.kill(procs[hung].pid, signal.SIGSTOP)
        stopped = time.monotonic()
        codes = [p.wait(timeout=300) for i, p in enumerate(procs) if i != hung]
        waited = time.monotonic() - stopped
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    logs = [(tmp_path / f"rank{rank}.log").read_text() for rank in range(world) if rank != hung]
    assert codes == [1, 1], logs
    # Named once (the first rank to finish waiting), with the node it ran on; the line is
    # what the bad-node record reads.
    line = f"hpcdist: training: rank {hung} on node{hung + 1} {NEVER_ANSWERED}"
    said = [x for log in logs for x in log.splitlines() if x.startswith("hpcdist: training:")]
    assert said == [line], logs
    assert named_nodes("".join(logs), ["node1", "node2", "node3"]) == [
        (f"node{hung + 1}", f"rank {hung} {NEVER_ANSWERED}")
    ]
    # The job's collective timeout ended the wait, not the exchanges' 600 s default.
    assert waited >= TIMEOUT_S + then_s - 1, waited
    assert waited < 200, waited
