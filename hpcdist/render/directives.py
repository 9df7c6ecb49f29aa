"""A JobSpec's SLURM request, built once: the ``#SBATCH`` directives in order, srun's options
and the command each srun task runs.

The template loops over ``sbatch_directives`` and ``srun_options``; ``hpcdist submit``
queues the rendered script itself. A new sbatch option is one row here.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from hpcdist.errors import SpecError
from hpcdist.facts.launch import (
    AGENT_WORDS,
    RANK_ENV_COMMAND,
    ignoring,
    per_node,
    rank_log_pattern,
    torchrun_command,
    torchrun_flags,
)
from hpcdist.render.container import container_prefix, container_srun_options
from hpcdist.spec.dependency import dependency_value
from hpcdist.spec.grammar import parse_signal
from hpcdist.spec.jobspec import JOB_OPTIONS, Count, JobSpec
from hpcdist.spec.logfolder import NOTE, moved_log
from hpcdist.spec.sweep import array_range, task_command

# Shell variables the nccl script sets when it counts the GPUs at run time (spec.gpus_auto).
GPUS_VAR, CPUS_VAR = '"$gpus"', '"$cpus"'
# The words of an array task's point (a bash array the rendered script sets).
POINT_WORDS = '"${point[@]}"'


@dataclass(frozen=True)
class Directive:
    """One ``#SBATCH --option[=value]`` line; ``value`` None is a flag such as --requeue."""

    option: str
    value: str | int | None = None
    comment: str = ""  # a line of explanation above the directive in a rendered script


def sbatch_directives(spec: JobSpec) -> list[Directive]:
    """Every directive of the job, in the order a person reads them."""
    rows = [Directive("job-name", spec.job_name), Directive("nodes", spec.nodes)]
    if spec.gpus_auto:
        rows.append(
            Directive(
                "exclusive",
                comment=(
                    "No GPU count was given: whole nodes; the script counts their GPUs "
                    "when it starts."
                ),
            )
        )
    else:
        rows += [_task_count(spec), Directive("cpus-per-task", _known(spec.srun_cpus_per_task))]
    rows.append(Directive("time", spec.time))
    # The options a field passes to sbatch as they are, declared on the field (job_field).
    for option in JOB_OPTIONS:
        value = getattr(spec, option.name)
        if option.sbatch is None or value is None or value is False:
            continue
        if value is True:  # a flag such as --exclusive
            if not any(row.option == option.sbatch for row in rows):
                rows.append(Directive(option.sbatch))
            continue
        moved = option.sbatch in ("output", "error") and moved_log(str(value))
        rows.append(Directive(option.sbatch, value, NOTE if moved else ""))
    rows += gpu_directives(spec)
    if spec.signal is not None:
        rows.append(Directive("signal", spec.signal, comment=f"The warning: {warning_text(spec)}."))
    rows += _array_rows(spec)
    dependency = dependency_value(spec.after)
    if dependency is not None:
        rows.append(Directive("dependency", dependency))
    if spec.requeue:
        rows += [
            Directive("requeue"),
            Directive(
                "open-mode",
                "append",
                comment=("A requeued job keeps writing to the same log instead of truncating it."),
            ),
        ]
    else:
        rows.append(Directive("no-requeue"))
    return _with_site_options(rows, spec)


def warning_text(spec: JobSpec) -> str:
    """Which signal the command gets before the time limit, and where (``--signal``): what
    ``render`` writes above the directive and ``submit`` prints."""
    if spec.signal is None:
        return "none; at the time limit SLURM sends TERM, then KILL"
    seconds = parse_signal("--signal", spec.signal).lead_s
    where = (
        "the batch shell, and hpcdist's runner passes it on to every rank"
        if spec.warns_batch_shell
        else "every rank (every process of the job step)"
    )
    return (
        f"SIG{spec.warning_signal} about {seconds} s before the time limit (SLURM may send it up "
        f"to a minute early) to {where}; hpcdist sends the command no other signal"
    )


def _array_rows(spec: JobSpec) -> list[Directive]:
    """The job array: a sweep's (one task per point), or --array's (every task this job)."""
    array = array_range(spec)
    if array is not None:
        at_once = f", at most {spec.max_parallel} at once." if spec.max_parallel else "."
        comment = "One array task per point of the sweep, each a whole job of this shape"
        return [Directive("array", array, comment=comment + at_once)]
    if spec.array is not None:
        comment = "Job array: every task runs this job; SLURM_ARRAY_TASK_ID tells them apart."
        return [Directive("array", spec.array, comment=comment)]
    return []


def _task_count(spec: JobSpec) -> Directive:
    """--ntasks (SLURM places the ranks: 3 over 2 nodes are 2 and 1), else per node."""
    if spec.ntasks is not None:
        return Directive("ntasks", spec.ntasks)
    return Directive("ntasks-per-node", _known(spec.srun_tasks_per_node))


def gpu_directives(spec: JobSpec) -> list[Directive]:
    """The GPU request in the shape the site wants (``gpu_request``, ``--gpu-type``)."""
    gpus = spec.gpus_per_node
    if not isinstance(gpus, int):
        if spec.gpu_type is not None:
            raise SpecError(
                f"--gpu-type {spec.gpu_type!r} needs a GPU count: pass --gpus-per-node N (a "
                "script that counts the GPUs when it starts asks for whole nodes, not a type)"
            )
        return []
    if gpus <= 0:
        return []
    typed = f"{spec.gpu_type}:" if spec.gpu_type else ""
    if spec.gpu_request == "gpus-per-task":
        # Under torchrun one task per node holds all of its node's GPUs.
        per_task = gpus // _known(spec.srun_tasks_per_node)
        return [Directive("gpus-per-task", f"{typed}{per_task}" if typed else per_task)]
    if spec.gpu_request == "gres" or spec.gpu_type:
        return [Directive("gres", f"gpu:{typed}{gpus}")]
    return [Directive("gpus-per-node", gpus)]


def _with_site_options(rows: list[Directive], spec: JobSpec) -> list[Directive]:
    """The profile's ``sbatch:`` and --sbatch's options after hpcdist's own rows (a key of
    both: the flag's value). Keys that name hpcdist's own rows are refused by validation;
    a row of the same name would still give way here, so that a line appears once."""
    site = dict(spec.sbatch_options)
    rows = [row for row in rows if row.option not in site]
    comment = "Site options: the profile's sbatch: keys, then --sbatch."
    for index, (option, value) in enumerate(site.items()):
        rows.append(Directive(option, value, comment if index == 0 else ""))
    return rows


def _known(count: Count) -> int:
    if not isinstance(count, int):
        raise ValueError(f"a count of {count!r} has no directive; the script counts it")
    return count


def srun_options(spec: JobSpec) -> list[str]:
    """srun's options for the job step, words for the script (shell expressions where the
    script counts GPUs at run time)."""
    torchrun = spec.launcher == "torchrun"
    if spec.gpus_auto:
        # Counted by the script itself; one torchrun per node takes all of its GPUs' CPUs.
        ntasks = "1" if torchrun else GPUS_VAR
        cpus = '"$(( cpus * gpus ))"' if torchrun else CPUS_VAR
    else:
        ntasks, cpus = str(spec.srun_tasks_per_node), str(spec.srun_cpus_per_task)
    words: list[str] = [
        f"--nodes={spec.nodes}",
        # --ntasks: SLURM places the ranks (block: 3 over 2 nodes are 2 and 1).
        f"--ntasks={spec.ntasks}"
        if spec.ntasks is not None
        else ShellWord(f"--ntasks-per-node={ntasks}"),
        ShellWord(f"--cpus-per-task={cpus}"),
    ]
    if spec.gpus_auto:
        words.append(ShellWord('${gpu_request:+"$gpu_request"}'))
    # --kill-on-bad-exit ends every rank when one dies, instead of leaving the rest waiting
    # in a collective.
    words.append("--kill-on-bad-exit=1")
    # The site's: binding, a pyxis container, then the profile's srun_args and --srun-arg.
    # These are plain values (the script quotes them).
    words += [f"--{name}={value}" for name, value in _binding(spec)]
    words += container_srun_options(spec)
    words += spec.srun_args
    return words


class ShellWord(str):
    """A word of srun's options that is already shell code (a count the script computes):
    the script writes it as it is, where every other word is quoted."""


def _binding(spec: JobSpec) -> list[tuple[str, str]]:
    pairs = [("cpu-bind", spec.cpu_bind), ("gpu-bind", spec.gpu_bind)]
    return [(name, value) for name, value in pairs if value is not None]


def rank_log_options(spec: JobSpec) -> list[str]:
    """srun's options for the ranks' output in a rendered script (``--rank-logs``): each line
    labelled with its rank, or one file per rank."""
    if spec.rank_logs == "label":
        return ["--label"]
    if spec.rank_logs == "split":
        words = [f"--output={rank_log_pattern(spec.output)}"]
        if spec.error is not None:
            words.append(f"--error={rank_log_pattern(spec.error)}")
        return words
    return []


def launch_argv(spec: JobSpec) -> list[str]:
    """The command srun starts on each node, already quoted word by word."""
    command = [shlex.quote(word) for word in task_command(spec)]
    if spec.sweep:
        # This array task's point: the script's case on SLURM_ARRAY_TASK_ID sets it.
        command.append(POINT_WORDS)
    wrapper = [shlex.quote(word) for word in container_prefix(spec)]
    if spec.launcher != "torchrun":
        # Under pyxis the command starts inside the image, which need not hold hpcdist;
        # apptainer's wrapper passes the variables in.
        pyxis = spec.container is not None and spec.container_runtime == "pyxis"
        return [*([] if pyxis else RANK_ENV_COMMAND), *wrapper, *command]
    nproc = GPUS_VAR if spec.gpus_auto else str(spec.tasks_per_node)
    flags = torchrun_flags('"${SLURM_JOB_NUM_NODES}"', nproc, '"${MASTER_ADDR}:${MASTER_PORT}"')
    if spec.warning_signal is None:
        shell, flag, script, *started = per_node(torchrun_command(["torchrun", *flags], command))
        return [*wrapper, shell, flag, shlex.quote(script), *started]
    # SLURM signals every process of the step: torchrun's agent outlives the warning (ignored
    # until it has started, then caught), its ranks get it as SLURM sent it.
    shell, flag, script, *started = ignoring([spec.warning_signal], [*AGENT_WORDS, *flags])
    return [*wrapper, shell, flag, shlex.quote(script), *torchrun_command(started, command)]
