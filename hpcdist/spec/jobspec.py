"""JobSpec: the one place a job's resources live, validated before anything is rendered.

Each field is declared once, with its default, help text, flag and whether a profile may
preset it (``job_field``); the CLI options, the built-in defaults and the profile's
``defaults:`` keys are derived from these declarations. Both ``hpcdist render`` and
``hpcdist submit`` build a JobSpec from defaults < profile < flags (``build_spec``) and never
look at the flags again.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from hpcdist.facts.cpulayout import WAIT_POLICIES, CpuLayout, cpu_layout
from hpcdist.spec.grammar import parse_signal
from hpcdist.spec.joboption import DERIVED, JobOption, job_field, job_options

Mode = Literal["threads", "gloo", "nccl", "test"]
Launcher = Literal["srun", "torchrun"]
MODES: tuple[str, ...] = ("threads", "gloo", "nccl", "test")
LAUNCHERS: tuple[str, ...] = ("srun", "torchrun")
GPU_REQUESTS: tuple[str, ...] = ("gpus-per-node", "gres", "gpus-per-task")
RANK_LOGS: tuple[str, ...] = ("label", "split", "none")
CONTAINER_RUNTIMES: tuple[str, ...] = ("apptainer", "singularity", "pyxis")

# A count known when the job is rendered, or "auto": one task per GPU of each node, counted
# by the script when the job starts (nccl with no GPU count anywhere).
AUTO: Literal["auto"] = "auto"
Count = int | Literal["auto"]

# The default work of every job: the emulator training (or the communication check).
TRAIN_COMMAND = ("python3", "-m", "ufsemulator", "train")
COMMCHECK_COMMAND = ("python3", "-m", "hpcdist.distributed.commcheck", "--timeout", "60")

# Every NCCL job starts with NVLink SHARP multicast off: on shared hosts a program that uses
# it can take the GPUs out of service. A profile may turn it back on.
_NCCL_ENV: dict[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def runs_on_gpus(mode: str, gpus_per_node: Count) -> bool:
    """nccl, and the communication check with GPUs, run one task per GPU over NCCL."""
    return mode == "nccl" or (mode == "test" and gpus_per_node != 0)


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """A validated job request; ``build_spec`` makes one from defaults < profile < flags."""

    mode: Mode = job_field("gloo", "Kind of job.", choices=MODES)
    nodes: int = job_field(
        1,
        "Number of nodes (a range MIN-MAX only where MIN = MAX).",
        short="-N",
        value_type="nodes",
        owns=("nodes",),
    )
    tasks_per_node: Count = job_field(
        DERIVED,
        "Ranks per node (default: 1, or one per GPU for nccl).",
        value_type="int",
        profile=False,
        owns=(
            "ntasks-per-node",
            "ntasks-per-core",
            "ntasks-per-socket",
            "ntasks-per-gpu",
        ),
    )
    ntasks: int | None = job_field(
        None,
        "Ranks in all, spread over the nodes as SLURM places them (e.g. 3 over 2 nodes: 2 "
        "and 1), instead of --tasks-per-node; CPU jobs under the srun launcher.",
        value_type="int",
        profile=False,
        owns=("ntasks",),
    )
    cpus_per_task: Count = job_field(
        DERIVED,
        "CPUs (threads) per rank (default: the node's cores shared evenly).",
        short="-c",
        value_type="int",
        owns=("cpus-per-task", "cpus-per-gpu"),
    )
    threads_per_task: int | None = job_field(
        None,
        "Compute threads per rank of a CPU job (default: the CPU layout: every CPU for one "
        "rank; where ranks exchange gradients, a quarter of each rank's CPUs kept free).",
        value_type="int",
    )
    omp_wait_policy: str | None = job_field(
        None,
        "What idle OpenMP threads of a CPU job do: passive (sleep) or active (spin) "
        "(default: the OpenMP runtime's own, spin briefly then sleep).",
        choices=WAIT_POLICIES,
    )
    gpus_per_node: Count = job_field(
        0,
        "GPUs per node (nccl, test), or 'auto': every GPU of each node, counted when the "
        "job starts (nccl's default where the profile names no count).",
        value_type="count",
        owns=("gpus", "gpus-per-node", "gpus-per-socket"),
    )
    memory: str | None = job_field(
        None, "Memory per node, e.g. 16G or 0 (all).", flag="--mem", sbatch="mem"
    )
    time: str = job_field(
        "00:30:00", "Time limit, e.g. 30, 04:00:00, 1-12.", short="-t", owns=("time",)
    )
    partition: str | None = job_field(
        None, "Partition (default: the profile's).", short="-p", profile=False, sbatch="partition"
    )
    account: str | None = job_field(
        None,
        "Account to charge (default: the profile's).",
        short="-A",
        profile=False,
        sbatch="account",
    )
    qos: str | None = job_field(
        None, "Quality of service (default: the profile's).", profile=False, sbatch="qos"
    )
    job_name: str = job_field(
        DERIVED,
        "Job name (default: the --command's program, else ufsemulator-MODE).",
        short="-J",
        profile=False,
        owns=("job-name",),
    )
    output: str = job_field(
        "%x-%j.out",
        "The job's log (stdout), as sbatch's --output; SLURM patterns like %j.",
        short="-o",
        sbatch="output",
    )
    error: str | None = job_field(
        None,
        "The job's stderr, as sbatch's --error (default: with stdout).",
        short="-e",
        sbatch="error",
    )
    workdir: str | None = job_field(
        None, "Working directory of the job.", flag="--chdir", sbatch="chdir"
    )
    setup: tuple[str, ...] = job_field(
        DERIVED,
        "A setup line such as 'module load cuda', run after the profile's; repeatable.",
        multiple=True,
        profile=False,
    )
    env: tuple[tuple[str, str], ...] = job_field(
        (),
        "Extra environment variable, merged over the profile's; repeatable.",
        multiple=True,
        profile=False,
        metavar="KEY=VALUE",
    )
    launcher: Launcher = job_field(
        "srun", "srun starts every rank, or one torchrun per node.", choices=LAUNCHERS
    )
    command: tuple[str, ...] = job_field(
        DERIVED, "Command each rank runs (default: the ufsemulator training).", profile=False
    )
    signal: str | None = job_field(
        "USR2@90",
        "Warning signal before the time limit, e.g. USR2@90 or B:USR1@120.",
        owns=("signal",),
    )
    requeue: bool = job_field(
        True,
        "Requeue after a preemption or the warning signal.",
        flag="--requeue/--no-requeue",
        value_type="bool",
        owns=("requeue", "no-requeue"),
    )
    max_restarts: int = job_field(3, "Requeue at most this many times.", value_type="int")
    exclude_bad_nodes: bool = job_field(
        True,
        "Keep the run's requeued or resubmitted pieces off a node that a failure named (a "
        "rank's death, a network error), for --bad-node-hold.",
        flag="--exclude-bad-nodes/--no-exclude-bad-nodes",
        value_type="bool",
    )
    bad_node_hold: int = job_field(
        3600,
        "Seconds a node that a failure named stays excluded from the run's next pieces.",
        value_type="int",
        metavar="SECONDS",
    )
    collective_timeout: int | None = job_field(
        None,
        "Limit for joining the process group and for every collective: a hung peer "
        "fails the job after it (default 120; the communication check's 60).",
        value_type="int",
        metavar="SECONDS",
    )
    # Sweeps and chains (hpcdist.spec.sweep, hpcdist.spec.dependency): parsed in options.py.
    overrides: tuple[str, ...] = job_field(
        (),
        "A training config value, e.g. training.lr=3e-4 or model.hidden_sizes=[32,32] "
        "(dotted key, YAML value); repeatable.",
        flag="--set",
        multiple=True,
        profile=False,
        metavar="KEY=VALUE",
    )
    sweep: tuple[tuple[str, tuple[str, ...]], ...] = job_field(
        (),
        "Values of one config key to sweep; repeatable: one job-array task (a whole job of "
        "this shape) per point of the product of all --sweep values.",
        multiple=True,
        profile=False,
        metavar="KEY=V1,V2,...",
    )
    max_parallel: int | None = job_field(
        None,
        "Array tasks of a --sweep that run at once (sbatch --array=0-N%K).",
        value_type="int",
        profile=False,
        metavar="K",
    )
    array: str | None = job_field(
        None,
        "Job array task ids, as sbatch's --array: e.g. 0-15, 1,3,5-7 or 0-15:2%4 (at most 4 "
        "at once); every task runs the same job, SLURM_ARRAY_TASK_ID tells them apart.",
        profile=False,
        metavar="IDS[%K]",
        owns=("array",),
    )
    after: tuple[str, ...] = job_field(
        (),
        "Start only after job JOB has ended: ok (the default: completed), any, or notok; or "
        "any sbatch --dependency value (afterok:J+10, aftercorr:J, singleton, ? for any "
        "one); repeatable, all must hold.",
        multiple=True,
        profile=False,
        metavar="JOB[:ok|any|notok]|DEPENDENCY",
        owns=("dependency",),
    )
    # One run across jobs (hpcdist.facts.runs): checked in validate.py.
    continue_run: str | None = job_field(
        None,
        "Continue run RUN (a run id of `hpcdist list`), or the run of job JOB: the job "
        "trains on in that run's folder under its id; with --after JOB, a chain of jobs is "
        "one run.",
        flag="--continue",
        profile=False,
        metavar="RUN|JOB",
    )
    tracker_env: tuple[str, ...] = job_field(
        (),
        "An environment variable naming your tracker's run (WANDB_RUN_ID, "
        "NEPTUNE_CUSTOM_RUN_ID): set to the run id in every job of the run, so its metrics "
        "continue in one tracker run; repeatable.",
        multiple=True,
        metavar="VAR",
    )
    # Site options: what a real cluster asks of its jobs (hpcdist/spec/siteopts.py checks them).
    constraint: str | None = job_field(
        None, "Node features the job needs, e.g. 'a100&ib'.", sbatch="constraint"
    )
    exclusive: bool | str = job_field(
        False,
        "Whole nodes, shared with no other job; --exclusive=user or =mcs: shared only with "
        "your own jobs (or your MCS label's), as sbatch's --exclusive.",
        flag="--exclusive/--no-exclusive",
        value_type="exclusive",
        sbatch="exclusive",
    )
    reservation: str | None = job_field(None, "Run in this reservation.", sbatch="reservation")
    mem_per_gpu: str | None = job_field(
        None, "Memory per GPU, e.g. 40G (instead of --mem).", sbatch="mem-per-gpu"
    )
    mail_type: str | None = job_field(
        None, "When to mail, e.g. END,FAIL or ALL.", sbatch="mail-type"
    )
    mail_user: str | None = job_field(None, "Who gets the mail.", sbatch="mail-user")
    nodelist: str | None = job_field(
        None, "Run on these nodes, e.g. 'node[01-04]'.", sbatch="nodelist"
    )
    exclude: str | None = job_field(
        None, "Never run on these nodes, e.g. 'node07'.", sbatch="exclude"
    )
    gpu_type: str | None = job_field(
        None, "GPU type, e.g. a100: asks for gres gpu:TYPE:N.", metavar="TYPE"
    )
    gpu_request: str = job_field(
        DERIVED,
        "How the GPUs are asked for (default: the profile's gpu_request, else gpus-per-node).",
        choices=GPU_REQUESTS,
        profile=False,
    )
    gpu_bind: str | None = job_field(None, "srun --gpu-bind, e.g. closest.")
    cpu_bind: str | None = job_field(None, "srun --cpu-bind, e.g. cores.")
    sbatch_options: tuple[tuple[str, str | None], ...] = job_field(
        (),
        "Any other sbatch option, passed as it is after the profile's; repeatable.",
        flag="--sbatch",
        multiple=True,
        profile=False,
        metavar="KEY[=VALUE]",
    )
    srun_args: tuple[str, ...] = job_field(
        (),
        "Any other srun option of the job step, after the profile's; repeatable.",
        flag="--srun-arg",
        multiple=True,
        profile=False,
        metavar="--OPTION[=VALUE]",
    )
    rank_logs: str = job_field(
        "label",
        "Rank logs: label (srun --label), split (one file per rank) or none.",
        choices=RANK_LOGS,
    )
    container: str | None = job_field(
        None, "Run every rank in this container image (default: the profile's).", profile=False
    )
    container_runtime: str = job_field(
        DERIVED,
        "Container runtime (default: the profile's, else apptainer).",
        choices=CONTAINER_RUNTIMES,
        profile=False,
    )
    container_mounts: tuple[str, ...] = job_field(
        (),
        "A mount SRC[:DST[:OPTS]] of the container, after the profile's; repeatable.",
        flag="--container-mount",
        multiple=True,
        profile=False,
    )
    container_options: tuple[str, ...] = job_field(
        (),
        "A runtime option, after the profile's; repeatable.",
        flag="--container-option",
        multiple=True,
        profile=False,
    )
    profile: str = "local"
    profile_source: str = ""  # the profile's file, as the script's header names it

    @property
    def gpus_auto(self) -> bool:
        """nccl with no GPU count: whole nodes, one task per GPU counted at run time."""
        return self.gpus_per_node == AUTO

    @property
    def cpus_auto(self) -> bool:
        """CPUs per task computed at run time: the node's CPUs over its GPUs."""
        return self.cpus_per_task == AUTO

    @property
    def world_size(self) -> int | None:
        """Ranks of the job; None when the GPUs are counted at run time (``gpus_auto``)."""
        if self.ntasks is not None:
            return self.ntasks
        tasks = self.tasks_per_node
        return self.nodes * tasks if isinstance(tasks, int) else None

    @property
    def srun_tasks(self) -> int | None:
        """Tasks srun starts in all, each with its own label or log: one torchrun per node,
        else one per rank; None when the GPUs are counted at run time."""
        return self.nodes if self.launcher == "torchrun" else self.world_size

    @property
    def shape(self) -> str:
        """The job's ranks in words: ``2 nodes x 2 tasks`` or ``3 tasks over 2 nodes``."""
        if self.ntasks is not None:
            return f"{self.ntasks} tasks over {self.nodes} nodes"
        per_node = self.tasks_per_node
        tasks = f"{per_node} tasks" if isinstance(per_node, int) else "one task per GPU"
        return f"{self.nodes} nodes x {tasks}"

    @property
    def srun_tasks_per_node(self) -> Count:
        """Tasks srun starts on each node: one torchrun per node, else one per rank."""
        return 1 if self.launcher == "torchrun" else self.tasks_per_node

    @property
    def srun_cpus_per_task(self) -> Count:
        """CPUs of each srun task: a torchrun per node holds the CPUs of all its ranks."""
        if self.launcher != "torchrun":
            return self.cpus_per_task
        cpus, tasks = self.cpus_per_task, self.tasks_per_node
        return cpus * tasks if isinstance(cpus, int) and isinstance(tasks, int) else AUTO

    @property
    def on_gpus(self) -> bool:
        """Whether the ranks run on GPUs over NCCL (nccl, or the check with GPUs)."""
        return runs_on_gpus(self.mode, self.gpus_per_node)

    @property
    def cpu_layout(self) -> CpuLayout | None:
        """How each rank of a CPU job uses its CPUs (None: a GPU job, or CPUs counted at
        run time). The user's --threads-per-task was checked against --cpus-per-task where
        it entered (``validate``): it is taken as it is, never clamped here."""
        cpus, ranks = self.cpus_per_task, self.world_size
        if self.on_gpus or not isinstance(cpus, int) or ranks is None:
            return None
        return cpu_layout(cpus, ranks, self.threads_per_task, self.omp_wait_policy)

    @property
    def warning_signal(self) -> str | None:
        """The name of the signal SLURM warns with before the time limit (``USR2`` of
        ``B:USR2@90``), or None."""
        if self.signal is None:
            return None
        return parse_signal("--signal", self.signal).name

    @property
    def warns_batch_shell(self) -> bool:
        """``--signal=B:...``: SLURM signals the batch shell alone, which passes it on."""
        return self.signal is not None and parse_signal("--signal", self.signal).batch_shell


JOB_OPTIONS: tuple[JobOption, ...] = tuple(job_options(JobSpec))
DEFAULTS: dict[str, Any] = {o.name: o.default for o in JOB_OPTIONS if o.has_default}


def default_job_name(mode: str, command: Sequence[str] = ()) -> str:
    """The mode's name for hpcdist's own commands; for a --command, its program's: the
    script or module an interpreter or launcher runs (``python3 -m pkg.train`` -> train,
    ``torchrun --nproc-per-node=2 fit.py`` -> fit), else the program itself."""
    if not command:
        return {"test": "hpcdist-commcheck"}.get(mode, f"ufsemulator-{mode}")
    words = iter(command)
    name = ""
    for word in words:
        if word in ("-m", "-c"):  # a module is named; code inline is not
            module = next(words, "") if word == "-m" else ""
            own = {"ufsemulator": f"ufsemulator-{mode}", COMMCHECK_COMMAND[2]: "hpcdist-commcheck"}
            if module in own:  # hpcdist's own programs keep their names
                return own[module]
            name = module.rpartition(".")[2]
            break
        base = word.rpartition("/")[2]
        if "=" in word or word.startswith("-") or word.isdigit() or _RUNNER.fullmatch(base):
            continue  # an option or its count, a variable (env A=B), what runs the program
        name = base.removesuffix(".py").removesuffix(".sh")
        break
    name = _NAME_CHARS.sub("-", name).strip("-.")[:64]
    return name or f"hpcdist-{mode}"


# What runs a program rather than being it: interpreters, env, launchers.
_RUNNER = re.compile(r"python[0-9.]*|env|bash|sh|torchrun|accelerate|launch|uv|run|exec|srun")
_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
