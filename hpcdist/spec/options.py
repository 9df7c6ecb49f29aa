"""The job flags shared by ``hpcdist render`` and ``hpcdist submit``, and their JobSpec.

Every job flag is derived from the JobSpec field it sets (``hpcdist.spec.jobspec.JOB_OPTIONS``): a
new field declared with ``job_field`` is a new flag of both commands, with nothing to add
here.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from typing import Any, TypeVar

import click

from hpcdist.errors import ProfileError, SpecError
from hpcdist.spec.build import build_spec
from hpcdist.spec.clusterprofile import cluster_profile
from hpcdist.spec.dependency import parse_after
from hpcdist.spec.grammar import node_count
from hpcdist.spec.joboption import JobOption
from hpcdist.spec.jobspec import AUTO, JOB_OPTIONS, JobSpec
from hpcdist.spec.logfolder import private_logs
from hpcdist.spec.profiles import Profile, load_profile
from hpcdist.spec.siteopts import parse_sbatch_option
from hpcdist.spec.sweep import parse_sets, parse_sweeps
from hpcdist.spec.validate import current_folder

F = TypeVar("F", bound=Callable[..., Any])
PROFILE_ENV = "HPCDIST_PROFILE"


class _GpuCount(click.ParamType):
    """A GPU count (an integer) or ``auto``."""

    name = "N|auto"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int) or value == AUTO:
            return value
        try:
            return int(value)
        except ValueError:
            self.fail(f"{value!r} is not an integer nor 'auto'", param, ctx)


class _NodeCount(click.ParamType):
    """SLURM's node count, ``4`` or ``MIN-MAX``; a range of two counts is refused in one line."""

    name = "N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return node_count("--nodes", value)


_TYPES: dict[str, Any] = {
    "str": None,
    "int": int,
    "bool": None,
    "count": _GpuCount(),
    "nodes": _NodeCount(),
}
# --no-exclusive: its own option (--exclusive takes an optional value, user or mcs).
_NO_EXCLUSIVE = "no_exclusive"


def _click_option(option: JobOption) -> Callable[[F], F]:
    if option.value_type == "exclusive":
        return _exclusive_options(option)
    names = [option.flag] + ([option.short] if option.short else [])
    kwargs: dict[str, Any] = {"default": None, "help": option.help, "metavar": option.metavar}
    if option.choices:
        kwargs["type"] = click.Choice(option.choices)
    elif _TYPES[option.value_type] is not None:
        kwargs["type"] = _TYPES[option.value_type]
    if option.multiple:
        kwargs.update(multiple=True, default=())
    return click.option(*names, option.name, **kwargs)


def _exclusive_options(option: JobOption) -> Callable[[F], F]:
    """``--exclusive`` (whole nodes), ``--exclusive=user|mcs``, and ``--no-exclusive``."""
    on, off = option.flag.split("/")
    with_value = click.option(
        on,
        option.name,
        is_flag=False,
        flag_value="",
        default=None,
        help=option.help,
        metavar="[=user|mcs]",
    )
    without = click.option(
        off, _NO_EXCLUSIVE, is_flag=True, default=None, help="Not --exclusive (over a profile's)."
    )
    return lambda func: with_value(without(func))


# Options that are not fields of the JobSpec: where its values come from.
_SOURCE_OPTIONS: tuple[Callable[[F], F], ...] = (
    click.option(
        "--profile",
        default=None,
        metavar="NAME|PATH",
        help=(
            "Cluster profile (default: $HPCDIST_PROFILE, else the cluster's own description, "
            "asked of SLURM)."
        ),
    ),
    click.option(
        "--trust-profile",
        is_flag=True,
        default=None,
        help="Use a profile file that another user owns or can write (refused otherwise).",
    ),
    click.option(
        "--backend",
        type=click.Choice(("gloo", "nccl")),
        default=None,
        help="Spelling of --mode for the two DDP backends.",
    ),
)
_OPTIONS = (*_SOURCE_OPTIONS, *(_click_option(o) for o in JOB_OPTIONS))


def job_options(func: F) -> F:
    for option in reversed(_OPTIONS):
        func = option(func)
    return func


def spec_from_options(options: dict[str, Any]) -> JobSpec:
    """defaults < profile < flags, validated; raises SpecError / ProfileError for the user."""
    return spec_and_profile(options)[0]


def spec_and_profile(options: dict[str, Any]) -> tuple[JobSpec, Profile]:
    """``spec_from_options``'s spec and the profile it was built from (read once), for a
    command that also heeds a profile key of its own (``render``'s ``trust_folder``)."""
    flags = dict(options)
    profile = options_profile(flags)
    flags.pop("profile", None)
    flags.pop("trust_profile", None)
    backend = flags.pop("backend", None)
    if backend and flags.get("mode") and flags["mode"] != backend:
        raise SpecError(f"--backend {backend!r} contradicts --mode {flags['mode']!r}")
    flags["mode"] = flags.get("mode") or backend
    _fold_exclusive(flags)
    flags["env"] = tuple(_parse_env(item) for item in flags.get("env") or ())
    flags["overrides"] = parse_sets(flags.get("overrides") or ())
    flags["sweep"] = parse_sweeps(flags.get("sweep") or ())
    flags["after"] = parse_after(flags.get("after") or ())
    flags["sbatch_options"] = tuple(
        parse_sbatch_option(item) for item in flags.get("sbatch_options") or ()
    )
    command = flags.pop("command", None)
    if command is not None:
        if "\n" in command or "\r" in command or "\x00" in command:
            # shlex would read a newline as a space: `a<newline>b` would run as `a b`
            raise SpecError(
                f"--command {command!r} contains a newline or NUL; expected one command line"
            )
        try:
            flags["command"] = tuple(shlex.split(command))
        except ValueError as exc:
            raise SpecError(f"--command {command!r} cannot be split into words: {exc}") from exc
        if not flags["command"]:
            raise SpecError(
                f"--command {command!r} is empty; expected the command each rank "
                "runs (leave the flag out for the emulator training)"
            )
    return private_logs(build_spec(profile, flags), current_folder()), profile


def options_profile(options: dict[str, Any]) -> Profile:
    """The profile the options name: --profile, else $HPCDIST_PROFILE, else the cluster's
    own description (hpcdist.spec.clusterprofile), for the partition --partition names."""
    named = options.get("profile")
    if named is not None and not str(named).strip():
        raise SpecError(f"--profile is empty ({named!r}); leave it out or name a profile")
    from_env = os.environ.get(PROFILE_ENV) if not named else None
    if not named and not (from_env or "").strip():
        partition = options.get("partition")
        return cluster_profile(str(partition) if partition else None)
    try:
        return load_profile(str(named or from_env), trust=bool(options.get("trust_profile", False)))
    except ProfileError as exc:
        if from_env and str(exc).startswith("--profile "):
            # The name came from the environment: the message names where it was set.
            raise ProfileError(PROFILE_ENV + str(exc).removeprefix("--profile")) from None
        raise


def _fold_exclusive(flags: dict[str, Any]) -> None:
    """--exclusive alone is True, --exclusive=user its kind, --no-exclusive False."""
    if flags.pop(_NO_EXCLUSIVE, None):
        if flags.get("exclusive") is not None:
            raise SpecError("--exclusive and --no-exclusive contradict each other; give one")
        flags["exclusive"] = False
    elif flags.get("exclusive") == "":
        flags["exclusive"] = True


def _parse_env(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep:
        raise SpecError(f"--env {item!r}; expected KEY=VALUE")
    return key, value
