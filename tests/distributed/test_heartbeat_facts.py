"""The heartbeat's file format (hpcdist.facts.heartbeat): a round trip, and a reader that
takes whatever an older or newer writer, or a torn file, left."""

from __future__ import annotations

import json

import pytest

from hpcdist.facts.heartbeat import HEARTBEAT_FILE, Heartbeat, parse


def test_heartbeat_round_trips_every_field() -> None:
    beat = Heartbeat(
        run_id="r20261127-abc",
        job_id="17",
        restart=1,
        epoch=3,
        epochs=10,
        step=1200,
        steps=4000,
        samples_per_s=51234.5,
        loss=0.0123,
        checkpoint_epoch=2,
        checkpoint_step=800,
        checkpoint_time=1764265000.5,
        checkpoint_s=0.42,
        piece_started=1764264900.0,
        phase="training",
        time=1764265012.25,
    )
    assert parse(beat.to_bytes()) == beat
    assert json.loads(beat.to_bytes())["version"] == 1
    assert HEARTBEAT_FILE == "heartbeat.json"


def test_missing_and_unknown_fields_are_none_or_ignored() -> None:
    beat = parse(b'{"step": 5, "future_field": [1, 2], "time": 10}')
    assert beat == Heartbeat(step=5, time=10.0)
    assert beat is not None and beat.checkpoint_s is None and beat.age_s(12.5) == 2.5


@pytest.mark.parametrize(
    "field, value",
    [
        ("step", "5"),
        ("step", -1),
        ("step", 2.5),
        ("epoch", True),
        ("samples_per_s", "fast"),
        ("loss", float("nan")),
        ("run_id", 7),
        ("phase", "dancing"),
    ],
)
def test_mistyped_value_becomes_none(field: str, value: object) -> None:
    text = json.dumps({field: value, "time": 1.0})
    beat = parse(text)
    assert beat is not None and getattr(beat, field) is None and beat.time == 1.0


@pytest.mark.parametrize("data", [b"", b"{", b"[1]", b"null", b"\xff\xfe"])
def test_torn_or_foreign_file_is_no_heartbeat(data: bytes) -> None:
    assert parse(data) is None


def test_age_without_time_is_unknown_and_never_negative() -> None:
    assert Heartbeat().age_s(100.0) is None
    assert Heartbeat(time=100.0).age_s(99.0) == 0.0
