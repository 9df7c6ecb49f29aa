"""Rank 0's heartbeat writer (hpcdist.distributed.heartbeat): written at most every few
seconds by a clock it reads once a step, atomically, never ending a training."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdist.distributed.heartbeat import HeartbeatWriter, heartbeat_for, record_piece
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
    assert record_piece(tmp_path / "run", resumed, env) == where
    assert where.stat().st_mode & 0o077 == 0  # private state
    assert '"resumed_from": {"epoch": 2, "step": 80' in where.read_text()
