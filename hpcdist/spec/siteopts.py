"""Site options of a job: the first-class ones a real cluster asks for (constraint, mail,
node choice, GPU shape and type, binding, containers) and the pass-through ones
(``--sbatch KEY[=VALUE]``, ``--srun-arg``), merged built-in < profile < flags and checked.

A pass-through option must not say what hpcdist already says: an option hpcdist owns is
refused with the first-class flag to use instead, so that the rendered script and the user can
never ask SLURM for two different things.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from hpcdist.errors import SpecError
from hpcdist.slurm.nodelist import NodeListError, expand_nodelist
from hpcdist.spec.grammar import (
    check_constraint,
    check_exclusive,
    check_mail_type,
    check_memory,
    check_node_list_chars,
)
from hpcdist.spec.jobspec import (
    AUTO,
    CONTAINER_RUNTIMES,
    GPU_REQUESTS,
    JOB_OPTIONS,
    RANK_LOGS,
    JobSpec,
)
from hpcdist.spec.profiles import Profile

# sbatch options hpcdist writes itself, with the flag that sets each: declared on the
# JobSpec fields (``job_field(..., sbatch=..., owns=...)``), in field order, and the two
# that no single field decides. sbatch also takes a unique abbreviation of a long option
# (--nod for --nodes): a key that abbreviates one of these is refused as well.
OWNED_SBATCH: dict[str, str] = {
    **{name: option.flag_for(name) for option in JOB_OPTIONS for name in option.sbatch_options()},
    "gpus-per-task": "--gpus-per-node with --gpu-request gpus-per-task",
    # A requeued job appends to its log: one log per job.
    "open-mode": "hpcdist's own --open-mode=append (a requeued job keeps its log)",
}
# gres is the GPUs' when hpcdist asks for GPUs; otherwise (gres=nvme:1) it passes through.
_GRES_OWNER = "--gpus-per-node and --gpu-type"

# sbatch options that change the sbatch client itself (what it prints, whether it queues,
# what it queues, the environment the job starts with) rather than the job: hpcdist reads
# sbatch's answer and queues its own script, so each is refused with what to use instead.
SBATCH_CLIENT: dict[str, str] = {
    "parsable": "makes sbatch print the job id alone, which hpcdist reads as a failure",
    "quiet": "hides the job id sbatch prints, which hpcdist reads to follow the job",
    "wait": "makes sbatch wait for the job's end; use hpcdist submit --wait",
    "test-only": "makes sbatch queue nothing; use hpcdist submit --dry-run",
    "wrap": "replaces hpcdist's script by a command; use --command",
    "help": "makes sbatch print its help and queue nothing",
    "usage": "makes sbatch print its usage and queue nothing",
    "version": "makes sbatch print its version and queue nothing",
    "clusters": "queues the job on another cluster, where hpcdist cannot follow it",
}
# --export without ALL starts the job without the login environment that hpcdist's script
# needs (PATH to python, the activated environment, HPCDIST_* variables).
_EXPORT = "export"

# srun options hpcdist writes itself for the job step.
OWNED_SRUN: dict[str, str] = {
    "nodes": "--nodes",
    "ntasks": "--tasks-per-node",
    "ntasks-per-node": "--tasks-per-node",
    "cpus-per-task": "--cpus-per-task",
    "kill-on-bad-exit": "hpcdist's own --kill-on-bad-exit=1",
    "label": "--rank-logs label",
    "output": "--rank-logs split",
    "error": "--rank-logs split",
    "gpus": "--gpus-per-node",
    "gpus-per-node": "--gpus-per-node",
    "gpus-per-task": "--gpu-request gpus-per-task",
    "container-image": "--container",
    "container-mounts": "--container-mount",
}
_SRUN_SHORT = {
    "-N": "--nodes",
    "-n": "--ntasks",
    "-c": "--cpus-per-task",
    "-K": "--kill-on-bad-exit",
    "-l": "--label",
    "-o": "--output",
    "-e": "--error",
    "-G": "--gpus",
}

# Container options that would hide the job's environment (SLURM_*, MASTER_*, HPCDIST_*)
# from the ranks inside.
_ENV_HIDING = ("--cleanenv", "-e", "--containall", "-C", "--no-container-env")

_SBATCH_KEY = re.compile(r"[a-z][a-z0-9-]*[a-z0-9]")
_SRUN_ARG = re.compile(r"(--[a-z][a-z0-9-]*[a-z0-9](=.*)?|-[A-Za-z])", re.S)
_BIND = re.compile(r"[A-Za-z0-9_:,.]+")
_GPU_TYPE = re.compile(r"[A-Za-z0-9_.-]+")
_FEATURE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_MAIL_USER = re.compile(r"[^\s,;]+")


def parse_sbatch_option(item: str) -> tuple[str, str | None]:
    """``KEY[=VALUE]`` of --sbatch (a leading ``--`` is allowed): the key and its value, None
    for a flag. The key is checked with the job (``check_site``)."""
    key, sep, value = item.removeprefix("--").partition("=")
    return key, (value if sep else None)


def site_fields(profile: Profile, merged: Mapping[str, Any]) -> dict[str, Any]:
    """The site fields of a JobSpec that the profile's site keys (sbatch, srun_args,
    gpu_request, container) add to or default; every other site field is the merged flag or
    profile ``defaults:`` value as it is (``build_spec``)."""
    sbatch = {key.removeprefix("--"): value for key, value in profile.sbatch.items()}
    sbatch.update(dict(merged.get("sbatch_options") or ()))
    box = profile.container
    return {
        "gpu_request": merged.get("gpu_request") or profile.gpu_request or GPU_REQUESTS[0],
        "sbatch_options": tuple(sbatch.items()),
        "srun_args": (*profile.srun_args, *(merged.get("srun_args") or ())),
        "rank_logs": merged.get("rank_logs") or RANK_LOGS[0],
        "container": merged.get("container") or box.get("image"),
        "container_runtime": (
            merged.get("container_runtime") or box.get("runtime") or CONTAINER_RUNTIMES[0]
        ),
        "container_mounts": (*box.get("mounts", ()), *(merged.get("container_mounts") or ())),
        "container_options": (*box.get("options", ()), *(merged.get("container_options") or ())),
    }


def uses_gpus(spec: JobSpec) -> bool:
    """Whether hpcdist asks SLURM for GPUs for this job (a count, or counted at run time)."""
    return spec.gpus_per_node == AUTO or (
        isinstance(spec.gpus_per_node, int) and spec.gpus_per_node > 0
    )


def check_site(spec: JobSpec, profile: Profile) -> None:
    """Raise SpecError naming the first bad site value and what was expected."""
    _check_choice("--gpu-request", spec.gpu_request, GPU_REQUESTS)
    _check_choice("--rank-logs", spec.rank_logs, RANK_LOGS)
    _check_choice("--container-runtime", spec.container_runtime, CONTAINER_RUNTIMES)
    for key, value in spec.sbatch_options:
        _check_sbatch_key(key, spec)
        _check_sbatch_client(key, value)
    for arg in spec.srun_args:
        _check_srun_arg("--srun-arg", arg)
    _check_gpu_shape(spec, profile)
    _check_binding(spec)
    _check_mem_per_gpu(spec)
    _check_mail(spec)
    _check_nodes(spec)
    _check_constraint(spec.constraint, profile)
    _check_container(spec)


def _check_binding(spec: JobSpec) -> None:
    for flag, value in (("--cpu-bind", spec.cpu_bind), ("--gpu-bind", spec.gpu_bind)):
        if value is not None and not _BIND.fullmatch(value):
            raise SpecError(
                f"{flag} {value!r}; expected srun's binding such as cores, closest or map_cpu:0,1"
            )
    if spec.gpu_bind is not None and not uses_gpus(spec):
        raise SpecError(f"--gpu-bind {spec.gpu_bind!r} needs GPUs; the job asks for none")


def _check_mem_per_gpu(spec: JobSpec) -> None:
    if spec.mem_per_gpu is None:
        return
    check_memory("--mem-per-gpu", spec.mem_per_gpu)
    if spec.memory is not None:
        raise SpecError(
            f"--mem {spec.memory!r} and --mem-per-gpu {spec.mem_per_gpu!r}; expected "
            "one of them (sbatch takes only one memory request)"
        )
    if not uses_gpus(spec):
        raise SpecError(f"--mem-per-gpu {spec.mem_per_gpu!r} needs GPUs; the job asks for none")


def _check_mail(spec: JobSpec) -> None:
    if spec.mail_type is not None:
        check_mail_type("--mail-type", spec.mail_type)
    if spec.mail_user is not None and not _MAIL_USER.fullmatch(spec.mail_user):
        raise SpecError(f"--mail-user {spec.mail_user!r}; expected one address or user name")


def _check_nodes(spec: JobSpec) -> None:
    check_exclusive("--exclusive", spec.exclusive)
    if isinstance(spec.exclusive, str) and spec.gpus_auto:
        raise SpecError(
            f"--exclusive={spec.exclusive} with --mode nccl and no GPU count: such a job takes "
            "whole nodes (--exclusive) to count their GPUs when it starts; expected "
            "--gpus-per-node N, or --exclusive alone"
        )
    for flag, nodes in (("--nodelist", spec.nodelist), ("--exclude", spec.exclude)):
        if nodes is None or "/" in nodes:  # with a slash: a file of node names
            continue
        check_node_list_chars(flag, nodes)
        try:
            names = expand_nodelist(nodes, flag)
        except NodeListError as exc:
            raise SpecError(f"{exc} (SLURM refuses it)") from exc
        if flag == "--nodelist" and len(set(names)) > spec.nodes:
            raise SpecError(
                f"--nodelist {nodes!r} names {len(set(names))} nodes, more than --nodes "
                f"{spec.nodes}: SLURM 22.05 refuses the job, later releases run it on "
                f"{spec.nodes} of them; expected at most {spec.nodes} names, or --nodes "
                f"{len(set(names))}"
            )


def _check_choice(flag: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SpecError(f"{flag} {value!r}; expected one of {', '.join(choices)}")


# Owned options that mean something else than the flag that owns them: said as what they
# do, never as a name for that flag (ntasks-per-socket is no --tasks-per-node).
_OTHER_LAYOUT = {
    "ntasks-per-core": "counts tasks per core",
    "ntasks-per-socket": "counts tasks per socket",
    "ntasks-per-gpu": "counts tasks per GPU",
    "cpus-per-gpu": "counts CPUs per GPU",
    "gpus-per-socket": "counts GPUs per socket",
}


def _owner(owned: Mapping[str, str], name: str) -> str | None:
    """The first-class flag for option ``name`` or an abbreviation of one (sbatch and srun
    take ``--nod`` for ``--nodes``); None where hpcdist does not own it."""
    return owned.get(name) or next(
        (flag for full, flag in owned.items() if full.startswith(name)), None
    )


def _check_sbatch_key(key: str, spec: JobSpec) -> None:
    if not _SBATCH_KEY.fullmatch(key):
        raise SpecError(
            f"--sbatch key {key!r} is not an sbatch long option; expected lower-case "
            "letters, digits and dashes, e.g. --sbatch comment=site-test"
        )
    matches = [full for full in OWNED_SBATCH if full.startswith(key)]
    full = key if key in OWNED_SBATCH else matches[0] if len(matches) == 1 else None
    other = _OTHER_LAYOUT.get(full or "")
    if other is not None:
        raise SpecError(
            f"--sbatch {key!r} {other}, a layout hpcdist does not make: it gives each node "
            "--tasks-per-node tasks of --cpus-per-task CPUs each (and --gpus-per-node "
            "GPUs); expected those flags"
        )
    owner = _owner(OWNED_SBATCH, key)
    if owner is None and "gres".startswith(key) and uses_gpus(spec):
        owner = _GRES_OWNER
    if owner is not None:
        raise SpecError(f"--sbatch {key!r} is hpcdist's own option; use {owner} instead")


def _check_sbatch_client(key: str, value: str | None) -> None:
    """Refuse an option that changes sbatch itself rather than the job (SBATCH_CLIENT)."""
    shown = key if value is None else f"{key}={value}"
    reason = _owner(SBATCH_CLIENT, key)
    if reason is not None:
        raise SpecError(f"--sbatch {shown!r} {reason}; leave it out")
    # (an abbreviation of export is one of export-file too: sbatch refuses it as ambiguous)
    if key == _EXPORT:
        kinds = [word.strip().upper() for word in (value or "").split(",")]
        if "ALL" not in kinds:
            raise SpecError(
                f"--sbatch {shown!r} would start the job without the environment hpcdist's "
                "script needs (PATH, the activated environment); expected export=ALL[,VAR=VALUE] "
                "or --env VAR=VALUE"
            )


def _check_srun_arg(flag: str, arg: str) -> None:
    if not _SRUN_ARG.fullmatch(arg):
        raise SpecError(
            f"{flag} {arg!r} is not one srun option; expected --name[=value], e.g. --cpu-bind=cores"
        )
    name = _SRUN_SHORT.get(arg, arg).removeprefix("--").partition("=")[0]
    owner = _owner(OWNED_SRUN, name)
    if owner is not None:
        raise SpecError(f"{flag} {arg!r} is hpcdist's own srun option; use {owner} instead")


def _check_gpu_shape(spec: JobSpec, profile: Profile) -> None:
    gpu_type = spec.gpu_type
    if gpu_type is None:
        return
    if not _GPU_TYPE.fullmatch(gpu_type):
        raise SpecError(f"--gpu-type {gpu_type!r}; expected a GPU type name such as a100 or h100")
    if not uses_gpus(spec):
        raise SpecError(
            f"--gpu-type {gpu_type!r} needs GPUs: expected --mode nccl, or --mode test "
            f"with --gpus-per-node (got --mode {spec.mode}, profile {profile.name!r})"
        )
    if profile.gpu_types and gpu_type not in profile.gpu_types:
        raise SpecError(
            f"--gpu-type {gpu_type!r} is not in profile {profile.name!r}; expected one of "
            f"{', '.join(profile.gpu_types)}"
        )


def _check_constraint(constraint: str | None, profile: Profile) -> None:
    if constraint is None:
        return
    check_constraint("--constraint", constraint)
    if profile.features:
        for name in _FEATURE.findall(constraint):
            if name not in profile.features:
                raise SpecError(
                    f"--constraint {constraint!r}: feature {name!r} is not in profile "
                    f"{profile.name!r}; expected one of {', '.join(profile.features)}"
                )


def _check_container(spec: JobSpec) -> None:
    if spec.container is None:
        if spec.container_mounts or spec.container_options:
            raise SpecError(
                "--container-mount/--container-option without an image; "
                "expected --container IMAGE (or the profile's container.image)"
            )
        return
    if not spec.container.strip():
        raise SpecError("--container '' is empty; expected an image, e.g. docker://pytorch/pytorch")
    for option in spec.container_options:
        name = option.partition("=")[0]
        if name in _ENV_HIDING:
            raise SpecError(
                f"--container-option {option!r} would hide the job's SLURM_* and HPCDIST_* "
                "variables from the ranks; expected options that keep the environment"
            )
        if not option.startswith("-"):
            raise SpecError(
                f"--container-option {option!r}; expected a runtime option such as --writable-tmpfs"
            )
    for mount in spec.container_mounts:
        parts = mount.split(":")
        if (
            not mount
            or len(parts) > 3
            or not all(parts[:2])
            or (spec.container_runtime == "pyxis" and "," in mount)
        ):
            raise SpecError(
                f"--container-mount {mount!r}; expected SRC[:DST[:OPTS]], e.g. /scratch:/scratch"
            )
