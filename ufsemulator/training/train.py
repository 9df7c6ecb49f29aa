"""Distributed training of the emulator: one code path for 1 process and many.

Every rank holds the data in memory, takes the same seeded train/validation split and
trains on its own equal-sized shard of the training set, reshuffled each epoch by a
generator seeded with (seed, epoch). A data set of several files is read in shares
instead, each rank its own block of records (``ufsemulator.training.sharedread``). A job of one
process sets up no process group at all. Nothing depends on hidden RNG state, so a run
stopped at any step boundary and resumed from its checkpoint ends with bitwise the same
weights as an uninterrupted one (CPU, same world size).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from hpcdist.distributed import (
    RUN_ID_VAR,
    DistContext,
    DistEnv,
    RollCall,
    cleanup_distributed,
    continue_run,
    name_the_missing,
    record_piece,
    setup_distributed,
    single_process,
)
from ufsemulator.checkpoints.checkpoint import restore_rng
from ufsemulator.checkpoints.state import TrainingState, read_state, state_from_bytes
from ufsemulator.config import Config
from ufsemulator.data.read import Dataset, load_dataset
from ufsemulator.data.sources import PathSpec
from ufsemulator.errors import CheckpointError, DataError
from ufsemulator.model.emulator import EmulatorMLP, ModelConfig
from ufsemulator.model.normalization import input_range, stats_from_shard, torch_all_reduce
from ufsemulator.overrides import overrides_record
from ufsemulator.training import earlysignal, runfiles
from ufsemulator.training.earlyread import EarlyRead, ReadRequest, read_request
from ufsemulator.training.loop import Loop, LoopHooks, Shards, StopFlag, full_model
from ufsemulator.training.parallel import grouped
from ufsemulator.training.summary import RunSummary, Status
from ufsemulator.training.timings import Timings, process_start

if TYPE_CHECKING:  # imported where a run reads in shares
    from ufsemulator.training.sharedread import SplitTimes

__all__ = ["StopFlag", "TrainResult", "split", "train"]

_EXPORTED_VARS = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
)


@dataclass(frozen=True)
class TrainResult:
    status: Status  # "completed" | "early_stopped" | "preempted"
    run_dir: Path
    epochs_run: int
    best_epoch: int  # 1-based; 0 if no epoch finished
    best_val_loss: float
    final_train_loss: float
    final_val_loss: float
    val_r2: float  # of the final epoch, target in normalised units
    samples_per_second: float  # all ranks together, training steps only
    wall_time_s: float
    model: EmulatorMLP = field(repr=False, compare=False)  # full weights, on every rank
    is_main: bool = True  # rank 0: the one that reports the status with its exit code

    @classmethod
    def of(
        cls,
        summary: RunSummary,
        run_dir: Path,
        wall_time_s: float,
        model: EmulatorMLP,
        is_main: bool,
    ) -> TrainResult:
        return cls(
            status=summary.status,
            run_dir=run_dir,
            epochs_run=summary.epochs_run,
            best_epoch=summary.best_epoch,
            best_val_loss=summary.best_val_loss,
            final_train_loss=summary.final("train_loss"),
            final_val_loss=summary.final("val_loss"),
            val_r2=summary.final("val_r2"),
            samples_per_second=summary.samples_per_second,
            wall_time_s=wall_time_s,
            model=model,
            is_main=is_main,
        )


def train(  # noqa: PLR0913 - the public entry point: callers name the keyword-only options
    config: Config,
    data_path: PathSpec | None = None,
    resume: str | Path | None = None,
    run_dir: str | Path | None = None,
    *,
    stop_flag: StopFlag | None = None,
    step_callback: Callable[[int], None] | None = None,
    hooks: LoopHooks | None = None,
    overrides: Sequence[str] = (),
    early_read: EarlyRead | None = None,
) -> TrainResult:
    """Train the emulator in the process group started here (torchrun, SLURM, submitit
    or one process) and return the outcome; rank 0 writes the run folder.

    ``stop_flag`` is set by the preemption signal (``config.preemption.signal``); at the
    next agreed step boundary rank 0 checkpoints and the status is ``"preempted"``.
    ``step_callback(global_step)`` runs after each optimiser step (tests, progress hooks);
    it is short for ``hooks=LoopHooks(after_step=...)``. ``hooks`` watch or steer the loop
    (``ufsemulator.training.loop.LoopHooks``). ``overrides`` are the ``KEY=VALUE`` texts already
    applied to ``config`` (``--set``), recorded in training_results.json. ``early_read``:
    this rank's read, started before torch was imported (``training.earlyread.start``); used
    where it is the read this run needs.
    """
    started = time.perf_counter()
    clock = _Clock(process=process_start(), train=started)
    hooks = _with_step_callback(hooks if hooks is not None else LoopHooks(), step_callback)
    flag = stop_flag if stop_flag is not None else StopFlag()
    if earlysignal.received():
        flag.set()  # the warning came while the process was still starting
    inputs = _TrainInputs(
        config=config,
        data_path=data_path,
        checkpoint=read_state(resume) if resume is not None else None,
        resume=resume,
        run_dir=run_dir,
        flag=flag,
        hooks=hooks,
        overrides=overrides,
        early_read=early_read,
    )
    # setup_distributed exports MASTER_PORT, RANK, ... for the code below it; a later
    # train() in this process must not mistake them for a launcher's (stale port).
    saved_env = {var: os.environ.get(var) for var in _EXPORTED_VARS}
    failed, roll = True, None
    try:
        with _stop_on_signal(_stop_signal_names(config), flag):
            ctx = _context(config)
            roll = _roll_call(ctx)
            clock.group = time.perf_counter()
            result = _train(ctx, inputs, clock)
            failed = False
            return result
    except Exception as exc:
        if roll is not None:  # a collective that timed out: name the ranks that hung or died
            name_the_missing(roll, exc, "training")
        raise
    finally:
        cleanup_distributed(after_error=failed)  # aborts NCCL's communicators after an error
        _restore_environ(saved_env)


@dataclass(frozen=True)
class _TrainInputs:
    """What ``train`` was asked, bundled for the run it starts once the group is up."""

    config: Config
    data_path: PathSpec | None
    checkpoint: TrainingState | None  # read from ``resume`` before the group started
    resume: str | Path | None
    run_dir: str | Path | None
    flag: StopFlag
    hooks: LoopHooks
    overrides: Sequence[str] = ()
    early_read: EarlyRead | None = None


def _with_step_callback(hooks: LoopHooks, step_callback: Callable[[int], None] | None) -> LoopHooks:
    if step_callback is None:
        return hooks
    if hooks.after_step is not None:
        raise ValueError("give step_callback or hooks.after_step, not both")
    return dataclasses.replace(hooks, after_step=step_callback)


def _stop_signal_names(config: Config) -> tuple[str, ...]:
    # SIGTERM too: scancel and `scontrol requeue` send it, KillWait seconds before SIGKILL.
    # And the job's own warning signal, when hpcdist's script names one.
    job_signal = earlysignal.job_signal()
    return (config.preemption.signal, "SIGTERM", *([job_signal.name] if job_signal else []))


def _restore_environ(saved: Mapping[str, str | None]) -> None:
    for var, value in saved.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value


@dataclass
class _Clock:
    """time.perf_counter() readings of one run's milestones (filled in as it goes)."""

    process: float  # the process started
    train: float  # train() was called
    group: float = 0.0  # the process group is up (or none was needed)
    data: float = 0.0  # the rows are on the device
    setup: float = 0.0  # model and loop built

    def timings(self, summary: RunSummary, exported: float) -> Timings:
        times = summary.loop_times
        first = times.first_step_at if times is not None and times.first_step_at else self.setup
        outside = summary.outside_steps_s
        epochs = summary.epochs_run
        return Timings(
            total_s=exported - self.process,
            startup_s=first - self.process,
            imports_s=self.train - self.process,
            process_group_s=self.group - self.train,
            data_s=self.data - self.group,
            setup_s=first - self.data,  # to the first step: the parts sum to startup_s
            steps_s=summary.train_time_s,
            epochs=epochs,
            outside_steps_s=outside,
            outside_steps_per_epoch_s=outside / epochs if epochs else 0.0,
            validation_s=times.validation_s if times is not None else 0.0,
            checkpoint_s=times.checkpoint_s if times is not None else 0.0,
            export_s=0.0,
        )


def _roll_call(ctx: DistContext) -> RollCall | None:
    """Where several ranks train, each notes its node in the group's store: a rank that
    sees a collective fail can then name the ranks that never answered, and their nodes."""
    env = ctx.env
    if not grouped() or env.world_size < 2:
        return None
    return RollCall.of_group(env.rank, env.world_size, env.hostname)


def _context(config: Config) -> DistContext:
    """A process group for several ranks (and for FSDP, which needs one even alone); one
    DDP process runs without: no store, no communicators, nothing to tear down."""
    env = DistEnv.from_environ(os.environ)
    if env.world_size == 1 and config.training.strategy == "ddp":
        return single_process()
    return setup_distributed()


def _train(ctx: DistContext, inputs: _TrainInputs, clock: _Clock) -> TrainResult:
    config, env = inputs.config, ctx.env
    run_dir = runfiles.resolve_run_dir(ctx, config, inputs.run_dir, inputs.resume)
    checkpoint, resume = _requeued(ctx, run_dir, inputs.checkpoint, inputs.resume)
    if ctx.is_main:  # this piece of the run, for `hpcdist status RUN`
        if checkpoint is not None:  # another run's checkpoint: that run goes on
            continue_run(Path(str(resume)).parent)
        chosen_by = runfiles.run_dir_source(config, inputs.run_dir, inputs.resume)
        record_piece(run_dir, _resumed_from(checkpoint, resume), chosen_by=chosen_by)
    # Before any data is read or step taken: a bad export name, unit or level fails now,
    # not after the training it would have thrown away.
    from ufsemulator.export.torchscript import check_export

    check_export(_model_config(config, config.data.inputs), config.export)
    path = runfiles.ensure_data(ctx, config, inputs.data_path)
    request = read_request(config, path, env.rank, env.world_size, os.environ)
    read = _read_rows(ctx, request, inputs.early_read, clock)
    torch.manual_seed(config.training.seed)  # same initial weights on every rank
    model = EmulatorMLP(_model_config(config, read.dataset.input_names))
    data_text = _data_text(config, read.dataset, read.in_shares)
    shards, split_times = _split_rows(ctx, config, read, model)
    trained_on = _bytes_trained_on(read.dataset)  # for the provenance: nothing is read again
    del read  # the rows live on the device now (on the CPU: in the shards)
    clock.data = time.perf_counter()
    if split_times is not None:
        print(split_times.describe(env.rank), flush=True)
    print(f"[Rank {env.rank}] Training samples: {shards.x_train.shape[0]}", flush=True)
    if ctx.is_main:
        print(
            f"{data_text}: train {shards.n_train}, validation {shards.n_val}, "
            f"target {config.data.target}",
            flush=True,
        )
    loop = _loop(ctx, inputs, model, shards, run_dir, (checkpoint, resume))
    clock.setup = time.perf_counter()
    summary = loop.run()
    final = full_model(loop.model, model.config)
    wall_time = time.perf_counter() - clock.train  # this process, from train() on
    if ctx.is_main:
        outcome = _Outcome(summary, run_dir, wall_time, clock, path, trained_on)
        _write_outputs(ctx, config, inputs.overrides, outcome)
    # No rank leaves before rank 0 has written everything: under srun --kill-on-bad-exit
    # the first rank to exit non-zero takes the others down with it.
    if grouped():
        dist.barrier()
    return TrainResult.of(summary, run_dir, wall_time, final, ctx.is_main)


def _requeued(
    ctx: DistContext,
    run_dir: Path,
    checkpoint: TrainingState | None,
    resume: str | Path | None,
) -> tuple[TrainingState | None, str | Path | None]:
    """The checkpoint to resume and where it came from: the one asked for, else a requeued
    job's (same job id, same run folder), which picks up where it was stopped, from the
    very bytes whose digest was checked."""
    found = runfiles.trusted_resume(ctx, run_dir) if checkpoint is None else None
    if found is None:
        return checkpoint, resume
    resume, data = found
    checkpoint = state_from_bytes(data, resume)
    if ctx.is_main:
        restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
        print(
            f"Resuming from {resume} (epoch {checkpoint.progress.epoch}, restart {restarts})",
            flush=True,
        )
    return checkpoint, resume


def _resumed_from(
    checkpoint: TrainingState | None, source: str | Path | None
) -> dict[str, Any] | None:
    """Where a piece starts: the checkpoint's epoch and step, and when it was written."""
    if checkpoint is None:
        return None
    p, path = checkpoint.progress, Path(str(source))
    try:
        written: float | None = path.stat().st_mtime
    except OSError:
        written = None
    return {
        "epoch": p.epoch,
        "step": p.step,
        "step_in_epoch": p.step_in_epoch,
        "time": written,
        "path": str(path.resolve()),
    }


@dataclass(frozen=True)
class _Read:
    """This rank's rows as read, and how the read went (for its log line)."""

    dataset: Dataset
    in_shares: bool  # each rank read its own block of records (training.sharedread)
    seconds: float
    rss_before: int  # host memory before the read (shares only; else 0)
    early_text: str  # how the early read overlapped torch's start ("": not read early)


def _read_rows(
    ctx: DistContext, request: ReadRequest, early_read: EarlyRead | None, clock: _Clock
) -> _Read:
    in_shares = request.share is not None
    rss_before = 0
    if in_shares:
        from ufsemulator.training.sharedread import host_memory_bytes

        rss_before = host_memory_bytes()
    read_started = time.perf_counter()
    with _device_ready_meanwhile(ctx, exchange=in_shares):
        dataset = early_read.take(request) if early_read is not None else None
        early = dataset is not None
        if dataset is None:
            dataset = load_dataset(
                request.path,
                request.options,
                atmosphere=request.atmosphere,
                share=request.share,
                cache_in_background=True,  # nothing here waits for the cache file
            )
    waited_s = time.perf_counter() - read_started
    if not early or early_read is None:
        return _Read(dataset, in_shares, waited_s, rss_before, "")
    since = clock.process
    early_text = (
        f"; read while torch started ({early_read.started - since:.2f} to "
        f"{early_read.finished - since:.2f} s into the process), waited {waited_s:.2f} s "
        f"for it at {read_started - since:.2f} s"
    )
    return _Read(dataset, in_shares, early_read.seconds, rss_before, early_text)


def _data_text(config: Config, dataset: Dataset, in_shares: bool) -> str:
    """Rank 0's lines on the data, up to the split's counts."""
    # Shares: each rank's "Read records" line says which records it read.
    records = "" if in_shares else f", {dataset.records_text()}"
    what = f"rank 0's share {len(dataset)}" if in_shares else f"{len(dataset)}"
    return (
        "".join(f"Data: {note}\n" for note in dataset.notes)
        + f"Data: {dataset.source}{records} ({what} points, mask {config.data.mask}, thin "
        f"{config.data.thin})"
    )


def _split_rows(
    ctx: DistContext, config: Config, read: _Read, model: EmulatorMLP
) -> tuple[Shards, SplitTimes | None]:
    """This rank's shards (``split``, or ``split_share`` for rows read in shares) and, for
    shares, the split's times, printed once the rows are freed."""
    if not read.in_shares:
        return split(ctx, config, read.dataset.inputs, read.dataset.targets, model), None
    from ufsemulator.training.sharedread import SplitTimes, describe_read, split_share

    line = describe_read(read.dataset, ctx.env.rank, read.seconds, read.rss_before)
    print(line + read.early_text, flush=True)
    split_times = SplitTimes()
    return split_share(ctx, config, read.dataset, model, split_times), split_times


def _loop(
    ctx: DistContext,
    inputs: _TrainInputs,
    model: EmulatorMLP,
    shards: Shards,
    run_dir: Path,
    resuming: tuple[TrainingState | None, str | Path | None],
) -> Loop:
    """The training loop over ``shards``, at the point ``resuming`` (checkpoint, source)."""
    checkpoint, resume = resuming
    if checkpoint is not None:
        _load_weights(model, checkpoint, resume)
        restore_rng(checkpoint.rng)
    loop = Loop(ctx, inputs.config, model, shards, run_dir, inputs.flag, inputs.hooks)
    if ctx.is_main and ctx.env.world_size > 1:
        print(f"Gradient all-reduce: {loop.grad_allreduce_status}", flush=True)
    if checkpoint is not None:
        loop.restore(checkpoint, str(resume))
    return loop


@contextlib.contextmanager
def _device_ready_meanwhile(ctx: DistContext, exchange: bool) -> Iterator[None]:
    """While the files are read (the CPU's work), a thread readies the GPU: its context,
    created on first use (the first copy of the rows), and, for ranks that will exchange
    their rows (``exchange``), NCCL's connections to every peer, made by the first
    all-to-all (about 1.1 s at 4 GPUs). The thread is joined before the main thread's
    first collective, so every rank issues the same collectives in the same order."""
    if ctx.device.type != "cuda":
        yield
        return
    failed: list[BaseException] = []
    starter = threading.Thread(
        target=_ready_device,
        args=(ctx.device, exchange and grouped() and ctx.backend == "nccl", failed),
        name="gpu-ready",
    )
    starter.start()
    try:
        yield
    finally:
        starter.join()
    if failed:  # as if the main thread had raised it: no rank goes on alone
        raise failed[0]


def _ready_device(device: torch.device, connect_peers: bool, failed: list[BaseException]) -> None:
    try:
        torch.cuda.set_device(device)  # the current device is the thread's own
        torch.empty(0, device=device)
        if connect_peers:
            ones = torch.ones(dist.get_world_size(), device=device)
            dist.all_to_all_single(torch.empty_like(ones), ones)
            torch.cuda.synchronize(device)
    except BaseException as exc:  # handed to the main thread
        failed.append(exc)


@contextlib.contextmanager
def _stop_on_signal(names: tuple[str, ...], flag: StopFlag) -> Iterator[None]:
    """Let ``names`` (e.g. SIGUSR2, the scheduler's warning) set ``flag`` while training."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may install handlers
        return

    def handler(received: int, frame: object) -> None:
        flag.set()  # nothing else: the loop checkpoints at the next agreed step boundary

    previous = {
        signum: signal.signal(signum, handler)
        for signum in {signal.Signals[name] for name in names}
    }
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def split(
    ctx: DistContext, config: Config, inputs: Any, targets: Any, model: EmulatorMLP
) -> Shards:
    """Seeded split (identical on every rank), this rank's shards, global statistics (set
    on ``model``); collective. What ``train`` trains on, for benchmarks and tests too.

    The training set is cut into ``world_size`` equal shards (a remainder of fewer than
    world_size samples is left out) so every rank runs the same number of steps."""
    rank, world = ctx.env.rank, ctx.env.world_size
    x_all = torch.as_tensor(inputs, dtype=torch.float32)
    y_all = torch.as_tensor(targets, dtype=torch.float32)
    n = x_all.shape[0]
    n_val = max(1, round(config.training.val_fraction * n))
    order = torch.randperm(n, generator=torch.Generator().manual_seed(config.training.seed))
    val_idx, train_idx = order[:n_val], order[n_val:]
    per_rank = train_idx.numel() // world
    if per_rank < 1:
        raise DataError(
            f"{train_idx.numel()} training samples cannot be shared by {world} ranks; "
            "use more data (a larger grid, thin: 1) or fewer ranks"
        )
    mine = train_idx[rank * per_rank : (rank + 1) * per_rank]
    val_mine = val_idx[rank::world]
    # On the group's own device: an NCCL group has no CPU backend to sum CPU tensors with.
    reduce = torch_all_reduce(ctx.device) if grouped() else None  # None: one process
    stats = stats_from_shard(x_all[mine], y_all[mine], all_reduce=reduce)
    model.set_normalization(stats)
    model.set_input_range(*input_range(x_all[mine], grouped(), ctx.device))
    with torch.no_grad():

        def norm_y(y: torch.Tensor) -> torch.Tensor:
            return (y - model.output_mean) / model.output_std

        return Shards(
            x_train=model.normalize_inputs(x_all[mine]).to(ctx.device),
            y_train=norm_y(y_all[mine]).to(ctx.device),
            x_val=model.normalize_inputs(x_all[val_mine]).to(ctx.device),
            y_val=norm_y(y_all[val_mine]).to(ctx.device),
            n_train=per_rank * world,
            n_val=n_val,
        )


def _load_weights(model: nn.Module, checkpoint: TrainingState, source: object) -> None:
    # A checkpoint from before the training range was kept: the range of the data just
    # read (the same files) stands in.
    current = model.state_dict()
    state: dict[str, Any] = {k: current[k] for k in ("input_min", "input_max") if k in current}
    state.update(checkpoint.model)
    try:
        model.load_state_dict(state)
    except (RuntimeError, KeyError, TypeError) as exc:
        reason = str(exc).strip().splitlines()[0]
        raise CheckpointError(
            f"checkpoint '{source}' does not fit the configured model: {reason}"
        ) from exc


def _model_config(config: Config, input_names: tuple[str, ...]) -> ModelConfig:
    return ModelConfig(
        n_in=len(input_names),
        input_names=input_names,
        input_levels=(0,) * len(input_names),
        hidden=config.model.hidden_sizes,
        activation=config.model.activation,
        output_names=(config.data.target,),
    )


TrainedOn = tuple[dict[str, tuple[str, int]], tuple[str | None, str | None]]


def _bytes_trained_on(dataset: Dataset) -> TrainedOn:
    """Every rank's files as it read them (resolved path -> SHA-256 and size, hashed while
    read) and the first and last record times, gathered from all ranks."""
    mine = ([(p, s, n) for _, p, s, n in dataset.file_digests], dataset.record_times)
    parts: list[Any] = [mine]
    if grouped():
        parts = [None] * dist.get_world_size()
        dist.all_gather_object(parts, mine)
    read: dict[str, tuple[str, int]] = {}
    stamps: list[str] = []
    for files, times in parts:
        read.update({path: (sha, size) for path, sha, size in files})
        stamps += [stamp for stamp in times if stamp is not None]
    return read, ((min(stamps), max(stamps)) if stamps else (None, None))


@dataclass(frozen=True)
class _Outcome:
    """A finished loop, as rank 0 writes it to the run folder."""

    summary: RunSummary
    run_dir: Path
    wall_time: float  # this process, from train() on
    clock: _Clock
    data_path: PathSpec | None = None  # the files trained on (else config.data.path)
    trained_on: TrainedOn | None = None  # their bytes' digests, taken while they were read


def _write_outputs(
    ctx: DistContext, config: Config, overrides: Sequence[str], outcome: _Outcome
) -> None:
    from ufsemulator.export import runrecord

    summary, run_dir = outcome.summary, outcome.run_dir
    export_started = time.perf_counter()
    used = outcome.data_path if outcome.data_path is not None else config.data.path
    data = _export(config, outcome, used)
    exported = time.perf_counter()
    timings = outcome.clock.timings(summary, exported)
    timings = dataclasses.replace(timings, export_s=exported - export_started)
    summary = dataclasses.replace(summary, timings=timings)
    run = summary.to_json()
    results = {
        "status": run.pop("status"),
        # One id across the run's requeued and resubmitted jobs (hpcdist's job script).
        "run_id": _run_id(),
        "world_size": ctx.env.world_size,
        "backend": ctx.backend,
        "device": str(ctx.device),
        "threads": torch.get_num_threads(),
        "strategy": config.training.strategy,
        "target": config.data.target,
        **run,
        "wall_time_s": outcome.wall_time,  # this process, from train() on
        "data": data,
        "config": runrecord.results_config(config, used),
        # What --set changed (a sweep's point): key -> the value the run used.
        "overrides": overrides_record(config, overrides),
    }
    runfiles.write_results(run_dir / "training_results.json", results)
    _report(ctx, config, summary, run_dir, outcome.wall_time)


def _export(config: Config, outcome: _Outcome, used: PathSpec | None) -> dict[str, Any] | None:
    """model.pt of a run that was not preempted; the data's record, for the results too."""
    from ufsemulator.export import runrecord

    run_dir = outcome.run_dir
    data = None
    if used is not None:
        read, times = outcome.trained_on if outcome.trained_on is not None else (None, None)
        data = runrecord.data_record(config, used, read, times)
    if outcome.summary.status != "preempted":
        best = run_dir / "best_model.pt"
        source = best if best.is_file() else run_dir / "checkpoint.pt"
        if source.is_file():
            run = outcome.summary.to_json()
            runrecord.export_run(source, run_dir, config, data or {}, run, _run_id())
    return data


def _run_id() -> str | None:
    return os.environ.get(RUN_ID_VAR, "").strip() or None


def _report(
    ctx: DistContext, config: Config, summary: RunSummary, run_dir: Path, wall_time: float
) -> None:
    """The loss curves and the summary lines, last: model.pt and the results are what a
    user waits for."""
    history = summary.progress.history
    if summary.epochs_run:
        runfiles.plot_loss_curves(
            run_dir / "loss_curves.svg",
            history["train_loss"],
            history["val_loss"],
            summary.best_epoch or None,
            f"ufsemulator {config.data.target}: {ctx.env.world_size} x {ctx.backend}",
        )
    line = (
        f"Training {summary.status}: {summary.epochs_run} epochs, best validation loss "
        f"{summary.best_val_loss:.5g} (epoch {summary.best_epoch}), R^2 "
        f"{summary.best_val_r2:.4f}, "
        f"{summary.samples_per_second:.0f} samples/s, {wall_time:.1f} s"
    )
    print(f"{line}\nRun folder: {run_dir}", flush=True)
    if summary.timings is not None:
        print(summary.timings.breakdown(), flush=True)
