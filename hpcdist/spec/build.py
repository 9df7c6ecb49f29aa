"""A JobSpec from defaults < profile < flags: merged, derived, checked (``build_spec``).

The one way a JobSpec is made: the CLI, the committed scripts and the tests all call
``build_spec``. The fields it fills and the site fields come from the ``job_field``
declarations of ``jobspec``; ``siteopts`` and ``validate`` check the result.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpcdist.errors import SpecError
from hpcdist.facts.cpulayout import CPUS_VAR, cpus_per_task
from hpcdist.facts.leads import SIGNAL_LEAD_VAR
from hpcdist.facts.protocol import (
    COLLECTIVE_TIMEOUT_ENV,
    LOCAL_FOLDER_VAR,
    MARKER_VAR,
    RESTARTS_VAR,
    SECRET_VAR,
    SIGNAL_VAR,
)
from hpcdist.spec.grammar import node_count
from hpcdist.spec.joboption import JobOption
from hpcdist.spec.jobspec import (
    _NCCL_ENV,
    AUTO,
    COMMCHECK_COMMAND,
    DEFAULTS,
    JOB_OPTIONS,
    MODES,
    TRAIN_COMMAND,
    Count,
    JobSpec,
    default_job_name,
    runs_on_gpus,
)
from hpcdist.spec.profiles import Profile
from hpcdist.spec.siteopts import site_fields
from hpcdist.spec.validate import validate


def build_spec(profile: Profile, flags: Mapping[str, Any]) -> JobSpec:
    """Merge defaults < profile < flags (flags that are None are unset) and validate."""
    _refuse_empty(profile, flags)
    merged = _merged(profile, flags)
    mode = str(merged["mode"])
    if mode not in MODES:
        raise SpecError(f"--mode {mode!r} is not a mode; expected one of {', '.join(MODES)}")
    gpus = _gpus(mode, merged["gpus_per_node"], profile, flags.get("gpus_per_node"))
    on_gpus = runs_on_gpus(mode, gpus)
    tasks, cpus = _tasks_and_cpus(merged, profile, gpus, on_gpus)
    env = _environment(profile, merged, on_gpus)
    _drop_what_does_not_apply(merged, flags, mode, on_gpus)
    derived = {
        "mode": mode,
        "tasks_per_node": tasks,
        "cpus_per_task": cpus,
        "gpus_per_node": gpus,
        "job_name": str(
            merged.get("job_name") or default_job_name(mode, merged.get("command") or ())
        ),
        "command": _command(merged, mode),
        # The profile's setup (module loads, the environment's activation) comes first, then
        # the flag's lines: --setup adds to the site's setup as --env adds to its variables.
        "setup": (*profile.setup, *merged.get("setup", ())),
        "env": tuple(env.items()),
        "signal": merged.get("signal") or None,
        "profile": profile.name,
        "profile_source": profile.source,
        **site_fields(profile, merged),
    }
    # Every other field is the merged value as its job_field declaration types it: a new
    # declared field needs no line here.
    declared = {
        option.name: _as_declared(option, merged.get(option.name))
        for option in JOB_OPTIONS
        if option.name not in derived
    }
    spec = JobSpec(**declared, **derived)
    try:
        validate(spec, profile)
    except SpecError as exc:
        raise SpecError(_named_where_it_came_from(str(exc), profile, flags)) from None
    return spec


def _merged(profile: Profile, flags: Mapping[str, Any]) -> dict[str, Any]:
    """defaults < the profile's defaults and site < the flags that are set."""
    merged: dict[str, Any] = dict(DEFAULTS)
    merged.update(profile.defaults)
    site = {"partition": profile.partition, "account": profile.account, "qos": profile.qos}
    merged.update({k: v for k, v in site.items() if v is not None})
    merged.update({k: v for k, v in flags.items() if v is not None and v != ()})
    where = "--nodes" if flags.get("nodes") is not None else profile.key("defaults.nodes")
    merged["nodes"] = node_count(where, merged["nodes"])
    return merged


def _tasks_and_cpus(
    merged: Mapping[str, Any], profile: Profile, gpus: Count, on_gpus: bool
) -> tuple[Any, Any]:
    """Tasks per node (one per GPU, else one) and CPUs per task, where not given."""
    tasks, ntasks = merged.get("tasks_per_node"), merged.get("ntasks")
    if ntasks is not None:
        if tasks is not None:
            raise SpecError(
                f"--ntasks {ntasks} and --tasks-per-node {tasks}: give one (--ntasks spreads "
                "the ranks over the nodes as SLURM places them)"
            )
        # The most any node holds (block placement): what its CPUs are shared by.
        tasks = -(-int(ntasks) // int(merged["nodes"])) if int(ntasks) > 0 else 1
    elif tasks is None:
        tasks = gpus if on_gpus else 1
    elif not isinstance(tasks, int):
        raise SpecError(f"--tasks-per-node {tasks!r}; expected a number of tasks per node")
    cpus = merged.get("cpus_per_task")
    if cpus is None:
        cpus = _fair_cpus(profile, tasks) if isinstance(tasks, int) else AUTO
    return tasks, cpus


# Variables hpcdist itself gives every rank, with the flag that sets each: a value of the
# user's would reach the ranks on one path and not the other (the warning the runner traps
# is --signal's, the local executor shares its CPUs by the layout), so it is refused.
_OWNED_ENV = {
    SIGNAL_VAR: "--signal",
    SIGNAL_LEAD_VAR: "--signal (its @SECONDS)",
    CPUS_VAR: "--cpus-per-task",
    COLLECTIVE_TIMEOUT_ENV: "--collective-timeout",
    MARKER_VAR: "nothing: hpcdist's runner sets it for each job",
    SECRET_VAR: "nothing: hpcdist's runner sets it for each job",
    RESTARTS_VAR: "nothing: hpcdist's runner sets it for each job",
    LOCAL_FOLDER_VAR: "nothing: the local executor sets it for each job",
    "HPCDIST_RANK_ENV": "nothing: each rank's start sets it",
}
# A CPU job's thread counts are its CPU layout's (--threads-per-task, --omp-wait-policy).
_LAYOUT_ENV = {
    "OMP_NUM_THREADS": "--threads-per-task",
    "MKL_NUM_THREADS": "--threads-per-task",
    "OMP_WAIT_POLICY": "--omp-wait-policy",
}


def _environment(profile: Profile, merged: Mapping[str, Any], on_gpus: bool) -> dict[str, str]:
    """The profile's variables, its NCCL or gloo ones, then --env and the collective timeout."""
    side = "nccl_env" if on_gpus else "gloo_env"
    for key_name, values in (("env", profile.env), (side, _side_env(profile, on_gpus))):
        _check_owned_env(values, profile.key(key_name), on_gpus)
    _check_owned_env(dict(merged["env"]), "--env", on_gpus)
    env = dict(profile.env)
    if on_gpus:
        env.update(profile.nccl_env)
        for key, value in _NCCL_ENV.items():
            env.setdefault(key, value)
    else:
        env.update(profile.gloo_env)
    env.update(dict(merged["env"]))  # built-in default ()
    timeout = merged.get("collective_timeout")
    if timeout is not None:
        env[COLLECTIVE_TIMEOUT_ENV] = str(int(timeout))
    return env


def _side_env(profile: Profile, on_gpus: bool) -> Mapping[str, str]:
    return profile.nccl_env if on_gpus else profile.gloo_env


def _check_owned_env(values: Mapping[str, str], where: str, on_gpus: bool) -> None:
    owned = _OWNED_ENV if on_gpus else {**_OWNED_ENV, **_LAYOUT_ENV}
    for key, value in values.items():
        if key in owned:
            use = owned[key]
            instead = use if use.startswith("nothing") else f"use {use} instead"
            whose = " of a CPU job (its CPU layout)" if key in _LAYOUT_ENV else ""
            raise SpecError(
                f"{where} {f'{key}={value}'!r}: hpcdist sets {key} for every rank{whose} "
                f"itself; {instead}"
            )


def _drop_what_does_not_apply(
    merged: dict[str, Any], flags: Mapping[str, Any], mode: str, on_gpus: bool
) -> None:
    """Unset the merged values that the job's mode, or its running on CPUs, rules out."""
    if mode == "test":
        # A smoke test has nothing to checkpoint: no warning signal, no requeue.
        merged["signal"], merged["requeue"] = None, False
    if flags.get("mem_per_gpu") is not None and flags.get("memory") is None:
        merged["memory"] = None  # --mem-per-gpu replaces the profile's --mem
    if not on_gpus:
        # A profile's GPU defaults are for its GPU jobs; only a flag is an error on CPUs.
        for key in ("gpu_type", "mem_per_gpu"):
            if flags.get(key) is None:
                merged[key] = None


def _command(merged: Mapping[str, Any], mode: str) -> tuple[str, ...]:
    """The command given, else the mode's: training, or the smoke test's communication check
    (with the collective timeout, where one is set)."""
    command = tuple(merged.get("command") or ())
    if command:
        return command
    timeout = merged.get("collective_timeout")
    if mode == "test" and timeout is not None:
        return (*COMMCHECK_COMMAND[:-1], str(int(timeout)))
    return COMMCHECK_COMMAND if mode == "test" else TRAIN_COMMAND


# Profile keys whose values reach a field other than the one of the same name.
_PROFILE_KEYS = {"sbatch_options": "sbatch", "srun_args": "srun_args"}
_SITE_KEYS = ("partition", "account", "qos", "setup")


def _named_where_it_came_from(message: str, profile: Profile, flags: Mapping[str, Any]) -> str:
    """A refusal names the flag of the value; where no flag set it, the value came from
    the profile: the message names the profile's file and key instead."""
    for option in JOB_OPTIONS:
        flag = option.flag.split("/")[0]
        if not message.startswith(flag + " ") or flags.get(option.name) not in (None, ()):
            continue
        if option.name in profile.defaults:
            key = f"defaults.{option.name}"
        elif option.name in _PROFILE_KEYS and getattr(profile, _PROFILE_KEYS[option.name], None):
            key = _PROFILE_KEYS[option.name]
        elif option.name in _SITE_KEYS and getattr(profile, option.name, None):
            key = option.name
        else:
            return message  # the built-in default: the flag is the way to change it
        return profile.key(key) + message[len(flag) :]
    return message


# Lists of words where an empty word is a mistake (command words and --env values may be
# empty on purpose: an empty argument, X=).
_WORD_LISTS = ("setup", "srun_args", "overrides", "container_mounts", "container_options")


def _refuse_empty(profile: Profile, flags: Mapping[str, Any]) -> None:
    """An empty value is never what a user means: SLURM refuses some (``--output=""``
    fails the job at launch) and others would be dropped silently. Named where it came
    from: the flag, or the profile file and key."""
    site = {
        "partition": profile.partition,
        "account": profile.account,
        "qos": profile.qos,
        "setup": profile.setup,
    }
    for source, values in (("flag", flags), ("defaults", profile.defaults), ("site", site)):
        for option in JOB_OPTIONS:
            if option.name not in values:
                continue
            value = values[option.name]
            words = value if option.name in _WORD_LISTS and isinstance(value, list | tuple) else ()
            if not (isinstance(value, str) and not value.strip()) and not any(
                isinstance(word, str) and not word.strip() for word in words
            ):
                continue
            if source == "flag":
                where = option.flag
            elif source == "defaults":
                where = profile.key(f"defaults.{option.name}")
            else:
                where = profile.key(option.name)
            raise SpecError(f"{where} is empty ({value!r}); leave it out or give a value")


def _gpus(mode: str, value: Count, profile: Profile, flag: object) -> Count:
    """GPUs per node: the flag, else the profile's; an nccl job with neither counts them."""
    if mode != "nccl":
        return value
    if isinstance(flag, int) and flag < 1:
        raise SpecError(
            f"--gpus-per-node must be >= 1 for --mode nccl, got {flag}; leave it out (or pass "
            "'auto') to use every GPU of each node, counted when the job starts"
        )
    return value or profile.gpus_per_node or AUTO


def _fair_cpus(profile: Profile, tasks_per_node: int) -> int:
    """All of a node's cores, shared evenly by the tasks on it."""
    return cpus_per_task(profile.cores_per_node or 1, tasks_per_node)


def _as_declared(option: JobOption, value: Any) -> Any:
    """A merged value in the type its declaration names (a flag, a profile or the default)."""
    if option.multiple:
        return tuple(value or ())
    if option.value_type == "bool":
        return bool(value)
    if option.value_type == "exclusive":
        # True (whole nodes), False, or a kind (user, mcs) that validation checks.
        return value if isinstance(value, str) and value not in ("", "true") else bool(value)
    if option.value_type == "nodes":
        return node_count("--nodes", value)
    if value is None:
        return None
    if option.value_type == "int":
        return int(value)
    if option.value_type == "str":
        return str(value)
    return value
