"""``ufsemulator export --checkpoint`` exports only a checkpoint this user's training wrote,
unchanged since (its digest in the private state), from folders nobody else can write; what
it writes is not writable by group or others, whatever the umask."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hpcdist.state.outputs import book_for
from ufsemulator.__main__ import main
from ufsemulator.checkpoints.checkpoint import save_checkpoint

from .test_export import _checkpoint, aice_model


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """runs/7/best_model.pt as a training in ``tmp_path`` writes it (umask 002)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "7").mkdir(parents=True, mode=0o755)
    previous = os.umask(0o002)
    try:
        path = tmp_path / "runs" / "7" / "best_model.pt"
        state = {**_checkpoint(aice_model()), "epoch": 1, "config": {}}
        save_checkpoint(state, path, book_for(), anchor=tmp_path)
        yield path
    finally:
        os.umask(previous)


def _export(path: Path, *extra: str) -> int:
    return main(["export", "--checkpoint", str(path), "--out", "m.pt", *extra])


def test_checkpoint_the_training_wrote_is_exported_and_the_export_is_not_group_writable(
    run: Path,
) -> None:
    assert _export(run) == 0
    for name in ("m.pt", "m.md"):
        assert Path(name).stat().st_mode & 0o022 == 0, name
    assert book_for().accepted(Path("m.pt").resolve())  # its digest kept, as for any output


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ("rewritten", "its SHA-256"),
        ("foreign", "is owned by uid 4242"),
        ("unrecorded", "no digest of it was recorded"),
        ("runs exchanged", "run folder '{runs}/7' is owned by uid 4242"),
    ],
)
def test_checkpoint_not_as_the_training_wrote_it_is_refused_in_one_line(
    run: Path, capsys: pytest.CaptureFixture[str], change: str, said: str
) -> None:
    other = aice_model()
    torch.nn.init.constant_(next(other.parameters()), 3.0)
    if change == "rewritten":
        torch.save({**_checkpoint(other), "epoch": 1, "config": {}}, run)
    elif change == "foreign":
        os.chown(run, 4242, -1)
    elif change == "unrecorded":
        book_for().record_path(run).unlink()
    else:  # another user's runs/7, with her checkpoint, in the place of the victim's
        os.rename(run.parent, run.parent.with_name("mine"))
        run.parent.mkdir(mode=0o755)
        torch.save({**_checkpoint(other), "epoch": 1, "config": {}}, run)
        os.chown(run.parent, 4242, -1)
    assert _export(run) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: refusing checkpoint '{run}': "), err
    assert said.format(runs=run.parent.parent) in err and err.count("\n") == 1
    assert not Path("m.pt").exists()


def test_trust_checkpoint_exports_a_file_of_another_user(run: Path) -> None:
    os.chown(run, 4242, -1)
    assert _export(run, "--trust-checkpoint") == 0
