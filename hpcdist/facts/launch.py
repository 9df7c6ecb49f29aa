"""The words that launch a job's ranks, as both sides spell them: the rendered script
(login side) and what reads the job's logs or starts its ranks (job side)."""

from __future__ import annotations

from collections.abc import Sequence


def rank_log_pattern(log: str, rank: str = "%t") -> str:
    """The per-rank file beside the job's log: ``%x-%j.out`` -> ``%x-%j.rank%t.out``; with
    ``rank`` a number, the name of that rank's file beside an expanded log path."""
    folder, slash, name = log.rpartition("/")
    stem, dot, suffix = name.rpartition(".")
    named = f"{stem}.rank{rank}.{suffix}" if dot and stem else f"{name}.rank{rank}"
    return f"{folder}{slash}{named}"


def torchrun_flags(
    nnodes: str, nproc: str, node_rank: str, endpoint: str, rdzv_id: str
) -> list[str]:
    """torchrun's flags for one agent per node meeting at ``endpoint`` (c10d rendezvous);
    the values are words for the script (shell expressions) or for argv (plain values)."""
    return [
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc}",
        f"--node-rank={node_rank}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={rdzv_id}",
    ]


def torchrun_command(torchrun: list[str], command: list[str]) -> list[str]:
    """``torchrun FLAGS`` followed by the job's command."""
    if (
        command[0] in ("python", "python3")
        and len(command) > 1
        and (command[1] == "-m" or not command[1].startswith("-"))
    ):
        # torchrun is itself the Python interpreter: hand it the module or script directly
        # (it knows no other interpreter option, such as -c).
        return torchrun + command[1:]
    return [*torchrun, "--no-python", *command]


def ignoring(signals: Sequence[str], argv: Sequence[str]) -> list[str]:
    """``argv`` started by a shell that first ignores ``signals`` (``USR2``): torchrun's
    agent, which SLURM signals with the rest of the step and which would die of the warning
    its ranks catch to checkpoint (they install their own handler). A shell, not Python:
    it runs inside the job's container too."""
    script = f'trap "" {" ".join(signals)} && exec "$@"'
    return ["bash", "-c", script, argv[0], *argv]
