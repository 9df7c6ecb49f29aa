"""The epoch/step loop: data-parallel or FSDP, gradient accumulation, validation, checkpoints.

A step is one optimiser update (``grad_accum_steps`` micro-batches of ``batch_size``
rows per rank). At step boundaries the ranks agree on a stop request (one all_reduce
MAX every ``preemption.check_every_steps`` steps, and at every epoch end); rank 0 then
checkpoints the step within the epoch, and a resumed run replays the same permutation
from that step on.

The step is launch-bound (a 9,345-parameter MLP), so nothing in it waits for the device:
the loss is summed on the device and read at the epoch end, the stop agreement runs on
the CPU, and checkpoint files are written by a background thread (all on disk before
``run`` returns). On a GPU (``training.cuda_graph``) the whole step is captured once as a
CUDA graph and replayed (``ufsemulator.training.stepgraph``). docs/benchmarks.md measures it
against plain DDP loops.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hpcdist.distributed import DistContext, HeartbeatWriter, heartbeat_for
from ufsemulator.checkpoints.checkpoint import capture_rng
from ufsemulator.checkpoints.state import EpochRecord, RunProgress, TrainingState
from ufsemulator.config import Config
from ufsemulator.errors import CheckpointError
from ufsemulator.model.emulator import EmulatorMLP, ModelConfig
from ufsemulator.training.adam import FusedAdam
from ufsemulator.training.earlystop import stop_before_the_end, timed_writer
from ufsemulator.training.fullstate import full_model_state, full_state, sharded, unwrap
from ufsemulator.training.gradreduce import LocalAllReduce, gradient_allreduce
from ufsemulator.training.gradsync import carries_vote, reduce_gradients
from ufsemulator.training.metrics import TrainSums, loss_function, val_metrics, validation_sums
from ufsemulator.training.parallel import (
    adam,
    compile_model,
    cuda_graph_blocker,
    grouped,
    no_sync,
    wrap,
)
from ufsemulator.training.progress import Progress
from ufsemulator.training.runfiles import run_anchor
from ufsemulator.training.stepgraph import GraphedSteps
from ufsemulator.training.summary import LoopTimes, RunSummary, Status
from ufsemulator.training.warmup import Warmup

__all__ = ["Loop", "LoopHooks", "RunSummary", "Shards", "Status", "StopFlag", "full_model"]

_VAL_CHUNK = 65536


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


@dataclass(frozen=True)
class LoopHooks:
    """Where a caller (a test, a benchmark, a progress report) watches or steers the loop
    without subclassing it. Every rank calls them; a hook that steers must answer the
    same on every rank."""

    # After each optimiser step, with the number of steps done (all epochs).
    after_step: Callable[[int], None] | None = None
    # After each epoch's end (validation done, its checkpoint handed to the writer), with
    # the run's progress; returning True ends the run there, as "completed".
    after_epoch: Callable[[RunProgress], bool] | None = None
    # Inside each step, after backward (gradients all-reduced), before the optimiser
    # update. A CUDA graph replays the captured step without calling it again; raising in
    # it while the graph is captured makes the capture fail (the eager fallback follows).
    before_update: Callable[[], None] | None = None


class Loop:
    """One run's training. Set once here: the context, configuration, shards, hooks, the
    wrapped model, optimiser and gradient all-reduce. What changes as it trains:
    ``progress`` (a frozen ``RunProgress``, replaced at every epoch end and stop: the
    checkpoint's counters and history), the running epoch's loss sums (``TrainSums``),
    and the CUDA graph (``GraphedSteps``, which keeps its own state)."""

    def __init__(
        self,
        ctx: DistContext,
        config: Config,
        model: EmulatorMLP,
        shards: Shards,
        run_dir: Path,
        flag: StopFlag,
        hooks: LoopHooks | None = None,
    ) -> None:
        self.ctx, self.config, self.shards, self.run_dir = ctx, config, shards, run_dir
        self.flag, self.hooks = flag, hooks if hooks is not None else LoopHooks()
        self.model_config = model.config
        cfg = config.training
        model = model.to(ctx.device)
        if cfg.compile:
            compile_model(model, cfg.strategy, ctx)
        self._graphs, self._graphs_off = self._cuda_graphs()
        # grad_reducer None: the backend's all-reduce.
        self.grad_reducer, self.grad_allreduce_status = self._gradient_allreduce(model)
        self.model = self._wrap(model)
        self.warmup = Warmup.for_run(
            cfg.lr,
            ctx.env.world_size,
            cfg.scale_lr_with_world_size,
            cfg.lr_warmup_epochs,
            self._steps_per_epoch(),
        )
        self.optimizer = adam(
            self.model,
            self.warmup.peak_lr,
            cfg.weight_decay,
            cfg.strategy,
            capturable=self._graphs is not None,
            warmup=self.warmup,
        )
        self.loss_fn = loss_function(cfg.loss, cfg.huber_delta)
        self.progress = RunProgress()
        self._sums = TrainSums(ctx.device)
        # On a GPU the stop check would copy the flag to the device and back, a host sync;
        # a CPU (gloo) group agrees on it without touching the GPU.
        on_gpu = ctx.device.type == "cuda" and grouped()
        self._flag_group = dist.new_group(backend="gloo") if on_gpu else None
        self._voted: bool | None = None  # the last step's agreed vote, where it carried one
        # Every checkpoint's SHA-256 goes to the private state: auto-resume trusts only those.
        # Every write walks to the run folder from the working folder again, checking each
        # folder it opens: a run folder swapped for another user's is refused, not written.
        anchor = run_anchor(run_dir)
        delay = cfg.test_checkpoint_delay_s
        self._writer = timed_writer(run_dir, anchor, delay) if ctx.is_main else None
        self.times = LoopTimes()
        # Rank 0's heartbeat in the run folder (hpcdist.facts.heartbeat); False: none.
        self.heartbeat_on = ctx.is_main
        self.heartbeat: HeartbeatWriter | None = None

    def _cuda_graphs(self) -> tuple[GraphedSteps | None, str]:
        """The CUDA graph of the steps, or None and why they run eagerly."""
        cfg, ctx = self.config.training, self.ctx
        if not cfg.cuda_graph:
            return None, "off (training.cuda_graph: false)"
        blocker = cuda_graph_blocker(cfg.strategy, cfg.compile, ctx)
        if blocker is None:
            return GraphedSteps(ctx.device), "off (training.cuda_graph: false)"
        if ctx.is_main and ctx.device.type == "cuda":
            print(f"training.cuda_graph ignored: {blocker}; the steps run eagerly", flush=True)
        return None, f"off ({blocker})"

    def _gradient_allreduce(self, model: nn.Module) -> tuple[LocalAllReduce | None, str]:
        """The DDP gradient all-reduce of ``training.grad_allreduce`` (None: the backend's)
        and its status line."""
        cfg = self.config.training
        if cfg.grad_allreduce == "backend" or cfg.strategy != "ddp":
            return None, "backend"
        numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
        numel += carries_vote(self.ctx.device)  # GradSync's stop vote rides along
        planned = cfg.epochs * self._steps_per_epoch() if cfg.grad_allreduce == "auto" else None
        reducer, why = gradient_allreduce(cfg.grad_allreduce, numel, self.ctx, planned)
        if reducer is None:
            return None, f"backend ({why})"
        return reducer, reducer.name

    def _steps_per_epoch(self) -> int:
        batches = math.ceil(self.shards.x_train.shape[0] / self.config.training.batch_size)
        return math.ceil(batches / self.config.training.grad_accum_steps)

    @property
    def cuda_graph_status(self) -> str:
        """Whether the steps run as a CUDA graph, for logs and benchmarks."""
        return self._graphs.status if self._graphs is not None else self._graphs_off

    def _wrap(self, model: nn.Module) -> nn.Module:
        cfg = self.config.training

        def make() -> nn.Module:
            return wrap(
                model,  # type: ignore[arg-type]
                cfg.strategy,
                cfg.ddp_bucket_cap_mb,
                self.ctx,
                self.grad_reducer,
                compiled=cfg.compile,
            )

        return make() if self._graphs is None else self._graphs.build(make)

    # ------------------------------------------------------------------ checkpoints

    def restore(self, state: TrainingState, source: str) -> None:
        """Optimiser and progress of ``state`` (the weights are already loaded)."""
        try:
            if isinstance(self.optimizer, FusedAdam):
                names = dict(unwrap(self.model).named_parameters())
                self.optimizer.load_full_state(state.optimizer, names)
            else:
                self._restore_torch_optimizer(state.optimizer)
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"checkpoint '{source}' cannot resume training: {exc}") from exc
        self.progress = state.progress
        self._sums.reset(state.progress.partial)
        self._fit_optimizer_flags()
        world = self.ctx.env.world_size
        if self.ctx.is_main and state.world_size != world:
            print(
                f"Warning: '{source}' was written by {state.world_size} ranks, resuming "
                f"with {world}: the shards differ, so the result is not bitwise that of an "
                "uninterrupted run",
                flush=True,
            )
        if self.ctx.is_main:
            p = self.progress
            print(
                f"Resumed from {source}: epoch {p.epoch + 1}, step {p.step_in_epoch} "
                f"of the epoch, {p.step} steps done",
                flush=True,
            )

    def _restore_torch_optimizer(self, saved: dict[str, Any]) -> None:
        # Here, not at the top: a run that does not resume never pays for its import.
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        # Loading takes the saved group's settings, the implementation flags too (a
        # FusedAdam checkpoint says fused=True): this optimiser keeps its own.
        own = [{k: g[k] for k in ("fused", "foreach")} for g in self.optimizer.param_groups]
        with warnings.catch_warnings():  # a capturable Adam's first, uncaptured step
            warnings.filterwarnings("ignore", message=".*capturable=True.*")
            set_optimizer_state_dict(
                self.model,
                self.optimizer,  # type: ignore[arg-type]
                saved,
                options=StateDictOptions(full_state_dict=True),
            )
        for group, flags in zip(self.optimizer.param_groups, own, strict=True):
            group.update(flags)

    def _fit_optimizer_flags(self) -> None:
        """A loaded optimiser state brings the flags of the run that wrote it (a CPU run, or
        a GPU run with CUDA graphs): capturable only where this run captures, and then
        with its step counts on the device."""
        if isinstance(self.optimizer, FusedAdam):
            return  # its step counts are on the device already; nothing to fit
        capturable = self._graphs is not None
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
        started = time.perf_counter()
        try:
            self._hand_over(checkpoint, best, started)
        finally:
            self.times.checkpoint_s += time.perf_counter() - started

    def _hand_over(self, checkpoint: bool, best: bool, started: float) -> None:
        if self._writer is None and not sharded(self.model):
            return  # only FSDP needs every rank to take part
        model_sd, optim_sd = full_state(self.model, self.optimizer)
        if self._writer is None:
            return
        state = TrainingState(
            model=model_sd,
            model_config=self.model_config,
            optimizer=optim_sd,
            config=self.config,
            rng=capture_rng(),
            world_size=self.ctx.env.world_size,
            progress=self.progress,
        )
        paths = [
            self.run_dir / name
            for name, wanted in (("checkpoint.pt", checkpoint), ("best_model.pt", best))
            if wanted
        ]
        label = (self.progress.epoch, self.progress.step, started) if checkpoint else None
        self._writer.submit(state.to_dict(), paths, label)

    # ------------------------------------------------------------------------ loop

    def run(self) -> RunSummary:
        """Train to the end, an early stop or an agreed stop request; every checkpoint is
        on disk when this returns."""
        # Subnormal floats are flushed to zero on the CPU while the loop runs: as weight decay
        # drives a weight toward zero, a few subnormal values made every CPU step about 45x
        # slower (94 ms against 2 ms for a 1000-row step of the default model, on a
        # checkpoint of epoch 460 of a 2-node training on the testbed). The flag is the
        # thread's: it is cleared again at the end, for the code that runs after the loop.
        torch.set_flush_denormal(True)
        try:
            with stop_before_the_end(self._writer, self.flag.set, self.run_dir):
                status = self._run()
        except BaseException:
            if self._writer is not None:
                self._writer.close(reraise=False)  # the training error is the one to see
            raise
        finally:
            torch.set_flush_denormal(False)
        if self._writer is not None:
            started = time.perf_counter()
            self._writer.close()
            self.times.checkpoint_s += time.perf_counter() - started
        if self.heartbeat is not None:
            p = self.progress
            self._beat(p.epoch + (status == "preempted"), p.step, _FINAL_PHASE[status])
        return RunSummary(
            status=status,
            progress=self.progress,
            n_train=self.shards.n_train,
            n_val=self.shards.n_val,
            cuda_graph=self.cuda_graph_status,
            grad_allreduce=self.grad_allreduce_status,
            loop_times=self.times,
        )

    def _run(self) -> Status:
        cfg = self.config.training
        x, y = self.shards.x_train, self.shards.y_train
        n_local, batch, accum = x.shape[0], cfg.batch_size, cfg.grad_accum_steps
        n_batches = math.ceil(n_local / batch)
        steps = self._steps_per_epoch()
        check_every = self.config.preemption.check_every_steps
        after_step, after_epoch = self.hooks.after_step, self.hooks.after_epoch
        bar = Progress(steps, cfg.epochs) if self.ctx.is_main and sys.stdout.isatty() else None
        beat = self._start_heartbeat(steps)
        beat_due = beat.due if beat is not None else _never
        upcoming: torch.Tensor | None = None  # the next epoch's order, prepared early
        while self.progress.epoch < cfg.epochs:
            epoch_start = time.perf_counter()
            if self.times.first_step_at is None:
                self.times.first_step_at = epoch_start
            # The step counters live in locals while the epoch runs; self.progress takes
            # them at the epoch's end or at a stop.
            epoch, step = self.progress.epoch, self.progress.step
            perm = upcoming if upcoming is not None else self._order(epoch, n_local)
            xs, ys = x[perm], y[perm]  # one gather per epoch, then contiguous slices
            with self._graphs.running() if self._graphs else contextlib.nullcontext():
                for s in range(self.progress.step_in_epoch, steps):
                    lo = s * accum
                    self._train_step(xs, ys, lo, min(lo + accum, n_batches), batch, step)
                    step += 1
                    if beat_due():  # one clock read a step
                        self._beat(epoch + 1, step)
                    if after_step is not None:
                        after_step(step)
                    if bar is not None:
                        bar.update(epoch, s + 1, self._sums.fold())
                    # (Not at the epoch's last step: the epoch end checks anyway.)
                    if step % check_every == 0 and s + 1 < steps and self._stop():
                        elapsed = time.perf_counter() - epoch_start
                        partial = self._sums.fold().tolist()
                        self.progress = self.progress.stopped_at(step, s + 1, partial, elapsed)
                        self._save(checkpoint=True, best=False)
                        self._log_preempted()
                        return "preempted"
            if epoch + 1 < cfg.epochs:
                # While the device still works through the queued steps.
                upcoming = self._order(epoch + 1, n_local)
            self._sync_device()  # kernels are still queued: the epoch ends when they have run
            train_time = time.perf_counter() - epoch_start + self.progress.partial_time[1]
            if bar is not None:
                bar.clear()
            status = self._end_epoch(epoch_start, train_time, step)
            if after_epoch is not None and after_epoch(self.progress):
                status = "completed"
            if status is not None:
                return status
        return "completed"

    def _sync_device(self) -> None:
        if self.ctx.device.type == "cuda":
            torch.cuda.synchronize(self.ctx.device)

    def _start_heartbeat(self, steps: int) -> HeartbeatWriter | None:
        if self.heartbeat_on and self.heartbeat is None:
            epochs = self.config.training.epochs
            self.heartbeat = heartbeat_for(self.run_dir, epochs, epochs * steps, self.progress.step)
        return self.heartbeat

    def _beat(self, epoch: int, step: int, phase: str = "training") -> None:
        """The heartbeat of step ``step`` of epoch ``epoch`` (1-based): the epoch's mean
        loss so far (else the last epoch's), the last checkpoint on disk."""
        beat = self.heartbeat
        if beat is None:
            return
        loss_sum, rows = self._sums.fold().tolist()  # every few seconds: one host sync
        history = self.progress.history.get("train_loss") or [None]
        values: dict[str, Any] = {"epoch": epoch, "phase": phase}
        values["loss"] = loss_sum / rows if rows else history[-1]
        done = self._writer.last_written if self._writer is not None else None
        if done is not None and done[0] is not None:
            (ck_epoch, ck_step, asked), finished, finished_perf = done
            values.update(
                checkpoint_epoch=ck_epoch,
                checkpoint_step=ck_step,
                checkpoint_time=finished,
                checkpoint_s=finished_perf - asked,
            )
        rows_per_step = self.shards.n_train / max(1, self._steps_per_epoch())
        beat.beat(step, rows_per_step, **values)

    def _order(self, epoch: int, n_local: int) -> torch.Tensor:
        """The epoch's seeded permutation of this rank's rows, on the device (the copy
        queued behind the work already there, not waited for)."""
        generator = torch.Generator().manual_seed(self.config.training.seed * 1_000_003 + epoch)
        perm = torch.randperm(n_local, generator=generator)
        if self.ctx.device.type != "cuda":
            return perm
        return perm.pin_memory().to(self.ctx.device, non_blocking=True)

    def _train_step(
        self, xs: torch.Tensor, ys: torch.Tensor, first: int, last: int, batch: int, done: int
    ) -> None:
        """One optimiser step (``done`` steps before it): ``_step`` itself, or a replay of
        its CUDA graph."""
        graphs = self._graphs
        if self.warmup.active and not isinstance(self.optimizer, FusedAdam):
            for group in self.optimizer.param_groups:  # FusedAdam reads its own step count
                group["lr"] = self.warmup.lr(done)
        if graphs is None:
            self._step(xs, ys, first, last, batch)
            return
        start = first * batch
        rows = min(last * batch, xs.shape[0]) - start
        x, y = xs[start : start + rows], ys[start : start + rows]
        graph = graphs.graph(rows)  # a full step's, or the epoch's short last step's
        if graph is None and graphs.may_capture(rows):
            self._capture(graphs, x, y, last - first, batch, done + 1)
            graph = graphs.graph(rows)
        if graph is None:
            # Warm-up, a shape's first step, or no graph: eagerly, same kernels.
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*capturable=True.*")
                self._step(xs, ys, first, last, batch)
            graphs.ran_eagerly(rows)
            return
        graph.replay(x, y)
        self._sums.rows += rows

    def _capture(
        self,
        graphs: GraphedSteps,
        x: torch.Tensor,
        y: torch.Tensor,
        micro: int,
        batch: int,
        at_step: int,
    ) -> None:
        """Capture ``_step`` over the ``micro`` micro-batches of rows ``x``, ``y``."""
        host_rows = self._sums.rows  # each replay counts its rows on the host instead
        # Gradients must not exist yet, so that the graph starts every step afresh: a plain
        # model's backward then allocates them in the graph's pool (every replay overwrites
        # them), and GradSync's first forward records the zeroing of its flat buffer.
        self.optimizer.zero_grad(set_to_none=True)
        try:
            graphs.capture(lambda xs, ys: self._step(xs, ys, 0, micro, batch), x, y, at_step)
        except Exception as exc:  # any capture error: run eagerly instead
            reason = graphs.give_up(exc)
            if self.ctx.is_main:
                print(
                    f"training.cuda_graph: capture failed ({reason}); the steps run eagerly",
                    flush=True,
                )
            # The gradients may hold the failed attempt's sums: the next step starts afresh.
            self.optimizer.zero_grad(set_to_none=True)
        finally:
            self._sums.rows = host_rows

    def _step(self, xs: torch.Tensor, ys: torch.Tensor, first: int, last: int, batch: int) -> None:
        """One optimiser step over micro-batches ``first..last-1``; the gradient is the
        mean over all their rows, all-reduced once (``no_sync`` on the others)."""
        n_local = xs.shape[0]
        total = min(last * batch, n_local) - first * batch
        sums, before_update = self._sums, self.hooks.before_update
        for b in range(first, last):
            xb, yb = xs[b * batch : (b + 1) * batch], ys[b * batch : (b + 1) * batch]
            sync = contextlib.nullcontext() if b == last - 1 else no_sync(self.model)
            with sync:
                raw = self.loss_fn(self.model(xb), yb)
                (raw * (xb.shape[0] / total) if last - first > 1 else raw).backward()
            sums.loss.add_(raw.detach(), alpha=xb.shape[0])
            sums.rows += xb.shape[0]
        # GradSync: the all-reduce (DDP's ran in backward), the stop votes with it on a CPU
        self._voted = reduce_gradients(self.model, self.flag.requested)
        if before_update is not None:
            before_update()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _end_epoch(self, epoch_start: float, train_time: float, step: int) -> Status | None:
        cfg = self.config.training
        # One collective and one read for the epoch's training totals, the validation sums
        # and the stop agreement (a stop request arriving after it waits for the next check).
        started = time.perf_counter()
        sums = self._sums.fold()
        vote = sums.new_full((1,), float(self.flag.requested))
        local = torch.cat([sums, self._validation_sums(), vote])
        if grouped():
            dist.all_reduce(local)
        loss_sum, rows, *val_sums, stop_votes = local.tolist()  # the epoch's one host sync
        self.times.validation_s += time.perf_counter() - started
        val_loss, r2 = val_metrics(val_sums)
        self._sums.reset()
        record = EpochRecord(
            step=step,
            train_loss=loss_sum / rows,
            val_loss=val_loss,
            val_r2=r2,
            epoch_time_s=time.perf_counter() - epoch_start + self.progress.partial_time[0],
            train_time_s=train_time,
            samples=rows,
        )
        progress = self.progress = self.progress.after_epoch(record)
        early = 0 < cfg.early_stopping_patience <= progress.bad_epochs
        stop = stop_votes > 0
        target = cfg.target_val_loss
        reached = target is not None and val_loss <= target
        last = progress.epoch == cfg.epochs or reached
        due = progress.epoch % cfg.checkpoint_every == 0 or early or stop or last
        if due or progress.improved:
            self._save(checkpoint=due, best=progress.improved)
        if self.ctx.is_main:
            print(
                f"Epoch {progress.epoch}/{cfg.epochs} - Train: {record.train_loss:.5g}, "
                f"Val: {val_loss:.5g}",
                flush=True,
            )
        if reached:  # finished: the model is as good as asked for
            if self.ctx.is_main:
                print(
                    f"Target reached: validation loss {val_loss:.5g} <= {target:.5g} at "
                    f"epoch {progress.epoch}",
                    flush=True,
                )
            return "completed"
        if early:  # finished: a stop request that came with it needs no resume
            if self.ctx.is_main:
                print(
                    f"Early stopping: no improvement for {progress.bad_epochs} epochs (best "
                    f"{progress.best_val:.5g} at epoch {progress.best_epoch})",
                    flush=True,
                )
            return "early_stopped"
        if stop and progress.epoch < cfg.epochs:
            self._log_preempted()
            return "preempted"
        return None

    def _validation_sums(self) -> torch.Tensor:
        net = unwrap(self.model)
        # Same chunk count on every rank: FSDP gathers weights in every forward call.
        per_rank = math.ceil(self.shards.n_val / self.ctx.env.world_size)
        return validation_sums(
            net,
            self.shards.x_val,
            self.shards.y_val,
            self.loss_fn,
            chunks=max(1, math.ceil(per_rank / _VAL_CHUNK)),
        )

    def _stop(self) -> bool:
        """Whether any rank was asked to stop: every rank gets the same answer (the votes
        the step's gradient exchange carried, where it carried them)."""
        if not grouped():
            return self.flag.requested
        if self._voted is not None:
            return self._voted
        flag = torch.tensor([int(self.flag.requested)], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._flag_group)
        return bool(flag.item())

    def _log_preempted(self) -> None:
        if self._writer is not None:
            self._writer.wait()  # the message promises a checkpoint on disk
        if self.ctx.is_main:
            path, p = self.run_dir / "checkpoint.pt", self.progress
            print(
                f"Stop requested: checkpoint at epoch {p.epoch + 1}, step "
                f"{p.step_in_epoch} of the epoch ({p.step} steps) in {path}; "
                "resume with --resume",
                flush=True,
            )


def _never() -> bool:
    return False


# The heartbeat's last phase, by how the loop ended.
_FINAL_PHASE: dict[str, str] = {
    "completed": "done",
    "early_stopped": "done",
    "preempted": "stopped",
}


def full_model(model: nn.Module, config: ModelConfig) -> EmulatorMLP:
    """A plain CPU copy of the (possibly wrapped or sharded) model; collective."""
    state = full_model_state(model)
    plain = EmulatorMLP(config)
    plain.load_state_dict(state)
    return plain
