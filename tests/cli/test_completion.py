"""Shell completion: the generated bash script, sourced in a real bash, offers the subcommands
and flag names; zsh gets the same answers through click's completion protocol."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path) -> dict[str, str]:
    # `hpcdist` on PATH, whether or not the package is installed: the script calls it back.
    wrapper = tmp_path / "hpcdist"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m hpcdist.cli.main "$@"\n')
    wrapper.chmod(0o755)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env["PATH"] = f"{tmp_path}:{env['PATH']}"
    return env


def _script(shell: str, env: dict[str, str]) -> str:
    proc = subprocess.run(
        ["hpcdist", "completion", shell],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return proc.stdout


@pytest.fixture(scope="module")
def bash_completion(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    tmp = tmp_path_factory.mktemp("completion")
    env = _env(tmp)
    script = tmp / "hpcdist.bash"
    script.write_text(_script("bash", env))
    return script, env


@pytest.mark.parametrize(
    ("words", "expected", "absent"),
    [
        ("hpcdist st", {"status"}, {"submit", "logs"}),
        (
            "hpcdist ''",
            {"render", "submit", "status", "logs", "list", "cancel", "run", "completion"},
            set(),
        ),
        ("hpcdist logs --", {"--rank", "--follow"}, {"--nodes"}),
        ("hpcdist status --", {"--json"}, set()),
        ("hpcdist run --col", {"--collective-timeout"}, set()),
        ("hpcdist completion ''", {"bash", "zsh"}, set()),
    ],
    ids=["prefix", "subcommands", "logs-flags", "status-flags", "run-flag", "shells"],
)
def test_bash_offers_subcommands_and_flags(
    bash_completion: tuple[Path, dict[str, str]], words: str, expected: set[str], absent: set[str]
) -> None:
    script, env = bash_completion
    program = (
        f"source {script}; COMP_WORDS=({words}); COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 )); "
        "_hpcdist_completion hpcdist; printf '%s\\n' \"${COMPREPLY[@]}\""
    )
    proc = subprocess.run(
        ["bash", "-c", program], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    offered = set(proc.stdout.split())
    assert expected <= offered, proc.stdout + proc.stderr
    assert not absent & offered


def test_zsh_script_and_protocol(tmp_path: Path) -> None:
    env = _env(tmp_path)
    script = _script("zsh", env)
    assert "#compdef hpcdist" in script
    assert "_HPCDIST_COMPLETE=zsh_complete" in script
    proc = subprocess.run(
        ["hpcdist"],
        env={
            **env,
            "_HPCDIST_COMPLETE": "zsh_complete",
            "COMP_WORDS": "hpcdist logs --",
            "COMP_CWORD": "2",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    # zsh_complete answers in triples: type, value, help.
    values = proc.stdout.splitlines()[1::3]
    assert {"--rank", "--follow", "--help"} <= set(values)


def test_unknown_shell_is_a_usage_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["hpcdist", "completion", "fish"],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "'fish' is not one of 'bash', 'zsh'" in proc.stderr
