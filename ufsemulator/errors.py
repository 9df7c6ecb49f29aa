"""Errors of the emulator workload that a user can cause and fix.

Both subclass ``ValueError`` so that a CLI can turn them into one line on stderr.
"""

from __future__ import annotations


class DataError(ValueError):
    """A data file is missing, unreadable, or lacks a variable; the message names both."""


class CheckpointError(ValueError):
    """A checkpoint is missing, truncated, or not in the expected format; names the file."""
