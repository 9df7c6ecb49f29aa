"""The environment a rendered script's job activates, for tests that run one under bash.

The scripts call ``python3 -m hpcdist.distributed.jobstep``: the job's environment has
hpcdist installed. A test that narrows PATH to its stand-ins puts this ``python3`` there.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import hpcdist


def install_job_python(bindir: Path) -> Path:
    """A ``python3`` in ``bindir`` that is the interpreter running the tests, importing the
    hpcdist under test (this checkout's, whatever the environment has installed)."""
    python = bindir / "python3"
    root = shlex.quote(str(Path(hpcdist.__file__).resolve().parents[1]))
    python.write_text(
        f"#!/bin/bash\nPYTHONPATH={root}${{PYTHONPATH:+:$PYTHONPATH}} "
        f'exec {shlex.quote(sys.executable)} "$@"\n'
    )
    python.chmod(0o755)
    return python
