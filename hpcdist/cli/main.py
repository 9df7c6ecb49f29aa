"""The ``hpcdist`` command line: render, submit, status, logs, cancel, list, env.

Rendering and submitting never import torch, so the CLI answers in a fraction of a second.
Each subcommand's module loads only when that subcommand runs (``SUBCOMMANDS``): ``render``
never imports submit, the job records or the SLURM queries, and shell completion (which
runs the CLI at every Tab) stays quick.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any

import click

from hpcdist.errors import UserError
from hpcdist.jobs.logread import one_line
from hpcdist.spec.options import job_options, spec_and_profile
from hpcdist.state.fileutil import umask_mode, write_atomic

# name -> (module, attribute): loaded when the subcommand is asked for (click's lazy group).
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "submit": ("hpcdist.cli.jobs", "submit"),
    "cancel": ("hpcdist.cli.jobs", "cancel_command"),
    "status": ("hpcdist.cli.follow", "status"),
    "logs": ("hpcdist.cli.follow", "logs"),
    "list": ("hpcdist.cli.follow", "list_command"),
    "report": ("hpcdist.cli.report", "report"),
    "env": ("hpcdist.cli.env", "env_command"),
    "run": ("hpcdist.cli.run", "run"),
    "completion": ("hpcdist.cli.completion", "completion"),
    "doctor": ("hpcdist.cli.site", "doctor"),
    "profile": ("hpcdist.cli.site", "profile"),
}

# The subcommands that ask SLURM: each takes --transport (SLURM's commands, or slurmrestd).
TRANSPORT_COMMANDS = ("submit", "cancel", "status", "logs", "list", "report", "doctor")
TRANSPORT_HELP = (
    "How SLURM is reached: cli (its commands, the default) or rest (slurmrestd at "
    "$HPCDIST_SLURMRESTD, token $SLURM_JWT). Default: $HPCDIST_TRANSPORT."
)


def _set_transport(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        os.environ["HPCDIST_TRANSPORT"] = value


def transport_option() -> click.Option:
    return click.Option(
        ["--transport"],
        type=click.Choice(["cli", "rest"]),
        expose_value=False,
        is_eager=True,
        callback=_set_transport,
        help=TRANSPORT_HELP,
    )


class _Cli(click.Group):
    """A group whose user errors are one line on stderr and exit code 2, never a traceback;
    its subcommands other than ``render`` load on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *SUBCOMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in SUBCOMMANDS and cmd_name not in self.commands:
            module, attribute = SUBCOMMANDS[cmd_name]
            command = getattr(importlib.import_module(module), attribute)
            if cmd_name in TRANSPORT_COMMANDS:
                command.params.append(transport_option())
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)

    def main(  # type: ignore[override]  # always exits, whatever standalone_mode says
        self, args: Any = None, prog_name: str | None = None, **extra: Any
    ) -> Any:
        extra["standalone_mode"] = False
        try:
            result = super().main(args, prog_name or "hpcdist", **extra)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("hpcdist: aborted", err=True)
            sys.exit(130)
        except click.ClickException as exc:
            help_ctx = getattr(exc, "ctx", None)
            if type(exc).__name__ == "NoArgsIsHelpError" and help_ctx is not None:
                # `hpcdist` alone: the help is the answer, not an error (click >= 8.2).
                click.echo(help_ctx.get_help())
                sys.exit(0)
            click.echo(f"hpcdist: error: {exc.format_message()}", err=True)
            sys.exit(2 if isinstance(exc, click.UsageError) else exc.exit_code)
        except UserError as exc:
            # One line, whatever it quotes: a path or a name may be another user's text.
            click.echo(f"hpcdist: error: {one_line(str(exc))}", err=True)
            sys.exit(2)
        sys.exit(result if isinstance(result, int) else 0)


@click.group(cls=_Cli)
@click.version_option("0.1.0", prog_name="hpcdist")
def cli() -> None:
    """Render, check and submit SLURM jobs for distributed PyTorch training."""


@cli.command()
@job_options
@click.option(
    "--script",
    "out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the script to this file instead of stdout.",
)
@click.option("--force", is_flag=True, help="Overwrite --script if it exists.")
@click.option(
    "--trust-folder",
    is_flag=True,
    help=(
        "Write --script into a folder that other users can write (refused otherwise); "
        "profile key trust_folder: true."
    ),
)
def render(out: Path | None, force: bool, trust_folder: bool, **options: Any) -> int:
    """Print the sbatch script for a job; change nothing."""
    from hpcdist.jobs.leadcheck import lead_warning
    from hpcdist.render.script import render as render_spec

    spec, profile = spec_and_profile(options)
    script = render_spec(spec)
    if warning := lead_warning(spec):
        click.echo(warning, err=True)
    if out is None:
        click.echo(script, nl=False)
        return 0
    _write_script(out, script, force, trust_folder or profile.trust_folder)
    click.echo(f"wrote {out}", err=True)
    return 0


def _write_script(out: Path, script: str, force: bool, trust_folder: bool) -> None:
    """Write ``render --script``'s file: never writable by group or others, and only into
    a folder no other user can write (or rename away), unless ``trust_folder`` (the flag
    or the profile's key): a script that another user can change runs their lines as you
    when you run sbatch."""
    from hpcdist.state.workfolder import script_folder_problem

    if out.exists() and not force:
        raise UserError(f"--script {str(out)!r} exists; pass --force to overwrite it")
    if not out.parent.is_dir():
        raise UserError(f"--script {str(out)!r}: folder {str(out.parent)!r} does not exist")
    problem = "" if trust_folder else script_folder_problem(out.parent)
    if problem:
        raise UserError(
            f"--script {str(out)!r}: {problem}, who could change the script before you run "
            "sbatch; write it to a folder only you can write (e.g. in your home), or pass "
            "--trust-folder (or set trust_folder: true in your profile) if you trust everyone "
            "who can write there"
        )
    try:
        write_atomic(out, script, mode=umask_mode(executable=True) & ~0o022)
    except OSError as exc:
        raise UserError(f"--script {str(out)!r} cannot be written: {exc.strerror}") from exc


def main(argv: list[str] | None = None) -> int:
    try:
        cli.main(args=argv, prog_name="hpcdist")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
