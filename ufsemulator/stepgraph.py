"""The training step as a CUDA graph: captured once, replayed for every full step.

The step is launch-bound (a 9,345-parameter MLP): one replay is one launch for forward,
loss, backward, the gradient all-reduce (``GradSync``), Adam and the loss sum, instead of
dozens of launches through Python and autograd. ``Loop`` decides what a step is; this
module owns the stream the steps run on, when a capture may happen and the captured graph.

The steps run on a side stream of their own, on which the wrapper is built too. The first
steps of every run are eager: they create what a capture may not allocate (Adam's state,
cuBLAS's workspace, the communicator of the first all-reduce).
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
    """The steps' stream, the graph once captured, and whether a capture failed. Its state
    changes only through its methods: ``ran_eagerly``, ``capture`` and ``give_up``."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self._graph: StepGraph | None = None
        self._failed = False
        self._eager_steps = 0  # steps run eagerly so far
        self._status = "on, not captured yet"

    @property
    def graph(self) -> StepGraph | None:
        """The captured step; None before the capture and after a failed one."""
        return self._graph

    @property
    def eager_steps(self) -> int:
        return self._eager_steps

    @property
    def status(self) -> str:
        """For logs and benchmarks: not captured yet, captured at which step, or why not."""
        return self._status

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

    def ran_eagerly(self) -> None:
        """Count a step run without the graph."""
        self._eager_steps += 1

    def may_capture(self) -> bool:
        return not self._failed and self._graph is None and self._eager_steps >= WARMUP_STEPS

    def capture(self, step: Step, x: torch.Tensor, y: torch.Tensor, at_step: int) -> StepGraph:
        """Capture ``step`` reading static copies of ``x`` and ``y``; nothing runs here.
        ``at_step`` (the run's step number) goes into the status. Raises whatever the
        capture raised; the caller then calls ``give_up`` and goes on eagerly."""
        static = StepGraph(torch.cuda.CUDAGraph(), x.clone(), y.clone())
        # thread_local: the NCCL watchdog and the checkpoint writer may call CUDA in their
        # threads meanwhile; only this thread's calls must be capturable.
        with torch.cuda.graph(static.graph, stream=self.stream, capture_error_mode="thread_local"):
            step(static.x, static.y)
        self._graph = static
        self._status = f"captured at step {at_step} of this run"
        return static

    def give_up(self, exc: Exception) -> str:
        """Record a failed capture; eager steps from here on. Returns the reason."""
        text = str(exc).strip()
        reason = f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
        self._status = f"capture failed ({reason}); eager"
        self._failed = True
        self._graph = None
        torch.cuda.synchronize(self.device)
        return reason
