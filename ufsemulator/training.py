"""Distributed training of the emulator: one code path for 1 process and many.

Every rank holds the data in memory, takes the same seeded train/validation split and
trains on its own equal-sized shard of the training set, reshuffled each epoch by a
generator seeded with (seed, epoch). Nothing depends on hidden RNG state, so a run
stopped at any step boundary and resumed from its checkpoint ends with bitwise the same
weights as an uninterrupted one (CPU, same world size).
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hpcdist.distributed import DistContext, cleanup_distributed, setup_distributed
from ufsemulator import runfiles
from ufsemulator.checkpoint import load_checkpoint, restore_rng, save_checkpoint
from ufsemulator.config import Config
from ufsemulator.export import export_checkpoint
from ufsemulator.loop import EpochState, Loop, LoopOutcome, gather_state_dict
from ufsemulator.data import DataOptions, load_dataset, make_synthetic
from ufsemulator.errors import CheckpointError, DataError
from ufsemulator.model import EmulatorMLP, ModelConfig
from ufsemulator.normalization import stats_from_shard, torch_all_reduce
