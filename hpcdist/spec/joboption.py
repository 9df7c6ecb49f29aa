"""How a JobSpec field is declared: its default, its help, its flag and whether a profile may
preset it, all in one place (the field itself), so the CLI options, the built-in defaults and
the profile's ``defaults:`` keys are derived rather than listed again.

    nodes: int = job_field(1, "Number of nodes.", short="-N")

declares ``--nodes/-N`` (an integer option), the default 1, and the profile key
``defaults.nodes``. With ``sbatch="mem"`` a set value is also passed to sbatch as it is
(``#SBATCH --mem=VALUE``): a new sbatch option is one field.
``owns=("nodes",)`` names the sbatch options hpcdist works out from the field itself, which
``--sbatch`` may therefore not set.
A field with ``default=DERIVED`` has no fixed default: ``build_spec`` computes it from the
others when neither a flag nor the profile sets it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

OPTION_KEY = "hpcdist.option"


class _Derived:
    def __repr__(self) -> str:
        return "DERIVED"


DERIVED: Any = _Derived()


@dataclass(frozen=True)
class JobOption:
    """What the command line and profiles know of one JobSpec field."""

    name: str  # the JobSpec field
    default: Any  # DERIVED: computed by build_spec
    help: str
    flag: str  # the long option, e.g. "--mem"
    short: str | None = None
    value_type: str = "str"  # str | int | bool | count (int or "auto") | nodes | exclusive
    choices: tuple[str, ...] = ()
    multiple: bool = False  # repeatable flag, a tuple in the spec
    profile: bool = True  # a profile's ``defaults:`` may preset it
    metavar: str | None = None
    sbatch: str | None = None  # the #SBATCH option this value is passed to as it is
    # sbatch options hpcdist works out from this field (--nodes, --ntasks-per-node, ...): a
    # pass-through of one is refused, naming this field's flag.
    owns: tuple[str, ...] = ()

    @property
    def has_default(self) -> bool:
        return self.default is not DERIVED

    def flag_for(self, option: str) -> str:
        """This field's flag for an sbatch option it sets: ``--no-requeue`` of
        ``--requeue/--no-requeue`` for no-requeue, else the first."""
        flags = self.flag.split("/")
        return f"--{option}" if f"--{option}" in flags else flags[0]

    def sbatch_options(self) -> tuple[str, ...]:
        """Every sbatch option this field decides: passed on as it is, or worked out."""
        return ((self.sbatch,) if self.sbatch else ()) + self.owns


# One keyword per JobOption attribute, as dataclasses.field takes its own: a declaration
# reads as the option it declares, and a bundle would only move these names into it.
def job_field(  # noqa: PLR0913
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    short: str | None = None,
    value_type: str = "str",
    choices: tuple[str, ...] = (),
    multiple: bool = False,
    profile: bool = True,
    metavar: str | None = None,
    sbatch: str | None = None,
    owns: tuple[str, ...] = (),
) -> Any:
    """A dataclass field of JobSpec that is also a job option (see the module doc)."""
    info = {
        "default": default,
        "help": help,
        "flag": flag,
        "short": short,
        "value_type": value_type,
        "choices": choices,
        "multiple": multiple,
        "profile": profile,
        "metavar": metavar,
        "sbatch": sbatch,
        "owns": owns,
    }
    # The JobSpec itself is always built complete by build_spec: no dataclass default.
    return dataclasses.field(metadata={OPTION_KEY: info})


def job_options(spec_class: type) -> Iterator[JobOption]:
    """The job options of a dataclass, in field order."""
    for f in dataclasses.fields(spec_class):
        info = f.metadata.get(OPTION_KEY)
        if info is None:
            continue
        flag = info["flag"] or "--" + f.name.replace("_", "-")
        yield JobOption(name=f.name, **{**info, "flag": flag})
