"""A job runs only in a folder where no other user can put or replace a file, and no Python
that the rendered script starts imports from the folder it starts in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdist.render.script import render
from hpcdist.spec.options import spec_from_options
from hpcdist.state.workfolder import check_working_folder, working_folder_problem


def test_private_folder_below_private_folders_is_accepted(tmp_path: Path) -> None:
    folder = tmp_path / "work"
    folder.mkdir(mode=0o755)
    assert working_folder_problem(folder) == ""


@pytest.mark.parametrize("mode", [0o775, 0o2775, 0o757, 0o1777])
def test_folder_others_can_write_is_refused_quoting_its_mode(tmp_path: Path, mode: int) -> None:
    folder = tmp_path / "work"
    folder.mkdir()
    folder.chmod(mode)
    problem = working_folder_problem(folder)
    assert problem.startswith(f"'{folder}' can be written by others") and f"{mode:04o}" in problem


@pytest.mark.parametrize("mode", [0o2775, 0o777])
def test_private_folder_inside_a_shared_one_is_refused(tmp_path: Path, mode: int) -> None:
    shared = tmp_path / "project"
    (shared / "mine").mkdir(parents=True, mode=0o755)
    shared.chmod(mode)
    problem = check_working_folder(shared / "mine")
    assert f"'{shared}', above '{shared / 'mine'}', can be written by others" in problem
    assert "rename it away" in problem and "--chdir" in problem


def test_sticky_parent_such_as_tmp_is_accepted(tmp_path: Path) -> None:
    sticky = tmp_path / "scratch"
    (sticky / "mine").mkdir(parents=True, mode=0o755)
    sticky.chmod(0o1777)
    assert working_folder_problem(sticky / "mine") == ""


def test_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "work"
    folder.mkdir(mode=0o755)
    problem = working_folder_problem(folder, my_uid=os.geteuid() + 1)
    assert problem.startswith(f"'{folder}' is owned by")


def _script_line(name: str) -> str:
    script = render(spec_from_options({"profile": "local", "mode": "threads", "nodes": 1}))
    return next(line for line in script.splitlines() if line.startswith(name))


def test_rendered_script_keeps_the_working_folder_off_the_import_path() -> None:
    assert _script_line("export PYTHONSAFEPATH=") == "export PYTHONSAFEPATH=1"


def test_runner_of_an_old_python_imports_nothing_from_its_folder(tmp_path: Path) -> None:
    """As Python < 3.11 does (it ignores PYTHONSAFEPATH): the script's runner line, in a
    folder with a planted ``hpcdist`` package and ``runpy``, runs the real one."""
    planted = tmp_path / "hpcdist"
    planted.mkdir()
    (planted / "__init__.py").write_text("raise SystemExit('PLANTED')\n")
    (tmp_path / "runpy.py").write_text("raise SystemExit('PLANTED')\n")
    main = _script_line("hpcdist_main=")
    repo = str(Path(__file__).resolve().parents[2])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    env["PYTHONPATH"] = f":relative:{repo}"  # an empty entry is the working folder too
    out = subprocess.run(
        [
            "bash",
            "-c",
            f'{main}\n{sys.executable} -c "$hpcdist_main" hpcdist.distributed.jobstep -h',
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and "prepare" in out.stdout, out.stderr
    assert "PLANTED" not in out.stdout + out.stderr
