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


def torchrun_flags(nnodes: str, nproc: str, endpoint: str) -> list[str]:
    """torchrun's flags for one agent per node meeting at ``endpoint``, the first node's;
    the values are words for the script (shell expressions) or for argv (plain values).

    The static rendezvous keeps the rank each node is given (``per_node`` adds it), so
    global rank 0 is on the first node and rank N on the node SLURM placed it; c10d's
    would order the nodes as it likes (by host name and process id)."""
    return [
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=static",
        f"--rdzv-endpoint={endpoint}",
    ]


# What srun starts before each rank's command under the srun launcher: torch's env://
# variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...) from SLURM's, then the command
# in its place (hpcdist.distributed.rankenv).
RANK_ENV_COMMAND = ("python3", "-m", "hpcdist.distributed.rankenv", "--")


# The node's rank as srun gives it to each of its tasks: the batch shell, which expands a
# script's words once on the first node, has only its own (0).
NODE_RANK_FLAG = '--node-rank="$SLURM_NODEID"'


def per_node(argv: Sequence[str], signals: Sequence[str] = ()) -> list[str]:
    """``argv`` (torchrun and its flags) started on each node by a shell that adds the
    node's own rank (``NODE_RANK_FLAG``), expanded there, and first ignores ``signals``
    (see ``ignoring``). A shell, not Python: it runs inside the job's container too."""
    trap = f'trap "" {" ".join(signals)} && ' if signals else ""
    return ["bash", "-c", f'{trap}exec "$0" {NODE_RANK_FLAG} "$@"', *argv]


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


# torchrun's agent where the job names a warning signal, started as ``python3 -c`` with it:
# torch.distributed.run (what the torchrun program runs) behind a handler that does nothing.
# SLURM signals every process of the step: the agent outlives the warning, while its ranks,
# which a new program image gives the default action again (a handler is not inherited, an
# ignored signal would be), get it as SLURM sent it: to catch, or to die of. A rank the
# warning killed makes the agent exit 128 + the signal, as srun does, so the job's runner
# can say so. The node's rank is the task's own (``SLURM_NODEID``), as ``NODE_RANK_FLAG``.
# A rank that died first of a signal that suggests its node (``NODE_SIGNALS``) is named with
# its node in one line (``RANK_DEATH_LINE``): srun sees only the agent's exit code, and the
# runner then keeps the run's next piece off that node (``hpcdist.distributed.badnodes``).
_AGENT = """\
import os, signal, sys
sys.path[:] = [p for p in sys.path if p[:1] == "/"]  # not the working folder ("")
warning = signal.SIG{name}
signal.signal(warning, lambda *_: None)
sys.argv[1:1] = ["--node-rank=" + os.environ["SLURM_NODEID"]]
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main
try:
    main()
except ChildFailedError as failed:
    rank, first = failed.get_first_failure()
    if first.exitcode in ({codes}):
        print("hpcdist: torchrun: rank", rank, "on", os.environ.get("SLURMD_NODENAME", "?"),
              "died of", signal.Signals(-first.exitcode).name, file=sys.stderr, flush=True)
    if all(f.exitcode != -warning for f in failed.failures.values()):
        raise
    print(failed, file=sys.stderr)
    sys.exit(128 + warning)"""

# The signals a rank dies of that point at its node rather than at the program: a bus error
# (a memory fault), an illegal instruction, a segmentation fault. Not KILL (the kernel's
# out-of-memory killer ends a rank so: the job's own memory, which another node would not
# cure; or a person), ABRT (a program's own abort, torch's teardown), TERM or INT (an end
# asked for).
NODE_SIGNALS = ("BUS", "ILL", "SEGV")
# What the agent prints of such a rank (after srun's label): rank, node, signal.
RANK_DEATH_LINE = r"hpcdist: torchrun: rank (\d+) on (\S+) died of SIG([A-Z]+)"


def torchrun_agent(warning: str) -> str:
    """The Python code of torchrun's agent for a job warned by ``warning`` (``USR2``): the
    script keeps it in ``AGENT_VAR`` and starts ``AGENT_WORDS`` in the place of ``torchrun``,
    its node rank included (see ``_AGENT``)."""
    codes = ", ".join(f"-signal.SIG{name}" for name in NODE_SIGNALS)
    return _AGENT.format(name=warning, codes=codes)


AGENT_VAR = "torchrun_agent"
AGENT_WORDS = ("python3", "-c", f'"${{{AGENT_VAR}}}"')


def ignoring(signals: Sequence[str], argv: Sequence[str]) -> list[str]:
    """``argv`` started by a shell that first ignores ``signals`` (``USR2``): torchrun's
    agent, which SLURM signals with the rest of the step and which would die of the warning
    its ranks catch to checkpoint (they install their own handler). A shell, not Python:
    it runs inside the job's container too."""
    script = f'trap "" {" ".join(signals)} && exec "$@"'
    return ["bash", "-c", script, argv[0], *argv]
