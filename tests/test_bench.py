from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.bench_training import (
    _graph_notes,
    _ours,
    _outside_steps,
    _summarise,
    _ttt_rows,
    _ttt_variant,
    _variant,
)
from bench.launch import NO_MULTICAST, rank_env
from bench.synthdata import Grid, make_arrays
from tests.ufsemulator.export.test_cxx_example import binary, case  # noqa: F401  (fixtures of the C++ example)
from ufsemulator.data.read import DataOptions, load_dataset
from ufsemulator.data.synthfiles import make_synthetic

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("mask", ["sea_ice", "ocean", "both"])
def test_bench_arrays_are_what_the_reader_reads_from_the_file(tmp_path: Path, mask: str) -> None:
    path = make_synthetic(tmp_path / "grid.nc", ni=40, nj=32, seed=0)
    dataset = load_dataset(path, DataOptions(mask=mask))
    inputs, targets = make_arrays(Grid(40, 32, mask=mask))
    assert np.array_equal(dataset.inputs, inputs) and np.array_equal(dataset.targets, targets)


def test_every_rank_gets_the_launcher_variables_and_no_multicast() -> None:
    env = rank_env(
        {"SLURM_PROCID": "7", "RANK": "9", "PATH": "/bin", "NCCL_NVLS_ENABLE": "1"},
        rank=2,
        world=4,
        port=29999,
        threads=4,
    )
    assert "SLURM_PROCID" not in env and env["PATH"] == "/bin"
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == ("2", "2", "4")
    assert (env["MASTER_PORT"], env["OMP_NUM_THREADS"]) == ("29999", "4")
    assert all(env[key] == value for key, value in NO_MULTICAST.items())


def test_efficiency_and_ratios_are_per_rank_medians() -> None:
    def runs(rate: float) -> list[dict[str, float]]:
        return [{"rows": rate * s, "seconds": s, "steps": 10} for s in (1.0, 2.0, 4.0)]

    results = {
        1: {"runs": {"dataloader": runs(100.0), "ours": runs(1000.0)}},
        4: {"runs": {"dataloader": runs(50.0), "ours": runs(900.0)}},
    }
    rows = {(r["loop"], r["ranks"]): r for r in _summarise(results, ["dataloader", "ours"])}
    ours4 = rows["ours", 4]
    assert ours4["per_rank"] == pytest.approx(900.0) and ours4["total"] == pytest.approx(3600.0)
    assert ours4["efficiency"] == pytest.approx(0.9)
    assert ours4["vs_dataloader"] == pytest.approx(18.0)
    assert ours4["step_ms"] == pytest.approx(200.0)  # median of 100, 200 and 400 ms
    assert rows["dataloader", 4]["vs_dataloader"] is None


def test_time_to_target_speedup_is_against_the_fewest_ranks() -> None:
    results = {
        1: {"lr": 1e-4, "reached": {"0.01": {"seconds": 6.0, "epoch": 6, "step": 1152}}},
        4: {"lr": 4e-4, "reached": {"0.01": {"seconds": 1.5, "epoch": 6, "step": 288}}},
    }
    rows = _ttt_rows([0.01, 0.005], results)
    assert [r["speedup"] for r in rows] == [None, pytest.approx(4.0), None, None]
    assert rows[3]["seconds"] is None  # 0.005 not reached


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("compiled:compile=true", {"compile": True}),
        ("buckets:ddp_bucket_cap_mb=0.016", {"ddp_bucket_cap_mb": 0.016}),
    ],
)
def test_variants_are_checked_like_the_config(text: str, expected: dict[str, object]) -> None:
    assert _variant(text) == (text.split(":")[0], expected)


@pytest.mark.parametrize("text", ["nokey", "ours:compile=true", "x:epoch=3", "x:compile=maybe"])
def test_bad_variants_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        _variant(text)


@pytest.mark.slow
def test_bench_runs_all_three_loops_on_two_gloo_ranks(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.bench_training",
            "--device",
            "cpu",
            "--ranks",
            "1,2",
            "--threads-per-rank",
            "1",
            "--steps",
            "3",
            "--epochs",
            "1",
            "--repeats",
            "1",
            "--grid",
            "40x32",
            "--work-dir",
            str(tmp_path),
            "--json",
            str(out),
            "--timeout",
            "240",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["throughput"]["rows"]
    assert {(r["loop"], r["ranks"]) for r in rows} == {
        (loop, world) for loop in ("dataloader", "resident", "ours") for world in (1, 2)
    }
    assert all(r["per_rank"] > 0 for r in rows)
    assert "| ours" in proc.stdout and "efficiency" in proc.stdout


def test_ours_config_changes_are_checked_like_the_config() -> None:
    assert _ours("cuda_graph=false") == {"cuda_graph": False}
    with pytest.raises(argparse.ArgumentTypeError):
        _ours("cuda_graph=maybe")
    # The harness's own switch rides along, unchecked by the config.
    assert _variant("capturefail:fail_capture=true,cuda_graph=true") == (
        "capturefail",
        {"cuda_graph": True, "fail_capture": True},
    )


def test_graph_notes_compare_each_variant_with_ours() -> None:
    def run(status: str, val: float) -> dict[str, object]:
        return {
            "rows": 1,
            "seconds": 1.0,
            "steps": 1,
            "cuda_graph": status,
            "train_loss": 0.5,
            "val_loss": val,
        }

    results = {
        4: {
            "runs": {
                "dataloader": [{"rows": 1, "seconds": 1.0, "steps": 1}],
                "ours": [run("captured at step 12 of this run", 0.25)],
                "eager": [run("off (training.cuda_graph: false)", 0.25)],
                "other": [run("off", 0.5)],
            }
        }
    }
    lines = _graph_notes(results, ["ours", "eager", "other"])
    assert lines[0].startswith("ours, 4 rank(s): CUDA graph captured at step 12")
    assert lines[1].endswith("bitwise the same as ours")
    assert lines[2].endswith("val loss 1.0e+00 relative from ours'")


def test_time_to_target_variants_and_epoch_clocks() -> None:
    ours = {
        "lr": 1e-4,
        "reached": {},
        "train_time_s": [0.05, 0.02, 0.02],
        "epoch_end_s": [0.06, 0.09, 0.12],
        "variants": {"eager": {"lr": 1e-4, "reached": {}}},
    }
    assert _ttt_variant({1: ours, 4: {"lr": 4e-4, "reached": {}}}, "eager") == {
        1: {"lr": 1e-4, "reached": {}}
    }
    text = _outside_steps(ours)
    assert "20.0 ms of steps" in text and "10.0 ms outside them" in text
    assert "epoch 1: 50.0 ms steps, 10.0 ms outside" in text
    assert _outside_steps({}) == "no per-epoch clock"


@pytest.mark.slow
def test_cpu_scaling_runs_every_exchange_beside_independent_copies(tmp_path: Path) -> None:
    # The short CPU mode of bench.cpu_scaling: 2 ranks of 1 CPU, as on a 2-core machine.
    out = tmp_path / "scaling.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.cpu_scaling",
            "--ranks",
            "2",
            "--cpus-per-rank",
            "1",
            "--steps",
            "3",
            "--epochs",
            "1",
            "--warmup-epochs",
            "0",
            "--grid",
            "40x32",
            "--layouts",
            "hpcdist",
            "--work-dir",
            str(tmp_path),
            "--json",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        # Every CPU of the machine: a test before may have left this process bound to one.
        preexec_fn=lambda: os.sched_setaffinity(0, range(os.cpu_count() or 1)),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    layouts = json.loads(out.read_text())["layouts"]
    # One layout: each layout runs every exchange again (the full mode compares several;
    # a --layout of one's own is parsed in test_cpu_scaling_takes_a_layout_of_ones_own).
    assert set(layouts) == {"hpcdist"}
    for layout in layouts.values():
        steps = layout["step_ms"]
        exchanges = {"shm", "direct", "halving", "gloo"}
        assert set(steps) == {"alone", "copies", *exchanges}, layout["errors"]
        assert len(steps["copies"]) == 2 and min(steps["copies"]) > 0
        assert all(steps[name] > 0 for name in ("alone", *exchanges))
        # Counted on the sockets: the TCP exchanges send about the gradients (2 ranks),
        # shared memory next to nothing.
        sent = layout["bytes_per_rank_step"]
        assert set(sent) == exchanges and len(layout["bytes_per_rank_step_each"]["gloo"]) == 2
        grads = layout["gradient_bytes"]
        assert all(0.9 * grads < sent[name] < 1.5 * grads for name in ("direct", "halving", "gloo"))
        assert sent["shm"] < 0.1 * grads
    assert "| hpcdist (1 threads" in proc.stdout and "direct/copies" in proc.stdout
    assert "halving sent" in proc.stdout


def test_cpu_scaling_takes_a_layout_of_ones_own() -> None:
    from bench.cpu_scaling import _layout

    assert _layout("passive:OMP_WAIT_POLICY=PASSIVE") == (
        "passive",
        {"OMP_WAIT_POLICY": "PASSIVE"},
    )
    assert _layout("t8:threads=8, KMP_BLOCKTIME=0") == (
        "t8",
        {"threads": "8", "KMP_BLOCKTIME": "0"},
    )
    for bad, said in (
        ("passive", "expected NAME:threads=T"),
        ("p:NOEQUALS", "expected VAR=VALUE in --layout"),
        ("p:threads=0", "threads must be an integer >= 1"),
    ):
        with pytest.raises(argparse.ArgumentTypeError, match=said):
            _layout(bad)


def test_cpu_scaling_refuses_more_cpus_than_it_may_use() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.cpu_scaling", "--ranks", "2", "--cpus-per-rank", "4096"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "2 ranks x 4096 CPUs need 8192 CPUs" in proc.stderr


@pytest.mark.cxx
@pytest.mark.xdist_group("cxx")  # on the worker that builds the C++ example
def test_export_paths_bench_short_mode_times_both_cxx_paths(
    binary: Path,  # noqa: F811
    case: dict[str, Any],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench.export_paths import main as export_paths

    out = tmp_path / "paths.json"
    args = ["--short", "--binary", str(binary), "--model", str(case["model"])]
    assert export_paths([*args, "--aoti", str(case["aoti"]), "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert (record["rows"], record["threads"], record["processes"]) == (1000, 1, 1)
    for path in ("torchscript", "aoti"):
        timings = record["paths"][path]
        assert timings["first_jacobian_ms"] > 0 and timings["jacobian_ms"] > 0
        # 1 and 2 threads measured; the ratio is whatever this machine gives, > 0.
        assert set(record["by_threads"]) == {"1", "2"}
        assert record["jacobian_vs_one_thread"][path]["1"] == 1.0
        assert record["jacobian_vs_one_thread"][path]["2"] > 0
    assert record["aoti_jacobian_speedup"] > 0 and record["aoti_max_diff"] < 1e-3
    printed = capsys.readouterr().out
    assert "| torchscript |" in printed and "| aoti |" in printed
    assert "C++ at 2 thread(s)" in printed and "torchscript 1 threads 1.00x" in printed
