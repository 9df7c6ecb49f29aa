"""Bad nodes: which node a failed step's log names, its record in the private state, and
the nodes the run's next piece is kept off."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpcdist.distributed import badnodes
from hpcdist.distributed.badnodes import LogMark, after_failure, for_next_piece, named_nodes
from hpcdist.facts.badnodes import BadNode, records_from_json, records_to_json, still_bad

NODES = ["node1", "node2", "node3"]
# What srun wrote on the testbed when rank 1 (node2) died of a bus error (a memory fault of
# its node) under --kill-on-bad-exit.
KILLED = """\
srun: error: node2: task 1: Bus error
srun: launch/slurm: _step_signal: Terminating StepId=14581344.0
0: slurmstepd-node1: error: *** STEP 14581344.0 ON node1 CANCELLED AT 2026-11-27T18:18:09 ***
srun: error: node1: task 0: Terminated
srun: Force Terminated StepId=14581344.0
"""


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        (KILLED, [("node2", "task 1 Bus error")]),
        # SIGKILL: the out-of-memory killer's (the job's own memory) or a person's.
        ("srun: error: node2: task 1: Killed\n", []),
        (
            "srun: error: node3: tasks 4-5: Segmentation fault\n",
            [("node3", "task 4-5 Segmentation fault")],
        ),
        (
            "srun: error: node2: task 1: Bus error (core dumped)\n",
            [("node2", "task 1 Bus error (core dumped)")],
        ),
        (
            "srun: error: node3: task 2: Illegal instruction\n",
            [("node3", "task 2 Illegal instruction")],
        ),
        # A program's own error, or the tasks srun ended: no node to blame.
        ("srun: error: node2: task 1: Exited with exit code 1\n", []),
        # A task that aborted itself: NCCL's watchdog on a rank that waited for a hung one
        # (srun then kills the rest); the waiting rank's node is not the bad one.
        (
            "srun: error: node1: task 0: Aborted (core dumped)\n"
            "srun: error: node2: task 1: Bus error\n",
            [],
        ),
        # The job's own memory: another node would not cure it.
        ("srun: error: node2: task 1: Out Of Memory\n", []),
        ("srun: error: node1: task 0: Terminated\nsrun: error: node2: task 1: Bus error\n", []),
        ("srun: error: Node failure on node3\n", [("node3", "a node failure")]),
        # torchrun's agent names the rank that died first and its node (srun sees only the
        # agent's exit code); not where SLURM counted an oom-kill in the step.
        (
            "1: hpcdist: torchrun: rank 3 on node2 died of SIGBUS\n"
            "srun: error: node2: task 1: Exited with exit code 1\n",
            [("node2", "rank 3 SIGBUS")],
        ),
        ("1: hpcdist: torchrun: rank 3 on node2 died of SIGKILL\n", []),
        ("hpcdist: torchrun: rank 0 on node1 died of SIGSEGV\n", [("node1", "rank 0 SIGSEGV")]),
        (
            "1: hpcdist: torchrun: rank 3 on node2 died of SIGBUS\n"
            "1: slurmstepd: error: Detected 1 oom_kill event in StepId=7.0\n",
            [],
        ),
        ("1: hpcdist: torchrun: rank 3 on node9 died of SIGBUS\n", []),
        # The communication check's ranks that never reached a step, with their nodes.
        (
            "0: FAIL: all_reduce did not finish within 9 s (rank 0/4 on node1, ...)\n"
            "0: hpcdist: commcheck: rank 3 on node2 never reached all_reduce\n",
            [("node2", "rank 3 never reached all_reduce")],
        ),
        ("hpcdist: commcheck: rank 3 on ? never reached barrier\n", []),
        # A node outside the job is nobody's business here.
        ("srun: error: node9: task 1: Bus error\n", []),
        ("", []),
    ],
)
def test_srun_report_names_the_first_task_killed(log: str, expected: list[tuple[str, str]]) -> None:
    assert named_nodes(log, NODES) == expected


def test_outside_a_slurm_allocation_no_node_is_named() -> None:
    assert named_nodes(KILLED, []) == []


def test_network_error_line_names_the_peer_but_not_a_longer_name() -> None:
    nccl = (
        "1: torch.distributed.DistBackendError: NCCL error: remote process exited or there "
        "was a network error, ncclRemoteError: socketProgress: Connection closed by remote "
        "peer node3<43212>\n"
    )
    assert [n for n, _ in named_nodes(nccl, NODES)] == ["node3"]
    # node1 is not node10, and a line that is no error names nobody.
    other = "0: gloo error: Connection reset by peer node10:29500\n0: Master: node1:29500\n"
    assert named_nodes(other, NODES) == []
    assert named_nodes("0: gloo: connected to node2\n", NODES) == []
    # The communication check's FAIL line names the rank's own host and the master: neither
    # is the peer that failed.
    fail = (
        "FAIL: all_reduce did not finish within 65 s (rank 1/2 on node2, master "
        "node1:29500, backend gloo); is every rank running and the master reachable?\n"
    )
    assert named_nodes(fail, NODES) == []


def test_hold_runs_out_at_until_and_the_latest_record_wins() -> None:
    old = BadNode("node2", "task 1 Bus error", 0.0, 100.0)
    new = BadNode("node2", "a node failure", 50.0, 150.0)
    assert still_bad([old, new], 99.0) == [new]
    assert still_bad([old], 99.9) == [old]
    assert still_bad([old], 100.0) == []
    assert records_from_json(records_to_json([old, new])) == [old, new]
    assert records_from_json("not json") == [] and records_from_json('{"nodes": [1]}') == []


@pytest.fixture
def job_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HPCDIST_HOME", raising=False)
    return {
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NODELIST": "node[1-3]",
        "SLURM_SUBMIT_DIR": str(tmp_path),
        "HPCDIST_BAD_NODE_HOLD": "3600",
    }


def _mark_then_write(tmp_path: Path, before: str, after: str) -> LogMark:
    log = tmp_path / "job.out"
    log.write_text(before)
    with open(log, "a") as out:
        mark = LogMark(fds=(out.fileno(),))
        out.write(after)
    return mark


def test_failed_step_records_the_node_for_the_hold_and_the_next_piece_excludes_it(
    tmp_path: Path, job_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    # What an earlier step wrote is not this failure's.
    mark = _mark_then_write(tmp_path, "srun: error: node1: task 0: Bus error\n", KILLED)
    assert after_failure(job_env, mark, now=1000.0) == ["node2"]
    assert "node node2 named by task 1 Bus error" in capsys.readouterr().err
    assert for_next_piece(job_env, now=1000.0 + 3599) == ["node2"]
    assert "excluding node node2" in capsys.readouterr().err
    assert for_next_piece(job_env, now=1000.0 + 3600) == []
    badnodes.say_held(job_env, now=1001.0)
    assert "this run is kept off node node2 (task 1 Bus error, until " in capsys.readouterr().err
    record = tmp_path / ".hpcdist" / "badnodes" / "77.json"
    assert os.stat(record).st_mode & 0o777 == 0o600
    # A resubmitted job is the same run: it reads the first job's record.
    resubmitted = {**job_env, "SLURM_JOB_ID": "78", "HPCDIST_RUN_DIR": "runs/77"}
    assert for_next_piece(resubmitted, now=1001.0) == ["node2"]


def test_without_a_hold_nothing_is_recorded_or_excluded(
    tmp_path: Path, job_env: dict[str, str]
) -> None:
    off = {k: v for k, v in job_env.items() if k != "HPCDIST_BAD_NODE_HOLD"}
    mark = _mark_then_write(tmp_path, "", KILLED)
    assert after_failure(off, mark, now=1.0) == []
    assert not (tmp_path / ".hpcdist" / "badnodes").exists()
    assert after_failure(job_env, mark, now=1.0) == ["node2"]
    assert for_next_piece(off, now=2.0) == []


def test_a_record_others_can_write_is_refused_not_used(
    tmp_path: Path, job_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert after_failure(job_env, _mark_then_write(tmp_path, "", KILLED), now=1.0)
    record = tmp_path / ".hpcdist" / "badnodes" / "77.json"
    record.chmod(0o666)
    assert badnodes.for_next_piece(job_env, now=2.0) == []
    assert "bad-node record not read" in capsys.readouterr().err


def _stand_in_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scontrol: bool) -> Path:
    """scontrol (whose job shows ExcNodeList=node9) and sbatch that record their calls."""
    bindir, calls = tmp_path / "bin", tmp_path / "calls"
    bindir.mkdir()
    tools = {"sbatch": f'echo "sbatch $*" >> {calls}'}
    if scontrol:
        tools["scontrol"] = (
            f'echo "scontrol $*" >> {calls}; '
            'if [ "$1" = show ]; then echo "   ReqNodeList=(null) ExcNodeList=node9"; fi'
        )
    for name, body in tools.items():
        (bindir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bindir / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(bindir))
    return calls


@pytest.mark.parametrize(
    ("scontrol", "expected"),
    [
        # SLURM refuses ExcNodeList for a running job: set once the job is pending again,
        # beside the job's own exclusions.
        (
            True,
            [
                "scontrol show job 77",  # still running (not cancelled), not requeued yet
                "scontrol requeue 77",
                "scontrol show job 77",
                "scontrol update JobId=77 ExcNodeList=node9,node2",
            ],
        ),
        # No scontrol: the script submitted again, kept off the node.
        (False, ["sbatch --exclude=node2 job.sh"]),
    ],
)
def test_the_requeued_or_resubmitted_piece_is_kept_off_the_bad_node(
    tmp_path: Path,
    job_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    scontrol: bool,
    expected: list[str],
) -> None:
    from hpcdist.distributed.requeue import requeue_job

    assert after_failure(job_env, _mark_then_write(tmp_path, "", KILLED))
    calls = _stand_in_slurm(tmp_path, monkeypatch, scontrol)
    env = {**job_env, "PATH": os.environ["PATH"]}
    assert requeue_job(env, 3, False, "job.sh", "a node failed the step")
    assert calls.read_text().splitlines() == expected
