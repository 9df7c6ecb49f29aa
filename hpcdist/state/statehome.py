"""Where the private state lives when the working folder is shared.

Job records, queued scripts, job secrets and checkpoint digests decide what runs as
the user. In a folder that others can write (group- or other-writable without the sticky
bit, anywhere above it), or that another user owns, they could rename ``.hpcdist`` away
and put their own in its place between submission and the job's start (the job reads
its secret and markers from there by path). So, unless ``HPCDIST_HOME`` says otherwise,
the state of such a folder lives in the user's own state folder, keyed by the project folder:

    ${XDG_STATE_HOME:-~/.local/state}/hpcdist/projects/<name>-<12 hex digits>

The job, started in the same folder, finds the same place. Run outputs stay in the
project folder; resuming from there checks the files by what was opened
(``hpcdist.state.trustedfile``) and their digests kept here.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path

from hpcdist.state.private import replaceable_by_others, user_name


def shared_reason(folder: Path) -> str:
    """Why others could replace what the user keeps in ``folder``: "" if they cannot."""
    folder = Path(os.path.abspath(folder))
    try:
        info = os.stat(folder)
    except OSError:
        return ""  # not there yet: whoever creates it decides
    if info.st_uid != os.geteuid():
        return f"{str(folder)!r} is owned by {user_name(info.st_uid)} (uid {info.st_uid})"
    above = replaceable_by_others(folder / ".hpcdist")
    if above is not None:
        held = os.stat(above)
        owner = f"owner {user_name(held.st_uid)}, mode {stat.S_IMODE(held.st_mode):04o}"
        return f"{str(above)!r} can be written by others ({owner})"
    return ""


def state_base(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    configured = env.get("XDG_STATE_HOME", "").strip()
    base = Path(configured).expanduser() if configured else Path.home() / ".local" / "state"
    return base / "hpcdist" / "projects"


def private_state_root(folder: Path, environ: Mapping[str, str] | None = None) -> Path:
    """The user's own state folder for a project folder (see the module docstring)."""
    real = os.path.realpath(folder)
    key = hashlib.sha256(real.encode()).hexdigest()[:12]
    name = re.sub(r"[^A-Za-z0-9._-]", "_", Path(real).name)[:40] or "root"
    return state_base(environ) / f"{name}-{key}"


def make_state_base(environ: Mapping[str, str] | None = None) -> Path:
    """``state_base()``'s parent (``.../hpcdist``), every missing folder from the home folder
    down created 0700 (a umask of 002 must not leave ``~/.local/state`` group-writable:
    reads below the home folder check every folder from it down)."""
    top = state_base(environ).parent
    home = Path(os.path.abspath(Path.home()))
    start = home if home in top.parents else Path(top.anchor)
    for folder in [*reversed(top.relative_to(start).parents), top.relative_to(start)]:
        if str(folder) != "." and not os.path.lexists(start / folder):
            with contextlib.suppress(FileExistsError):
                os.mkdir(start / folder, 0o700)
    return top
