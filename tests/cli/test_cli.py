"""The command line as a whole: every option explains itself, and `hpcdist` alone is help."""

from __future__ import annotations

import os
import subprocess
import sys

import click
import pytest

from hpcdist.cli.main import cli


def _commands() -> list[tuple[str, click.Command]]:
    assert isinstance(cli, click.Group)
    ctx = click.Context(cli)  # subcommands load on demand: ask for each by name
    named = [(name, cli.get_command(ctx, name)) for name in cli.list_commands(ctx)]
    return [(name, command) for name, command in named if command is not None]


@pytest.mark.parametrize(("name", "command"), _commands(), ids=[n for n, _ in _commands()])
def test_every_option_of_every_command_has_help(name: str, command: click.Command) -> None:
    undocumented = [
        p.opts[0]
        for p in command.params
        if isinstance(p, click.Option) and not (p.help or "").strip()
    ]
    assert undocumented == []


def test_hpcdist_alone_prints_its_help_and_succeeds() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "hpcdist.cli.main"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("_")},
    )
    assert proc.returncode == 0
    assert proc.stdout.startswith("Usage: hpcdist [OPTIONS] COMMAND [ARGS]...")
    assert "submit" in proc.stdout and proc.stderr == ""
