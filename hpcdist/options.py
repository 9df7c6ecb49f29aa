"""The job flags shared by ``hpcdist render`` and ``hpcdist submit``, and their JobSpec."""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from typing import Any, TypeVar

import click

from hpcdist.errors import SpecError
from hpcdist.profiles import DEFAULT_PROFILE, load_profile
from hpcdist.spec import LAUNCHERS, MODES, JobSpec, build_spec

F = TypeVar("F", bound=Callable[..., Any])

_JOB_OPTIONS: tuple[Callable[[F], F], ...] = (
    click.option("--profile", default=None, metavar="NAME|PATH",
                 help=f"Cluster profile (default: $HPCDIST_PROFILE, else {DEFAULT_PROFILE})."),
    click.option("--mode", type=click.Choice(MODES), default=None, help="Kind of job."),
    click.option("--backend", type=click.Choice(("gloo", "nccl")), default=None,
                 help="Spelling of --mode for the two DDP backends."),
    click.option("--nodes", "-N", type=int, default=None, help="Number of nodes."),
    click.option("--tasks-per-node", type=int, default=None,
                 help="Ranks per node (default: 1, or the GPUs per node for nccl)."),
    click.option("--cpus-per-task", "-c", type=int, default=None,
                 help="CPUs (threads) per rank (default: the node's cores shared evenly)."),
    click.option("--gpus-per-node", type=int, default=None, help="GPUs per node (nccl only)."),
    click.option("--mem", "memory", default=None, help="Memory per node, e.g. 16G or 0 (all)."),
    click.option("--time", "-t", default=None, help="Time limit, e.g. 30, 04:00:00, 1-12."),
    click.option("--partition", "-p", default=None),
    click.option("--account", "-A", default=None),
    click.option("--qos", default=None),
    click.option("--job-name", "-J", default=None),
    click.option("--output", default=None, help="stdout path; SLURM patterns like %j allowed."),
    click.option("--error", default=None, help="stderr path (default: with stdout)."),
    click.option("--chdir", "workdir", default=None, help="Working directory of the job."),
    click.option("--setup", multiple=True, help="A setup line (module load ...); repeatable."),
    click.option("--env", "env", multiple=True, metavar="KEY=VALUE",
                 help="Extra environment variable; repeatable."),
    click.option("--launcher", type=click.Choice(LAUNCHERS), default=None,
                 help="srun starts every rank, or one torchrun per node."),
    click.option("--command", default=None,
                 help="Command each rank runs (default: the ufsemulator training)."),
    click.option("--signal", default=None, help="Warning signal before the limit, e.g. USR2@90."),
    click.option("--requeue/--no-requeue", default=None, help="Requeue after preemption."),
    click.option("--max-restarts", type=int, default=None),
    click.option("--collective-timeout", type=int, default=None, metavar="SECONDS",
                 help="Limit for joining the process group and for every collective: a hung "
                      "peer fails the job after it (default 120; the check's 60)."),
)


def job_options(func: F) -> F:
    for option in reversed(_JOB_OPTIONS):
        func = option(func)
    return func


def spec_from_options(options: dict[str, Any]) -> JobSpec:
    """defaults < profile < flags, validated; raises SpecError / ProfileError for the user."""
    flags = dict(options)
    profile = load_profile(flags.pop("profile") or os.environ.get("HPCDIST_PROFILE")
                           or DEFAULT_PROFILE)
    backend = flags.pop("backend", None)
    if backend and flags.get("mode") and flags["mode"] != backend:
        raise SpecError(f"--backend {backend!r} contradicts --mode {flags['mode']!r}")
    flags["mode"] = flags.get("mode") or backend
    flags["env"] = tuple(_parse_env(item) for item in flags.get("env") or ())
    command = flags.pop("command", None)
    if command is not None:
        try:
            flags["command"] = tuple(shlex.split(command))
        except ValueError as exc:
            raise SpecError(f"--command {command!r} cannot be split into words: {exc}") from exc
    return build_spec(profile, flags)


def _parse_env(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep:
        raise SpecError(f"--env {item!r}; expected KEY=VALUE")
    return key, value
