"""JobSpec: the one place a job's resources live, validated before anything is rendered.

Both ``hpcdist render`` and ``hpcdist submit`` build a JobSpec from defaults < profile <
flags (``build_spec``) and never look at the flags again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from hpcdist.errors import SpecError
from hpcdist.profiles import Profile
from hpcdist.slurmtime import time_limit_seconds

Mode = Literal["threads", "gloo", "nccl", "test"]
Launcher = Literal["srun", "torchrun"]
MODES: tuple[str, ...] = ("threads", "gloo", "nccl", "test")
LAUNCHERS: tuple[str, ...] = ("srun", "torchrun")

# The default work of every job: the emulator training (or the communication check).
TRAIN_COMMAND = ("python3", "-m", "ufsemulator", "train")
COMMCHECK_COMMAND = ("python3", "-m", "hpcdist.commcheck", "--timeout", "60")

_DEFAULTS: dict[str, Any] = {
    "mode": "gloo",
    "nodes": 1,
    "gpus_per_node": 0,
    "memory": None,
    "time": "00:30:00",
    "launcher": "srun",
    "signal": "USR2@90",
    "requeue": True,
    "max_restarts": 3,
    "output": "%x-%j.out",
    "error": None,
    "workdir": None,
}

_FLAG_NAMES = {"memory": "--mem", "workdir": "--chdir"}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MEMORY = re.compile(r"\d+[KMGT]?")
_SIGNAL = re.compile(r"(B:)?(USR1|USR2|TERM|INT|HUP|URG|CONT)(@\d+)?")


@dataclass(frozen=True)
class JobSpec:
    mode: Mode
    nodes: int
    tasks_per_node: int
    cpus_per_task: int
    gpus_per_node: int
    time: str
    job_name: str
    output: str
    command: tuple[str, ...]
    launcher: Launcher = "srun"
    memory: str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    error: str | None = None
    workdir: str | None = None
    setup: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    signal: str | None = "USR2@90"
    requeue: bool = True
    max_restarts: int = 3
    profile: str = "local"

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node

    @property
    def srun_tasks_per_node(self) -> int:
        """Tasks srun starts on each node: one torchrun per node, else one per rank."""
        return 1 if self.launcher == "torchrun" else self.tasks_per_node

    @property
    def time_seconds(self) -> int:
        return time_limit_seconds(self.time)


def default_job_name(mode: str) -> str:
    return {"test": "hpcdist-commcheck"}.get(mode, f"ufsemulator-{mode}")


def build_spec(profile: Profile, flags: Mapping[str, Any]) -> JobSpec:
    """Merge defaults < profile < flags (flags that are None are unset) and validate."""
    merged: dict[str, Any] = dict(_DEFAULTS)
    merged.update(profile.defaults)
    merged.update(
        {k: v for k, v in {
            "partition": profile.partition,
            "account": profile.account,
            "qos": profile.qos,
        }.items() if v is not None}
    )
    merged.update({k: v for k, v in flags.items() if v is not None and v != ()})

    mode = str(merged["mode"])
    if mode not in MODES:
        raise SpecError(f"--mode {mode!r} is not a mode; expected one of {', '.join(MODES)}")
    gpus = int(merged["gpus_per_node"])
    if mode == "nccl" and gpus == 0:
        gpus = profile.gpus_per_node
    tasks = merged.get("tasks_per_node")
    if tasks is None:
        tasks = gpus if mode == "nccl" else 1
    cpus = merged.get("cpus_per_task")
    if cpus is None:
        cpus = _fair_cpus(profile, int(tasks))

    env = dict(profile.env)
    env.update(profile.nccl_env if mode == "nccl" else profile.gloo_env)
    env.update(dict(merged.get("env", ())))
    if mode == "test":
        # A smoke test has nothing to checkpoint: no warning signal, no requeue.
        merged["signal"], merged["requeue"] = None, False
    command = tuple(merged.get("command") or ())
    if not command:
        command = COMMCHECK_COMMAND if mode == "test" else TRAIN_COMMAND

    spec = JobSpec(
        mode=mode,  # type: ignore[arg-type]  # checked against MODES above
        nodes=int(merged["nodes"]),
        tasks_per_node=int(tasks),
        cpus_per_task=int(cpus),
        gpus_per_node=gpus if mode == "nccl" else int(merged["gpus_per_node"]),
        time=str(merged["time"]),
        job_name=str(merged.get("job_name") or default_job_name(mode)),
        output=str(merged["output"]),
        command=command,
        launcher=merged["launcher"],
        memory=None if merged["memory"] is None else str(merged["memory"]),
        partition=merged.get("partition"),
        account=merged.get("account"),
        qos=merged.get("qos"),
        error=merged.get("error"),
        workdir=merged.get("workdir"),
        setup=tuple(merged.get("setup") or profile.setup),
        env=tuple(env.items()),
        signal=merged.get("signal") or None,
        requeue=bool(merged["requeue"]),
        max_restarts=int(merged["max_restarts"]),
        profile=profile.name,
    )
    validate(spec, profile)
    return spec


def _fair_cpus(profile: Profile, tasks_per_node: int) -> int:
    """All of a node's cores, shared evenly by the tasks on it."""
    cores = profile.cores_per_node or 1
    return max(1, cores // max(1, tasks_per_node))


def validate(spec: JobSpec, profile: Profile) -> None:
    """Raise SpecError naming the first bad value and what was expected."""
    _check_text_values(spec)
    if spec.nodes < 1:
        raise SpecError(f"--nodes must be >= 1, got {spec.nodes}")
    if profile.max_nodes is not None and spec.nodes > profile.max_nodes:
        raise SpecError(
            f"--nodes {spec.nodes} exceeds profile {profile.name!r} limit of "
            f"{profile.max_nodes} nodes"
        )
    if spec.mode == "threads" and spec.nodes != 1:
        raise SpecError(f"--mode threads runs on exactly 1 node, got --nodes {spec.nodes}")
    if spec.mode == "threads" and spec.tasks_per_node != 1:
        raise SpecError(f"--mode threads runs 1 task, got --tasks-per-node {spec.tasks_per_node}")
    _check_gpus(spec, profile)
    if spec.tasks_per_node < 1:
        raise SpecError(f"--tasks-per-node must be >= 1, got {spec.tasks_per_node}")
    if spec.cpus_per_task < 1:
        raise SpecError(f"--cpus-per-task must be >= 1, got {spec.cpus_per_task}")
    cores = profile.cores_per_node
    if cores is not None and spec.tasks_per_node * spec.cpus_per_task > cores:
        raise SpecError(
            f"{spec.tasks_per_node} tasks x --cpus-per-task {spec.cpus_per_task} = "
            f"{spec.tasks_per_node * spec.cpus_per_task} CPUs per node exceeds profile "
            f"{profile.name!r} limit of {cores} cores per node"
        )
    seconds = time_limit_seconds(spec.time)
    if profile.max_time is not None and seconds > time_limit_seconds(profile.max_time):
        raise SpecError(
            f"--time {spec.time!r} exceeds profile {profile.name!r} limit of {profile.max_time}"
        )
    if profile.partitions and spec.partition not in profile.partitions:
        raise SpecError(
            f"--partition {spec.partition!r} is not in profile {profile.name!r}; "
            f"expected one of {', '.join(profile.partitions)}"
        )
    if spec.launcher not in LAUNCHERS:
        raise SpecError(f"--launcher {spec.launcher!r}; expected one of {', '.join(LAUNCHERS)}")
    if spec.memory is not None and not _MEMORY.fullmatch(spec.memory):
        raise SpecError(f"--mem {spec.memory!r}; expected a size such as 4000M, 16G or 0")
    if spec.signal is not None and not _SIGNAL.fullmatch(spec.signal):
        raise SpecError(f"--signal {spec.signal!r}; expected [B:]SIGNAL[@SECONDS], e.g. USR2@90")
    if spec.max_restarts < 0:
        raise SpecError(f"--max-restarts must be >= 0, got {spec.max_restarts}")
    for key, _ in spec.env:
        if not _ENV_NAME.fullmatch(key):
            raise SpecError(
                f"--env {key!r} is not a variable name; expected [A-Za-z_][A-Za-z0-9_]*"
            )
    if not spec.job_name.strip():
        raise SpecError("--job-name must not be empty")


def _check_gpus(spec: JobSpec, profile: Profile) -> None:
    if spec.mode != "nccl" and spec.gpus_per_node:
        raise SpecError(
            f"--gpus-per-node {spec.gpus_per_node} needs --mode nccl, got --mode {spec.mode}"
        )
    if spec.mode != "nccl":
        return
    if spec.gpus_per_node < 1:
        raise SpecError(
            f"--mode nccl needs --gpus-per-node >= 1; profile {profile.name!r} has no GPUs"
        )
    if spec.gpus_per_node > profile.gpus_per_node:
        raise SpecError(
            f"--gpus-per-node {spec.gpus_per_node} exceeds profile {profile.name!r} limit of "
            f"{profile.gpus_per_node} GPUs per node"
        )
    if spec.tasks_per_node != spec.gpus_per_node:
        raise SpecError(
            f"--mode nccl runs one task per GPU: --tasks-per-node {spec.tasks_per_node} "
            f"!= --gpus-per-node {spec.gpus_per_node}"
        )


def _check_text_values(spec: JobSpec) -> None:
    """Newlines and NULs would end a directive or a quoted word: refuse them outright."""
    for name, value in _text_values(spec):
        if "\n" in value or "\r" in value or "\x00" in value:
            shown = value.encode("unicode_escape").decode("ascii")
            raise SpecError(f"{name} {shown!r} contains a newline or NUL; expected one line")


def _text_values(spec: JobSpec) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for f in fields(spec):
        value = getattr(spec, f.name)
        flag = _FLAG_NAMES.get(f.name, "--" + f.name.replace("_", "-"))
        if isinstance(value, str):
            out.append((flag, value))
        elif f.name == "env":
            out.extend((f"--env {k}", f"{k}={v}") for k, v in value)
        elif isinstance(value, tuple):
            out.extend((flag, str(v)) for v in value)
    return out
