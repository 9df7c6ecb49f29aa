"""The scontrol calls a job makes about itself, against a stand-in ``scontrol`` that the
requeue's TERM reaches while it runs (as SLURM ends the job's processes seconds after
``scontrol requeue``, sooner than a loaded host finishes the exclusion after it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdist.slurm import control


def _scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    tool = bindir / "scontrol"
    tool.write_text(f'#!/bin/bash\necho "$*" >> {calls}\n{body}\n')
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    return calls


# The TERM comes while the command runs; it then finishes its work and says so.
TERMED_MID_WAY = 'if [ "$1" = show ]; then echo "   ExcNodeList=node4"; exit 0; fi\n'
TERMED_MID_WAY += "kill -TERM $$; sleep 0.2; exit 0"


def test_the_exclusion_survives_the_requeues_term(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _scontrol(tmp_path, monkeypatch, TERMED_MID_WAY)
    assert control.exclude_nodes("77", ["node2"])
    # The job's own exclusion is kept beside the new one.
    assert calls.read_text().splitlines() == [
        "show job 77",
        "update JobId=77 ExcNodeList=node4,node2",
    ]
    assert control.requeue("77")


def test_a_refused_exclusion_or_requeue_is_said_as_such(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _scontrol(tmp_path, monkeypatch, "echo 'Job is no longer pending execution' >&2; exit 1")
    assert not control.exclude_nodes("77", ["node2"])
    assert not control.requeue("77")


def test_a_command_killed_otherwise_is_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _scontrol(tmp_path, monkeypatch, "kill -KILL $$")
    assert not control.requeue("77")
