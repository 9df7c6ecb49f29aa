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
from hpcdist.hangs import COLLECTIVE_TIMEOUT_ENV
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
    "collective_timeout": None,
}

# Every NCCL job starts with NVLink SHARP multicast off: on shared hosts a program that uses
# it can take the GPUs out of service. A profile may turn it back on.
_NCCL_ENV: dict[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

_FLAG_NAMES = {"memory": "--mem", "workdir": "--chdir"}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MEMORY = re.compile(r"\d+[KMGT]?")
_SIGNAL = re.compile(r"(B:)?(USR1|USR2|TERM|INT|HUP|URG|CONT)(@\d+)?")


@dataclass(frozen=True)
class JobSpec:
    """A validated job request.

    In nccl mode ``gpus_per_node == 0`` means that no GPU count was given anywhere: the job
    takes whole nodes and its script counts the GPUs when it starts (``gpus_auto``). Then
    ``tasks_per_node`` is 0 too (one task per GPU, known only at run time), and so is
    ``cpus_per_task`` unless it was given (the node's CPUs shared by its GPUs' tasks).
    """

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
    collective_timeout: int | None = None  # seconds; reaches the ranks as an env variable

    @property
    def gpus_auto(self) -> bool:
        """nccl with no GPU count: whole nodes, one task per GPU counted at run time."""
        return self.mode == "nccl" and self.gpus_per_node == 0

    @property
    def cpus_auto(self) -> bool:
        """CPUs per task computed at run time: the node's CPUs over its GPUs."""
        return self.gpus_auto and self.cpus_per_task == 0

    @property
    def world_size(self) -> int:
        """Ranks of the job; 0 when the GPUs are counted at run time (``gpus_auto``)."""
        return self.nodes * self.tasks_per_node

    @property
    def srun_tasks_per_node(self) -> int:
        """Tasks srun starts on each node: one torchrun per node, else one per rank."""
        return 1 if self.launcher == "torchrun" else self.tasks_per_node

    @property
    def srun_cpus_per_task(self) -> int:
        """CPUs of each srun task: a torchrun per node holds the CPUs of all its ranks."""
        return self.cpus_per_task * (self.tasks_per_node if self.launcher == "torchrun" else 1)

    @property
    def warning_signal(self) -> str | None:
        """The name of the signal SLURM warns with before the time limit (``USR2`` of
        ``B:USR2@90``), or None."""
        if self.signal is None:
            return None
        return self.signal.removeprefix("B:").partition("@")[0]

    @property
    def warns_batch_shell(self) -> bool:
        """``--signal=B:...``: SLURM signals the batch shell alone, which passes it on."""
        return self.signal is not None and self.signal.startswith("B:")

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
    tasks = merged.get("tasks_per_node")
    cpus = merged.get("cpus_per_task")
    if mode == "nccl":
        gpus = _nccl_gpus(gpus, profile, flags.get("gpus_per_node"))
    if cpus is not None and int(cpus) < 1:
        raise SpecError(f"--cpus-per-task must be >= 1, got {cpus}")
    # nccl and the communication check on GPUs run one task per GPU over NCCL.
    on_gpus = mode == "nccl" or (mode == "test" and gpus > 0)
    if tasks is None:
        tasks = gpus if on_gpus else 1  # 0 in nccl mode: one per GPU counted at run time
    if cpus is None:
        cpus = 0 if mode == "nccl" and gpus == 0 else _fair_cpus(profile, int(tasks))

    env = dict(profile.env)
    if on_gpus:
        env.update(profile.nccl_env)
        for key, value in _NCCL_ENV.items():
            env.setdefault(key, value)
    else:
        env.update(profile.gloo_env)
    env.update(dict(merged.get("env", ())))
    timeout = merged.get("collective_timeout")
    if timeout is not None:
        if int(timeout) < 1:
            raise SpecError(f"--collective-timeout must be >= 1 second, got {timeout}")
        env[COLLECTIVE_TIMEOUT_ENV] = str(int(timeout))
    if mode == "test":
        # A smoke test has nothing to checkpoint: no warning signal, no requeue.
        merged["signal"], merged["requeue"] = None, False
    command = tuple(merged.get("command") or ())
    if not command:
        command = COMMCHECK_COMMAND if mode == "test" else TRAIN_COMMAND
        if mode == "test" and timeout is not None:
            command = (*COMMCHECK_COMMAND[:-1], str(int(timeout)))

    spec = JobSpec(
        mode=mode,  # type: ignore[arg-type]  # checked against MODES above
        nodes=int(merged["nodes"]),
        tasks_per_node=int(tasks),
        cpus_per_task=int(cpus),
        gpus_per_node=gpus,
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
        collective_timeout=None if timeout is None else int(timeout),
    )
    validate(spec, profile)
    return spec


def _nccl_gpus(gpus: int, profile: Profile, flag: object) -> int:
    """GPUs per node of an nccl job: the flag, else the profile's; 0 means count at run time."""
    if flag is not None and gpus < 1:
        raise SpecError(
            f"--gpus-per-node must be >= 1 for --mode nccl, got {gpus}; leave it out to use "
            "every GPU of each node, counted when the job starts"
        )
    return gpus or profile.gpus_per_node


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
    if spec.tasks_per_node < 1 and not spec.gpus_auto:
        raise SpecError(f"--tasks-per-node must be >= 1, got {spec.tasks_per_node}")
    if spec.cpus_per_task < 1 and not spec.cpus_auto:
        raise SpecError(f"--cpus-per-task must be >= 1, got {spec.cpus_per_task}")
    cores = profile.cores_per_node
    if cores is not None and spec.gpus_auto and spec.cpus_per_task > cores:
        raise SpecError(
            f"--cpus-per-task {spec.cpus_per_task} exceeds profile {profile.name!r} limit of "
            f"{cores} cores per node"
        )
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
    if spec.gpus_per_node < 0:
        raise SpecError(f"--gpus-per-node must be >= 0, got {spec.gpus_per_node}")
    if spec.mode not in ("nccl", "test") and spec.gpus_per_node:
        raise SpecError(
            f"--gpus-per-node {spec.gpus_per_node} needs --mode nccl or --mode test, "
            f"got --mode {spec.mode}"
        )
    # A profile without a GPU count (0) does not know the nodes' GPUs: nothing to check against.
    if profile.gpus_per_node and spec.gpus_per_node > profile.gpus_per_node:
        raise SpecError(
            f"--gpus-per-node {spec.gpus_per_node} exceeds profile {profile.name!r} limit of "
            f"{profile.gpus_per_node} GPUs per node"
        )
    if spec.gpus_auto:
        if spec.tasks_per_node != 0:
            raise SpecError(
                f"--tasks-per-node {spec.tasks_per_node} with --mode nccl needs a GPU count: "
                f"pass --gpus-per-node {spec.tasks_per_node} (one task per GPU), or neither "
                "to use every GPU of each node, counted when the job starts"
            )
        return
    if spec.gpus_per_node and spec.tasks_per_node != spec.gpus_per_node:
        raise SpecError(
            f"--mode {spec.mode} runs one task per GPU: --tasks-per-node {spec.tasks_per_node} "
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
