"""Rank 0's heartbeat writer (hpcdist.distributed.heartbeat): written at most every few
seconds by a clock it reads once a step, atomically, never ending a training."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpcdist.distributed.heartbeat import HeartbeatWriter, RecentRate, heartbeat_for, record_piece
from hpcdist.facts.heartbeat import HEARTBEAT_FILE, Heartbeat, parse


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


def _writer(tmp_path: Path, clock: Clock, every_s: float = 5.0) -> HeartbeatWriter:
    return HeartbeatWriter(tmp_path, Heartbeat(run_id="7-ab"), every_s, clock, lambda: 1000.0)


def test_first_step_beats_then_not_before_the_interval(tmp_path: Path) -> None:
    clock = Clock()
    writer = _writer(tmp_path, clock)
    assert writer.due()
    writer.beat(1, 100.0, epoch=1)
    clock.now += 4.999
    assert not writer.due()  # just below the interval
    clock.now += 0.001
    assert writer.due()  # at the interval
    assert writer.written == 1


def test_due_reads_the_clock_once(tmp_path: Path) -> None:
    clock = Clock()
    writer = _writer(tmp_path, clock)
    writer.beat(1, 10.0)
    before = clock.reads
    for _ in range(10):
        writer.due()
    assert clock.reads - before == 10


def test_rate_is_rows_since_the_last_beat(tmp_path: Path) -> None:
    clock = Clock()
    writer = _writer(tmp_path, clock)
    first = writer.beat(10, 250.0, epoch=1)
    assert first is not None and first.samples_per_s is None  # no interval yet
    clock.now += 5.0
    second = writer.beat(30, 250.0, epoch=2, loss=0.5)
    assert second is not None and second.samples_per_s == pytest.approx(20 * 250.0 / 5.0)
    on_disk = parse((tmp_path / HEARTBEAT_FILE).read_bytes())
    assert on_disk == second
    assert on_disk.run_id == "7-ab" and on_disk.step == 30 and on_disk.epoch == 2
    assert on_disk.piece_started == 1000.0 and on_disk.time == 1000.0


def test_a_failed_write_stops_the_heartbeat_not_the_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = Clock()
    writer = _writer(tmp_path / "missing-file-as-folder", clock)
    (tmp_path / "missing-file-as-folder").write_text("a file where the folder should be")
    assert writer.beat(1, 1.0) is None and writer.stopped
    assert "heartbeat stopped" in capsys.readouterr().err
    clock.now += 10
    assert writer.beat(2, 1.0) is None and writer.written == 0


def test_heartbeat_for_a_requeued_piece(tmp_path: Path) -> None:
    env = {"HPCDIST_RUN_ID": "12-cafe", "SLURM_JOB_ID": "12", "SLURM_RESTART_COUNT": "2"}
    fixed = heartbeat_for(tmp_path, 10, 400, 120, env).fixed
    assert (fixed.run_id, fixed.job_id, fixed.restart) == ("12-cafe", "12", 2)
    assert (fixed.epochs, fixed.steps, fixed.piece_step) == (10, 400, 120)


def test_record_piece_only_where_the_script_named_a_record(tmp_path: Path) -> None:
    assert record_piece(tmp_path, None, {}) is None
    where = tmp_path / "12-1.train.json"
    env = {"HPCDIST_RUN_RECORD": str(where), "HPCDIST_RUN_ID": "12-cafe"}
    resumed = {"epoch": 2, "step": 80, "time": 5.0, "path": "/r/checkpoint.pt"}
    assert record_piece(tmp_path / "run", resumed, env, chosen_by="config") == where
    assert where.stat().st_mode & 0o077 == 0  # private state
    assert '"resumed_from": {"epoch": 2, "step": 80' in where.read_text()
    assert '"run_dir_from": "config"' in where.read_text()
    record_piece(tmp_path / "run", None, env)
    assert '"run_dir_from": null' in where.read_text()


def test_resuming_another_runs_checkpoint_continues_that_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hpcdist.distributed.heartbeat import continue_run

    old = tmp_path / "runs" / "41"
    old.mkdir(parents=True)
    (old / HEARTBEAT_FILE).write_bytes(Heartbeat(run_id="41-aa", phase="stopped").to_bytes())
    (old / HEARTBEAT_FILE).chmod(0o644)
    root = tmp_path / ".hpcdist" / "runs"
    for run in ("41-aa", "60-bb"):
        (root / run).mkdir(parents=True, mode=0o700)
    piece = root / "60-bb" / "60-0.json"
    piece.write_text('{"run_id": "60-bb", "job_id": "60"}')
    piece.chmod(0o600)
    env = {
        "HPCDIST_RUN_ID": "60-bb",
        "HPCDIST_RUN_RECORD": str(root / "60-bb" / "60-0.train.json"),
        "HPCDIST_TRACKER_ENV": "WANDB_RUN_ID,OTHER",
        "WANDB_RUN_ID": "60-bb",
        "OTHER": "chosen by the user",
    }
    assert continue_run(old, env) == "41-aa"
    assert env["HPCDIST_RUN_ID"] == env["WANDB_RUN_ID"] == "41-aa"
    assert env["OTHER"] == "chosen by the user"
    assert env["HPCDIST_RUN_RECORD"] == str(root / "41-aa" / "60-0.train.json")
    assert '"run_id": "41-aa"' in (root / "41-aa" / "60-0.json").read_text()
    assert not (root / "60-bb").exists()  # the run it was started as had nothing else
    assert "continuing run 41-aa" in capsys.readouterr().err
    # The same run again, no heartbeat, or one another user could have written: no change.
    assert continue_run(old, env) is None
    assert continue_run(tmp_path, {"HPCDIST_RUN_ID": "x-1"}) is None
    (old / HEARTBEAT_FILE).chmod(0o666)
    other = {"HPCDIST_RUN_ID": "70-cc"}
    assert continue_run(old, other) is None and other["HPCDIST_RUN_ID"] == "70-cc"


def test_a_loose_umask_leaves_the_heartbeat_writable_by_nobody_else(tmp_path: Path) -> None:
    previous = os.umask(0o002)
    try:
        _writer(tmp_path, Clock()).beat(1, 1.0)
    finally:
        os.umask(previous)
    assert (tmp_path / HEARTBEAT_FILE).stat().st_mode & 0o777 == 0o644


def _paced(rates: list[float], every_s: float = 5.0) -> RecentRate:
    """The recent rate after intervals of ``every_s`` seconds at these steps a second."""
    recent, mark = RecentRate(), (0.0, 0)
    for rate in rates:
        end = (mark[0] + every_s, mark[1] + round(rate * every_s))
        recent, mark = recent.add(mark, end), end
    return recent


def _steps_per_s(recent: RecentRate, rates: list[float], every_s: float = 5.0) -> float | None:
    return recent.steps_per_s((every_s * len(rates), sum(round(r * every_s) for r in rates)))


@pytest.mark.parametrize(
    ("rates", "expected"),
    [
        ([10.0] * 4, 10.0),
        # 20% faster is the same pace, however long: the average takes it in.
        ([10.0] * 4 + [12.0] * 4, (200 + 240) / 40),
        # 22% faster, twice in a row: not yet a new pace.
        ([10.0] * 4 + [12.2] * 2, (200 + 2 * 61) / 30),
        # Three in a row: a new pace, its rate from where it began.
        ([10.0] * 4 + [12.2] * 3, 12.2),
        ([10.0] * 4 + [7.8] * 3, 7.8),  # 22% slower, three in a row
        # One slow interval (a validation, a checkpoint) stays in the average at its cost.
        ([10.0] * 4 + [2.0] + [10.0] * 3, (200 + 10 + 150) / 40),
        # Off the pace three times, but not the same way: noise.
        ([10.0] * 4 + [13.0, 7.0, 13.0], (200 + 65 + 35 + 65) / 35),
    ],
)
def test_recent_rate_starts_again_after_three_intervals_off_the_pace(
    rates: list[float], expected: float
) -> None:
    recent = _paced(rates)
    assert _steps_per_s(recent, rates) == pytest.approx(expected)


def test_the_heartbeat_carries_the_recent_rate_from_the_second_beat(tmp_path: Path) -> None:
    clock = Clock()
    writer = _writer(tmp_path, clock)
    first = writer.beat(10, 100.0)
    assert first is not None and first.recent_steps_per_s is None
    for step in (60, 110, 210, 310, 410):  # 10 steps/s, then 20 from step 110 on
        clock.now += 5.0
        beat = writer.beat(step, 100.0)
    assert beat is not None and beat.recent_steps_per_s == pytest.approx(20.0)
    on_disk = parse((tmp_path / HEARTBEAT_FILE).read_bytes())
    assert on_disk is not None and on_disk.recent_steps_per_s == pytest.approx(20.0)
