"""One run across a requeue, on the testbed: a training requeued once (`scontrol requeue`,
the cheapest preemption: SLURM's TERM, the checkpoint, the same job id again) is one run
in `hpcdist status RUN`, with both pieces, where the second resumed from and how long each
waited and ran; `hpcdist logs RUN` is one log with a header per piece; the last piece's
training_results.json carries the run id the first piece was given. While it runs, `status`
of the job shows the step of the total, the rate and the predicted end (the fields only:
their values depend on the machine's speed)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

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


def test_a_requeued_training_is_one_run_with_its_pieces(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    config = tmp_path / "onerun.yaml"
    config.write_text(CONFIG.format(epochs=2000))  # runs until the test requeues it
    job = sbatch(_script(tmp_path, config), cwd=tmp_path, wait=False).job_id
    run_dir = tmp_path / "runs" / str(job)

    # While it runs: progress, rate and the predicted end, once two heartbeats gave a rate.
    def progress_shown() -> bool:
        out = _hpcdist(tmp_path, "status", str(job)).stdout
        return "steps/s" in out and "ends:" in out

    _wait_for(progress_shown, 300, "status to show the training's rate")
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

    # The requeue: TERM, a checkpoint, the job back in the queue under its own id.
    _wait_for((run_dir / "checkpoint.pt").exists, 120, "the first checkpoint")
    run_slurm("scontrol", "requeue", str(job))
    _wait_for(lambda: "Stop requested" in _log(tmp_path, "onerun", job), 120, "the checkpoint")
    stopped = int(re.findall(r"checkpoint at epoch (\d+)", _log(tmp_path, "onerun", job))[-1])
    config.write_text(CONFIG.format(epochs=stopped + 1))  # the second piece ends the training

    def done() -> bool:  # the first piece wrote its results too: "preempted"
        release_requeue_hold(job)
        results = run_dir / "training_results.json"
        return results.exists() and '"status": "completed"' in results.read_text()

    _wait_for(done, 400, "the requeued job to finish its training")
    assert job_state(job, timeout=120) == "COMPLETED"
    results = json.loads((run_dir / "training_results.json").read_text())
    assert results["run_id"] == run_id and results["status"] == "completed"

    status = _hpcdist(tmp_path, "status", run_id)
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0] == f"run {run_id}: 2 pieces, jobs {job}"
    piece = re.compile(rf"^ +(\d) +{job} +(\d) +(\w+) +([\d:-]+) +([\d:-]+)  (.*)$")
    rows = [piece.match(line) for line in lines[2:4]]
    assert all(rows), status.stdout
    assert [r.group(1, 2) for r in rows] == [("1", "0"), ("2", "1")]
    assert rows[0].group(6) == "start"
    assert re.fullmatch(r"epoch \d+, step \d+ \(\d\d:\d\d:\d\d\)", rows[1].group(6))
    assert rows[1].group(3) == "COMPLETED"
    assert all(re.fullmatch(r"\d+:\d\d:\d\d", r.group(4)) for r in rows), status.stdout

    merged = _hpcdist(tmp_path, "logs", run_id)
    assert merged.returncode == 0, merged.stderr
    headers = re.findall(
        rf"^==> run {run_id}, piece (\d): job {job}, restart (\d)", merged.stdout, re.M
    )
    assert headers == [("1", "0"), ("2", "1")]
    second_part = merged.stdout.split("piece 2:")[1]
    assert "Resuming from" in second_part and "Training completed" in second_part
    assert "Resuming from" not in merged.stdout.split("piece 2:")[0]

    listed = _hpcdist(tmp_path, "list").stdout
    assert re.search(rf"^ +{job} +COMPLETED .* {re.escape(run_id)} ", listed, re.M), listed
    print(f"measured: run {run_id}: piece 1 stopped at epoch {stopped}\n{status.stdout}")


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
