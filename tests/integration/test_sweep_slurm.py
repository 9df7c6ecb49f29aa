"""Sweeps as one job array, per-task preemption, `hpcdist report` and `--after`, on the testbed.

Small trainings (a 64 x 48 synthetic grid): a 2-node task takes about 15 s here, most of it
start-up. The testbed has 4 nodes, so a 2-node sweep with --max-parallel 2 fills it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from hpcdist.jobs.records import FINAL_STATES
from tests.integration.conftest import SlurmCluster, run_slurm, slurm_env

HPCDIST = [sys.executable, "-m", "hpcdist.cli.main"]
SMALL = ["--set", "data.synthetic.ni=64", "--set", "data.synthetic.nj=48"]
# An epoch of the small training takes about 4 ms here: 3000 of them leave the warning
# some 12 s to land after "Epoch 3" shows (80 left 0.3 s, and the task sometimes ended first).
WARNED_EPOCHS = 3000


def _hpcdist(*argv: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HPCDIST, *argv],
        cwd=cwd,
        env=slurm_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _job_id(out: str) -> str:
    found = re.findall(r"Submitted job (\d+)", out)
    assert found, out
    return found[0]


def _sacct(job_id: str) -> dict[str, tuple[str, str, str]]:
    """{task id: (state, start, end)} from sacct, the latest run of each task."""
    proc = run_slurm("sacct", "-X", "-n", "-P", "-j", job_id, "-o", "JobID,State,Start,End")
    rows: dict[str, tuple[str, str, str]] = {}
    for line in proc.stdout.splitlines():
        task, state, start, end = line.split("|")
        rows[task] = (state.split()[0], start, end)
    return rows


def _sacct_tasks(job_id: str, count: int, timeout: float = 60.0) -> dict[str, tuple[str, str, str]]:
    """``_sacct`` once every task of the array has a final state there: slurmdbd records a
    task's end some seconds after squeue (which `--wait` follows) forgets it."""
    deadline = time.monotonic() + timeout
    while True:
        rows = _sacct(job_id)
        tasks = [rows.get(f"{job_id}_{i}", ("",))[0] for i in range(count)]
        if all(state in FINAL_STATES for state in tasks) or time.monotonic() > deadline:
            return rows
        time.sleep(0.5)


def _log(folder: Path, task: str) -> str:
    """An array task's log, where SLURM says it is (``hpcdist logs``); "" before it exists."""
    shown = _hpcdist("logs", task, cwd=folder)
    return shown.stdout if shown.returncode == 0 else ""


def _most_at_once(intervals: list[tuple[datetime, datetime]]) -> int:
    """The most intervals running at one moment (one that ends as another starts: apart).
    The count only grows at a start, so the starts are the moments to look at."""
    return max(sum(start <= moment < end for start, end in intervals) for moment, _ in intervals)


@pytest.mark.slurm_versions
def test_sweep_runs_every_point_as_an_array_task_at_most_k_at_once(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    started = time.monotonic()
    proc = _hpcdist(
        "submit",
        "--nodes",
        "2",
        "--backend",
        "gloo",
        "--sweep",
        "training.lr=1e-3,3e-3",
        "--sweep",
        "model.hidden_sizes=[32,32],[64,64]",
        "--max-parallel",
        "2",
        "--set",
        "training.epochs=20",
        *SMALL,
        "--wait",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = _job_id(proc.stdout)
    assert f"Job {job} ended: 4 of 4 tasks COMPLETED" in proc.stdout
    rows = _sacct_tasks(job, 4)
    assert sorted(rows) == [f"{job}_{i}" for i in range(4)]
    assert {state for state, _, _ in rows.values()} == {"COMPLETED"}
    intervals = [
        (datetime.fromisoformat(start), datetime.fromisoformat(end))
        for _, start, end in rows.values()
    ]
    assert _most_at_once(intervals) <= 2, rows
    # 4 nodes fit two 2-node tasks anyway: the controller's record shows the limit itself.
    shown = run_slurm("scontrol", "show", "job", "-o", f"{job}_0").stdout
    assert "ArrayTaskThrottle=2 " in shown, shown

    report = _hpcdist("report", job, "--json", "--plot", str(tmp_path / "sweep.png"), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    points = json.loads(report.stdout)
    assert len(points) == 4
    losses = [p["best_val_loss"] for p in points]
    assert all(loss is not None and loss > 0 for loss in losses)
    assert losses == sorted(losses) and [p["best"] for p in points] == [True, False, False, False]
    assert all(p["epochs"] == 20 and p["state"] == "COMPLETED" for p in points)
    assert (tmp_path / "sweep.png").stat().st_size > 1000
    # Each task trained its own point in its own run folder, which records the point.
    for i, (lr, sizes) in enumerate(
        [(1e-3, [32, 32]), (1e-3, [64, 64]), (3e-3, [32, 32]), (3e-3, [64, 64])]
    ):
        results = json.loads(
            (tmp_path / "runs" / f"{job}_{i}" / "training_results.json").read_text()
        )
        assert results["overrides"]["training.lr"] == lr
        assert results["overrides"]["model.hidden_sizes"] == sizes
        assert results["config"]["model"]["hidden_sizes"] == sizes
        assert results["epochs_run"] == 20
    table = _hpcdist("report", job, cwd=tmp_path).stdout
    assert (
        len([line for line in table.splitlines() if f"{job}_" in line and "COMPLETED" in line]) == 4
    )
    print(f"measured: 4-point sweep of 2-node tasks in {time.monotonic() - started:.1f} s")


def test_a_point_that_fails_at_run_time_fails_alone_and_the_report_says_why(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-file.nc"
    proc = _hpcdist(
        "submit",
        "--nodes",
        "1",
        "--backend",
        "gloo",
        "--cpus-per-task",
        "1",
        "--sweep",
        f"data.path=null,{missing}",
        "--set",
        "training.epochs=3",
        *SMALL,
        "--wait",
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    job = _job_id(proc.stdout)
    assert f"Job {job} ended: 1 of 2 tasks COMPLETED" in proc.stdout
    rows = _sacct_tasks(job, 2)
    assert (rows[f"{job}_0"][0], rows[f"{job}_1"][0]) == ("COMPLETED", "FAILED")
    report = _hpcdist("report", job, cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    failed = [line for line in report.stdout.splitlines() if line.startswith(f"{job}_1 FAILED: ")]
    assert len(failed) == 1 and str(missing) in failed[0], report.stdout
    assert re.search(rf"^\*\s+{job}_0\s+data\.path=null\s+COMPLETED", report.stdout, re.M), (
        report.stdout
    )


def _release(task: str) -> None:
    """Start a requeued task now instead of after SLURM's BeginTime hold (about 120 s)."""
    proc = run_slurm("squeue", "-h", "-j", task, "-o", "%T|%r", check=False)
    state, _, reason = proc.stdout.strip().partition("|")
    if state == "PENDING" and "BeginTime" in reason:
        time.sleep(2)  # not in the second of the requeue: slurmd would refuse the credential
        run_slurm("scontrol", "update", f"JobId={task}", "StartTime=now", check=False)


def test_a_warned_array_task_checkpoints_requeues_alone_and_resumes_its_own_run(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    waiter = subprocess.Popen(
        [
            *HPCDIST,
            "submit",
            "--nodes",
            "1",
            "--backend",
            "gloo",
            "--cpus-per-task",
            "1",
            "--sweep",
            "training.lr=1e-3,3e-3",
            "--set",
            f"training.epochs={WARNED_EPOCHS}",
            "--set",
            "training.early_stopping_patience=0",
            *SMALL,
            "--wait",
        ],
        cwd=tmp_path,
        env=slurm_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert waiter.stdout is not None
    job = _job_id(waiter.stdout.readline())
    warned, other = f"{job}_1", f"{job}_0"
    deadline = time.monotonic() + 120
    while "Epoch 3/" not in _log(tmp_path, warned):
        assert time.monotonic() < deadline and waiter.poll() is None, _log(tmp_path, warned)
        time.sleep(0.5)
    run_slurm("scancel", "--signal=USR2", warned)
    deadline = time.monotonic() + 240
    while waiter.poll() is None and time.monotonic() < deadline:
        _release(warned)
        time.sleep(1)
    out, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 0, out + err
    assert f"Job {job} ended: 2 of 2 tasks COMPLETED" in out
    resumed = re.findall(
        r"Resuming from (\S+) \(epoch \d+, restart (\d+)\)", _log(tmp_path, warned)
    )
    assert resumed and resumed[0][0] == str(tmp_path / "runs" / warned / "checkpoint.pt")
    assert resumed[0][1] == "1"
    assert "Resuming" not in _log(tmp_path, other)
    results = {
        task: json.loads((tmp_path / "runs" / task / "training_results.json").read_text())
        for task in (warned, other)
    }
    assert results[warned]["epochs_run"] == results[other]["epochs_run"] == WARNED_EPOCHS
    assert results[warned]["overrides"]["training.lr"] == 3e-3


@pytest.mark.slurm_versions
def test_a_job_submitted_after_another_starts_only_once_it_has_ended(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    first = _hpcdist(
        "submit",
        "--mode",
        "threads",
        "--command",
        "sleep 6",
        "--no-requeue",
        "--no-preflight",
        cwd=tmp_path,
    )
    assert first.returncode == 0, first.stderr
    before = _job_id(first.stdout)
    second = _hpcdist(
        "submit",
        "--mode",
        "threads",
        "--command",
        "true",
        "--after",
        f"{before}:any",
        "--no-preflight",
        "--wait",
        cwd=tmp_path,
    )
    assert second.returncode == 0, second.stdout + second.stderr
    after = _job_id(second.stdout)
    deadline = time.monotonic() + 30
    while _sacct(before).get(before, ("",))[0] not in FINAL_STATES:
        assert time.monotonic() < deadline
        time.sleep(0.5)
    _, _, ended = _sacct(before)[before]
    _, began, _ = _sacct(after)[after]
    assert datetime.fromisoformat(began) >= datetime.fromisoformat(ended), (ended, began)


@pytest.mark.slurm_versions
@pytest.mark.parametrize("after", ["999999999", "999999999_3:notok"])
def test_after_a_job_the_controller_does_not_know_is_one_line_and_writes_nothing(
    slurm_cluster: SlurmCluster, tmp_path: Path, after: str
) -> None:
    proc = _hpcdist(
        "submit", "--mode", "threads", "--command", "true", "--after", after, cwd=tmp_path
    )
    assert proc.returncode == 2
    job = after.partition(":")[0]
    assert proc.stderr == (
        f"hpcdist: error: --after {job}: the SLURM controller does not know job {job}; "
        "expected a queued, running or recently ended job (squeue -j)\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_the_rendered_array_script_requeues_a_warned_task_alone_under_plain_sbatch(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    render_args = [
        "render",
        "--nodes",
        "1",
        "--backend",
        "gloo",
        "--cpus-per-task",
        "1",
        "--output",
        "sweep-%A_%a.out",
        "--sweep",
        "training.lr=1e-3,3e-3",
        "--set",
        f"training.epochs={WARNED_EPOCHS}",
        "--set",
        "training.early_stopping_patience=0",
        *SMALL,
        "--script",
        str(tmp_path / "sweep.sh"),
    ]
    rendered = _hpcdist(*render_args, cwd=tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    submitted = run_slurm("sbatch", "--parsable", str(tmp_path / "sweep.sh"), cwd=tmp_path)
    job = submitted.stdout.strip().split(";")[0]
    warned, other = f"{job}_1", f"{job}_0"

    def log(task: str) -> str:
        path = tmp_path / f"sweep-{task}.out"
        return path.read_text(errors="replace") if path.is_file() else ""

    deadline = time.monotonic() + 120
    while "Epoch 3/" not in log(warned):
        assert time.monotonic() < deadline, log(warned)
        time.sleep(0.5)
    run_slurm("scancel", "--signal=USR2", warned)
    deadline = time.monotonic() + 240
    while True:
        _release(warned)
        states = _sacct(job)
        if (
            sorted(states) == [other, warned]
            and all(state in FINAL_STATES for state, _, _ in states.values())
            and not run_slurm("squeue", "-h", "-j", job, check=False).stdout.strip()
        ):
            break
        assert time.monotonic() < deadline, (states, log(warned))
        time.sleep(1)
    assert {task: state for task, (state, _, _) in states.items()} == {
        other: "COMPLETED",
        warned: "COMPLETED",
    }, log(warned)
    assert f"requeueing array task {warned}" in log(warned)
    resumed = re.findall(r"Resuming from (\S+) \(epoch \d+, restart 1\)", log(warned))
    assert resumed == [str(tmp_path / "runs" / warned / "checkpoint.pt")], log(warned)
    assert "Resuming" not in log(other) and "requeueing" not in log(other)
    for task, lr in ((other, 1e-3), (warned, 3e-3)):
        results = json.loads((tmp_path / "runs" / task / "training_results.json").read_text())
        assert (results["epochs_run"], results["overrides"]["training.lr"]) == (WARNED_EPOCHS, lr)
    # No record of hpcdist's (plain sbatch): report reads SLURM and the run folders.
    report = _hpcdist("report", job, "--json", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    rows = {row["job_id"]: row for row in json.loads(report.stdout)}
    assert sorted(rows) == [other, warned]
    assert [rows[t]["state"] for t in (other, warned)] == ["COMPLETED", "COMPLETED"]
    assert "training.lr=0.003" in rows[warned]["overrides"]
    assert all(row["epochs"] == WARNED_EPOCHS and row["best_val_loss"] > 0 for row in rows.values())
