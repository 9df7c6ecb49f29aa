"""A job's log never goes to a folder others can write: SLURM would follow their link."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdist.errors import SpecError
from hpcdist.render.script import render
from hpcdist.spec.options import spec_from_options
from hpcdist.state.statehome import private_state_root

OPTIONS = {"profile": "local", "mode": "threads", "nodes": 1, "command": "true"}


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("HPCDIST_HOME", raising=False)
    return tmp_path / "state"


def test_log_of_a_shared_folder_goes_to_the_users_own_and_the_script_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: Path
) -> None:
    shared = tmp_path / "project"
    shared.mkdir()
    shared.chmod(0o2775)
    monkeypatch.chdir(shared)
    script = render(spec_from_options(OPTIONS))
    folder = private_state_root(shared) / "logs"
    assert f'#SBATCH --output="{folder}/%x-%j.out"' in script
    above = script.splitlines()[
        script.splitlines().index(f'#SBATCH --output="{folder}/%x-%j.out"') - 1
    ]
    assert above.startswith("# The folder the job's log would go to can be written by others")
    assert folder.is_dir() and folder.stat().st_mode & 0o777 == 0o700


def test_log_of_a_private_folder_stays_where_it_was_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: Path
) -> None:
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    monkeypatch.chdir(mine)
    assert '#SBATCH --output="%x-%j.out"' in render(spec_from_options(OPTIONS))


def test_absolute_log_in_a_shared_folder_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: Path
) -> None:
    shared = tmp_path / "project"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError, match=rf"--error '{shared}/e.log': '{shared}' can be written"):
        spec_from_options({**OPTIONS, "error": f"{shared}/e.log"})
