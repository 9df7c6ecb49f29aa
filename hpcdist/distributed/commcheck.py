"""Communication smoke test: ``python -m hpcdist.distributed.commcheck [--timeout S]``.

Every rank joins the process group, then all_reduce (each rank contributes rank + 1, so
the sum is N(N+1)/2), broadcast of 42 from rank 0 and a barrier, each under a timeout.
Rank 0 prints one line starting ``PASS``; any rank that sees a failure prints one line
starting ``FAIL`` naming the step, the master address and port, then one line for each rank
that never reached that step, with its node (``hpcdist.distributed.rollcall``: the ranks note
their arrival at each step in the group's store), and exits non-zero.
A watchdog ends the process if a step hangs, so a missing peer never costs the walltime.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from hpcdist.distributed import (
    DistContext,
    DistributedInitError,
    cleanup_distributed,
    collective_timeout_s,
    network_hint,
    resolve_env,
    setup_distributed,
)
from hpcdist.distributed.rollcall import RollCall, blame_lines


def _hint() -> str:
    return f"is every rank running and the master reachable? {network_hint(os.environ)}"


# init and gloo collectives have their own timeouts and better messages; the watchdog only
# catches what hangs past them (a stuck NCCL kernel, a TCPStore retry that overshoots)
_INIT_GRACE_S = 15.0
_STEP_GRACE_S = 5.0
EXIT_FAIL = 1


# The steps whose arrivals the ranks note in the group's store (``RollCall``), so that a
# rank that sees a step fail can name the ranks (and their nodes) that never reached it.
CHECK_STEPS = ("all_reduce", "broadcast", "barrier")


class _Watchdog:
    """Ends the process with a FAIL line when the current step overruns its budget, naming
    the ranks that never reached it where the group's store can tell (``arrivals``)."""

    arrivals: RollCall | None = None

    def __init__(self, describe: Callable[[], str]) -> None:
        self._describe = describe
        self._lock = threading.Lock()
        self._step = "start"
        self._budget_s = 0.0
        self._deadline = float("inf")
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="commcheck-watchdog", daemon=True)
        self._thread.start()

    @contextmanager
    def step(self, name: str, budget_s: float) -> Iterator[None]:
        with self._lock:
            self._step, self._budget_s = name, budget_s
            self._deadline = time.monotonic() + budget_s
        try:
            if self.arrivals is not None and name in CHECK_STEPS:
                self.arrivals.answer(name)
            yield
        finally:
            with self._lock:
                self._deadline = float("inf")

    def stop(self) -> None:
        self._stopped.set()

    @property
    def current(self) -> str:
        with self._lock:
            return self._step

    def blame(self, step: str) -> None:
        """Print who never reached ``step`` (``RollCall.asked``: a store that refuses names
        nobody, one silent for ``SILENT_S`` names rank 0; the verdict waits no longer)."""
        if self.arrivals is None or step not in CHECK_STEPS:
            return
        missing = self.arrivals.asked(step)
        for line in blame_lines("commcheck", missing, f"never reached {step}"):
            print(line, flush=True)

    def _watch(self) -> None:
        while not self._stopped.wait(0.25):
            with self._lock:
                overdue = time.monotonic() > self._deadline
                step, budget = self._step, self._budget_s
            if overdue:
                print(
                    f"FAIL: {step} did not finish within {budget:g} s ({self._describe()}); "
                    f"{_hint()}",
                    flush=True,
                )
                self.blame(step)
                os._exit(EXIT_FAIL)  # the hung call holds the main thread; nothing else ends it


class _CheckFailed(RuntimeError):
    """A collective completed but delivered the wrong value."""


def _check(ctx: DistContext, timeout_s: float, watchdog: _Watchdog) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    def synced() -> None:
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)

    n, rank = ctx.env.world_size, ctx.env.rank
    timings: dict[str, float] = {}

    with watchdog.step("all_reduce", timeout_s + _STEP_GRACE_S):
        value = torch.tensor([rank + 1], dtype=torch.int64, device=ctx.device)
        start = time.perf_counter()
        dist.all_reduce(value)
        synced()
        timings["all_reduce"] = time.perf_counter() - start
    if int(value.item()) != n * (n + 1) // 2:
        raise _CheckFailed(f"all_reduce returned {int(value.item())}, expected {n * (n + 1) // 2}")

    with watchdog.step("broadcast", timeout_s + _STEP_GRACE_S):
        value = torch.tensor([42 if rank == 0 else -1], dtype=torch.int64, device=ctx.device)
        start = time.perf_counter()
        dist.broadcast(value, src=0)
        synced()
        timings["broadcast"] = time.perf_counter() - start
    if int(value.item()) != 42:
        raise _CheckFailed(f"broadcast from rank 0 delivered {int(value.item())}, expected 42")

    with watchdog.step("barrier", timeout_s + _STEP_GRACE_S):
        start = time.perf_counter()
        dist.barrier()
        synced()
        timings["barrier"] = time.perf_counter() - start
    return timings


def _timeout_s(argv: list[str] | None) -> float:
    """--timeout, else the job's collective timeout, else 60 (a bad one: exit 2)."""
    parser = argparse.ArgumentParser(
        prog="python -m hpcdist.distributed.commcheck",
        description="all_reduce + broadcast + barrier across all ranks, with a verdict",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="limit for joining the group and for each collective (default: the job's "
        "--collective-timeout, else 60)",
    )
    args = parser.parse_args(argv)
    if args.timeout is None:
        try:
            args.timeout = collective_timeout_s(os.environ, default=60.0)
        except ValueError as exc:
            parser.error(str(exc))
    if args.timeout <= 0:
        parser.error(f"--timeout must be > 0, got {args.timeout:g}")
    return float(args.timeout)


def main(argv: list[str] | None = None) -> int:
    timeout = _timeout_s(argv)
    # torch logs every TCPStore retry with a C++ stack trace; the FAIL line says it once
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    try:
        env = resolve_env(os.environ)
    except ValueError as exc:  # DistEnvError, NodeListError: stale or malformed variables
        print(f"FAIL: environment: {exc}", flush=True)
        return EXIT_FAIL
    where = f"rank {env.rank}/{env.world_size} on {env.hostname}, master "
    backend = "?"

    def describe() -> str:
        return f"{where}{env.master_addr}:{env.master_port}, backend {backend}"

    import torch  # noqa: F401  (imported here so that init timings exclude the import)

    watchdog = _Watchdog(describe)
    try:
        start = time.perf_counter()
        with watchdog.step("init_process_group", timeout + _INIT_GRACE_S):
            ctx = setup_distributed(timeout)
        init_s = time.perf_counter() - start
        env, backend = ctx.env, ctx.backend
        watchdog.arrivals = RollCall.of_group(env.rank, env.world_size, env.hostname)
        timings = _check(ctx, timeout, watchdog)
    except DistributedInitError as exc:
        print(f"FAIL: init_process_group: {exc}", flush=True)
        return EXIT_FAIL
    except _CheckFailed as exc:
        print(f"FAIL: {exc} ({describe()})", flush=True)
        return EXIT_FAIL
    except Exception as exc:  # a collective that timed out or lost a peer
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        print(f"FAIL: {type(exc).__name__}: {reason} ({describe()}); {_hint()}", flush=True)
        watchdog.blame(watchdog.current)
        return EXIT_FAIL
    finally:
        with watchdog.step("cleanup", timeout):
            cleanup_distributed()
        watchdog.stop()

    if env.rank == 0:
        steps = ", ".join(f"{name} {seconds * 1e3:.2f} ms" for name, seconds in timings.items())
        print(
            f"PASS: world size {env.world_size}, {backend} backend, master "
            f"{env.master_addr}:{env.master_port}; init {init_s * 1e3:.0f} ms, {steps}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
