"""The ``hpcdist`` console script's first code: a Ctrl-C that comes while Python still
loads the command line (the first fraction of a second, before click can turn it into
"aborted") ends it with the same one line and exit code 130, never a traceback."""

from __future__ import annotations

import sys

# Exit status of a command ended by Ctrl-C (128 + SIGINT), as a shell reports it.
INTERRUPTED = 130


def main(argv: list[str] | None = None) -> int:
    try:
        from hpcdist.cli.main import main as cli_main

        return cli_main(argv)
    except KeyboardInterrupt:
        print("hpcdist: aborted", file=sys.stderr)  # as click says it once it runs
        return INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
