"""One run across a requeue, on the testbed: a training requeued once (`scontrol requeue`,
the cheapest preemption: SLURM's TERM, the checkpoint, the same job id again) is one run
in `hpcdist status RUN`, with both pieces, where the second resumed from and how long each
waited and ran; `hpcdist logs RUN` is one log with a header per piece; the last piece's
training_results.json carries the run id the first piece was given. While it runs, `status`
of the job shows the step of the total, the rate and the predicted end (the fields only:
their values depend on the machine's speed)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hpcdist.render.script import render
from hpcdist.spec.options import spec_from_options
from tests.integration.conftest import (
    SlurmCluster,
    job_state,
    release_requeue_hold,
    run_slurm,
    sbatch,
    slurm_env,
)
from tests.integration.test_faults import _log, _wait_for
from tests.integration.test_preemption import refuse_requeues

CONFIG = """\
data: {{mask: ocean}}
training: {{epochs: {epochs}, lr: 1.0e-3, early_stopping_patience: 0, checkpoint_every: 1}}
preemption: {{check_every_steps: 5}}
"""


def _hpcdist(folder: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpcdist.cli.main", *argv],
        cwd=folder,
        env=slurm_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _script(folder: Path, config: Path) -> Path:
    spec = spec_from_options(
        {
            "profile": "local",
            "mode": "gloo",
            "nodes": 2,
            "cpus_per_task": 1,
            "job_name": "onerun",
            "time": "20:00",
            "command": f"python3 -m ufsemulator train --config {config}",
        }
    )
    script = folder / "onerun.sh"
    script.write_text(render(spec))
    return script


def _preempt(job: int, piece: int, log: Callable[[], str]) -> None:
    """Preempt ``piece`` of ``job`` once it has resumed (the pieces after the first) and
    finished an epoch (its checkpoint, every epoch here); wait for the next piece to resume."""

    def trained_an_epoch() -> bool:
        text = log()
        return (
            text.count("Resuming from") == piece - 1 and "Epoch " in text.split("Resuming from")[-1]
        )

    _wait_for(trained_an_epoch, 240, f"piece {piece}'s first checkpoint", job, log)
    run_slurm("scontrol", "requeue", str(job))
    _wait_for(
        lambda: log().count("Stop requested") == piece, 120, f"piece {piece}'s stop", job, log
    )

    def resumed() -> bool:
        release_requeue_hold(job)
        return log().count("Resuming from") == piece

    _wait_for(resumed, 300, f"piece {piece + 1} to resume", job, log)


def test_a_training_preempted_twice_then_resubmitted_is_one_run_of_four_pieces(
    slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "onerun.yaml"
    config.write_text(CONFIG.format(epochs=2000))  # trains until the test gives it an end
    bindir = tmp_path / "site-bin"  # the job's PATH, first; empty until the refusal
    bindir.mkdir()
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    job = sbatch(_script(tmp_path, config), cwd=tmp_path, wait=False).job_id
    run_dir = tmp_path / "runs" / str(job)

    def log() -> str:  # every piece of the job id's log (the resubmitted job has its own)
        return _log(tmp_path, "onerun", job)

    # While it runs: progress, rate and the predicted end, once two heartbeats gave a rate.
    def progress_shown() -> bool:
        out = _hpcdist(tmp_path, "status", str(job)).stdout
        return "steps/s" in out and "ends:" in out

    _wait_for(progress_shown, 300, "status to show the training's rate", job, log)
    shown = _hpcdist(tmp_path, "status", str(job)).stdout
    step, total = map(int, re.search(r"progress: +step (\d+) of (\d+)", shown).groups())
    assert 0 < step <= total
    assert re.search(r"ends: +\d\d:\d\d:\d\d \(in [\d:-]+\); (fits|does not fit)", shown), shown
    run_id = re.search(r"^run (\S+): 1 piece, jobs " + str(job) + "$", shown, re.M).group(1)
    assert run_id.startswith(f"{job}-")
    data = json.loads(_hpcdist(tmp_path, "status", "--json", str(job)).stdout)
    forecast = data["run"]["forecast"]
    assert data["run"]["run_id"] == run_id and forecast["steps"] == total
    assert forecast["steps_per_s"] > 0 and forecast["end"] > data["run"]["heartbeat"]["time"]

    # Two preemptions (scontrol requeue: SLURM's TERM, a checkpoint, the same job id again),
    # each once the piece has resumed and written a checkpoint of its own.
    for piece in (1, 2):
        _preempt(job, piece, log)

    # The third piece is warned; the site now refuses the requeue its rank 0 asks for, so
    # hpcdist submits the script again: a new job id, the same run. The fourth piece reads the
    # training's end, set a few epochs on (the third read its own at its start). Warned once
    # it trains (an epoch done: every rank's handler is in place).
    _wait_for(
        lambda: "Epoch " in log().split("Resuming from")[-1], 240, "piece 3's first epoch", job, log
    )
    refuse_requeues(bindir)  # from now on
    epoch = int(re.findall(r"^0: Epoch (\d+)/", log(), re.M)[-1])
    config.write_text(CONFIG.format(epochs=epoch + 5))
    run_slurm("scancel", "--signal=USR2", str(job))
    _wait_for(lambda: "resubmitting" in log(), 120, "the refused requeue's resubmission")
    again = re.search(r"Submitted batch job (\d+)", log().split("resubmitting")[-1])
    assert again, log()
    second_job = int(again.group(1))
    assert job_state(job, timeout=120) == "COMPLETED"  # its shell ended 0 after resubmitting
    assert job_state(second_job, timeout=400) == "COMPLETED", _log(tmp_path, "onerun", second_job)
    results = json.loads((run_dir / "training_results.json").read_text())
    assert results["run_id"] == run_id and results["status"] == "completed"
    resumed = re.search(r"Resuming from \S+ \(epoch (\d+),", _log(tmp_path, "onerun", second_job))
    assert resumed, _log(tmp_path, "onerun", second_job)
    stopped = int(resumed.group(1))

    status = _hpcdist(tmp_path, "status", run_id)
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0] == f"run {run_id}: 4 pieces, jobs {job}, {second_job}", status.stdout
    piece_row = re.compile(r"^ +(\d) +(\d+) +(\d) +(\w+) +([\d:-]+) +([\d:-]+)  (.*)$")
    rows = [piece_row.match(line) for line in lines[2:6]]
    assert all(rows), status.stdout
    assert [r.group(1, 2, 3) for r in rows] == [
        ("1", str(job), "0"),
        ("2", str(job), "1"),
        ("3", str(job), "2"),
        ("4", str(second_job), "0"),
    ], status.stdout
    assert rows[0].group(7) == "start"
    # Each later piece resumed from a checkpoint (epoch, step, time); the last from the
    # third piece's stop; each waited in the queue and ran a time of its own.
    for row in rows[1:]:
        assert re.fullmatch(r"epoch \d+, step \d+ \(\d\d:\d\d:\d\d\)", row.group(7)), status.stdout
    assert rows[3].group(7).startswith(f"epoch {stopped},"), status.stdout
    assert rows[3].group(4) == "COMPLETED"
    assert all(re.fullmatch(r"\d+:\d\d:\d\d", r.group(5)) for r in rows), status.stdout
    assert all(re.fullmatch(r"\d+:\d\d:\d\d", r.group(6)) for r in rows), status.stdout

    merged = _hpcdist(tmp_path, "logs", run_id)
    assert merged.returncode == 0, merged.stderr
    headers = re.findall(
        rf"^==> run {run_id}, piece (\d): job (\d+), restart (\d)", merged.stdout, re.M
    )
    assert headers == [
        ("1", str(job), "0"),
        ("2", str(job), "1"),
        ("3", str(job), "2"),
        ("4", str(second_job), "0"),
    ], merged.stdout[:2000]
    parts = re.split(r"^==> run .*$", merged.stdout, flags=re.M)[1:]
    assert "Resuming from" not in parts[0]
    assert all("Resuming from" in part for part in parts[1:])
    assert "Training completed" in parts[3]

    listed = _hpcdist(tmp_path, "list").stdout
    assert re.search(rf"^ +{job} +COMPLETED .* {re.escape(run_id)} ", listed, re.M), listed
    print(f"measured: run {run_id}: four pieces, the last resumed at epoch {stopped}")
    print(status.stdout)


def _chain_script(folder: Path, name: str, config: Path, **flags: object) -> Path:
    spec = spec_from_options(
        {
            "profile": "local",
            "mode": "gloo",
            "nodes": 1,
            "cpus_per_task": 1,
            "job_name": name,
            "time": "10:00",
            # Each rank says which tracker run it would log to, then trains.
            "command": "bash -c 'echo tracker=$WANDB_RUN_ID; exec python3 -m ufsemulator "
            f"train --config {config}'",
            "tracker_env": ("WANDB_RUN_ID",),
            **flags,
        }
    )
    script = folder / f"{name}.sh"
    script.write_text(render(spec))
    return script


def test_a_chain_continued_with_continue_job_is_one_run(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """`--after A --continue A`, queued before A starts: B trains on in A's run folder,
    from A's last checkpoint, under A's run id (and tracker id)."""
    first_config, second_config = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first_config.write_text(CONFIG.format(epochs=2))
    second_config.write_text(CONFIG.format(epochs=4))
    held = sbatch(_chain_script(tmp_path, "a", first_config), "--hold", cwd=tmp_path, wait=False)
    a = held.job_id
    b_script = _chain_script(tmp_path, "b", second_config, after=(str(a),), continue_run=str(a))
    b = sbatch(b_script, cwd=tmp_path, wait=False).job_id
    run_slurm("scontrol", "release", str(a))
    assert job_state(b, timeout=400) == "COMPLETED", _log(tmp_path, "b", b)
    results = json.loads((tmp_path / "runs" / str(a) / "training_results.json").read_text())
    run_id = results["run_id"]
    assert run_id.startswith(f"{a}-") and results["status"] == "completed"
    assert len(results["history"]["train_loss"]) == 4  # two epochs of A's, two of B's
    assert not (tmp_path / "runs" / str(b)).exists()
    assert "Resuming from" in _log(tmp_path, "b", b)
    status = _hpcdist(tmp_path, "status", run_id).stdout
    assert status.splitlines()[0] == f"run {run_id}: 2 pieces, jobs {a}, {b}"
    assert re.search(rf"^ +2 +{b} +0 +COMPLETED .*  epoch 2, step \d+ ", status, re.M), status
    # The tracker variable of every piece was the run id.
    for name, job in (("a", a), ("b", b)):
        assert re.findall(r"tracker=(\S*)", _log(tmp_path, name, job)) == [run_id], name
    # report reads B where it trained: A's run folder, as B's piece of the run records.
    report = _hpcdist(tmp_path, "report", str(b))
    assert report.returncode == 0, report.stderr
    assert report.stdout.splitlines()[-1] == f"best: {b} ({tmp_path / 'runs' / str(a)})"


@pytest.mark.parametrize("named_by", ["HPCDIST_RUN_DIR", "--set output.run_dir"])
def test_report_reads_a_run_folder_set_by_the_environment_or_the_config(
    slurm_cluster: SlurmCluster, tmp_path: Path, named_by: str
) -> None:
    folder, run_dir = tmp_path / "work", tmp_path / "scratch" / "exp1"  # two levels missing
    folder.mkdir()
    (folder / "cfg.yaml").write_text(CONFIG.format(epochs=1))
    by_config = named_by.startswith("--set")
    spec = spec_from_options(
        {
            "profile": "local",
            "mode": "threads",
            "cpus_per_task": 1,
            "job_name": "rundir",
            "time": "10:00",
            "command": "python3 -m ufsemulator train --config cfg.yaml",
            "overrides": [f"output.run_dir={run_dir}"] if by_config else [],
        }
    )
    script = folder / "rundir.sh"
    script.write_text(render(spec))
    export = [] if by_config else [f"--export=ALL,HPCDIST_RUN_DIR={run_dir}"]
    job = sbatch(script, *export, cwd=folder, timeout=400)
    assert job.returncode == 0, _log(folder, "rundir", job.job_id)
    assert (run_dir / "training_results.json").is_file()
    assert not (folder / "runs").exists()
    report = _hpcdist(folder, "report", str(job.job_id))
    assert report.returncode == 0, report.stderr
    lines = report.stdout.splitlines()
    shown = f'output.run_dir="{run_dir}"' if by_config else "-"  # the job's overrides
    assert lines[1].split()[:4] == ["*", str(job.job_id), shown, "COMPLETED"], report.stdout
    assert lines[2:] == [f"best: {job.job_id} ({run_dir})"]
