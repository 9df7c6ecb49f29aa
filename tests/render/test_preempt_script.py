"""A rendered script under a preemption: the batch shell gets TERM while srun runs; it
requeues a preempted job, submits it again where the requeue is refused, and leaves a job
that was cancelled (TERM without a preemption) or submitted with --no-requeue alone."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hpcdist.render.script import quote, render
from hpcdist.spec.options import spec_from_options
from tests.jobenv import install_job_python


def _run(
    tmp_path: Path, preempted: bool, requeue_rc: int, requeue: bool = True
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    preempt_time = "2026-11-26T13:41:02" if preempted else "None"
    tools = {
        # Rank 0 checkpoints and leaves the marker; meanwhile SLURM sends TERM to the batch
        # shell (srun's parent) too; srun then reports its killed ranks.
        "srun": 'mkdir -p "$(dirname "$HPCDIST_REQUEUE_MARKER")"; '
        'echo runs/77 > "$HPCDIST_REQUEUE_MARKER"; kill -TERM "$PPID"; sleep 0.3; exit 143',
        "scontrol": f'echo "scontrol $*" >> {quote(str(calls))}; '
        f'if [ "$1" = show ]; then echo "   PreemptTime={preempt_time} SuspendTime=None"; '
        f"exit 0; fi; exit {requeue_rc}",
        "sbatch": f'echo "sbatch $* run_dir=$HPCDIST_RUN_DIR" >> {quote(str(calls))}',
    }
    for name, body in tools.items():
        (bindir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bindir / name).chmod(0o755)
    install_job_python(bindir)
    script = render(
        spec_from_options({"profile": None, "mode": "gloo", "nodes": 2, "requeue": requeue})
    )
    job = tmp_path / "job.sh"
    job.write_text(script)
    env = {
        "PATH": f"{bindir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_SUBMIT_DIR": str(tmp_path),
    }
    proc = subprocess.run(
        ["bash", str(job)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30
    )
    lines = calls.read_text().splitlines() if calls.exists() else []
    return proc, lines


def test_preempted_job_requeues_itself(tmp_path: Path) -> None:
    proc, calls = _run(tmp_path, preempted=True, requeue_rc=0)
    assert proc.returncode == 0, proc.stderr
    # Asked at the TERM (did the command requeue the job itself?), then before requeueing.
    assert calls == ["scontrol show job 77", "scontrol show job 77", "scontrol requeue 77"]


def test_preempted_job_where_requeue_is_refused_is_submitted_again(tmp_path: Path) -> None:
    proc, calls = _run(tmp_path, preempted=True, requeue_rc=1)
    assert proc.returncode == 0, proc.stderr
    assert calls == [
        "scontrol show job 77",
        "scontrol show job 77",
        "scontrol requeue 77",
        f"sbatch {tmp_path / 'job.sh'} run_dir=runs/77",
    ]
    assert "no requeue (scontrol missing or refused), resubmitting" in proc.stderr


def test_cancelled_job_is_neither_requeued_nor_submitted_again(tmp_path: Path) -> None:
    proc, calls = _run(tmp_path, preempted=False, requeue_rc=0)
    # Never a requeue: the decision's looks, then whether SLURM requeued the job all the
    # same (scontrol requeue by hand) before saying how to resume.
    assert calls == ["scontrol show job 77"] * 3
    assert "not requeueing: job 77 was ended (TERM) without a preemption" in proc.stderr
    assert proc.returncode == 143


@pytest.mark.parametrize("requeue_rc", [0, 1])
def test_no_requeue_job_is_never_resubmitted(tmp_path: Path, requeue_rc: int) -> None:
    proc, calls = _run(tmp_path, preempted=True, requeue_rc=requeue_rc, requeue=False)
    assert calls == []
    assert proc.returncode != 0
