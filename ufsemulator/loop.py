"""The epoch/step loop: DDP or FSDP, gradient accumulation, validation, checkpoints.

A step is one optimiser update (``grad_accum_steps`` micro-batches of ``batch_size``
rows per rank). At step boundaries the ranks agree on a stop request (one all_reduce
MAX every ``preemption.check_every_steps`` steps, and at every epoch end); rank 0 then
checkpoints the step within the epoch, and a resumed run replays the same permutation
from that step on.

The step is launch-bound (a 9,345-parameter MLP), so nothing in it waits for the device:
the loss is summed on the device and read at the epoch end, the stop agreement runs on
the CPU, and checkpoint files are written by a background thread (all on disk before
``run`` returns). On a GPU (``training.cuda_graph``) the whole step (forward, loss,
backward with DDP's all-reduce, Adam, the loss sum) is captured once as a CUDA graph and
replayed: one launch a step instead of dozens. docs/benchmarks.md measures it against
plain DDP loops.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_optimizer_state_dict,
)
from torch.nn.parallel import DistributedDataParallel

from hpcdist.distributed import DistContext
from ufsemulator.checkpoint import capture_rng
from ufsemulator.ckptwriter import CheckpointWriter
from ufsemulator.config import Config
from ufsemulator.errors import CheckpointError
from ufsemulator.model import EmulatorMLP, ModelConfig
from ufsemulator.parallel import adam, compile_model, cuda_graph_blocker, no_sync, wrap

Status = Literal["completed", "early_stopped", "preempted"]
HISTORY_KEYS = ("train_loss", "val_loss", "val_r2", "epoch_time_s", "train_time_s", "samples")
_VAL_CHUNK = 65536
# Full (unsharded) state on rank 0 only, in CPU memory: what a checkpoint file holds.
_SAVE_OPTIONS = StateDictOptions(full_state_dict=True, cpu_offload=True)
# Eager DDP iterations before a capture: DDP rebuilds its buckets after the first one and
# times iterations 1-10 (and every 100th) with CUDA events that a graph cannot hold.
_GRAPH_WARMUP_STEPS = 11
_DDP_TIMED_EVERY = 100


@dataclass(frozen=True, eq=False)
class _StepGraph:
    """A captured training step and the static buffers it reads its rows from."""

    graph: torch.cuda.CUDAGraph
    x: torch.Tensor
    y: torch.Tensor


class StopFlag:
    """Set asynchronously (a signal handler); read by the loop at step boundaries."""

    def __init__(self) -> None:
        self.requested = False

    def set(self) -> None:
        self.requested = True


@dataclass(frozen=True, eq=False)
class Shards:
    """This rank's normalised training shard and share of the validation set."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    n_train: int  # all ranks together
    n_val: int


class Loop:
    def __init__(
        self,
        ctx: DistContext,
        config: Config,
        model: EmulatorMLP,
        shards: Shards,
        run_dir: Path,
        flag: StopFlag,
        step_callback: Callable[[int], None] | None = None,
    ) -> None:
        self.ctx, self.config, self.shards, self.run_dir = ctx, config, shards, run_dir
        self.flag, self.step_callback = flag, step_callback
        self.model_config = model.config
        cfg = config.training
        model = model.to(ctx.device)
        if cfg.compile:
            compile_model(model, cfg.strategy, ctx)
        # CUDA graphs: the steps run (eagerly first, then captured and replayed) on a side
        # stream of their own, which DDP is built on too (see _wrap).
        self._stream: torch.cuda.Stream | None = None
        self._graph: _StepGraph | None = None
        self._graph_failed = False
        self._eager_steps = 0  # DDP iterations this loop ran eagerly
        self.cuda_graph_status = "off (training.cuda_graph: false)"
        if cfg.cuda_graph:
            blocker = cuda_graph_blocker(cfg.strategy, cfg.compile, ctx)
            if blocker is None:
                self._stream = torch.cuda.Stream(ctx.device)
                self.cuda_graph_status = "on, not captured yet"
            else:
                self.cuda_graph_status = f"off ({blocker})"
                if ctx.is_main and ctx.device.type == "cuda":
                    print(f"training.cuda_graph ignored: {blocker}; the steps run eagerly",
                          flush=True)  # fmt: skip
        self.model = self._wrap(model)
        scale = ctx.env.world_size if cfg.scale_lr_with_world_size else 1
        self.optimizer = adam(self.model, cfg.lr * scale, cfg.weight_decay, cfg.strategy,
                              capturable=self._stream is not None)  # fmt: skip
        self.loss_fn = _loss(cfg.loss, cfg.huber_delta)
        self.epoch = 0  # completed epochs
        self.step = 0  # optimiser steps, all epochs
        self.step_in_epoch = 0  # steps done in the epoch in progress
        self.partial = torch.zeros(2, dtype=torch.float64, device=ctx.device)  # loss sum, rows
        # The step adds its loss into a view made once (no indexing op per step) and counts
        # its rows on the host (no kernel per step); _fold_rows() moves them into partial.
        self._loss_sum = self.partial[0]
        self._rows = 0
        # On a GPU the stop check would copy the flag to the device and back, a host sync;
        # a CPU (gloo) group agrees on it without touching the GPU.
        self._flag_group = dist.new_group(backend="gloo") if ctx.device.type == "cuda" else None
        self._writer = CheckpointWriter() if ctx.is_main else None
        self.partial_time = [0.0, 0.0]  # epoch and training seconds before a preemption
        self.best_val = math.inf
        self.best_epoch = 0
        self.bad_epochs = 0
        self.history: dict[str, list[float]] = {key: [] for key in HISTORY_KEYS}

    def _wrap(self, model: nn.Module) -> nn.Module:
        cfg = self.config.training
        if self._stream is None:
            return wrap(model, cfg.strategy, cfg.ddp_bucket_cap_mb, self.ctx)  # type: ignore[arg-type]
        # DDP's gradient hooks belong to the stream current when it is built; a capture
        # on another stream would fail, so it is built on the steps' stream.
        main = torch.cuda.current_stream(self.ctx.device)
        self._stream.wait_stream(main)
        with torch.cuda.stream(self._stream):
            wrapped = wrap(model, cfg.strategy, cfg.ddp_bucket_cap_mb, self.ctx)  # type: ignore[arg-type]
        main.wait_stream(self._stream)
        return wrapped

    # ------------------------------------------------------------------ checkpoints

    def restore(self, ckpt: dict[str, Any], source: str) -> None:
        """Optimiser, counters and history of ``ckpt`` (the weights are already loaded)."""
        try:
            with warnings.catch_warnings():  # a capturable Adam's first, uncaptured step
                warnings.filterwarnings("ignore", message=".*capturable=True.*")
                set_optimizer_state_dict(
                    self.model, self.optimizer, ckpt["optimizer"],
                    options=StateDictOptions(full_state_dict=True),
                )  # fmt: skip
            self.epoch, self.step = int(ckpt["epoch"]), int(ckpt["step"])
            self.step_in_epoch = int(ckpt["step_in_epoch"])
            self.partial.copy_(ckpt["partial"].to(self.partial))
            self.partial_time = [float(v) for v in ckpt["partial_time"]]
            self.best_val, self.best_epoch = float(ckpt["best_val"]), int(ckpt["best_epoch"])
            self.bad_epochs = int(ckpt["bad_epochs"])
            self.history = {key: [float(v) for v in ckpt["history"][key]] for key in HISTORY_KEYS}
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"checkpoint '{source}' cannot resume training: {exc}") from exc
        self._fit_optimizer_flags()
        world = self.ctx.env.world_size
        if self.ctx.is_main and int(ckpt.get("world_size", world)) != world:
            print(f"Warning: '{source}' was written by {ckpt['world_size']} ranks, resuming "
                  f"with {world}: the shards differ, so the result is not bitwise that of an "
                  "uninterrupted run", flush=True)  # fmt: skip
        if self.ctx.is_main:
            print(f"Resumed from {source}: epoch {self.epoch + 1}, step {self.step_in_epoch} "
                  f"of the epoch, {self.step} steps done", flush=True)  # fmt: skip

    def _fit_optimizer_flags(self) -> None:
        """A loaded optimiser state brings the flags of the run that wrote it (a CPU run, or
        a GPU run with CUDA graphs): capturable only where this run captures, and then
        with its step counts on the device."""
        capturable = self._stream is not None
        for group in self.optimizer.param_groups:
            group["capturable"] = capturable
            if not capturable:
                continue
            for param in group["params"]:
                state = self.optimizer.state.get(param, {})
                step = state.get("step")
                if isinstance(step, torch.Tensor) and step.device != param.device:
                    state["step"] = step.to(device=param.device, dtype=torch.float32)

    def _save(self, checkpoint: bool, best: bool) -> None:
        """Collective (FSDP gathers the full state); rank 0 writes, in the background."""
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=_SAVE_OPTIONS)
        self._fold_rows()
        if self._writer is None:
            return
        state = {
            "model": model_sd, "model_config": self.model_config.to_dict(),
            "optimizer": optim_sd, "epoch": self.epoch, "step": self.step,
            "step_in_epoch": self.step_in_epoch, "partial": self.partial.cpu(),
            "partial_time": list(self.partial_time), "rng": capture_rng(),
            "config": self.config.to_dict(), "best_val": self.best_val,
            "best_epoch": self.best_epoch, "bad_epochs": self.bad_epochs,
            "history": self.history, "world_size": self.ctx.env.world_size,
        }  # fmt: skip
        paths = [self.run_dir / name for name, wanted in
                 (("checkpoint.pt", checkpoint), ("best_model.pt", best)) if wanted]  # fmt: skip
        self._writer.submit(state, paths)

    # ------------------------------------------------------------------------ loop

    def run(self) -> Status:
        """Train to the end, an early stop or an agreed stop request; every checkpoint is
        on disk when this returns."""
        try:
            status = self._run()
        except BaseException:
            if self._writer is not None:
                self._writer.close(reraise=False)  # the training error is the one to see
            raise
        if self._writer is not None:
            self._writer.close()
        return status

    def _run(self) -> Status:
        cfg = self.config.training
        x, y = self.shards.x_train, self.shards.y_train
        n_local, batch, accum = x.shape[0], cfg.batch_size, cfg.grad_accum_steps
        n_batches = math.ceil(n_local / batch)
        steps = math.ceil(n_batches / accum)
        tty = self.ctx.is_main and sys.stdout.isatty()
        progress = _Progress(steps, cfg.epochs) if tty else None
        upcoming: tuple[int, torch.Tensor] | None = None  # the next epoch's order, prefetched
        while self.epoch < cfg.epochs:
            epoch_start = time.perf_counter()
            if upcoming is not None and upcoming[0] == self.epoch:
                perm = upcoming[1]
            else:
                perm = self._order(self.epoch, n_local)
            xs, ys = x[perm], y[perm]  # one gather per epoch, then contiguous slices
            with self._step_stream():
                for s in range(self.step_in_epoch, steps):
                    lo = s * accum
                    self._train_step(xs, ys, lo, min(lo + accum, n_batches), batch)
                    self.step += 1
                    self.step_in_epoch = s + 1
                    if self.step_callback is not None:
                        self.step_callback(self.step)
                    if progress is not None:
                        self._fold_rows()
                        progress.update(self.epoch, s + 1, self.partial)
                    # (Not at the epoch's last step: the epoch end checks anyway.)
                    if (self.step % self.config.preemption.check_every_steps == 0
                            and s + 1 < steps and self._stop()):  # fmt: skip
                        elapsed = time.perf_counter() - epoch_start
                        self.partial_time = [self.partial_time[0] + elapsed,
                                             self.partial_time[1] + elapsed]  # fmt: skip
                        self._save(checkpoint=True, best=False)
                        self._log_preempted()
                        return "preempted"
            if self.epoch + 1 < cfg.epochs:
                # While the device still works through the queued steps.
                upcoming = (self.epoch + 1, self._order(self.epoch + 1, n_local))
            if self.ctx.device.type == "cuda":
                # Kernels are still queued: the epoch's time is when they have run.
                torch.cuda.synchronize(self.ctx.device)
            train_time = time.perf_counter() - epoch_start + self.partial_time[1]
            if progress is not None:
                progress.clear()
            status = self._end_epoch(epoch_start, train_time)
            if status is not None:
                return status
        return "completed"

    def _order(self, epoch: int, n_local: int) -> torch.Tensor:
        """The epoch's seeded permutation of this rank's rows, on the device (the copy
        queued behind the work already there, not waited for)."""
        generator = torch.Generator().manual_seed(self.config.training.seed * 1_000_003 + epoch)
        perm = torch.randperm(n_local, generator=generator)
        if self.ctx.device.type != "cuda":
            return perm
        return perm.pin_memory().to(self.ctx.device, non_blocking=True)

    @contextlib.contextmanager
    def _step_stream(self) -> Iterator[None]:
        """With CUDA graphs, the steps run on their own stream, ordered after everything
        queued before them (the epoch's gather, validation) and before everything after."""
        if self._stream is None:
            yield
            return
        main = torch.cuda.current_stream(self.ctx.device)
        self._stream.wait_stream(main)
        try:
            with torch.cuda.stream(self._stream):
                yield
        finally:
            main.wait_stream(self._stream)

    def _train_step(
        self, xs: torch.Tensor, ys: torch.Tensor, first: int, last: int, batch: int
    ) -> None:
        """One optimiser step: ``_step`` itself, or a replay of its CUDA graph."""
        if self._stream is None:
            self._step(xs, ys, first, last, batch)
            return
        rows = min(last * batch, xs.shape[0]) - first * batch
        micro = last - first
        full = micro == self.config.training.grad_accum_steps and rows == micro * batch
        graph = self._graph
        if graph is None and full and self._may_capture():
            graph = self._capture(xs, ys, first, micro, batch)
        if graph is None or not full:
            # Warm-up, an epoch's short last step, or no graph: eagerly, same kernels.
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*capturable=True.*")
                self._step(xs, ys, first, last, batch)
            self._eager_steps += 1
            return
        start = first * batch
        graph.x.copy_(xs[start : start + rows])
        graph.y.copy_(ys[start : start + rows])
        graph.graph.replay()
        self._rows += rows

    def _may_capture(self) -> bool:
        n = self._eager_steps  # DDP's iteration count; the capture is iteration n + 1
        return (not self._graph_failed and n >= _GRAPH_WARMUP_STEPS
                and n % _DDP_TIMED_EVERY != 0 and (n + 1) % _DDP_TIMED_EVERY != 0)  # fmt: skip

    def _capture(
        self, xs: torch.Tensor, ys: torch.Tensor, first: int, micro: int, batch: int
    ) -> _StepGraph | None:
        """Capture ``_step`` over ``micro`` full micro-batches into a graph that reads its
        rows from static buffers (filled before each replay). Nothing runs here."""
        assert self._stream is not None
        start, rows = first * batch, micro * batch
        static = _StepGraph(torch.cuda.CUDAGraph(), xs[start : start + rows].clone(),
                            ys[start : start + rows].clone())  # fmt: skip
        host_rows = self._rows
        # Gradients must not exist yet: backward then allocates them in the graph's pool,
        # and every replay overwrites them instead of adding to them.
        self.optimizer.zero_grad(set_to_none=True)
        try:
            # thread_local: the NCCL watchdog and the checkpoint writer may call CUDA in
            # their threads meanwhile; only this thread's calls must be capturable.
            with torch.cuda.graph(static.graph, stream=self._stream,
                                  capture_error_mode="thread_local"):  # fmt: skip
                self._step(static.x, static.y, 0, micro, batch)
        except Exception as exc:  # any capture error: run eagerly instead
            self._rows = host_rows
            self._give_up_graphs(exc)
            return None
        self._rows = host_rows  # counted by each replay
        self._graph = static
        self.cuda_graph_status = f"captured at step {self.step + 1} of this run"
        return static

    def _give_up_graphs(self, exc: Exception) -> None:
        """A capture failed (on every rank alike): eager steps from here on, with a fresh
        DDP wrapper, since the failed capture may have left DDP's reducer mid-iteration."""
        text = str(exc).strip()
        reason = f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
        self.cuda_graph_status = f"capture failed ({reason}); eager"
        self._graph_failed = True
        if self.ctx.is_main:
            print(f"training.cuda_graph: capture failed ({reason}); the steps run eagerly",
                  flush=True)  # fmt: skip
        torch.cuda.synchronize(self.ctx.device)
        self.optimizer.zero_grad(set_to_none=True)
        module = self.model.module if isinstance(self.model, DistributedDataParallel) else None
        if module is not None:
            self.model = None  # type: ignore[assignment]  # the old reducer goes first
            gc.collect()
            self.model = self._wrap(module)

    def _step(self, xs: torch.Tensor, ys: torch.Tensor, first: int, last: int, batch: int) -> None:
        """One optimiser step over micro-batches ``first..last-1``; the gradient is the
        mean over all their rows, all-reduced once (``no_sync`` on the others)."""
        n_local = xs.shape[0]
        total = min(last * batch, n_local) - first * batch
        for b in range(first, last):
            xb, yb = xs[b * batch : (b + 1) * batch], ys[b * batch : (b + 1) * batch]
            sync = contextlib.nullcontext() if b == last - 1 else no_sync(self.model)
            with sync:
                raw = self.loss_fn(self.model(xb), yb)
                (raw * (xb.shape[0] / total) if last - first > 1 else raw).backward()
            self._loss_sum.add_(raw.detach(), alpha=xb.shape[0])
            self._rows += xb.shape[0]
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _fold_rows(self) -> None:
        if self._rows:
            self.partial[1].add_(self._rows)  # integers: exact in float64, in any grouping
            self._rows = 0

    def _end_epoch(self, epoch_start: float, train_time: float) -> Status | None:
        cfg = self.config.training
        self._fold_rows()
        # One collective and one read for the epoch's training totals, the validation sums
        # and the stop agreement (a stop request arriving after it waits for the next check).
        local = torch.cat([self.partial, self._validation_sums(),
                           self.partial.new_full((1,), float(self.flag.requested))])
        dist.all_reduce(local)
        loss_sum, rows, *val_sums, stop_votes = local.tolist()
        val_loss, r2 = _val_metrics(val_sums)
        improved = val_loss < self.best_val  # False for NaN
        self.epoch += 1
        if improved:
            self.best_val, self.best_epoch, self.bad_epochs = val_loss, self.epoch, 0
        else:
            self.bad_epochs += 1
        early = 0 < cfg.early_stopping_patience <= self.bad_epochs
        for key, value in (("train_loss", loss_sum / rows), ("val_loss", val_loss),
                           ("val_r2", r2), ("train_time_s", train_time),
                           ("samples", rows)):  # fmt: skip
            self.history[key].append(value)
        self.step_in_epoch = 0
        self.partial.zero_()
        stop = stop_votes > 0
        due = self.epoch % cfg.checkpoint_every == 0 or early or stop or self.epoch == cfg.epochs
        self.history["epoch_time_s"].append(
            time.perf_counter() - epoch_start + self.partial_time[0]
        )
        self.partial_time = [0.0, 0.0]
        if due or improved:
            self._save(checkpoint=due, best=improved)
        if self.ctx.is_main:
            train_loss = self.history["train_loss"][-1]
            print(f"Epoch {self.epoch}/{cfg.epochs} - Train: {train_loss:.5g}, "
                  f"Val: {val_loss:.5g}", flush=True)  # fmt: skip
        if early:  # finished: a stop request that came with it needs no resume
            if self.ctx.is_main:
                print(f"Early stopping: no improvement for {self.bad_epochs} epochs (best "
                      f"{self.best_val:.5g} at epoch {self.best_epoch})", flush=True)  # fmt: skip
            return "early_stopped"
        if stop and self.epoch < cfg.epochs:
            self._log_preempted()
            return "preempted"
        return None

    @torch.no_grad()
    def _validation_sums(self) -> torch.Tensor:
        """This rank's sums over its share of the validation set (float64, on the device):
        loss, squared error, sum and sum of squares of the targets, count."""
        x, y = self.shards.x_val, self.shards.y_val
        world = self.ctx.env.world_size
        # Same chunk count on every rank: FSDP gathers weights in every forward call.
        chunks = max(1, math.ceil(math.ceil(self.shards.n_val / world) / _VAL_CHUNK))
        net = self.model.module if isinstance(self.model, DistributedDataParallel) else self.model
        sums = torch.zeros(5, dtype=torch.float64, device=x.device)
        for xc, yc in zip(x.tensor_split(chunks), y.tensor_split(chunks), strict=True):
            pred = net(xc).double()
            yd = yc.double()
            sums += torch.stack([
                self.loss_fn(pred, yd, reduction="sum"), ((pred - yd) ** 2).sum(),
                yd.sum(), (yd * yd).sum(), torch.tensor(float(yd.numel()), device=x.device),
            ])  # fmt: skip
        return sums

    def _stop(self) -> bool:
        """Whether any rank was asked to stop: every rank gets the same answer."""
        flag = torch.tensor([int(self.flag.requested)], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._flag_group)
        return bool(flag.item())

    def _log_preempted(self) -> None:
        if self._writer is not None:
            self._writer.wait()  # the message promises a checkpoint on disk
        if self.ctx.is_main:
            path = self.run_dir / "checkpoint.pt"
            print(f"Stop requested: checkpoint at epoch {self.epoch + 1}, step "
                  f"{self.step_in_epoch} of the epoch ({self.step} steps) in {path}; "
                  "resume with --resume", flush=True)  # fmt: skip


def _val_metrics(sums: list[float]) -> tuple[float, float]:
    """(loss, R^2) of the whole validation set from the all-reduced sums."""
    loss_sum, sse, s1, s2, count = sums
    spread = s2 - s1 * s1 / count
    return loss_sum / count, 1.0 - sse / spread if spread > 0 else float("nan")


def full_model(model: nn.Module, config: ModelConfig) -> EmulatorMLP:
    """A plain CPU copy of the (possibly wrapped or sharded) model; collective."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    plain = EmulatorMLP(config)
    plain.load_state_dict(state)
    return plain


def _loss(name: str, delta: float) -> Callable[..., torch.Tensor]:
    losses: dict[str, Callable[..., torch.Tensor]] = {
        "mse": F.mse_loss,
        "mae": F.l1_loss,
        "huber": functools.partial(F.huber_loss, delta=delta),
    }
    return losses[name]


class _Progress:
    """A one-line progress bar for a person at a terminal (rank 0 only)."""

    def __init__(self, steps: int, epochs: int) -> None:
        self.steps, self.epochs, self.last = steps, epochs, 0.0

    def update(self, epoch: int, step: int, partial: torch.Tensor) -> None:
        now = time.monotonic()
        if now - self.last < 0.2 and step < self.steps:
            return
        self.last = now
        done = int(30 * step / self.steps)
        loss = float(partial[0] / partial[1]) if float(partial[1]) else float("nan")
        sys.stdout.write(f"\rEpoch {epoch + 1}/{self.epochs} [{'#' * done}{'.' * (30 - done)}] "
                         f"{step}/{self.steps} loss {loss:.4g}")  # fmt: skip
        sys.stdout.flush()

    def clear(self) -> None:
        sys.stdout.write("\r" + " " * 72 + "\r")
        sys.stdout.flush()
