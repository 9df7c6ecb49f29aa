"""Every script under bench/ runs in CI in a short mode on the CPU, so an interface change
(a renamed flag, a moved module) cannot leave one broken until the next GPU run.

bench/bench_training.py has its own short run in tests/test_bench.py; launch, refloops,
synthdata and worker are the libraries those runs use. The GPU driver
(bench/gpu_slurm_job.sh) renders every job script it would submit and checks each with
``bash -n``, then runs on its own real testbeds every job that needs no GPU (--cpu).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _env(**extra: str) -> dict[str, str]:
    """This interpreter first on PATH (the scripts call python3), the repository importable,
    no GPU: what a CPU CI machine sees."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(extra)
    return env


def _run(argv: list[str], timeout: float, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=REPO, env=_env(**extra), capture_output=True, text=True, timeout=timeout
    )


def _torchrun(nproc: int, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        *args,
    ]


def test_gpu_slurm_driver_renders_every_job_script(tmp_path: Path) -> None:
    proc = _run(
        ["bash", "bench/gpu_slurm_job.sh", "--render-only", str(tmp_path / "out")],
        timeout=240,
        GPU_SLURM_WORK=str(tmp_path / "work"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "FAIL" not in summary, summary
    checked = [line.split()[1] for line in summary.splitlines() if "passes bash -n" in line]
    assert checked == [
        "nccl-check-1x4:",
        "test-mode-1x4:",
        "train-gpu-1x4:",
        "autodetect-1x4:",
        "preempt-reference:",
        "nccl-check-2x2:",
        "train-2-nodes:",
    ], summary
    for name in (
        "nccl_check_1x4",
        "test_1x4",
        "autodetect",
        "preempt",
        "nccl_check_2x2",
        "train_2x2",
    ):
        script = (tmp_path / "work" / f"{name}.sh").read_text()
        assert script.startswith("#!/bin/bash") and "#SBATCH --nodes=" in script


@pytest.mark.slurm
def test_gpu_slurm_driver_runs_every_job_without_gpus_on_real_testbeds(tmp_path: Path) -> None:
    """--cpu: the driver's own testbeds (SLURM from unpacked .debs, as on a GPU host), every
    job that needs no GPU submitted and judged, the GPU jobs listed as skipped."""
    offset = int(os.environ.get("HPCDIST_TESTBED_PORT_OFFSET") or 0) + 80
    proc = _run(
        ["bash", "bench/gpu_slurm_job.sh", "--cpu", str(tmp_path / "out")],
        timeout=600,
        GPU_SLURM_WORK=str(tmp_path / "work"),
        GPU_SLURM_PORT_OFFSET=str(offset),
    )
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert proc.returncode == 0, summary + proc.stdout[-3000:]
    passed = [line.split()[1] for line in summary.splitlines() if line.startswith("PASS ")]
    assert passed == [
        "test-mode-1x4",
        "autodetect-no-gpu",
        "preempt-reference",
        "preempted",
        "train-2-nodes",
    ], summary
    assert "same weights as job" in summary and "bit for bit" in summary, summary
    skipped = [line.split()[1] for line in summary.splitlines() if line.startswith("SKIP ")]
    assert skipped == ["nccl-check-1x4:", "train-gpu-1x4:", "nccl-check-2x2:"], summary
    assert "jobs: 5 passed, 0 failed, 3 skipped" in summary, summary


def test_bench_cli_times_the_command_line(tmp_path: Path) -> None:
    out = tmp_path / "cli.json"
    proc = _run(
        [
            sys.executable,
            "-m",
            "bench.bench_cli",
            "--runs",
            "1",
            "--repeats",
            "1",
            "--top",
            "3",
            "--json",
            str(out),
        ],
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())


@pytest.mark.slow
def test_collectives_on_cpu_ranks(tmp_path: Path) -> None:
    out = tmp_path / "collectives.json"
    proc = _run(
        [
            sys.executable,
            "-m",
            "bench.collectives",
            "--device",
            "cpu",
            "--ranks",
            "1,2",
            "--threads-per-rank",
            "1",
            "--chunks",
            "2",
            "--timeout",
            "100",
            "--json",
            str(out),
        ],
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())


@pytest.mark.slow
def test_floor_forms_a_gloo_group_without_gpus() -> None:
    proc = _run(_torchrun(2, "-m", "bench.floor"), timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_e2e_data_floor_days_and_cpu_stages(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _run(
        [
            sys.executable,
            "-m",
            "bench.e2e",
            "--out",
            str(out),
            "--work",
            str(tmp_path / "w"),
            "--stages",
            "data,floor,days,cpu",
            "--target-days",
            "10:1",
            "--days-set",
            "training.lr_warmup_epochs=0.5",
            "--grid",
            "40x32",
            "--days",
            "2",
            "--gpus",
            "1",
            "--cpu-ranks",
            "1",
            "--threads",
            "1",
            "--max-epochs",
            "1",
            "--timeout",
            "120",
        ],
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "status completed" in proc.stdout, proc.stdout
    assert (out / "e2e.json").is_file()
    days = json.loads((tmp_path / "w" / "days1-10" / "training_results.json").read_text())
    assert days["overrides"] == {"training.lr_warmup_epochs": 0.5}


@pytest.mark.slow
def test_userloop_trains_on_daily_files(tmp_path: Path) -> None:
    days = tmp_path / "days"
    made = _run(
        [
            sys.executable,
            "-m",
            "ufsemulator",
            "make-data",
            "--grid",
            "40x32",
            "--days",
            "2",
            "--out",
            str(days),
        ],
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    run_dir = tmp_path / "run"
    proc = _run(
        [
            *_torchrun(2, "-m", "bench.userloop", "--data", str(days / "iceh.*.nc")),
            "--target",
            "0.0001",
            "--max-epochs",
            "1",
            "--run-dir",
            str(run_dir),
        ],
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    assert (run_dir / "result.json").is_file() and (run_dir / "model.pt").is_file()


@pytest.mark.slow
def test_hang_check_fails_at_the_collective_timeout_on_gloo(tmp_path: Path) -> None:
    started = time.monotonic()
    proc = _run(
        _torchrun(2, "-m", "bench.gpu_hang_check"),
        timeout=120,
        HPCDIST_COLLECTIVE_TIMEOUT="5",
        HANG_SLEEP_S="20",
        HPCDIST_RUN_DIR=str(tmp_path),
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output  # rank 0 fails instead of hanging
    assert "[Rank 0] first all-reduce: 2.0" in output
    assert "the hung all-reduce returned?" not in output
    assert time.monotonic() - started < 120  # ended, by the 5 s collective timeout (above)


@pytest.mark.slow
def test_run_gpu_driver_runs_its_cpu_stage(tmp_path: Path) -> None:
    proc = _run(
        ["bash", "bench/run_gpu.sh"],
        timeout=300,
        OUT=str(tmp_path),
        BENCH_STAGES="gloo",
        BENCH_ARGS="--ranks 1 --threads-per-rank 1 --steps 3 --epochs 1 --warmup-epochs 0 "
        "--repeats 1 --grid 40x32",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no GPU visible: GPU stages skipped" in proc.stdout
    assert json.loads((tmp_path / "gloo.json").read_text())


def test_read_scaling_sets_shares_beside_one_reader(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "bench.read_scaling", "--work", str(tmp_path / "work")]
    argv += ["--grid", "40x32", "--days", "3", "--ranks", "2", "--repeats", "1"]
    proc = _run([*argv, "--out", str(tmp_path / "out")], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 together vs 1 rank:" in proc.stdout and "share 1, alone" in proc.stdout
    report = json.loads((tmp_path / "out" / "read_scaling.json").read_text())
    whole, together = report["whole"], report["together"]
    # Files 0 and 1..2 (balanced by bytes): the shares hold every row once.
    assert [r["rank"] for r in together] == [0, 1]
    assert sum(r["rows"] for r in together) == whole["rows"] > 0
    assert report["speedup"] == whole["seconds"] / max(r["seconds"] for r in together)


@pytest.mark.slow
def test_batch_invariance_bench_measures_the_cost_and_finds_no_differing_row(
    tmp_path: Path,
) -> None:
    out = tmp_path / "invariance.json"
    argv = [sys.executable, "-m", "bench.batch_invariance", "--short", "--json", str(out)]
    proc = _run(argv, timeout=300)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())
    exported = [r for r in results if r["path"] == "torchscript"]
    assert sorted(r["method"] for r in exported) == ["adjoint", "jac_physical", "predict", "tlm"]
    assert all(r["differing_rows"] == 0 and r["rows"] == 2000 and r["ms"] > 0 for r in exported)
    assert "| torchscript | jac_physical | 1 | 2000 |" in proc.stdout and "cost" in proc.stdout
    bad = _run([*argv[:3], "--rows", "2"], timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --rows must be >= 4")
