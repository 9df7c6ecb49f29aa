"""How a CPU rank uses the cores it was given: compute threads, OpenMP's wait, the exchange.

A data-parallel CPU rank computes in OpenMP threads, then waits for the other ranks'
gradients. When every core of a node runs a compute thread, the step collapses: on a
64-core host, 4 ranks x 16 threads ran 20-70 ms a step where one rank alone ran 1.3 ms,
and even 4 independent copies that exchange nothing ran 4-8 ms (docs/benchmarks.md).
Idle OpenMP workers spin, the exchange (the shared-memory wait, the TCP exchange,
gloo's threads) and Python's own work have no core of their own, and every rank waits for
the slowest. Keeping a quarter of each rank's cores free brought the 4-rank step to
0.92-1.06x the slowest independent copy's (16 cores a rank: 12 threads; 8 cores: 6).

``cpu_layout`` is the one place that decides. The rendered scripts, ``submit``,
``hpcdist run`` and torchrun's ranks take its answer (``CpuLayout.env()``);
``--threads-per-task`` and ``--omp-wait-policy`` override it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# The rank's own CPU count, for its binding under torchrun (SLURM_CPUS_PER_TASK counts
# the whole torchrun's there).
CPUS_VAR = "HPCDIST_CPUS_PER_TASK"
KEEP_FRACTION = 4  # one core in four is kept free where ranks exchange gradients
WAIT_POLICIES = ("passive", "active")  # None: the OpenMP runtime's own default


@dataclass(frozen=True)
class CpuLayout:
    """``threads`` compute threads on ``cpus`` cores; ``cpus - threads`` are left to the
    gradient exchange. ``wait_policy``: what an idle OpenMP worker does (``passive``:
    sleeps at once, ``active``: spins; None: the runtime's default, which spins briefly,
    then sleeps, and measured fastest once cores are kept free)."""

    cpus: int
    threads: int
    wait_policy: str | None = None

    def __post_init__(self) -> None:
        if self.cpus < 1:
            raise ValueError(f"a task needs at least 1 CPU, got {self.cpus}")
        if not 1 <= self.threads <= self.cpus:
            raise ValueError(
                f"threads per task must be between 1 and the task's {self.cpus} CPUs, "
                f"got {self.threads}"
            )
        if self.wait_policy is not None and self.wait_policy not in WAIT_POLICIES:
            raise ValueError(
                f"OpenMP wait policy must be one of {', '.join(WAIT_POLICIES)}, "
                f"got {self.wait_policy!r}"
            )

    @property
    def exchange_cpus(self) -> int:
        return self.cpus - self.threads

    def env(self) -> Mapping[str, str]:
        """The variables a rank starts with (OpenMP and MKL read them at start-up)."""
        threads = str(self.threads)
        env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, CPUS_VAR: str(self.cpus)}
        if self.wait_policy is not None:
            env["OMP_WAIT_POLICY"] = self.wait_policy.upper()
        return env

    def describe(self) -> str:
        kept = f", {self.exchange_cpus} for the exchange" if self.exchange_cpus else ""
        wait = self.wait_policy or "the runtime's default"
        return (
            f"{self.threads} compute thread{'s' if self.threads != 1 else ''} on "
            f"{self.cpus} CPU{'s' if self.cpus != 1 else ''}{kept}; OpenMP wait: {wait}"
        )


def cpus_per_task(cores: int, tasks: int) -> int:
    """The one rule for a task's CPUs where none were asked for: the node's ``cores``
    shared evenly by its ``tasks`` (at least one each). Render, submit, ``hpcdist run``,
    the GPU count in a job and a local job's ranks all ask here."""
    return max(1, max(1, cores) // max(1, tasks))


def cpu_layout(
    cpus: int,
    ranks: int,
    threads: int | None = None,
    wait_policy: str | None = None,
) -> CpuLayout:
    """The layout for a task of ``cpus`` CPUs in a job of ``ranks`` ranks; ``threads``
    and ``wait_policy`` are the user's overrides (None: chosen here). A job of one rank
    exchanges nothing and computes on every core; otherwise a quarter of the cores (at
    least one, none where a rank has a single CPU) are kept for the exchange."""
    if threads is None:
        keep = 0 if ranks < 2 or cpus < 2 else max(1, cpus // KEEP_FRACTION)
        threads = cpus - keep
    return CpuLayout(cpus, threads, wait_policy)
