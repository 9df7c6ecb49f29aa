"""Paths that must exist on the login node: --chdir and the folders of --output/--error are
checked before anything is queued, in render and submit alike (a missing one is queued by
sbatch and fails at launch)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hpcdist.errors import SpecError
from hpcdist.spec.options import spec_from_options

# (folders made under the current folder, flags, the refused flag or None: accepted)
CASES: list[tuple[tuple[str, ...], dict[str, Any], str | None]] = [
    (("run",), {"workdir": "run"}, None),
    ((), {"workdir": "run"}, "--chdir 'run': folder '{cwd}/run' does not exist"),
    ((), {"workdir": "{cwd}/gone"}, "--chdir '{cwd}/gone': folder '{cwd}/gone' does not exist"),
    (("logs",), {"output": "logs/o-%j.out"}, None),
    ((), {"output": "logs/o-%j.out"}, "--output 'logs/o-%j.out': folder '{cwd}/logs'"),
    (("logs",), {"error": "logs/e-%j.err"}, None),
    ((), {"error": "logs/e-%j.err"}, "--error 'logs/e-%j.err': folder '{cwd}/logs'"),
    # Relative logs start from --chdir's folder, as SLURM opens them there.
    (("run/logs",), {"workdir": "run", "output": "logs/o.out"}, None),
    (
        ("run", "logs"),
        {"workdir": "run", "output": "logs/o.out"},
        "--output 'logs/o.out': folder '{cwd}/run/logs' (relative to --chdir 'run')",
    ),
    (("run",), {"workdir": "run", "output": "{cwd}/run/o.out"}, None),
    # A folder part with a % pattern is made for the job: the check stops before it.
    ((), {"output": "%u/o-%j.out"}, None),
    (("logs",), {"output": "logs/%x/o-%j.out"}, None),
    ((), {"output": "logs/%x/o-%j.out"}, "--output 'logs/%x/o-%j.out': folder '{cwd}/logs'"),
    # A log in the folder itself needs nothing more.
    ((), {"output": "o-%j.out", "error": "e-%j.err"}, None),
]


@pytest.mark.parametrize(("made", "flags", "refused"), CASES)
def test_chdir_and_log_folders_must_exist(
    made: tuple[str, ...],
    flags: dict[str, Any],
    refused: str | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    for folder in made:
        (tmp_path / folder).mkdir(parents=True)
    given = {k: v.format(cwd=tmp_path) for k, v in flags.items()}
    options = {"profile": None, "mode": "gloo", **given}
    if refused is None:
        spec = spec_from_options(options)
        assert (spec.workdir, spec.output) == (
            given.get("workdir"),
            given.get("output", "%x-%j.out"),
        )
        return
    with pytest.raises(SpecError) as info:
        spec_from_options(options)
    assert str(info.value).startswith(refused.format(cwd=tmp_path)), str(info.value)
    assert "expected an existing folder" in str(info.value)


def test_a_file_in_place_of_the_chdir_folder_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes").write_text("")
    with pytest.raises(SpecError, match=r"^--chdir 'notes': folder '.*/notes' does not exist"):
        spec_from_options({"profile": None, "mode": "gloo", "workdir": "notes"})


def test_a_profile_chdir_that_is_missing_names_the_profile_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    site = tmp_path / "site.yaml"
    site.write_text("defaults:\n  workdir: /nonexistent/run\n")
    site.chmod(0o600)
    with pytest.raises(SpecError) as info:
        spec_from_options({"profile": str(site), "mode": "gloo"})
    assert str(info.value).startswith(
        f"profile 'site' ({site}) key defaults.workdir '/nonexistent/run': folder "
        "'/nonexistent/run' does not exist"
    ), str(info.value)


def _hpcdist(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpcdist.cli.main", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    "command",
    [
        ["render"],
        ["submit", "--executor", "local", "--mode", "threads"],
        ["submit", "--executor", "local", "--mode", "threads", "--dry-run"],
    ],
)
@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--chdir", "/nonexistent"], "--chdir '/nonexistent': folder '/nonexistent'"),
        (["-o", "logs/o-%j.out"], "--output 'logs/o-%j.out': folder '{cwd}/logs'"),
        (["-e", "logs/e-%j.err"], "--error 'logs/e-%j.err': folder '{cwd}/logs'"),
    ],
)
def test_a_missing_folder_is_one_line_exit_2_and_nothing_written(
    command: list[str], flags: list[str], named: str, tmp_path: Path
) -> None:
    proc = _hpcdist([*command, *flags], tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"hpcdist: error: {named.format(cwd=tmp_path)}"), lines
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_render_accepts_the_same_flags_once_the_folders_exist(tmp_path: Path) -> None:
    (tmp_path / "run" / "logs").mkdir(parents=True)
    proc = _hpcdist(["render", "--chdir", "run", "-o", "logs/o-%j.out"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert '#SBATCH --chdir="run"' in proc.stdout
    assert '#SBATCH --output="logs/o-%j.out"' in proc.stdout
