"""Diagnosing hangs: the collective timeout a job carries into its ranks, where NCCL's
flight recorder dumps, and which network variables to set when ranks cannot meet.

Pure functions of an environment mapping; ``hpcdist.distributed`` applies them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from hpcdist.facts.protocol import COLLECTIVE_TIMEOUT_ENV, RUN_DIR_VAR
from hpcdist.facts.runs import RUNS_DIR, run_name

DEFAULT_TIMEOUT_S = 120.0
# What decides where ranks meet: named, with the values this rank sees, in failure messages.
NETWORK_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "MASTER_ADDR")
# PyTorch's NCCL flight recorder: the ring of recent collectives, and where it is dumped.
# (torch >= 2.5 reads the TORCH_FR_* spellings too).
_TRACE_BUFFER_ENVS = ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE")
_TRACE_FILE_ENVS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")


def network_hint(env: Mapping[str, str]) -> str:
    """Which variables to set when ranks cannot reach each other, and what they are now."""
    now = ", ".join(f"{var}={env[var]}" if env.get(var) else f"{var} unset" for var in NETWORK_VARS)
    return (
        "on nodes with several networks set GLOO_SOCKET_IFNAME (gloo) or NCCL_SOCKET_IFNAME "
        "(nccl) to the interface that reaches the master, e.g. ib0 or eth0, and MASTER_ADDR "
        f"to the master's address on that network (now: {now})"
    )


def collective_timeout_s(env: Mapping[str, str], default: float = DEFAULT_TIMEOUT_S) -> float:
    """Seconds a rank waits to join the group or for any collective: the job's
    ``--collective-timeout`` (``HPCDIST_COLLECTIVE_TIMEOUT``), else ``default``."""
    text = env.get(COLLECTIVE_TIMEOUT_ENV, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise ValueError(f"{COLLECTIVE_TIMEOUT_ENV}={text!r}; expected a number of seconds > 0")
    return value


def flight_recorder_files(env: Mapping[str, str]) -> dict[str, str]:
    """Where NCCL's flight recorder dumps (one file per rank, torch appends the rank):
    into the run folder, for a job whose profile turned the recorder on and named no file.
    Pure: the variables to set; {} when there is nothing to add."""
    entries = 0
    for var in _TRACE_BUFFER_ENVS:
        text = env.get(var, "").strip()
        entries = max(entries, int(text) if text.isdigit() else 0)
    if entries <= 0 or any(env.get(var) for var in _TRACE_FILE_ENVS):
        return {}
    # The folder the training writes to (ufsemulator's runs/<job id>), or the one named.
    run_dir = env.get(RUN_DIR_VAR, "").strip() or os.path.join(
        RUNS_DIR, run_name(env) or env.get("TORCHELASTIC_RUN_ID") or "local"
    )
    prefix = os.path.join(os.path.abspath(run_dir), "nccl_trace_rank_")
    return dict.fromkeys(_TRACE_FILE_ENVS, prefix)


def hang_advice(timeout_s: float | None = None) -> str:
    """What to do about a training whose heartbeat stopped while its job runs (``hpcdist
    status``): what ends a hung collective, and where to look."""
    limit = f"{timeout_s:.0f} s" if timeout_s else f"{DEFAULT_TIMEOUT_S:.0f} s by default"
    return (
        "a rank may wait in a collective for a peer that died or hangs: the job's collective "
        f"timeout (--collective-timeout, {limit}) ends it with a message naming the "
        "collective; read the last lines of every rank (hpcdist logs JOB), set "
        f"{_TRACE_BUFFER_ENVS[0]} in the profile so NCCL's flight recorder dumps into the run "
        "folder, and cancel the job if it stays silent"
    )
