"""The CPU layout: compute threads per rank, the cores kept for the gradient exchange,
and how it reaches the rendered script, submit and the rank itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hpcdist.distributed.cpubind import cpus_per_rank, rank_cpus
from hpcdist.errors import SpecError
from hpcdist.facts.cpulayout import CPUS_VAR, CpuLayout, cpu_layout, cpus_per_task
from hpcdist.render.script import render
from hpcdist.spec.options import spec_from_options


@pytest.mark.parametrize(
    ("cpus", "ranks", "threads"),
    [
        (1, 4, 1),  # one CPU: nothing to keep
        (2, 2, 1),  # the smallest rank that can keep one
        (3, 2, 2),
        (4, 4, 3),  # a quarter is one core
        (7, 4, 6),
        (8, 4, 6),  # a quarter is two
        (16, 4, 12),
        (40, 4, 30),  # the cpu-cluster profile's node
        (64, 2, 48),
        (16, 1, 16),  # one rank exchanges nothing: every core computes
        (40, 1, 40),
    ],
)
def test_ranks_that_exchange_keep_a_quarter_of_their_cores(
    cpus: int, ranks: int, threads: int
) -> None:
    layout = cpu_layout(cpus, ranks)
    assert (layout.cpus, layout.threads) == (cpus, threads)
    assert layout.exchange_cpus == cpus - threads
    assert layout.wait_policy is None


def test_the_users_threads_and_wait_policy_win() -> None:
    layout = cpu_layout(16, 4, threads=16, wait_policy="passive")
    assert (layout.threads, layout.exchange_cpus) == (16, 0)
    assert layout.env() == {
        "OMP_NUM_THREADS": "16",
        "MKL_NUM_THREADS": "16",
        CPUS_VAR: "16",
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    assert "OMP_WAIT_POLICY" not in cpu_layout(16, 4).env()


@pytest.mark.parametrize(
    ("cpus", "threads", "wait", "message"),
    [
        (0, 1, None, "at least 1 CPU, got 0"),
        (4, 0, None, "between 1 and the task's 4 CPUs, got 0"),
        (4, 5, None, "between 1 and the task's 4 CPUs, got 5"),
        (4, 4, "lazy", "one of passive, active, got 'lazy'"),
    ],
)
def test_impossible_layouts_are_refused_with_the_value(
    cpus: int, threads: int, wait: str | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        CpuLayout(cpus, threads, wait)


def _script(**flags: Any) -> str:
    return render(spec_from_options({"profile": None, **flags}))


def test_cpu_cluster_render_keeps_ten_of_forty_cores_for_the_exchange() -> None:
    script = _script(profile="cpu-cluster", mode="gloo", nodes=4)
    assert "#SBATCH --cpus-per-task=40\n" in script
    assert "export OMP_NUM_THREADS=30\nexport MKL_NUM_THREADS=30\n" in script
    assert f"export {CPUS_VAR}=40\n" in script
    assert "# CPU layout: 30 compute threads on 40 CPUs, 10 for the exchange" in script
    assert "OMP_WAIT_POLICY" not in script


def test_local_profile_render_keeps_one_of_two_cpus_for_the_exchange() -> None:
    script = _script(mode="gloo", nodes=4)
    assert "export OMP_NUM_THREADS=1\n" in script
    assert f"export {CPUS_VAR}=2\n" in script


def test_a_single_rank_computes_on_every_cpu() -> None:
    script = _script(profile="cpu-cluster", mode="threads")
    assert "export OMP_NUM_THREADS=40\n" in script


@pytest.mark.parametrize("threads", [1, 40])
def test_threads_per_task_reaches_the_script_at_both_ends(threads: int) -> None:
    script = _script(
        profile="cpu-cluster",
        mode="gloo",
        nodes=2,
        threads_per_task=threads,
        omp_wait_policy="active",
    )
    assert f"export OMP_NUM_THREADS={threads}\n" in script
    assert "export OMP_WAIT_POLICY=ACTIVE\n" in script


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            {"threads_per_task": 0},
            "--threads-per-task must be between 1 and --cpus-per-task 40, got 0",
        ),
        (
            {"threads_per_task": 41},
            "--threads-per-task must be between 1 and --cpus-per-task 40, got 41",
        ),
        (
            {"mode": "nccl", "gpus_per_node": 2, "threads_per_task": 4},
            "--threads-per-task 4 is for CPU jobs; --mode nccl runs on GPUs",
        ),
    ],
)
def test_impossible_thread_counts_are_refused_before_rendering(
    flags: dict[str, Any], message: str
) -> None:
    options = {"profile": "cpu-cluster", "mode": "gloo", "nodes": 2, **flags}
    with pytest.raises(SpecError) as caught:
        spec_from_options(options)
    assert str(caught.value) == message


def test_the_rendered_script_gives_the_ranks_the_layout() -> None:
    spec = spec_from_options({"profile": "cpu-cluster", "mode": "gloo", "nodes": 4})
    script = render(spec)
    layout = spec.cpu_layout
    assert layout is not None
    for key, value in layout.env().items():
        assert f"export {key}={value}\n" in script
    assert layout.env()["OMP_NUM_THREADS"] == "30"


@pytest.mark.parametrize(
    ("cores", "tasks", "cpus"), [(40, 1, 40), (40, 4, 10), (40, 3, 13), (2, 4, 1), (0, 1, 1)]
)
def test_cpus_per_task_shares_the_cores_evenly_at_least_one(
    cores: int, tasks: int, cpus: int
) -> None:
    assert cpus_per_task(cores, tasks) == cpus


def test_a_local_rank_fits_the_layout_to_the_cores_it_shares() -> None:
    from hpcdist.distributed.localstep import Step, task_environ

    script_env = {"OMP_NUM_THREADS": "30", "HPCDIST_CPUS_PER_TASK": "40", "SLURM_JOB_ID": "7"}
    step = Step(tasks=2, cpus=40, command=("true",), kill_on_bad_exit=True)
    env = task_environ(script_env, step, rank=1, cores=6)
    # 6 cores for 2 ranks: 3 CPUs each, one kept for the exchange.
    assert (env["HPCDIST_CPUS_PER_TASK"], env["OMP_NUM_THREADS"]) == ("3", "2")
    assert (env["SUBMITIT_LOCAL_GLOBALID"], env["SUBMITIT_LOCAL_NTASKS"]) == ("1", "2")
    assert "SLURM_JOB_ID" not in env
    gpu = task_environ({"SLURM_JOB_ID": "7"}, step, rank=0, cores=6)
    assert "OMP_NUM_THREADS" not in gpu  # a GPU job's script sets no layout


@pytest.mark.parametrize(
    ("value", "expected"),
    [("16", 16), ("1", 1), ("0", None), ("-2", None), ("x", None), ("", None)],
)
def test_the_layouts_cpu_share_is_read_only_when_it_is_a_count(
    value: str, expected: int | None
) -> None:
    assert cpus_per_rank({CPUS_VAR: value}) == expected


def test_under_torchrun_each_rank_binds_its_whole_share_not_only_its_threads() -> None:
    allowed = list(range(64))
    blocks = [rank_cpus(allowed, r, 4, 12, share=16) for r in range(4)]
    assert blocks == [tuple(range(16 * r, 16 * (r + 1))) for r in range(4)]
    # Without the share, the block is the threads (as before the layout existed).
    assert rank_cpus(allowed, 1, 4, 12) == tuple(range(12, 24))


def test_a_share_bigger_than_the_set_leaves_the_binding_to_slurm() -> None:
    # srun already gave this task its own 16 CPUs: nothing to split.
    assert rank_cpus(list(range(16)), 1, 4, 12, share=16) is None


def test_the_rank_uses_the_layouts_threads_not_slurms_cpu_count() -> None:
    from hpcdist.distributed.distenv import DistEnv

    env = {
        "SLURM_JOB_ID": "7",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_TASKS_PER_NODE": "1(x2)",
        "SLURM_CPUS_PER_TASK": "40",
        "OMP_NUM_THREADS": "30",
    }
    assert DistEnv.from_environ(env).num_threads == 30
    del env["OMP_NUM_THREADS"]
    assert DistEnv.from_environ(env).num_threads == 40


def test_committed_scripts_carry_the_layout() -> None:
    root = Path(__file__).resolve().parents[2]
    # Rendered with `generic` (nothing of a site assumed): 1 CPU a rank, its one thread.
    multinode = (root / "hpc" / "train_distributed_multinode.sh").read_text()
    assert "export OMP_NUM_THREADS=1\n" in multinode
    assert f"export {CPUS_VAR}=1\n" in multinode
    # --cpus-per-task 40 for the one rank of the threads job: every CPU computes.
    threads = (root / "hpc" / "train.sh").read_text()
    assert "export OMP_NUM_THREADS=40\n" in threads
    assert f"export {CPUS_VAR}=40\n" in threads
