from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from ufsemulator.__main__ import EXIT_PREEMPTED, main
from ufsemulator.checkpoints.checkpoint import load_checkpoint
from ufsemulator.config import Config, load_config
from ufsemulator.training import gradreduce
from ufsemulator.training.train import StopFlag, TrainResult, train

REPO = Path(__file__).resolve().parents[3]
SMOKE = REPO / "ufsemulator" / "configs" / "smoke.yaml"
RUN_FILES = {
    "checkpoint.pt",
    "heartbeat.json",
    "checkpoint_timing.json",
    "best_model.pt",
    "model.pt",
    "model.md",
    "loss_curves.svg",
    "training_results.json",
}
# Launcher variables a test run must not inherit (and setup_distributed exports).
LAUNCH_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_PROCID",
    "SLURM_JOB_ID",
    "SUBMITIT_LOCAL_GLOBALID",
    "SUBMITIT_LOCAL_JOB_ID",
)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("data")


@pytest.fixture(autouse=True)
def single_process(monkeypatch: pytest.MonkeyPatch, data_dir: Path) -> Iterator[None]:
    monkeypatch.setenv("HPCDIST_DATA_DIR", str(data_dir))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    for var in LAUNCH_VARS:
        monkeypatch.delenv(var, raising=False)
    yield


def run_single(monkeypatch: pytest.MonkeyPatch, config: Config, **kwargs: object) -> TrainResult:
    result = train(config, **kwargs)  # type: ignore[arg-type]
    # train() leaves no launcher variables behind for the next run in this process
    assert not [var for var in LAUNCH_VARS if var in os.environ]
    return result


def smoke(**training: object) -> Config:
    config = load_config(SMOKE)
    return dataclasses.replace(config, training=dataclasses.replace(config.training, **training))


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_single_process_run_writes_the_run_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_single(monkeypatch, smoke(), run_dir=tmp_path / "run")
    out = capsys.readouterr().out
    assert result.status == "completed" and result.epochs_run == 3
    assert {p.name for p in (tmp_path / "run").iterdir()} == RUN_FILES
    assert "Single process: no process group\n" in out  # nothing to set up for one rank
    assert re.search(r"^\[Rank 0\] Training samples: \d+$", out, re.M)
    assert re.search(r"^Epoch 3/3 - Train: [\d.e-]+, Val: [\d.e-]+$", out, re.M)
    results = json.loads((tmp_path / "run" / "training_results.json").read_text())
    for key in (
        "world_size",
        "backend",
        "device",
        "threads",
        "epoch_times_s",
        "samples_per_second",
        "final_train_loss",
        "final_val_loss",
        "best_val_loss",
        "best_val_r2",
        "epochs_run",
    ):
        assert key in results, key
    assert results["world_size"] == 1 and len(results["epoch_times_s"]) == 3
    assert results["final_val_loss"] == pytest.approx(result.final_val_loss)
    scripted = torch.jit.load(str(tmp_path / "run" / "model.pt"))
    x = torch.randn(5, 14)
    best = load_checkpoint(tmp_path / "run" / "best_model.pt")
    assert best["epoch"] == result.best_epoch
    assert scripted.predict(x).shape == (5, 1)


def test_stop_and_resume_is_bitwise_identical(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    straight = run_single(monkeypatch, smoke(epochs=4), run_dir=tmp_path / "a")
    first = run_single(monkeypatch, smoke(epochs=2), run_dir=tmp_path / "b")
    assert first.epochs_run == 2
    resumed = run_single(
        monkeypatch,
        smoke(epochs=4),
        resume=tmp_path / "b" / "checkpoint.pt",
        run_dir=tmp_path / "b",
    )
    assert resumed.epochs_run == 4
    assert_same_weights(straight.model, resumed.model)
    a = json.loads((tmp_path / "a" / "training_results.json").read_text())["history"]
    b = json.loads((tmp_path / "b" / "training_results.json").read_text())["history"]
    assert a == b


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_mid_epoch_preemption_resumes_bitwise(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, strategy: str
) -> None:
    config = smoke(epochs=3, batch_size=32, strategy=strategy)  # 5 steps per epoch
    config = dataclasses.replace(
        config, preemption=dataclasses.replace(config.preemption, check_every_steps=1)
    )
    straight = run_single(monkeypatch, config, run_dir=tmp_path / "a")

    def warn_at_step_7(step: int) -> None:
        if step == 7:  # the scheduler's warning arrives in epoch 2, step 2
            os.kill(os.getpid(), signal.SIGUSR2)

    stopped = run_single(monkeypatch, config, run_dir=tmp_path / "b", step_callback=warn_at_step_7)
    assert stopped.status == "preempted"
    ckpt = load_checkpoint(tmp_path / "b" / "checkpoint.pt")
    assert (ckpt["epoch"], ckpt["step_in_epoch"], ckpt["step"]) == (1, 2, 7)
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL  # handler removed again
    resumed = run_single(monkeypatch, config, resume=tmp_path / "b" / "checkpoint.pt")
    assert resumed.status == "completed" and resumed.run_dir == tmp_path / "b"
    assert_same_weights(straight.model, resumed.model)
    a = json.loads((tmp_path / "a" / "training_results.json").read_text())["history"]
    b = json.loads((tmp_path / "b" / "training_results.json").read_text())["history"]
    assert a == b


def test_a_ddp_checkpoint_resumes_under_fsdp_with_torchs_own_adam(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The ddp run's FusedAdam records fused=True; FSDP's torch.optim.Adam (for-loop form)
    keeps its own implementation flags when it loads that state."""
    config = smoke(epochs=2, batch_size=32)

    def warn_at_step_3(step: int) -> None:
        if step == 3:
            os.kill(os.getpid(), signal.SIGUSR2)

    stopped = run_single(monkeypatch, config, run_dir=tmp_path / "b", step_callback=warn_at_step_3)
    assert stopped.status == "preempted"
    saved = load_checkpoint(tmp_path / "b" / "checkpoint.pt")["optimizer"]["param_groups"][0]
    assert (saved["fused"], saved["foreach"]) == (True, None)
    fsdp = dataclasses.replace(
        config, training=dataclasses.replace(config.training, strategy="fsdp")
    )
    resumed = run_single(monkeypatch, fsdp, resume=tmp_path / "b" / "checkpoint.pt")
    assert resumed.status == "completed" and resumed.epochs_run == 2
    written = load_checkpoint(tmp_path / "b" / "checkpoint.pt")["optimizer"]["param_groups"][0]
    assert (written["fused"], written["foreach"]) == (None, False)


def test_gradient_accumulation_matches_one_big_batch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from ufsemulator.training import loop

    calls = []
    original = loop.no_sync

    def counting_no_sync(model: torch.nn.Module) -> object:  # one process: no DDP wrapper
        calls.append(1)
        return original(model)

    monkeypatch.setattr(loop, "no_sync", counting_no_sync)
    big = run_single(monkeypatch, smoke(epochs=2, batch_size=60), run_dir=tmp_path / "a")
    assert not calls
    # 154 rows: steps of 60, 60 and 34 rows = micro-batches of 30+30, 30+30 and 30+4
    accum = run_single(
        monkeypatch, smoke(epochs=2, batch_size=30, grad_accum_steps=2), run_dir=tmp_path / "b"
    )
    assert len(calls) == 2 * 3  # one no_sync (the first micro-batch) per step
    for p, q in zip(big.model.parameters(), accum.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


def test_early_stopping_stops_and_keeps_the_best_model(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    result = run_single(
        monkeypatch, smoke(epochs=50, lr=0.5, early_stopping_patience=2), run_dir=tmp_path
    )
    assert result.status == "early_stopped" and result.epochs_run < 50
    assert result.epochs_run == result.best_epoch + 2
    assert load_checkpoint(tmp_path / "best_model.pt")["epoch"] == result.best_epoch


# ------------------------------------------------------------------ several processes

RANK_SCRIPT = textwrap.dedent(
    """
    import sys, torch
    from pathlib import Path
    from ufsemulator.config import load_config
    from ufsemulator.training.train import train

    out, run_dir, strategy, rank = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    written = []
    def audit(event, args):
        if event == "open" and str(args[0]).startswith(str(run_dir)):
            flags = args[2] if isinstance(args[2], int) else 0
            if (isinstance(args[1], str) and set(args[1]) & set("wax+")) or flags & 0o3:
                written.append(str(args[0]))
    sys.addaudithook(audit)
    config = load_config(sys.argv[5])
    result = train(config, run_dir=run_dir)
    torch.save({"state": result.model.state_dict(), "written": written,
                "status": result.status, "val": result.final_val_loss},
               out / f"rank{rank}.pt")
    """
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


RankRun = list[tuple[str, dict]]  # (output, rank{r}.pt) per rank


def run_ranks(
    tmp_path: Path, strategy: str, data_dir: Path, world: int = 2, training: str = ""
) -> RankRun:
    config = tmp_path / "config.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    # smoke.yaml ends inside its training section
    config.write_text(SMOKE.read_text() + f"  strategy: {strategy}\n{training}")
    port = free_port()
    procs = []
    for rank in range(world):
        env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
        env.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            WORLD_SIZE=str(world),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(world),
            PYTHONPATH=str(REPO),
            HPCDIST_DATA_DIR=str(data_dir),
            OMP_NUM_THREADS="1",
        )
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    RANK_SCRIPT,
                    str(tmp_path),
                    str(tmp_path / "run"),
                    strategy,
                    str(rank),
                    str(config),
                ],
                env=env,
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = [p.communicate(timeout=180)[0] for p in procs]
    for proc, out in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, out
    return [
        (out, torch.load(tmp_path / f"rank{r}.pt", weights_only=True))
        for r, out in enumerate(outputs)
    ]


@pytest.fixture(scope="module")
def ddp_ranks(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> tuple[Path, RankRun]:
    tmp = tmp_path_factory.mktemp("ddp")
    return tmp, run_ranks(tmp, "ddp", data_dir)


@pytest.mark.slow
def test_two_gloo_ranks_agree_and_only_rank_0_writes(ddp_ranks: tuple[Path, RankRun]) -> None:
    from ufsemulator.data.read import DataOptions, load_dataset
    from ufsemulator.model.normalization import stats_from_shard
    from ufsemulator.training.runfiles import synthetic_path

    tmp_path, ((out0, r0), (out1, r1)) = ddp_ranks
    assert "Distributed training initialized: gloo backend, 2 processes" in out0
    assert re.search(r"^Master: 127\.0\.0\.1:\d+$", out0, re.M)
    n0 = re.search(r"^\[Rank 0\] Training samples: (\d+)$", out0, re.M)
    n1 = re.search(r"^\[Rank 1\] Training samples: (\d+)$", out1, re.M)
    assert n0 and n1 and n0.group(1) == n1.group(1)
    assert re.search(r"^Epoch 3/3 - Train: [\d.e-]+, Val: [\d.e-]+$", out0, re.M)
    assert "Epoch" not in out1 and "Distributed training initialized" not in out1
    assert r0["written"] and not r1["written"]
    assert {p.name for p in (tmp_path / "run").iterdir()} == RUN_FILES
    # Statistics from all-reduced sums, weights kept in step by DDP: all identical.
    for key in r0["state"]:
        assert torch.equal(r0["state"][key], r1["state"][key]), key
    assert r0["val"] == r1["val"]
    # ... and the statistics are those of the whole training set in one process.
    dataset = load_dataset(synthetic_path(40, 32, 0), DataOptions())
    n = len(dataset)
    n_val = round(0.2 * n)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(42))
    train_idx = order[n_val:][: 2 * ((n - n_val) // 2)].numpy()
    stats = stats_from_shard(dataset.inputs[train_idx], dataset.targets[train_idx])
    torch.testing.assert_close(
        r0["state"]["input_mean"], torch.tensor(stats.input_mean, dtype=torch.float32)
    )
    torch.testing.assert_close(
        r0["state"]["output_std"], torch.tensor(stats.output_std, dtype=torch.float32)
    )


@pytest.mark.slow
def test_ranks_of_one_host_share_their_gradients_in_memory_with_gloos_result(
    tmp_path: Path, data_dir: Path
) -> None:
    before = set(gradreduce.SHM_DIR.glob("hpcdist-grads-*"))
    (out0, shared), _ = run_ranks(tmp_path / "shared", "ddp", data_dir)
    assert "Gradient all-reduce: shared memory (this host)" in out0
    assert set(gradreduce.SHM_DIR.glob("hpcdist-grads-*")) == before  # removed once mapped
    (gloo_out, gloo), (_, gloo1) = run_ranks(
        tmp_path / "gloo", "ddp", data_dir, training="  grad_allreduce: backend\n"
    )
    assert "Gradient all-reduce: backend" in gloo_out
    # Two ranks: a/2 + b/2 in either order is the same sum, so the same bits.
    for key in shared["state"]:
        assert torch.equal(shared["state"][key], gloo["state"][key]), key
    assert shared["val"] == gloo["val"] == gloo1["val"]


@pytest.mark.slow
def test_shared_memory_with_several_buckets_and_micro_batches_on_three_ranks(
    tmp_path: Path, data_dir: Path
) -> None:
    # Several DDP buckets (one hook call each per step), accumulation (no hook call on the
    # first micro-batch) and three ranks, where the order of the sum matters.
    training = "  ddp_bucket_cap_mb: 0.005\n  grad_accum_steps: 2\n"
    shared = run_ranks(tmp_path / "shared", "ddp", data_dir, world=3, training=training)
    assert "Gradient all-reduce: shared memory (this host)" in shared[0][0]
    gloo = run_ranks(
        tmp_path / "gloo",
        "ddp",
        data_dir,
        world=3,
        training=training + "  grad_allreduce: backend\n",
    )
    for key in shared[0][1]["state"]:
        for _, rank in shared[1:]:  # every rank summed in the same order: the same bits
            assert torch.equal(rank["state"][key], shared[0][1]["state"][key]), key
        torch.testing.assert_close(shared[0][1]["state"][key], gloo[0][1]["state"][key])


@pytest.mark.slow
def test_fsdp_on_two_gloo_ranks_matches_ddp(
    tmp_path: Path, data_dir: Path, ddp_ranks: tuple[Path, RankRun]
) -> None:
    ddp = ddp_ranks[1][0][1]
    (_, fsdp0), (_, fsdp1) = run_ranks(tmp_path, "fsdp", data_dir)
    assert fsdp0["status"] == "completed" and fsdp0["written"] and not fsdp1["written"]
    for key in ddp["state"]:
        torch.testing.assert_close(fsdp0["state"][key], ddp["state"][key])
        assert torch.equal(fsdp0["state"][key], fsdp1["state"][key])


# ------------------------------------------------------------------------------- CLI


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_cli_trains_and_exports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "grid.nc"
    assert main(["make-data", "--out", str(data), "--ni", "40", "--nj", "32"]) == 0
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--config",
                str(SMOKE),
                "--data",
                str(data),
                "--run-dir",
                str(run),
                "--epochs",
                "2",
            ]
        )
        == 0
    )
    assert json.loads((run / "training_results.json").read_text())["epochs_run"] == 2
    assert (
        main(
            ["export", "--checkpoint", str(run / "checkpoint.pt"), "--out", str(tmp_path / "m.pt")]
        )
        == 0
    )
    exported = torch.jit.load(str(tmp_path / "m.pt"))
    # Rows inside the training range: a background mostly outside it is refused.
    assert exported.jac_physical(exported.input_mean.repeat(3, 1)).shape == (3, 1, 14)
    # Resuming without --config takes the checkpoint's config; --epochs extends the run.
    assert main(["train", "--resume", str(run / "checkpoint.pt"), "--epochs", "3"]) == 0
    assert load_checkpoint(run / "checkpoint.pt")["epoch"] == 3


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--config", "{tmp}/bad.yaml"], "unknown key 'training.epoch'"),
        (["train", "--resume", "{tmp}/garbage.pt"], "garbage.pt"),
        (["train", "--resume", "{tmp}/absent.pt"], "absent.pt"),
        (["train", "--config", str(SMOKE), "--data", "{tmp}/absent.nc"], "absent.nc"),
        (["export", "--checkpoint", "{tmp}/garbage.pt", "--out", "{tmp}/m.pt"], "garbage.pt"),
        (["train", "--epochs", "0"], "--epochs must be >= 1"),
    ],
)
def test_cli_user_errors_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    (tmp_path / "bad.yaml").write_text("training:\n  epoch: 3\n")
    (tmp_path / "garbage.pt").write_bytes(b"\x00garbage")
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_preempted_cli_run_exits_with_the_requeue_code(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    class AlreadyWarned(StopFlag):
        def __init__(self) -> None:
            self.requested = True

    monkeypatch.setattr("ufsemulator.training.train.StopFlag", AlreadyWarned)
    rc = main(["train", "--config", str(SMOKE), "--run-dir", str(tmp_path)])
    assert rc == EXIT_PREEMPTED
    ckpt = load_checkpoint(tmp_path / "checkpoint.pt")
    # smoke: 2 steps per epoch, so the first agreed check is the one at the epoch's end
    assert (ckpt["epoch"], ckpt["step"], ckpt["step_in_epoch"]) == (1, 2, 0)
    results = json.loads((tmp_path / "training_results.json").read_text())
    assert results["status"] == "preempted" and not (tmp_path / "model.pt").exists()


# ------------------------------------------------------------------------ run folder


@pytest.mark.parametrize(
    ("environ", "name"),
    [
        ({"SLURM_JOB_ID": "4242", "SUBMITIT_LOCAL_JOB_ID": "77"}, "4242"),
        ({"SUBMITIT_LOCAL_JOB_ID": "77"}, "77"),
        ({"SLURM_JOB_ID": " "}, None),
        ({}, None),
    ],
)
def test_default_run_dir_is_named_for_the_job(environ: dict[str, str], name: str | None) -> None:
    from ufsemulator.training.runfiles import default_run_dir

    path = default_run_dir(environ, base=Path("/scratch"))
    assert path.parent == Path("/scratch/runs")
    if name is None:
        assert re.fullmatch(r"\d{8}-\d{6}", path.name)
    else:
        assert path.name == name


def test_data_dir_follows_hpcdist_data_dir() -> None:
    from ufsemulator.training.runfiles import data_dir, synthetic_path

    assert data_dir({"HPCDIST_DATA_DIR": "/data/x"}) == Path("/data/x")
    assert data_dir({}) == Path.home() / ".cache" / "ufsemulator"
    assert synthetic_path(8, 6, 1, {"HPCDIST_DATA_DIR": "/d"}) == Path("/d/synthetic_8x6_seed1.nc")


def test_progress_bar_only_at_a_terminal(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_single(monkeypatch, smoke(epochs=1), run_dir=tmp_path / "a")
    assert "\r" not in capsys.readouterr().out
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    run_single(monkeypatch, smoke(epochs=1), run_dir=tmp_path / "b")
    assert re.search(r"\rEpoch 1/1 \[#+\] 2/2 loss [\d.]+", capsys.readouterr().out)


# ------------------------------------------------------------------------- CUDA graphs


def test_cuda_graph_is_on_by_default_and_ignored_on_the_cpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ufsemulator.training import loop as loop_module

    assert load_config(None).training.cuda_graph is True
    statuses: list[str] = []
    original = loop_module.Loop.run

    def run(self: loop_module.Loop) -> loop_module.RunSummary:
        statuses.append(self.cuda_graph_status)
        return original(self)

    monkeypatch.setattr(loop_module.Loop, "run", run)
    on = run_single(monkeypatch, smoke(epochs=2, cuda_graph=True), run_dir=tmp_path / "a")
    off = run_single(monkeypatch, smoke(epochs=2, cuda_graph=False), run_dir=tmp_path / "b")
    assert statuses == ["off (not on a GPU)", "off (training.cuda_graph: false)"]
    assert "training.cuda_graph" not in capsys.readouterr().out  # no note on the CPU
    assert_same_weights(on.model, off.model)
    ckpt = load_checkpoint(tmp_path / "a" / "checkpoint.pt")
    assert not any(group["capturable"] for group in ckpt["optimizer"]["param_groups"])


def test_cuda_graph_blockers() -> None:
    from hpcdist.distributed import DistContext, DistEnv
    from ufsemulator.training.parallel import cuda_graph_blocker

    def ctx(backend: str, device: str) -> DistContext:
        env = DistEnv(
            rank=0,
            local_rank=0,
            world_size=1,
            local_world_size=1,
            node_rank=0,
            master_addr="127.0.0.1",
            master_port=29500,
            num_threads=None,
            source="single",
            hostname="localhost",
        )
        return DistContext(env=env, backend=backend, device=torch.device(device), is_main=True)

    assert cuda_graph_blocker("ddp", False, ctx("gloo", "cpu")) == "not on a GPU"
    assert "fsdp" in (cuda_graph_blocker("fsdp", False, ctx("nccl", "cuda:0")) or "")
    assert "compile" in (cuda_graph_blocker("ddp", True, ctx("nccl", "cuda:0")) or "")
    assert cuda_graph_blocker("ddp", False, ctx("nccl", "cuda:0")) is None


# 40x32 grid: 154 training rows. Batch 32: 4 full steps and one of 26 rows an epoch; after
# 3 eager steps, step 4 (the last full one of epoch 1) is captured; step 5, the first short
# one, runs eagerly, and the next, step 10 at the end of epoch 2, is captured. Batch 77
# divides the rows: 2 full steps an epoch, one graph.
GRAPH_CASES = [
    (32, [(3, 4), (4, 10)], "step 4 (32 rows), step 10 (26 rows)", [21, 5]),
    (77, [(3, 4)], "step 4 (77 rows)", [9]),
]


@pytest.mark.parametrize(("batch", "expected", "status", "replays"), GRAPH_CASES)
def test_graph_bookkeeping_trains_like_eager_steps(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    batch: int,
    expected: list[tuple[int, int]],
    status: str,
    replays: list[int],
) -> None:
    """The graph path's logic on the CPU, with a stand-in for the CUDA graph that replays
    the captured step eagerly from the static buffers: warm-up steps, the capture point,
    the rows copied before each replay, the short last step of an epoch with a graph of
    its own and the host-side row count all give bitwise the training of the plain loop."""
    from ufsemulator.training import loop as loop_module
    from ufsemulator.training import stepgraph

    captures: list[tuple[int, int]] = []
    loops: list[loop_module.Loop] = []

    class ReplayEagerly:
        """Stands in for torch.cuda.CUDAGraph: a replay runs the captured step eagerly."""

        def __init__(self, step: stepgraph.Step, x: torch.Tensor, y: torch.Tensor) -> None:
            self.step, self.x, self.y, self.replays = step, x, y, 0

        def replay(self) -> None:
            loop = loops[-1]
            rows = loop._sums.rows  # a real replay does not touch the host's count
            self.step(self.x, self.y)
            loop._sums.rows = rows
            self.replays += 1

    fakes: list[ReplayEagerly] = []

    def capture(
        self: stepgraph.GraphedSteps,
        step: stepgraph.Step,
        x: torch.Tensor,
        y: torch.Tensor,
        at_step: int,
    ) -> stepgraph.StepGraph:
        captures.append((self.eager_steps, at_step))
        static_x, static_y = torch.full_like(x, 7.0), torch.full_like(y, 7.0)
        fakes.append(ReplayEagerly(step, static_x, static_y))
        # Stands in for GraphedSteps.capture, so it records what that method records.
        static = stepgraph.StepGraph(fakes[-1], static_x, static_y)  # type: ignore[arg-type]
        self._record(static, at_step)
        return static

    real_capture = loop_module.Loop._capture

    def recording_capture(self: loop_module.Loop, *args: Any) -> None:
        loops.append(self)
        real_capture(self, *args)

    monkeypatch.setattr(loop_module, "cuda_graph_blocker", lambda *args: None)
    monkeypatch.setattr(torch.cuda, "Stream", lambda *args, **kwargs: object())
    monkeypatch.setattr(stepgraph.GraphedSteps, "build", lambda self, make: make())
    monkeypatch.setattr(stepgraph.GraphedSteps, "running", lambda self: contextlib.nullcontext())
    monkeypatch.setattr(stepgraph.GraphedSteps, "capture", capture)
    monkeypatch.setattr(loop_module.Loop, "_capture", recording_capture)
    graphed = run_single(monkeypatch, smoke(epochs=6, batch_size=batch), run_dir=tmp_path / "a")
    assert captures == expected
    assert loops[0].cuda_graph_status == f"captured at {status} of this run"
    plain = run_single(
        monkeypatch, smoke(epochs=6, batch_size=batch, cuda_graph=False), run_dir=tmp_path / "b"
    )
    assert_same_weights(graphed.model, plain.model)
    a = json.loads((tmp_path / "a" / "training_results.json").read_text())["history"]
    b = json.loads((tmp_path / "b" / "training_results.json").read_text())["history"]
    for key in ("train_loss", "val_loss", "val_r2"):
        assert a[key] == b[key], key
    # 32: 24 full steps in 6 epochs, the first 3 eager; 6 short ones, the first eager.
    # 77: 12 full steps, the first 3 eager.
    assert [fake.replays for fake in fakes] == replays


def test_failed_capture_goes_on_eagerly_and_trains_like_the_plain_loop(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ufsemulator.training import loop as loop_module
    from ufsemulator.training import stepgraph

    statuses: list[str] = []

    def failing_capture(
        self: stepgraph.GraphedSteps,
        step: stepgraph.Step,
        x: torch.Tensor,
        y: torch.Tensor,
        at_step: int,
    ) -> stepgraph.StepGraph:
        # A real capture records kernels without running them; on the CPU the stand-in
        # cannot, so it fails before the step's first operation.
        raise RuntimeError("operation not permitted when stream is capturing")

    real_run = loop_module.Loop.run

    def run(self: loop_module.Loop) -> loop_module.RunSummary:
        status = real_run(self)
        statuses.append(self.cuda_graph_status)
        return status

    monkeypatch.setattr(loop_module, "cuda_graph_blocker", lambda *args: None)
    monkeypatch.setattr(torch.cuda, "Stream", lambda *args, **kwargs: object())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    monkeypatch.setattr(stepgraph.GraphedSteps, "build", lambda self, make: make())
    monkeypatch.setattr(stepgraph.GraphedSteps, "running", lambda self: contextlib.nullcontext())
    monkeypatch.setattr(stepgraph.GraphedSteps, "capture", failing_capture)
    monkeypatch.setattr(loop_module.Loop, "run", run)
    failed = run_single(monkeypatch, smoke(epochs=6, batch_size=32), run_dir=tmp_path / "a")
    assert statuses == [
        "capture failed (RuntimeError: operation not permitted when stream is capturing); eager"
    ]
    assert "training.cuda_graph: capture failed" in capsys.readouterr().out
    plain = run_single(
        monkeypatch, smoke(epochs=6, batch_size=32, cuda_graph=False), run_dir=tmp_path / "b"
    )
    assert_same_weights(failed.model, plain.model)


def test_a_job_ending_before_its_checkpoint_fits_checkpoints_early_on_its_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # SLURM ends this job now and warns 1 s before: no checkpoint of 0.5 s plus the margin
    # fits, so the training stops itself once it has measured one (it trains until then).
    monkeypatch.setenv("HPCDIST_SIGNAL_LEAD", "1")
    monkeypatch.setenv("SLURM_JOB_END_TIME", str(int(time.time())))
    config = smoke(epochs=1_000_000, test_checkpoint_delay_s=0.5)
    result = run_single(monkeypatch, config, run_dir=tmp_path / "run")
    out = capsys.readouterr().out
    assert result.status == "preempted", out
    assert "warning lead 1 s is shorter than the last checkpoint" in out
    assert "hpcdist: checkpointing early" in out
    timing = json.loads((tmp_path / "run" / "checkpoint_timing.json").read_text())
    assert timing["seconds"] >= 0.5
    stopped = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert stopped["epoch"] == result.epochs_run < 1_000_000


def test_loop_hooks_watch_every_step_and_may_end_the_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from ufsemulator.checkpoints.state import RunProgress
    from ufsemulator.training.loop import LoopHooks

    updates: list[int] = []
    epochs: list[tuple[int, int]] = []

    def after_epoch(progress: RunProgress) -> bool:
        epochs.append((progress.epoch, progress.step))
        return progress.epoch == 2

    hooks = LoopHooks(after_epoch=after_epoch, before_update=lambda: updates.append(1))
    steps: list[int] = []
    config = smoke(epochs=5)
    result = run_single(
        monkeypatch, config, run_dir=tmp_path / "a", hooks=hooks, step_callback=steps.append
    )
    assert (result.status, result.epochs_run) == ("completed", 2)
    assert epochs == [(1, 2), (2, 4)] and steps == [1, 2, 3, 4] and len(updates) == 4
    with pytest.raises(ValueError, match="not both"):
        both = LoopHooks(after_step=steps.append)
        train(smoke(), run_dir=tmp_path / "b", step_callback=steps.append, hooks=both)


def test_training_flushes_subnormal_floats_on_the_cpu_while_it_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A subnormal weight made each CPU step ~45x slower (testbed, epoch 460): the loop
    flushes them to zero while it runs, and clears the flag again when it returns.
    1e-39 is subnormal in float32; flushed, the product is 0."""

    from ufsemulator.training.loop import LoopHooks

    def product() -> float:
        return (torch.tensor([1e-39], dtype=torch.float32) * 1.0).item()

    seen: list[float] = []
    assert product() != 0.0
    run_single(
        monkeypatch,
        smoke(epochs=1),
        run_dir=tmp_path / "run",
        hooks=LoopHooks(after_step=lambda step: seen.append(product())),
    )
    assert seen and set(seen) == {0.0}
    assert product() != 0.0  # cleared for what runs after the loop


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_run_id_and_heartbeat_of_a_finished_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from hpcdist.facts.heartbeat import parse

    monkeypatch.setenv("HPCDIST_RUN_ID", "41-beefed")
    record = tmp_path / "state" / "41-0.train.json"
    record.parent.mkdir()
    monkeypatch.setenv("HPCDIST_RUN_RECORD", str(record))
    result = run_single(monkeypatch, smoke(), run_dir=tmp_path / "run")
    results = json.loads((tmp_path / "run" / "training_results.json").read_text())
    assert results["run_id"] == "41-beefed"
    beat = parse((tmp_path / "run" / "heartbeat.json").read_bytes())
    assert beat is not None and beat.run_id == "41-beefed" and beat.phase == "done"
    assert beat.epoch == beat.epochs == result.epochs_run == 3
    assert beat.steps is not None and beat.step == beat.steps > 0 and beat.piece_step == 0
    assert beat.checkpoint_epoch == 3 and beat.checkpoint_step == beat.steps
    assert beat.checkpoint_s is not None and beat.checkpoint_s > 0
    assert beat.loss == pytest.approx(result.final_train_loss)
    piece = json.loads(record.read_text())
    assert piece["run_id"] == "41-beefed" and piece["resumed_from"] is None
    assert piece["run_dir"] == str(tmp_path / "run")
    from ufsemulator.export.torchscript import read_extra_files

    origin = json.loads(read_extra_files(tmp_path / "run" / "model.pt")["provenance.json"])
    assert origin["run_id"] == "41-beefed"
