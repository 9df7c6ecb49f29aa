"""A rank killed on one node by a signal of its node (a bus error: a memory fault): the run
is requeued without that node and completes.

The training is the real `python3 -m ufsemulator train` in a script rendered by hpcdist,
submitted with plain sbatch (tests/integration/test_faults.py's job); its run folder is
runs/<job id> under tmp_path.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import SlurmCluster, run_slurm, sbatch, slurm_env, squeue
from tests.integration.test_faults import (
    ENDLESS,
    _finish_after,
    _follow,
    _log,
    _rank_pid,
    _training_job,
    _wait_for,
)


def _end_once_requeued(tmp_path: Path, name: str, job_id: int) -> None:
    """The first piece trains until the test breaks it (it never ends by itself): once hpcdist
    has requeued the job (SLURM holds it), the piece that resumes is given its end, a few
    epochs past the checkpoint."""
    _wait_for(
        lambda: "requeueing job" in _log(tmp_path, name, job_id) and squeue(job_id)[0] == "PENDING",
        300,
        "the requeue after the failure",
        job_id,
        lambda: _log(tmp_path, name, job_id),
    )
    _finish_after(tmp_path / f"{name}.yaml", tmp_path / "runs" / str(job_id))


def _node_of(pid: int) -> str:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    names = [v.split(b"=", 1)[1] for v in environ if v.startswith(b"SLURMD_NODENAME=")]
    return names[0].decode()


@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_a_killed_rank_requeues_the_run_without_its_node_and_it_completes(
    slurm_cluster: SlurmCluster, tmp_path: Path, launcher: str
) -> None:
    script = _training_job(tmp_path, "badnode", ENDLESS, launcher=launcher)
    job = sbatch(script, cwd=tmp_path, wait=False)
    checkpoint = tmp_path / "runs" / str(job.job_id) / "checkpoint.pt"
    _wait_for(checkpoint.exists, 180, "the first checkpoint", job.job_id)
    variable = "SLURM_PROCID" if launcher == "srun" else "RANK"
    pid = _rank_pid(str(tmp_path / "badnode.yaml"), 1, variable)
    assert pid is not None, "rank 1's process not found"
    bad = _node_of(pid)  # node2 on an idle testbed, where a 2-node job gets node[1-2]
    os.kill(pid, signal.SIGBUS)
    _end_once_requeued(tmp_path, "badnode", job.job_id)
    state = _follow(job.job_id, timeout=600)
    log = _log(tmp_path, "badnode", job.job_id)
    assert state == "COMPLETED", log
    # srun names the task it saw killed ("Bus error", "(core dumped)" where a core was
    # written); under torchrun the agent names its rank.
    said = re.search(r"task 1 Bus error(?: \(core dumped\))?", log) if launcher == "srun" else None
    why = said[0] if said else "rank 1 SIGBUS"
    assert f"hpcdist: node {bad} named by {why}" in log, log
    assert f"hpcdist: excluding node {bad} from the next piece" in log, log
    assert f"hpcdist: a node failed the step, requeueing job {job.job_id}" in log, log
    # The TERM of hpcdist's own requeue is not taken for the command's (Lightning's).
    assert "was requeued by scontrol requeue" not in log, log
    assert f"hpcdist: this run is kept off node {bad} ({why}, until " in log, log
    pieces = re.findall(r"^hpcdist: job \d+ on (\S+), restart (\d+)$", log, re.M)
    assert [restart for _, restart in pieces] == ["0", "1"], log
    second = run_slurm("scontrol", "show", "hostnames", pieces[1][0]).stdout.split()
    assert bad not in second and len(second) == 2, pieces
    assert re.search(r"Resuming from \S+ \(epoch \d+, restart 1\)", log), log
    # `hpcdist status` says which node the run is kept off, and why.
    status = subprocess.run(
        [sys.executable, "-m", "hpcdist.cli.main", "status", str(job.job_id)],
        cwd=tmp_path,
        env=slurm_env(),
        capture_output=True,
        text=True,
    )
    assert re.search(rf"excluded: +{bad} \({why}, until ", status.stdout), status
    print(f"measured: {launcher}: rank 1 killed on {bad}; requeued on {pieces[1][0]}, COMPLETED")


def test_a_training_rank_that_hangs_is_named_and_the_run_goes_on_without_its_node(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    # Rank 1 stops (SIGSTOP: alive, silent, as a rank on a sick node hangs) while the first
    # piece trains; the others' next collective times out after --collective-timeout 5 s.
    script = _training_job(tmp_path, "hangs", ENDLESS, collective_timeout=5)
    job = sbatch(script, cwd=tmp_path, wait=False)
    checkpoint = tmp_path / "runs" / str(job.job_id) / "checkpoint.pt"
    _wait_for(checkpoint.exists, 180, "the first checkpoint", job.job_id)
    pid = _rank_pid(str(tmp_path / "hangs.yaml"), 1)
    assert pid is not None, "rank 1's process not found"
    bad = _node_of(pid)
    os.kill(pid, signal.SIGSTOP)
    _end_once_requeued(tmp_path, "hangs", job.job_id)
    state = _follow(job.job_id, timeout=600)
    log = _log(tmp_path, "hangs", job.job_id)
    assert state == "COMPLETED", log
    # Rank 0 saw the collective time out, rank 1 never answered: named once, with its node.
    never = "never answered after a collective failed"
    assert log.count(f"hpcdist: training: rank 1 on {bad} {never}") == 1, log
    assert f"hpcdist: node {bad} named by rank 1 {never}" in log, log
    pieces = re.findall(r"^hpcdist: job \d+ on (\S+), restart (\d+)$", log, re.M)
    assert [restart for _, restart in pieces] == ["0", "1"], log
    assert "was requeued by scontrol requeue" not in log, log
    second = run_slurm("scontrol", "show", "hostnames", pieces[1][0]).stdout.split()
    assert bad not in second and len(second) == 2, pieces
    print(f"measured: training rank 1 stopped on {bad}; requeued on {pieces[1][0]}, COMPLETED")


# The communication check, with the rank on the job's second node stalled before the
# all_reduce in the job's first run (as a rank on a sick node would stall): its arrival is
# never noted in the group's store. Anywhere else the check runs as shipped.
STALLS_ON_THE_SECOND_NODE = """\
import os, sys, time
from hpcdist.distributed import commcheck, rollcall
first_run = os.environ.get("SLURM_RESTART_COUNT", "0") == "0"
noted = rollcall.RollCall.answer
def arrive(self, step):
    if step == "all_reduce" and first_run and os.environ["SLURM_NODEID"] == "1":
        time.sleep(600)
    noted(self, step)
rollcall.RollCall.answer = arrive
raise SystemExit(commcheck.main(sys.argv[1:]))
"""


def test_a_rank_the_communication_check_never_saw_keeps_the_run_off_its_node(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    from hpcdist.render.script import render
    from hpcdist.spec.options import spec_from_options

    (tmp_path / "stalls.py").write_text(STALLS_ON_THE_SECOND_NODE)
    spec = spec_from_options(
        {
            "profile": "local",
            "mode": "gloo",
            "nodes": 2,
            "cpus_per_task": 1,
            "job_name": "stalled",
            "time": "10:00",
            "command": f"python3 {tmp_path / 'stalls.py'} --timeout 5",
        }
    )
    script = tmp_path / "stalled.sh"
    script.write_text(render(spec))
    job = sbatch(script, cwd=tmp_path, wait=False)
    state = _follow(job.job_id, timeout=400)
    log = _log(tmp_path, "stalled", job.job_id)
    pieces = re.findall(r"^hpcdist: job \d+ on (\S+), restart (\d+)$", log, re.M)
    assert [restart for _, restart in pieces] == ["0", "1"], log
    bad = run_slurm("scontrol", "show", "hostnames", pieces[0][0]).stdout.split()[1]
    # Rank 0 saw the all_reduce fail and named rank 1 and its node; the runner kept the run
    # off that node, and the check passed on the others.
    assert f"0: hpcdist: commcheck: rank 1 on {bad} never reached all_reduce" in log, log
    assert f"hpcdist: node {bad} named by rank 1 never reached all_reduce" in log, log
    second = run_slurm("scontrol", "show", "hostnames", pieces[1][0]).stdout.split()
    assert bad not in second and len(second) == 2, pieces
    assert state == "COMPLETED", log
    assert re.search(r"^0: PASS: world size 2, gloo backend", log, re.M), log
    print(f"measured: commcheck stalled on {bad}; requeued on {pieces[1][0]}, PASS")
