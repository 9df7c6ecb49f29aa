"""The workload's configuration checker, found through an entry point: how ``--set`` and
``--sweep`` are checked without hpcdist importing the workload.

A workload declares, in its package metadata, the module (or object) that knows its
configuration's schema, under the entry point group ``hpcdist.config_checkers`` and the
name of the module its command runs (``python -m NAME train``)::

    [project.entry-points."hpcdist.config_checkers"]
    ufsemulator = "ufsemulator.overrides"

hpcdist calls what the ``ConfigChecker`` protocol lists, and turns the ``ValueError`` any of
them raises into a SpecError naming the flag. The entry point is loaded only when a job has
``--set`` or ``--sweep``, so rendering any other job never imports the workload.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any, Protocol, cast

from hpcdist.errors import SpecError
from hpcdist.spec.jobspec import TRAIN_COMMAND

GROUP = "hpcdist.config_checkers"
# The workload whose config --set and --sweep change: the module of the training command.
WORKLOAD = TRAIN_COMMAND[2]


class ConfigChecker(Protocol):
    """What hpcdist asks of a workload's configuration (each raises ValueError when wrong)."""

    def parse_override(self, text: str, flag: str = ..., /) -> tuple[str, Any]:
        """``KEY=VALUE`` -> (key, value): the override's form."""
        ...

    def parse_value(self, raw: str, where: str, /) -> Any:
        """One value as the configuration file would read it."""
        ...

    def valid_key(self, key: str, /) -> bool:
        """Whether ``key`` has the form of a configuration key."""
        ...

    def check_overrides(self, texts: Iterable[str], flag: str = ..., /) -> object:
        """Every ``KEY=VALUE`` against the configuration's schema."""
        ...


@functools.cache
def config_checker(workload: str = WORKLOAD) -> ConfigChecker:
    """The checker ``workload`` declares (entry point ``hpcdist.config_checkers``)."""
    # importlib.metadata costs the CLI ~10 ms: loaded only for a job with --set or --sweep.
    from importlib.metadata import entry_points

    for point in entry_points(group=GROUP):
        if point.name == workload:
            return cast(ConfigChecker, point.load())
    raise SpecError(
        f"--set and --sweep change {workload}'s configuration, but no installed package "
        f"declares its checker (entry point group {GROUP!r}); expected {workload} installed "
        "in this environment (pip install, which registers the entry point)"
    )
