"""One rank of a benchmark job: ``python -m bench.worker JOB.json`` (started by bench.launch).

Two kinds of job, both in a process group formed by hpcdist's ``setup_distributed``:

- ``throughput``: the reference loops and the project's ``Loop`` (``ours``, plus any
  config variants of it) on the same rows, one after the other, ``repeats`` times.
  ``ours`` is ``Loop.run()`` itself, the code ``python -m ufsemulator train`` runs; its
  time is the per-epoch training time it records (``train_time_s``: the steps and the
  epoch's shuffle, the device synchronised at the end; validation and checkpoints not
  counted, as the references have none).
- ``ttt``: time to a target validation loss: the project's split (``training.split``)
  and ``Loop.run()`` from its first step until the epoch whose validation loss reaches
  the smallest target.

Rank 0 rewrites the result file after every measurement, so a later failure keeps the
numbers taken before it.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bench import collectives, exchanges, refloops
from bench.launch import NO_MULTICAST
from bench.socketbytes import tcp_bytes_sent
from bench.synthdata import load_arrays
from hpcdist.distributed import DistContext, distributed
from ufsemulator.checkpoints.state import RunProgress
from ufsemulator.config import Config, load_config
from ufsemulator.model.emulator import EmulatorMLP, ModelConfig
from ufsemulator.model.normalization import stats_from_shard
from ufsemulator.training.loop import Loop, LoopHooks, Shards, StopFlag
from ufsemulator.training.train import split


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    job: dict[str, Any] = json.loads(Path(args[0]).read_text())
    unsafe = {k: os.environ.get(k) for k, v in NO_MULTICAST.items() if os.environ.get(k) != v}
    if unsafe:  # never start NCCL with NVLink multicast possible (shared GPU hosts)
        print(f"error: NVLink multicast must be off in every rank: {unsafe}", file=sys.stderr)
        return 2
    backend = "nccl" if job["device"] == "cuda" else "gloo"
    with distributed(timeout_s=job.get("init_timeout_s", 120.0), backend=backend) as ctx:
        result: dict[str, Any] = {
            "world": ctx.env.world_size,
            "backend": ctx.backend,
            "device": _device_name(ctx),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
        }
        runners = {
            "throughput": throughput,
            "ttt": time_to_target,
            "collectives": collectives.measure,
            "exchanges": exchanges.measure,
        }
        runners[job["kind"]](ctx, job, result)
        _write(ctx, job, result)
    return 0


def _device_name(ctx: DistContext) -> str:
    if ctx.device.type == "cuda":
        return torch.cuda.get_device_name(ctx.device)
    return "cpu"


def _write(ctx: DistContext, job: dict[str, Any], result: dict[str, Any]) -> None:
    if ctx.is_main:
        path = Path(job["result"])
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(path)


def _with_training(config: Config, **changes: Any) -> Config:
    return dataclasses.replace(config, training=dataclasses.replace(config.training, **changes))


# ------------------------------------------------------------------------------ throughput


def throughput(ctx: DistContext, job: dict[str, Any], result: dict[str, Any]) -> None:
    rank, world = ctx.env.rank, ctx.env.world_size
    batch, warmup, epochs = job["batch"], job["warmup_epochs"], job["epochs"]
    inputs, targets = load_arrays(Path(job["data"]))
    torch.manual_seed(0)
    template = EmulatorMLP(ModelConfig())
    template.set_normalization(stats_from_shard(inputs, targets))
    with torch.no_grad():
        x_pool = template.normalize_inputs(torch.from_numpy(inputs))
        y_pool = (torch.from_numpy(targets) - template.output_mean) / template.output_std
    # Weak scaling: every rank gets steps x batch rows (the pool repeated where it is
    # smaller), so each rank runs the same number of steps per epoch at any world size.
    per_rank = job["steps"] * batch
    pool = x_pool.shape[0]
    mine = (torch.arange(per_rank) + rank * per_rank) % pool
    everyone = torch.arange(per_rank * world) % pool
    val = torch.arange(rank, min(pool, job["val_rows"] * world), world)
    result.update(rows_per_rank=per_rank, pool_rows=pool, runs={}, errors={})

    def fresh_model() -> EmulatorMLP:
        return copy.deepcopy(template)

    loops: dict[str, Callable[[], refloops.Timing]] = {
        "dataloader": lambda: refloops.dataloader_loop(
            ctx, fresh_model(), x_pool[everyone], y_pool[everyone], batch, warmup, epochs
        ),
        "resident": lambda: refloops.resident_loop(
            ctx, fresh_model(), x_pool[mine], y_pool[mine], batch, warmup, epochs
        ),
    }
    shards = Shards(
        x_train=x_pool[mine].to(ctx.device),
        y_train=y_pool[mine].to(ctx.device),
        x_val=x_pool[val].to(ctx.device),
        y_val=y_pool[val].to(ctx.device),
        n_train=per_rank * world,
        n_val=val.numel() * world,
    )
    base = _with_training(
        load_config(None),
        batch_size=batch,
        epochs=warmup + epochs,
        early_stopping_patience=0,
        checkpoint_every=10**9,
    )
    variants = _variants(job)
    _start_line(job)
    for name, changes in variants.items():
        changes = dict(changes)
        hooks = _capture_hooks(changes.pop("fail_capture", False))
        config = _with_training(base, **changes)
        loops[name] = functools.partial(_ours, ctx, config, fresh_model, shards, warmup, hooks)
    for repeat in range(job["repeats"]):
        for name in job["loops"] + [v for v in variants if v != "ours"]:
            if name in result["errors"]:
                continue
            try:
                timing = loops[name]()
            except Exception as exc:
                result["errors"][name] = f"{type(exc).__name__}: {exc}"
                traceback.print_exc()
                _write(ctx, job, result)
                raise
            result["runs"].setdefault(name, []).append(timing.as_dict())
            if ctx.is_main:
                rate = timing.rows / timing.seconds if timing.seconds else 0.0
                print(
                    f"[bench] {world} ranks, repeat {repeat + 1}: {name} "
                    f"{rate / 1e3:.1f}k samples/s per rank",
                    flush=True,
                )
            _write(ctx, job, result)


def _start_line(job: dict[str, Any], timeout_s: float = 300.0) -> None:
    """Wait until every process the launcher started for this measurement is ready (its
    data loaded), so that independent copies run side by side, not one after another."""
    line = job.get("start_line")
    if not line:
        return
    folder = Path(line["folder"])
    (folder / str(os.getpid())).touch()
    deadline = time.monotonic() + timeout_s
    while sum(1 for _ in folder.iterdir()) < line["count"]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"not every process reached the start line in {timeout_s:.0f} s")
        time.sleep(0.001)


def _variants(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``ours``' config changes, and each variant's: ours' changes, then its own."""
    ours = job.get("ours", {})
    return {"ours": ours, **{k: {**ours, **v} for k, v in job.get("variants", {}).items()}}


def _fail_capture() -> None:
    """A ``before_update`` hook that makes the CUDA-graph capture fail after backward (DDP's
    all-reduce recorded, the optimiser step not): the fallback to eager steps is measured."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("capture failure injected by the benchmark")


def _capture_hooks(fail_capture: bool) -> LoopHooks:
    return LoopHooks(before_update=_fail_capture if fail_capture else None)


def _ours(
    ctx: DistContext,
    config: Config,
    make_model: Callable[[], EmulatorMLP],
    shards: Shards,
    warmup: int,
    hooks: LoopHooks,
) -> refloops.Timing:
    sent_at: list[int] = []  # this process's TCP bytes when the timed epochs begin

    def mark(progress: RunProgress) -> bool:
        if progress.epoch == warmup:
            sent_at.append(tcp_bytes_sent())
        return bool(hooks.after_epoch(progress)) if hooks.after_epoch else False

    with tempfile.TemporaryDirectory(prefix="bench-run-") as run_dir:
        watched = dataclasses.replace(hooks, after_epoch=mark)
        loop = Loop(ctx, config, make_model(), shards, Path(run_dir), StopFlag(), watched)
        refloops.settle(ctx)
        if warmup == 0:
            sent_at.append(tcp_bytes_sent())
        summary = loop.run()
        sent = tcp_bytes_sent() - sent_at[0] if sent_at else None
    history = summary.progress.history
    steps_per_epoch = -(-shards.x_train.shape[0] // config.training.batch_size)
    timed = range(warmup, len(history["train_time_s"]))
    # Rank 0's clock is the one reported: it enters each epoch last (it snapshots the
    # checkpoint), so its epoch is the steps alone; the others' include their wait for it.
    seconds = sum(history["train_time_s"][e] for e in timed)
    rows = sum(history["samples"][e] for e in timed) / ctx.env.world_size
    # Each rank's mean wait for the others inside the shared-memory all-reduce (ms).
    waited = getattr(loop.grad_reducer, "waited_s", None)
    waits: list[Any] = [None] * ctx.env.world_size
    steps = max(summary.progress.step, 1)
    dist.all_gather_object(waits, None if waited is None else 1e3 * waited / steps)
    # Each rank's TCP bytes sent per timed step, counted by the kernel (bench.socketbytes).
    sent_per_step: list[Any] = [None] * ctx.env.world_size
    timed_steps = steps_per_epoch * len(timed)
    dist.all_gather_object(sent_per_step, None if sent is None else sent / max(timed_steps, 1))
    extra = {
        "wait_ms": waits,
        "bytes_sent_per_step": sent_per_step,
        "cuda_graph": summary.cuda_graph,
        "grad_allreduce": summary.grad_allreduce,
        "train_loss": history["train_loss"][-1],
        "val_loss": history["val_loss"][-1],
    }
    return refloops.Timing(int(rows), seconds, steps_per_epoch * len(timed), extra)


# --------------------------------------------------------------------------- time to target


class _Targets:
    """Clocks a run until its validation loss reaches each target; its ``after_epoch``
    (a ``LoopHooks`` hook) ends the run once all are reached."""

    def __init__(self, targets: list[float]) -> None:
        self.targets = sorted(targets, reverse=True)
        self.reached: dict[float, dict[str, float]] = {}
        self.epoch_end_s: list[float] = []  # clock at each epoch's end (after its checkpoint)
        self.started = 0.0

    def start(self) -> None:
        self.started = time.perf_counter()

    def after_epoch(self, progress: RunProgress) -> bool:
        self.epoch_end_s.append(time.perf_counter() - self.started)
        val = progress.history["val_loss"][-1]
        for target in self.targets:
            if target not in self.reached and val <= target:
                self.reached[target] = {
                    "seconds": time.perf_counter() - self.started,
                    "epoch": progress.epoch,
                    "step": progress.step,
                    "val_loss": val,
                }
        return len(self.reached) == len(self.targets)


def time_to_target(ctx: DistContext, job: dict[str, Any], result: dict[str, Any]) -> None:
    inputs, targets = load_arrays(Path(job["data"]))
    config = _with_training(
        load_config(None),
        scale_lr_with_world_size=True,
        epochs=job["max_epochs"],
        early_stopping_patience=0,
        **job.get("training", {}),
    )
    torch.manual_seed(config.training.seed)  # as training._train: same weights on every rank
    model = EmulatorMLP(
        ModelConfig(hidden=config.model.hidden_sizes, activation=config.model.activation)
    )
    shards = split(ctx, config, inputs, targets, model)
    steps_per_epoch = -(-shards.x_train.shape[0] // config.training.batch_size)
    result.update(
        targets=job["targets"],
        steps_per_epoch=steps_per_epoch,
        n_train=shards.n_train,
        n_val=shards.n_val,
        lr=config.training.lr * ctx.env.world_size,
        batch_per_rank=config.training.batch_size,
        variants={},
    )
    # ours (the default config), then each variant, from the same initial weights.
    for name, changes in _variants(job).items():
        changes = dict(changes)
        fail_capture = changes.pop("fail_capture", False)
        run = _ttt_run(
            ctx,
            _with_training(config, **changes),
            copy.deepcopy(model),
            shards,
            job["targets"],
            fail_capture,
        )
        if name == "ours":
            result.update(run)
        else:
            result["variants"][name] = run
        _write(ctx, job, result)


def _ttt_run(
    ctx: DistContext,
    config: Config,
    model: EmulatorMLP,
    shards: Shards,
    targets: list[float],
    fail_capture: bool = False,
) -> dict[str, Any]:
    # One-time costs (CUDA kernel loading, cuBLAS and communicator set-up) are not training:
    # a throwaway loop pays them first, two steps on a copy of the model.
    rows = 2 * config.training.batch_size
    warm = dataclasses.replace(shards, x_train=shards.x_train[:rows], y_train=shards.y_train[:rows])
    with tempfile.TemporaryDirectory(prefix="bench-warm-") as run_dir:
        Loop(
            ctx,
            _with_training(config, epochs=1),
            copy.deepcopy(model),
            warm,
            Path(run_dir),
            StopFlag(),
        ).run()
    watch = _Targets(targets)
    hooks = dataclasses.replace(_capture_hooks(fail_capture), after_epoch=watch.after_epoch)
    with tempfile.TemporaryDirectory(prefix="bench-ttt-") as run_dir:
        loop = Loop(ctx, config, model, shards, Path(run_dir), StopFlag(), hooks)
        refloops.settle(ctx)
        watch.start()
        summary = loop.run()
        total = time.perf_counter() - watch.started
    history = summary.progress.history
    return {
        "status": summary.status,
        "reached": {str(k): v for k, v in watch.reached.items()},
        "total_s": total,
        "epochs_run": summary.epochs_run,
        "val_loss": list(history["val_loss"]),
        "epoch_time_s": list(history["epoch_time_s"]),
        "train_time_s": list(history["train_time_s"]),
        "epoch_end_s": watch.epoch_end_s,
        "cuda_graph": summary.cuda_graph,
        "grad_allreduce": summary.grad_allreduce,
        "lr": config.training.lr * ctx.env.world_size,
    }


if __name__ == "__main__":
    code = main()
    # Results are written and the group destroyed: leave without the interpreter's
    # teardown, in which gloo's threads were seen to abort a finished rank (SIGABRT, "terminate
    # called without an active exception"; once in 12 runs of a 2-rank job here).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
