"""The local srun stand-in reads the launch line a rendered script gives srun."""

from __future__ import annotations

from hpcdist.distributed.localstep import Step, parse_srun, task_environ


def test_the_stand_in_starts_ntasks_ranks_when_the_script_names_them() -> None:
    step = parse_srun(["--nodes=2", "--ntasks=3", "--cpus-per-task=1", "python3", "x.py"])
    assert (step.tasks, step.command) == (3, ("python3", "x.py"))
    assert parse_srun(["--nodes=2", "--ntasks-per-node=2", "true"]).tasks == 4


def test_each_local_rank_has_its_nodes_id_as_srun_gives_it() -> None:
    # A torchrun launch line expands it per task for --node-rank.
    step = Step(tasks=2, cpus=None, command=("true",), kill_on_bad_exit=True)
    env = task_environ({"SLURM_NODEID": "7", "SLURM_JOB_ID": "9"}, step, 1, cores=2)
    assert env["SLURM_NODEID"] == "0"
    assert (env["SUBMITIT_LOCAL_GLOBALID"], env["SUBMITIT_LOCAL_JOB_ID"]) == ("1", "9")
