"""The ``hpcdist`` command line (top layer): flags in, one line of error or the result out.

Owns the click commands and nothing else: each subcommand module asks the rooms below it
(``jobs``, ``render``, ``spec``, ``distributed``, ``slurm``, ``state``) to do the work.
May import every room; nothing imports it.
"""

from __future__ import annotations

import sys

# Exit status of a command ended by Ctrl-C (128 + SIGINT), as a shell reports it.
INTERRUPTED = 130


def main(argv: list[str] | None = None) -> int:
    """The console script: the CLI, whose imports a Ctrl-C may interrupt as well (the first
    fraction of a second of every command): one line, never a traceback."""
    try:
        from hpcdist.cli.main import main as run

        return run(argv)
    except KeyboardInterrupt:
        print("hpcdist: interrupted", file=sys.stderr)
        return INTERRUPTED
