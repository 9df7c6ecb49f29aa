"""``hpcdist completion bash|zsh``: the shell completion script, from click's own protocol
(the script calls ``hpcdist`` back with ``_HPCDIST_COMPLETE=bash_complete`` set)."""

from __future__ import annotations

import click

COMPLETE_VAR = "_HPCDIST_COMPLETE"
SHELLS = ("bash", "zsh")


@click.command()
@click.argument("shell", type=click.Choice(SHELLS))
def completion(shell: str) -> int:
    """Print the completion script for SHELL. Enable it with
    eval "$(hpcdist completion bash)" in ~/.bashrc (or zsh in ~/.zshrc)."""
    from click.shell_completion import get_completion_class

    root = click.get_current_context().find_root().command
    completer = get_completion_class(shell)
    if completer is None:  # click ships both; guards against a trimmed click
        raise click.UsageError(f"click has no completion for {shell!r}; expected bash or zsh")
    click.echo(completer(root, {}, "hpcdist", COMPLETE_VAR).source())
    return 0
