"""How the ranks of a step ended, from srun's own lines (hpcdist.distributed.rankdeath):
a rank killed by SIGKILL is named with its signal, and a job that ended without a requeue
says how to resume from its checkpoint."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpcdist.distributed.badnodes import LogMark
from hpcdist.distributed.rankdeath import (
    KILLED_STATUS,
    killed_lines,
    killed_ranks,
    report,
    resume_lines,
)

# srun 22.05 on the testbed, rank 1 killed by SIGKILL, then srun ending rank 0 with TERM.
SRUN_LINES = """\
hpcdist: job 11581352 on node[1-2], restart 0
srun: error: node2: task 1: Killed
srun: launch/slurm: _step_signal: Terminating StepId=11581352.0
0: slurmstepd-node1: error: *** STEP 11581352.0 ON node1 CANCELLED AT 2026-11-27T18:26:38 ***
srun: error: node1: task 0: Terminated
srun: Force Terminated StepId=11581352.0
"""


@pytest.mark.parametrize(
    ("text", "killed"),
    [
        (SRUN_LINES, {1: "Killed"}),
        (
            "srun: error: n1: tasks 0-2,5: Killed\n",
            {0: "Killed", 1: "Killed", 2: "Killed", 5: "Killed"},
        ),
        ("srun: error: gpu-07: task 3: Out Of Memory\n", {3: "Out Of Memory"}),
        ("srun: error: node1: task 0: Terminated\n", {}),  # TERM: not the OOM killer's
        ("srun: error: node1: task 0: Exited with exit code 1\n", {}),
        ("1: Killed\n[Rank 1] task 1: Killed\n", {}),  # a rank's own words are not srun's
    ],
)
def test_killed_ranks_are_read_from_sruns_lines(text: str, killed: dict[int, str]) -> None:
    assert killed_ranks(text) == killed


def test_the_killed_rank_is_named_with_its_signal_and_where_memory_is_shown() -> None:
    assert killed_lines({1: "Killed"}, "77") == [
        "rank 1 was killed by signal 9 (SIGKILL): likely out of memory (the OOM killer's "
        "signal); its memory against the request: hpcdist status 77"
    ]
    assert killed_lines({0: "Out Of Memory", 2: "Killed"}, "70_3")[0].startswith(
        "ranks 0, 2 were killed by signal 9 (SIGKILL): the out-of-memory killer;"
    )
    assert killed_lines({}, "77") == []


def test_the_resume_route_is_said_only_where_a_checkpoint_is_kept(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "77"}
    assert resume_lines(env, tmp_path) == []
    (tmp_path / "runs" / "77").mkdir(parents=True)
    (tmp_path / "runs" / "77" / "checkpoint.pt").write_bytes(b"x")
    assert resume_lines(env, tmp_path) == [
        "the checkpoint in runs/77 is kept: resume it by submitting the job again with "
        "--set output.run_dir=runs/77 (hpcdist submit or render)"
    ]
    # An array task's run folder is named for the array and the task.
    task = {"SLURM_JOB_ID": "79", "SLURM_ARRAY_JOB_ID": "78", "SLURM_ARRAY_TASK_ID": "1"}
    assert resume_lines(task, tmp_path) == []


def test_the_runner_reads_only_what_srun_appended_and_exits_137_for_a_killed_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "job.out"
    log.write_text("srun: error: node2: task 5: Killed\n")  # an earlier run's, before now
    monkeypatch.chdir(tmp_path)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    try:
        watch = LogMark((fd,))
        assert report(watch, 143, {"SLURM_JOB_ID": "77"}) == 143  # nothing new: srun's own
        os.write(fd, SRUN_LINES.encode())
        assert report(watch, 0, {"SLURM_JOB_ID": "77"}) == 0
        assert report(watch, 143, {"SLURM_JOB_ID": "77"}) == KILLED_STATUS == 137
    finally:
        os.close(fd)
    err = capfd.readouterr().err
    assert err == f"hpcdist: {killed_lines({1: 'Killed'}, '77')[0]}\n"
    assert "rank 5" not in err


def test_a_stderr_that_is_no_file_is_not_read(tmp_path: Path) -> None:
    read, write = os.pipe()
    try:
        assert LogMark((write,)).written_since() == ""
    finally:
        os.close(read)
        os.close(write)
