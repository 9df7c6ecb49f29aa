"""The training step as a CUDA graph: captured once, replayed for every full step.

The step is launch-bound (a 9,345-parameter MLP): one replay is one launch for forward,
loss, backward, the gradient all-reduce (``GradSync``), Adam and the loss sum, instead of
dozens of launches through Python and autograd. ``Loop`` decides what a step is; this
module owns the stream the steps run on, when a capture may happen and the captured graph.

An epoch has two shapes of step: the full ones and, unless the batch divides the rows, a
shorter last one. Each shape gets its own graph, so that no step of an epoch goes through
Python's dozens of launches once the graphs exist (on the default data set, one step in
16 is the short one).

The steps run on a side stream of their own, on which the wrapper is built too. The first
steps of every run are eager: they create what a capture may not allocate (Adam's state,
cuBLAS's workspace, the communicator of the first all-reduce); and a shape is captured only
after one eager step of its own (cuBLAS picks its kernels per shape).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

# Eager steps before a capture (see the module's docstring).
WARMUP_STEPS = 3

Step = Callable[[torch.Tensor, torch.Tensor], None]


@dataclass(frozen=True, eq=False)
class StepGraph:
    """A captured training step and the static buffers it reads its rows from."""

    graph: torch.cuda.CUDAGraph
    x: torch.Tensor
    y: torch.Tensor

    def replay(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x.copy_(x)
        self.y.copy_(y)
        self.graph.replay()


class GraphedSteps:
    """The steps' stream, a graph for each shape of step once captured, and whether a
    capture failed. Its state changes only through its methods: ``ran_eagerly``,
    ``capture`` and ``give_up``."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self._graphs: dict[int, StepGraph] = {}  # by the step's number of rows
        self._failure: str | None = None  # why a capture failed: eager from then on
        self._eager_steps = 0  # steps run eagerly so far
        self._eager_rows: set[int] = set()  # the shapes of those steps
        self._captured: list[str] = []  # "step N (R rows)" of each capture, for the status

    def graph(self, rows: int) -> StepGraph | None:
        """The captured step over ``rows`` rows; None before its capture and after a
        failed one."""
        return self._graphs.get(rows)

    @property
    def eager_steps(self) -> int:
        return self._eager_steps

    @property
    def status(self) -> str:
        """For logs and benchmarks: not captured yet, captured at which steps, or why not."""
        if self._failure is not None:
            return f"capture failed ({self._failure}); eager"
        if not self._captured:
            return "on, not captured yet"
        return "captured at " + ", ".join(self._captured) + " of this run"

    def build(self, make: Callable[[], nn.Module]) -> nn.Module:
        """``make()`` (the data-parallel wrapper) on the steps' stream, ordered with the
        main one."""
        main = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(main)
        with torch.cuda.stream(self.stream):
            wrapped = make()
        main.wait_stream(self.stream)
        return wrapped

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Run the enclosed steps on the steps' stream, after everything queued before them
        (the epoch's gather, validation) and before everything after."""
        main = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(main)
        try:
            with torch.cuda.stream(self.stream):
                yield
        finally:
            main.wait_stream(self.stream)

    def ran_eagerly(self, rows: int) -> None:
        """Count a step over ``rows`` rows run without a graph."""
        self._eager_steps += 1
        self._eager_rows.add(rows)

    def may_capture(self, rows: int) -> bool:
        """Whether to capture the step over ``rows`` rows now: no capture has failed, it has
        no graph yet, it has run eagerly before, and so have the run's warm-up steps."""
        return (
            self._failure is None
            and rows not in self._graphs
            and rows in self._eager_rows
            and self._eager_steps >= WARMUP_STEPS
        )

    def capture(self, step: Step, x: torch.Tensor, y: torch.Tensor, at_step: int) -> StepGraph:
        """Capture ``step`` reading static copies of ``x`` and ``y``; nothing runs here.
        ``at_step`` (the run's step number) goes into the status. Raises whatever the
        capture raised; the caller then calls ``give_up`` and goes on eagerly."""
        static = StepGraph(torch.cuda.CUDAGraph(), x.clone(), y.clone())
        # thread_local: the NCCL watchdog and the checkpoint writer may call CUDA in their
        # threads meanwhile; only this thread's calls must be capturable.
        with torch.cuda.graph(static.graph, stream=self.stream, capture_error_mode="thread_local"):
            step(static.x, static.y)
        self._record(static, at_step)
        return static

    def _record(self, static: StepGraph, at_step: int) -> None:
        rows = static.x.shape[0]
        self._graphs[rows] = static
        self._captured.append(f"step {at_step} ({rows} rows)")

    def give_up(self, exc: Exception) -> str:
        """Record a failed capture; eager steps from here on. Returns the reason."""
        text = str(exc).strip()
        reason = f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
        self._failure = reason
        self._graphs.clear()
        torch.cuda.synchronize(self.device)
        return reason
