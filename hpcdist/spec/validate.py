"""Validation of a JobSpec against its profile: the first bad value, named, with what was
expected, as a SpecError that the CLI prints as one line."""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import fields
from pathlib import Path

from hpcdist.errors import SpecError
from hpcdist.slurm.timelimit import parse_time_limit, time_limit_seconds
from hpcdist.spec.grammar import (
    DEFAULT_MAX_ARRAY_SIZE,
    MAX_NAME_BYTES,
    MAX_PATH_BYTES,
    array_last_id,
    check_length,
    check_memory,
    parse_signal,
    partitions,
)
from hpcdist.spec.jobspec import AUTO, JOB_OPTIONS, LAUNCHERS, JobSpec
from hpcdist.spec.loginpaths import check_login_paths
from hpcdist.spec.profiles import Profile
from hpcdist.spec.runopts import check_run_options
from hpcdist.spec.siteopts import check_site
from hpcdist.spec.sweep import check_sweep
from hpcdist.state.workfolder import check_working_folder

# The flag that sets each JobSpec field (the profile's name comes from --profile).
_FLAG_NAMES = {o.name: o.flag.partition("/")[0] for o in JOB_OPTIONS} | {
    "profile": "--profile",
    "profile_source": "--profile",
}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The longest values SLURM takes, in bytes (one more: "Pathname of a file, directory or
# other parameter too long").
MAX_NAME, MAX_PATH = MAX_NAME_BYTES, MAX_PATH_BYTES
_PATH_FIELDS = ("output", "error", "workdir")


def validate(spec: JobSpec, profile: Profile) -> None:
    """Raise SpecError naming the first bad value and what was expected."""
    _check_text_values(spec)
    _check_lengths(spec)
    _check_node_count(spec, profile)
    _check_gpus(spec, profile)
    _check_cpus(spec, profile)
    _check_time_and_limits(spec, profile)
    _check_job_environment(spec)
    _check_array(spec, profile)
    check_sweep(spec)
    check_run_options(spec)
    if spec.output.endswith(".sh"):
        raise SpecError(
            f"--output {spec.output!r} names the job's log, as in sbatch; expected "
            "a log name such as %x-%j.out (render writes the script with --script)"
        )
    check_site(spec, profile)
    # Last: the only check that looks at this machine's folders.
    check_login_paths(
        spec,
        current_folder(),
        lambda folder: Path(folder).is_dir(),
        lambda folder: check_working_folder(Path(folder), "the folder"),
    )


def _check_node_count(spec: JobSpec, profile: Profile) -> None:
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
    if spec.ntasks is not None:
        _check_ntasks(spec, spec.ntasks)


def _check_ntasks(spec: JobSpec, ntasks: int) -> None:
    """--ntasks: at least one task on every node; ranks srun places, on CPUs."""
    if ntasks < spec.nodes:
        raise SpecError(
            f"--ntasks {ntasks} is fewer than --nodes {spec.nodes}; SLURM starts at least "
            "one task on every node"
        )
    if spec.mode not in ("gloo", "test") or spec.on_gpus:
        got = f"--mode {spec.mode}"
        if spec.mode == "test":
            got += f" with --gpus-per-node {spec.gpus_per_node} (one task per GPU)"
        raise SpecError(
            f"--ntasks {ntasks} needs ranks on CPUs (--mode gloo, or --mode test without GPUs), "
            f"got {got}"
        )
    if spec.launcher == "torchrun":
        raise SpecError(
            f"--ntasks {ntasks} needs --launcher srun: torchrun starts the same number of "
            "ranks on every node (--tasks-per-node)"
        )


def _check_time_and_limits(spec: JobSpec, profile: Profile) -> None:
    """--time and the warning signal that must fit in it, the partition, launcher, memory,
    collective timeout and restarts."""
    seconds = time_limit_seconds(spec.time)
    most = _profile_time(profile)
    if most is not None and seconds > most:
        raise SpecError(
            f"--time {spec.time!r} exceeds profile {profile.name!r} limit of {profile.max_time}"
        )
    _check_partitions(spec, profile)
    if spec.launcher not in LAUNCHERS:
        raise SpecError(f"--launcher {spec.launcher!r}; expected one of {', '.join(LAUNCHERS)}")
    if spec.memory is not None:
        check_memory("--mem", spec.memory)
        _check_memory_fits(spec.memory, profile)
    if spec.signal is not None:
        _check_warning_fits(spec.signal, spec.time, seconds)
    if spec.collective_timeout is not None and spec.collective_timeout < 1:
        raise SpecError(f"--collective-timeout must be >= 1 second, got {spec.collective_timeout}")
    if spec.max_restarts < 0:
        raise SpecError(f"--max-restarts must be >= 0, got {spec.max_restarts}")
    if spec.bad_node_hold < 1:
        raise SpecError(f"--bad-node-hold must be >= 1 second, got {spec.bad_node_hold}")


def _check_memory_fits(memory: str, profile: Profile) -> None:
    """--mem above the memory of the profile's smallest node: SLURM would refuse the job
    (or, with other nodes, never start it)."""
    number = re.fullmatch(r"\+?([0-9]+)([KkMmGgTt]?)[Bb]?", memory)
    if profile.memory_mb is None or number is None:
        return
    scale = {"k": 1 / 1024, "": 1, "m": 1, "g": 1024, "t": 1024**2}[number[2].lower()]
    wanted = int(number[1]) * scale
    if wanted > profile.memory_mb:
        raise SpecError(
            f"--mem {memory!r} ({wanted:.0f} MB) exceeds the {profile.memory_mb} MB a node of "
            f"profile {profile.name!r} has; expected at most {profile.memory_mb}M, or 0 for "
            "all of a node's memory"
        )


def _check_array(spec: JobSpec, profile: Profile) -> None:
    """--array: SLURM's grammar and the site's MaxArraySize; a sweep makes its own array
    (one task per point)."""
    if spec.array is None:
        return
    last = array_last_id("--array", spec.array)
    most = profile.max_array_size
    if most is not None and last >= most:
        raise SpecError(
            f"--array {spec.array!r} has task id {last}; profile {profile.name!r} takes "
            f"ids up to {most - 1} (MaxArraySize {most})"
        )
    if most is None and last >= DEFAULT_MAX_ARRAY_SIZE:
        raise SpecError(
            f"--array {spec.array!r} has task id {last}; expected ids up to "
            f"{DEFAULT_MAX_ARRAY_SIZE - 1} (SLURM's default MaxArraySize)"
        )
    if spec.sweep:
        raise SpecError(
            f"--array {spec.array!r} with --sweep: the sweep makes the job array itself (one "
            "task per point); expected one of them (--max-parallel limits a sweep's tasks)"
        )


def _check_partitions(spec: JobSpec, profile: Profile) -> None:
    """--partition: one, or a comma list SLURM picks the first that can start the job from."""
    if spec.partition is None:
        return
    names = partitions(spec.partition)
    if not names:
        raise SpecError(f"--partition {spec.partition!r} names no partition; expected e.g. debug")
    for name in names:
        if profile.partitions and name not in profile.partitions:
            raise SpecError(
                f"--partition {spec.partition!r}: {name!r} is not in profile {profile.name!r}; "
                f"expected one or a comma list of {', '.join(profile.partitions)}"
            )


def _check_job_environment(spec: JobSpec) -> None:
    """--setup lines, --env names and the job's name."""
    for line in spec.setup:
        _check_setup_line(line)
    for key, _ in spec.env:
        if not _ENV_NAME.fullmatch(key):
            raise SpecError(
                f"--env {key!r} is not a variable name; expected [A-Za-z_][A-Za-z0-9_]*"
            )
    if not spec.job_name.strip():
        raise SpecError("--job-name must not be empty")


def current_folder() -> Path:
    """The folder relative paths start from; "." where it was removed under us (then no
    relative folder exists, and a message names the path as given)."""
    try:
        return Path.cwd()
    except OSError:
        return Path(".")


def _check_gpus(spec: JobSpec, profile: Profile) -> None:
    gpus = spec.gpus_per_node
    if not isinstance(gpus, int):
        if spec.mode != "nccl":
            raise SpecError(
                f"--gpus-per-node auto needs --mode nccl, got --mode {spec.mode}; "
                "expected a GPU count"
            )
        if spec.tasks_per_node != AUTO:
            raise SpecError(
                f"--tasks-per-node {spec.tasks_per_node} with --mode nccl needs a GPU count: "
                f"pass --gpus-per-node {spec.tasks_per_node} (one task per GPU), or neither "
                "to use every GPU of each node, counted when the job starts"
            )
        return
    if gpus < 0:
        raise SpecError(f"--gpus-per-node must be >= 0, got {gpus}")
    if spec.mode not in ("nccl", "test") and gpus:
        raise SpecError(
            f"--gpus-per-node {gpus} needs --mode nccl or --mode test, got --mode {spec.mode}"
        )
    # A profile without a GPU count (0) does not know the nodes' GPUs: nothing to check against.
    if profile.gpus_per_node and gpus > profile.gpus_per_node:
        raise SpecError(
            f"--gpus-per-node {gpus} exceeds profile {profile.name!r} limit of "
            f"{profile.gpus_per_node} GPUs per node"
        )
    if gpus and spec.tasks_per_node != gpus:
        raise SpecError(
            f"--mode {spec.mode} runs one task per GPU: --tasks-per-node {spec.tasks_per_node} "
            f"!= --gpus-per-node {gpus}"
        )


def _check_cpus(spec: JobSpec, profile: Profile) -> None:
    tasks, cpus, cores = spec.tasks_per_node, spec.cpus_per_task, profile.cores_per_node
    if isinstance(tasks, int) and tasks < 1:
        raise SpecError(f"--tasks-per-node must be >= 1, got {tasks}")
    if not isinstance(cpus, int):
        _check_threads(spec, 1)  # GPU counted at run time: --threads-per-task is refused
        return
    if cpus < 1:
        raise SpecError(f"--cpus-per-task must be >= 1, got {cpus}")
    _check_threads(spec, cpus)
    if cores is None:
        return
    if not isinstance(tasks, int) and cpus > cores:
        raise SpecError(
            f"--cpus-per-task {cpus} exceeds profile {profile.name!r} limit of "
            f"{cores} cores per node"
        )
    if isinstance(tasks, int) and tasks * cpus > cores:
        raise SpecError(
            f"{tasks} tasks x --cpus-per-task {cpus} = {tasks * cpus} CPUs per node exceeds "
            f"profile {profile.name!r} limit of {cores} cores per node"
        )


def _profile_time(profile: Profile) -> int | None:
    """The profile's max_time in seconds (None: none, or no limit such as UNLIMITED); a bad
    one is named as the profile's key."""
    if profile.max_time is None:
        return None
    return parse_time_limit(profile.max_time, profile.key("max_time"))


def _check_warning_fits(signal: str, time: str, limit_s: int) -> None:
    """A warning at or before the job's start leaves it no time to work: it would be
    warned, checkpoint and be requeued (or restarted) in a loop."""
    warning_s = parse_signal("--signal", signal).lead_s
    if warning_s >= limit_s:
        raise SpecError(
            f"--time {time!r} ({limit_s} s) leaves no time before --signal {signal!r} warns "
            f"{warning_s} s before the end; give a --time over {warning_s} s or a shorter "
            "warning"
        )


def _check_threads(spec: JobSpec, cpus: int) -> None:
    threads = spec.threads_per_task
    if threads is None:
        return
    if spec.on_gpus:
        raise SpecError(
            f"--threads-per-task {threads} is for CPU jobs; --mode {spec.mode} runs on GPUs"
        )
    if not 1 <= threads <= cpus:
        raise SpecError(
            f"--threads-per-task must be between 1 and --cpus-per-task {cpus}, got {threads}"
        )


def _check_setup_line(line: str) -> None:
    """A setup line is shell code, written as it is: it must be one complete line of bash
    (closed quotes, brackets and blocks), or the rest of the script would be read as part
    of it. bash itself is the judge (``bash -n``, which runs nothing)."""
    reason = _bash_syntax_error(line)
    if reason is not None:
        raise SpecError(
            f"--setup {line!r} is not a complete shell line ({reason}); expected "
            "e.g. 'module load cuda'"
        )


def _bash_syntax_error(line: str) -> str | None:
    """bash's complaint about ``line`` (its last line, without bash's own prefix), or None."""
    try:
        proc = subprocess.run(
            ["bash", "-n", "-c", line], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        try:  # no bash here: quotes at least must close
            shlex.split(line, comments=True)
        except ValueError as exc:
            return str(exc)
        return None
    lines = proc.stderr.strip().splitlines()
    if any("here-document" in line for line in lines):
        # bash only warns of a here-document that the line leaves open: the script's next
        # lines would be read into it, and the job would fail when it starts.
        return "a here-document (<<) that this line does not close"
    if proc.returncode == 0:
        return None
    if not lines:
        return "syntax error"
    return lines[-1].removeprefix("bash: ").removeprefix("-c: ")


def _check_lengths(spec: JobSpec) -> None:
    for option in JOB_OPTIONS:
        value = getattr(spec, option.name)
        if option.name != "job_name" and option.sbatch is None:
            continue
        limit = MAX_PATH if option.name in _PATH_FIELDS else MAX_NAME
        if isinstance(value, str):
            check_length(_FLAG_NAMES[option.name], value, limit)


def _check_text_values(spec: JobSpec) -> None:
    """Newlines and NULs would end a directive or a quoted word: refuse them outright."""
    for name, value in _text_values(spec):
        if "\n" in value or "\r" in value or "\x00" in value:
            raise SpecError(f"{name} {value!r} contains a newline or NUL; expected one line")


def _text_values(spec: JobSpec) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for f in fields(spec):
        value = getattr(spec, f.name)
        flag = _FLAG_NAMES[f.name]
        if isinstance(value, str):
            out.append((flag, value))
        elif f.name == "env":
            out.extend((f"--env {k}", f"{k}={v}") for k, v in value)
        elif f.name == "sbatch_options":
            out.extend((flag, k if v is None else f"{k}={v}") for k, v in value)
        elif isinstance(value, tuple):
            out.extend((flag, str(v)) for v in value)
    return out
