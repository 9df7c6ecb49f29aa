"""The ``hpcdist`` console script's first code: a Ctrl-C that comes while Python still
loads the command line (the first fraction of a second, before click can turn it into
"aborted") ends it with the same one line and exit code 130, never a traceback."""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from hpcdist.cli.main import main as cli_main

        return cli_main()
    except KeyboardInterrupt:
        print("\nhpcdist: aborted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
