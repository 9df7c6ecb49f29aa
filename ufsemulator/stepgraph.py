"""The training step as a CUDA graph: captured once, replayed for every full step.

The step is launch-bound (a 9,345-parameter MLP): one replay is one launch for forward,
loss, backward with DDP's all-reduce, Adam and the loss sum, instead of dozens of
launches through Python and autograd. ``Loop`` decides what a step is; this module owns
the stream the steps run on, when a capture may happen and the captured graph.

The steps run on a side stream of their own, on which DDP is built too: its gradient
hooks belong to the stream current when it is built, and a capture on another stream
would fail. The first steps of every run are eager: DDP rebuilds its buckets after its
first iteration and times iterations 1-10 (and every 100th) with CUDA events that a graph
cannot hold, so the capture is never such an iteration or right after one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

# Eager DDP iterations before a capture (see the module's docstring).
WARMUP_STEPS = 11
DDP_TIMED_EVERY = 100

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
    """The steps' stream, the graph once captured, and whether a capture failed."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.graph: StepGraph | None = None
        self.failed = False
        self.eager_steps = 0  # DDP iterations run eagerly so far
        self.status = "on, not captured yet"

    def build(self, make: Callable[[], nn.Module]) -> nn.Module:
        """``make()`` (the DDP wrapper) on the steps' stream, ordered with the main one."""
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

    def may_capture(self) -> bool:
        n = self.eager_steps  # DDP's iteration count; the capture is iteration n + 1
        return (not self.failed and n >= WARMUP_STEPS
                and n % DDP_TIMED_EVERY != 0 and (n + 1) % DDP_TIMED_EVERY != 0)  # fmt: skip

    def capture(self, step: Step, x: torch.Tensor, y: torch.Tensor) -> StepGraph:
        """Capture ``step`` reading static copies of ``x`` and ``y``; nothing runs here.
        Raises whatever the capture raised; the caller falls back to eager steps."""
        static = StepGraph(torch.cuda.CUDAGraph(), x.clone(), y.clone())
        # thread_local: the NCCL watchdog and the checkpoint writer may call CUDA in their
        # threads meanwhile; only this thread's calls must be capturable.
        with torch.cuda.graph(static.graph, stream=self.stream,
                              capture_error_mode="thread_local"):  # fmt: skip
            step(static.x, static.y)
        self.graph = static
        return static

    def give_up(self, exc: Exception) -> str:
        """Record a failed capture; eager steps from here on. Returns the reason."""
        text = str(exc).strip()
        reason = f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
        self.status = f"capture failed ({reason}); eager"
        self.failed = True
        torch.cuda.synchronize(self.device)
        return reason
