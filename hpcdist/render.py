"""Render a JobSpec into an sbatch script with the Jinja templates in templates/."""

from __future__ import annotations

import shlex
from pathlib import Path

import jinja2

from hpcdist.exitcodes import REQUEUE_EXIT_CODE
from hpcdist.spec import JobSpec

VERSION = "0.1.0"


def template_dir() -> Path:
    """templates/ ships inside the wheel as hpcdist/templates; in a checkout it is at the top."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "templates", here.parent / "templates"):
        if (candidate / "base.sh.j2").is_file():
            return candidate
    raise FileNotFoundError(f"hpcdist templates not found beside {here}")


def quote(value: object, context: str = "shell") -> str:
    """The one quoting filter: every user value passes through it on its way into a script.

    ``shell`` quotes a word for bash. ``sbatch`` quotes a ``#SBATCH`` argument for sbatch's
    own parser, which bash never sees: that parser groups with double quotes and takes a
    backslash as an escape everywhere (also inside quotes), so shell quoting would lose
    backslashes there.
    """
    text = str(value)
    if context == "shell":
        return shlex.quote(text)
    if context == "sbatch":
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    raise ValueError(f"unknown quoting context {context!r}; expected 'shell' or 'sbatch'")


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["q"] = quote
    return env


# Shell variables the nccl script sets when it counts the GPUs at run time (spec.gpus_auto).
GPUS_VAR, CPUS_VAR = '"$gpus"', '"$cpus"'


def torchrun_flags(nnodes: str, nproc: str, node_rank: str, endpoint: str,
                   rdzv_id: str) -> list[str]:
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
    if command[0] in ("python", "python3") and len(command) > 1 and (
        command[1] == "-m" or not command[1].startswith("-")
    ):
        # torchrun is itself the Python interpreter: hand it the module or script directly
        # (it knows no other interpreter option, such as -c).
        return torchrun + command[1:]
    return [*torchrun, "--no-python", *command]


def launch_argv(spec: JobSpec) -> list[str]:
    """The command srun starts on each node, already quoted word by word."""
    command = [quote(word) for word in spec.command]
    if spec.launcher != "torchrun":
        return command
    nproc = GPUS_VAR if spec.gpus_auto else str(spec.tasks_per_node)
    torchrun = ["torchrun", *torchrun_flags(
        '"${SLURM_JOB_NUM_NODES}"', nproc, '"${SLURM_NODEID}"',
        '"${MASTER_ADDR}:${MASTER_PORT}"', '"${SLURM_JOB_ID}"')]
    if spec.warning_signal:
        # SLURM signals every process of the step: torchrun itself would die of the warning
        # its ranks catch to checkpoint, so it ignores it (its ranks set their own handler).
        script = f'trap "" {spec.warning_signal} && exec "$@"'
        torchrun = ["bash", "-c", quote(script), "torchrun", *torchrun]
    return torchrun_command(torchrun, command)


def render(spec: JobSpec) -> str:
    """The sbatch script text for a spec; pure, no file or process touched."""
    template = _environment().get_template(f"{spec.mode}.sh.j2")
    torchrun = spec.launcher == "torchrun"
    cpus_per_srun_task = spec.srun_cpus_per_task
    if spec.gpus_auto:
        # Counted by the script itself; one torchrun per node takes all of its GPUs' CPUs.
        srun_ntasks = "1" if torchrun else GPUS_VAR
        srun_cpus = '"$(( cpus * gpus ))"' if torchrun else CPUS_VAR
        threads_expr = CPUS_VAR
    else:
        srun_ntasks, srun_cpus = str(spec.srun_tasks_per_node), str(cpus_per_srun_task)
        # Under torchrun SLURM_CPUS_PER_TASK counts the node's share; each rank gets its own.
        threads_expr = str(spec.cpus_per_task) if torchrun else '"${SLURM_CPUS_PER_TASK:-1}"'
    return template.render(
        spec=spec,
        version=VERSION,
        cpus_per_srun_task=cpus_per_srun_task,
        srun_ntasks=srun_ntasks,
        srun_cpus=srun_cpus,
        threads_expr=threads_expr,
        launch_argv=launch_argv(spec),
        requeue_exit=REQUEUE_EXIT_CODE,
    )
