"""A one-line progress bar for a person at a terminal (rank 0 only)."""

from __future__ import annotations

import sys
import time

import torch


class Progress:
    """Redrawn at most five times a second; ``clear`` before the epoch's log line."""

    def __init__(self, steps: int, epochs: int) -> None:
        self.steps, self.epochs, self.last = steps, epochs, 0.0

    def update(self, epoch: int, step: int, partial: torch.Tensor) -> None:
        now = time.monotonic()
        if now - self.last < 0.2 and step < self.steps:
            return
        self.last = now
        done = int(30 * step / self.steps)
        loss = float(partial[0] / partial[1]) if float(partial[1]) else float("nan")
        sys.stdout.write(
            f"\rEpoch {epoch + 1}/{self.epochs} [{'#' * done}{'.' * (30 - done)}] "
            f"{step}/{self.steps} loss {loss:.4g}"
        )
        sys.stdout.flush()

    def clear(self) -> None:
        sys.stdout.write("\r" + " " * 72 + "\r")
        sys.stdout.flush()
