"""Config overrides (``--set``) and sweeps (``--sweep``) of a job: parsed, checked against the
training config's schema (the checker the workload declares, ``hpcdist.spec.workload``)
before anything is queued, and turned into the words each array task adds to its command
(``--set KEY=VALUE`` for ``python -m ufsemulator train``).

A sweep is the cartesian product of its ``--sweep KEY=V1,V2,...`` values, in the order the
flags were given (the last flag varies fastest); point ``i`` is array task ``i``. The rendered
script carries the points readably (a ``case`` on ``SLURM_ARRAY_TASK_ID``); ``hpcdist submit``
queues that script.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from hpcdist.errors import SpecError
from hpcdist.spec.jobspec import JobSpec
from hpcdist.spec.workload import WORKLOAD, config_checker

SET_FLAG, SWEEP_FLAG = "--set", "--sweep"
# A sweep's script holds every point (a line each): 50,000 points stay well below SLURM's
# default largest batch script (4 MB). A site's MaxArraySize (1001 by default) splits a
# sweep into several arrays of that script when it is submitted (hpcdist.slurm.limits).
MAX_POINTS = 50_000
_BRACKETS = {"[": "]", "{": "}"}

Sweep = tuple[tuple[str, tuple[str, ...]], ...]


def parse_sets(items: Sequence[str]) -> tuple[str, ...]:
    """``--set`` texts, each checked for its form (KEY=VALUE, a YAML value); kept as given."""
    if not items:
        return ()  # without --set, render never imports the training's config
    checker = config_checker()
    for item in items:
        try:
            checker.parse_override(item, SET_FLAG)
        except ValueError as exc:
            raise SpecError(str(exc)) from None
    return tuple(items)


def parse_sweeps(items: Sequence[str]) -> Sweep:
    """``--sweep KEY=V1,V2,...`` -> ((key, (v1, v2, ...)), ...); commas inside brackets or
    quotes belong to their value (``model.hidden_sizes=[32,32],[64,64]`` is two values)."""
    if not items:
        return ()
    checker = config_checker()
    out: list[tuple[str, tuple[str, ...]]] = []
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not checker.valid_key(key):
            raise SpecError(
                f"{SWEEP_FLAG} {item!r}; expected KEY=V1,V2,... with a dotted config key"
            )
        values = split_values(raw, f"{SWEEP_FLAG} {item!r}")
        try:
            for value in values:
                checker.parse_value(value, f"{SWEEP_FLAG} {key}")
        except ValueError as exc:
            raise SpecError(str(exc)) from None
        if key in (k for k, _ in out):
            raise SpecError(f"{SWEEP_FLAG} {key} is given twice; expected one --sweep per key")
        if len(set(values)) != len(values):
            raise SpecError(f"{SWEEP_FLAG} {item!r} repeats a value; expected distinct values")
        out.append((key, values))
    return tuple(out)


def split_values(raw: str, where: str) -> tuple[str, ...]:
    """Split at the commas outside brackets and quotes; every value non-empty."""
    values, current, stack, quote = [], "", [], ""
    for char in raw:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in _BRACKETS:
            stack.append(char)
        elif char in "]}":
            if not stack or _BRACKETS[stack.pop()] != char:
                raise SpecError(
                    f"{where} has an unbalanced {char!r}; expected e.g. [32,32],[64,64]"
                )
        elif char == "," and not stack:
            values.append(current.strip())
            current = ""
            continue
        current += char
    if stack or quote:
        raise SpecError(
            f"{where} has an unclosed {(stack or [quote])[-1]!r}; expected e.g. [32,32]"
        )
    values.append(current.strip())
    if any(not value for value in values):
        raise SpecError(f"{where} has an empty value; expected KEY=V1,V2,... with no empty value")
    return tuple(values)


def points(spec: JobSpec) -> list[tuple[str, ...]]:
    """The sweep's points, each as ``KEY=VALUE`` texts; [] for a job without --sweep."""
    if not spec.sweep:
        return []
    keys = [key for key, _ in spec.sweep]
    return [
        tuple(f"{key}={value}" for key, value in zip(keys, combo, strict=True))
        for combo in itertools.product(*(values for _, values in spec.sweep))
    ]


def array_range(spec: JobSpec) -> str | None:
    """sbatch's ``--array`` value (``0-N`` or ``0-N%K``), None without --sweep."""
    count = len(points(spec))
    if not count:
        return None
    limit = f"%{spec.max_parallel}" if spec.max_parallel is not None else ""
    return f"0-{count - 1}{limit}"


def set_words(texts: Sequence[str]) -> list[str]:
    """``--set KEY=VALUE`` words for the training command."""
    return [word for text in texts for word in (SET_FLAG, text)]


def task_command(spec: JobSpec, point: Sequence[str] = ()) -> tuple[str, ...]:
    """The command of a task: the job's command, its --set values, then its point's."""
    return (*spec.command, *set_words(spec.overrides), *set_words(point))


def runs_training(command: Sequence[str]) -> bool:
    """Whether a command is the emulator training (``... ufsemulator train ...``), which is
    what reads --set."""
    return any(a.endswith(WORKLOAD) and b == "train" for a, b in itertools.pairwise(command))


def check_sweep(spec: JobSpec) -> None:
    """Every point (--set with the sweep's values) against the config's schema, and the
    sweep's shape; SpecError for the first problem."""
    if spec.max_parallel is not None and not spec.sweep:
        raise SpecError(f"--max-parallel {spec.max_parallel} needs --sweep; expected a sweep")
    if spec.max_parallel is not None and spec.max_parallel < 1:
        raise SpecError(f"--max-parallel must be >= 1, got {spec.max_parallel}")
    if not spec.overrides and not spec.sweep:
        return
    if not runs_training(spec.command):
        raise SpecError(
            f"--set and --sweep change the training config, but the command is "
            f"{' '.join(spec.command)!r}; expected python3 -m ufsemulator train"
        )
    swept = {key for key, _ in spec.sweep}
    for text in spec.overrides:
        key = text.partition("=")[0].strip()
        if key in swept:
            raise SpecError(f"{SET_FLAG} {key} is also swept; expected it in one of the two")
    if spec.sweep and any(
        text.partition("=")[0].strip() == "output.run_dir"
        for text in (*spec.overrides, *(f"{k}=" for k, _ in spec.sweep))
    ):
        raise SpecError(
            "output.run_dir with --sweep would give every point one run folder; expected "
            "it unset (each task trains in runs/<array job id>_<task id>)"
        )
    all_points = points(spec) or [()]
    if len(all_points) > MAX_POINTS:
        raise SpecError(
            f"the sweep has {len(all_points)} points; expected at most {MAX_POINTS} "
            "(its script holds every point)"
        )
    if spec.sweep and len(all_points) < 2:
        raise SpecError(
            f"the sweep has 1 point ({', '.join(all_points[0])}); expected 2 or more "
            "(use --set for a single value)"
        )
    checker = config_checker()
    for index, point in enumerate(all_points):
        try:
            checker.check_overrides((*spec.overrides, *point))
        except ValueError as exc:
            where = f"sweep point {index} ({', '.join(point)}): " if point else f"{SET_FLAG}: "
            raise SpecError(f"{where}{exc}") from None
