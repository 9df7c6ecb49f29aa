"""A JobSpec's SLURM request, built once: the ``#SBATCH`` directives in order, srun's options
and the command each srun task runs.

The template loops over ``sbatch_directives`` and ``srun_options``; ``hpcdist submit`` hands
the same rows to submitit (``submit.slurm_parameters``). A new sbatch option is one row here,
and ``render`` and ``submit`` cannot disagree about it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from hpcdist.dependency import dependency_value
from hpcdist.protocol import port_seed_shell, port_shell_expression
from hpcdist.spec import JOB_OPTIONS, Count, JobSpec
from hpcdist.sweep import array_range, task_command

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
        rows += [
            Directive("ntasks-per-node", _known(spec.srun_tasks_per_node)),
            Directive("cpus-per-task", _known(spec.srun_cpus_per_task)),
        ]
    rows.append(Directive("time", spec.time))
    # The options a field passes to sbatch as they are, declared on the field (job_field).
    for option in JOB_OPTIONS:
        value = getattr(spec, option.name)
        if option.sbatch is not None and value is not None:
            rows.append(Directive(option.sbatch, value))
    if isinstance(spec.gpus_per_node, int) and spec.gpus_per_node > 0:
        rows.append(Directive("gpus-per-node", spec.gpus_per_node))
    if spec.signal is not None:
        rows.append(Directive("signal", spec.signal))
    array = array_range(spec)
    if array is not None:
        rows.append(
            Directive(
                "array",
                array,
                comment=(
                    "One array task per point of the sweep, each a whole job of this shape"
                    + (f", at most {spec.max_parallel} at once." if spec.max_parallel else ".")
                ),
            )
        )
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
    words = [f"--nodes={spec.nodes}", f"--ntasks-per-node={ntasks}", f"--cpus-per-task={cpus}"]
    if spec.gpus_auto:
        words.append('${gpu_request:+"$gpu_request"}')
    # --kill-on-bad-exit ends every rank when one dies, instead of leaving the rest waiting
    # in a collective.
    words.append("--kill-on-bad-exit=1")
    return words


def torchrun_flags(
    nnodes: str, nproc: str, node_rank: str, endpoint: str, rdzv_id: str
) -> list[str]:
    """torchrun's flags for one agent per node meeting at ``endpoint`` (c10d rendezvous);
    the values are words for the script (shell expressions) or for argv (plain values)."""
    return [
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc}",
        f"--node-rank={node_rank}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={rdzv_id}",
    ]


def torchrun_command(torchrun: list[str], command: list[str]) -> list[str]:
    """``torchrun FLAGS`` followed by the job's command."""
    if (
        command[0] in ("python", "python3")
        and len(command) > 1
        and (command[1] == "-m" or not command[1].startswith("-"))
    ):
        # torchrun is itself the Python interpreter: hand it the module or script directly
        # (it knows no other interpreter option, such as -c).
        return torchrun + command[1:]
    return [*torchrun, "--no-python", *command]


def launch_argv(spec: JobSpec) -> list[str]:
    """The command srun starts on each node, already quoted word by word."""
    command = [shlex.quote(word) for word in task_command(spec)]
    if spec.sweep:
        # This array task's point: the script's case on SLURM_ARRAY_TASK_ID sets it.
        command.append(POINT_WORDS)
    if spec.launcher != "torchrun":
        return command
    nproc = GPUS_VAR if spec.gpus_auto else str(spec.tasks_per_node)
    torchrun = [
        "torchrun",
        *torchrun_flags(
            '"${SLURM_JOB_NUM_NODES}"',
            nproc,
            '"${SLURM_NODEID}"',
            '"${MASTER_ADDR}:${MASTER_PORT}"',
            '"${SLURM_JOB_ID}"',
        ),
    ]
    if spec.warning_signal:
        # SLURM signals every process of the step: torchrun itself would die of the warning
        # its ranks catch to checkpoint, so it ignores it (its ranks set their own handler).
        script = f'trap "" {spec.warning_signal} && exec "$@"'
        torchrun = ["bash", "-c", shlex.quote(script), "torchrun", *torchrun]
    return torchrun_command(torchrun, command)


# The batch script's (unexported) copy of the job's secret, read from its 0600 file.
SECRET_SHELL_VAR = "hpcdist_secret"


def torchrun_port_expression() -> str:
    """The torchrun rendezvous port in a batch script: the port srun's first step (step 0)
    would derive from the job's secret, so the script and hpcdist's submit path meet on
    the same formula."""
    return port_shell_expression(port_seed_shell(SECRET_SHELL_VAR), "0")
