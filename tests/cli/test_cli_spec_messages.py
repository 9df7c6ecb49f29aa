"""Messages of the flags' layer that must be true: where a value came from (a flag, a
profile, an environment variable), what bash would make of a setup line, which modes a
flag needs, and a Ctrl-C at any moment of a command (one line, never a traceback)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcdist.cli.main import cli


def _one_line(args: list[str], env: dict[str, str] | None = None) -> str:
    result = CliRunner().invoke(cli, ["render", *args], env=env)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.stderr
    return lines[0].removeprefix("hpcdist: error: ")


def test_a_profile_named_by_the_environment_is_blamed_on_it() -> None:
    said = _one_line([], env={"HPCDIST_PROFILE": "nosuch", "XDG_CONFIG_HOME": "/nonexistent"})
    assert said.startswith("HPCDIST_PROFILE 'nosuch' is not a shipped profile (")
    said = _one_line(["--profile", "nosuch"], env={"HPCDIST_PROFILE": "local"})
    assert said.startswith("--profile 'nosuch' is not a shipped profile (")
    said = _one_line([], env={"HPCDIST_PROFILE": "./missing.yaml"})
    assert said == "HPCDIST_PROFILE './missing.yaml': no such file"


@pytest.mark.parametrize("line", ["cat <<EOF", "cat <<-END", "python - <<'PY'"])
def test_a_setup_line_that_opens_a_here_document_is_refused(line: str) -> None:
    said = _one_line(["--setup", line])
    assert said == (
        f"--setup {line!r} is not a complete shell line (a here-document (<<) that this line "
        "does not close); expected e.g. 'module load cuda'"
    )


def test_a_setup_line_with_a_here_string_passes() -> None:
    result = CliRunner().invoke(cli, ["render", "--setup", "cat <<< hello"])
    assert result.exit_code == 0, result.output
    assert "\ncat <<< hello\n" in result.stdout


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["--mode", "test", "--gpus-per-node", "1", "--ntasks", "2"],
            "--ntasks 2 needs ranks on CPUs (--mode gloo, or --mode test without GPUs), got "
            "--mode test with --gpus-per-node 1 (one task per GPU)",
        ),
        (
            ["--mode", "nccl", "--ntasks", "2"],
            "--ntasks 2 needs ranks on CPUs (--mode gloo, or --mode test without GPUs), got "
            "--mode nccl",
        ),
        # GPUs counted when the job starts: the thread count was ignored without a word
        (
            ["--mode", "nccl", "--threads-per-task", "2"],
            "--threads-per-task 2 is for CPU jobs; --mode nccl runs on GPUs",
        ),
    ],
)
def test_mode_messages_say_each_mode_once(args: list[str], said: str) -> None:
    assert _one_line(args) == said


def test_ctrl_c_while_the_cli_loads_is_one_line(tmp_path: Path) -> None:
    """Ctrl-C in the first fraction of a second lands in the CLI's imports (click here)."""
    code = (
        "import builtins\n"
        "real = builtins.__import__\n"
        "def interrupted(name, *args, **kwargs):\n"
        "    if name == 'click':\n"
        "        raise KeyboardInterrupt\n"
        "    return real(name, *args, **kwargs)\n"
        "builtins.__import__ = interrupted\n"
        "from hpcdist.cli.entry import main\n"
        "raise SystemExit(main(['submit', '--dry-run']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stderr, proc.stdout) == (130, "hpcdist: aborted\n", "")
    assert list(tmp_path.iterdir()) == []


def test_the_console_script_is_the_guarded_entry_point() -> None:
    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '\nhpcdist = "hpcdist.cli.entry:main"\n' in text
