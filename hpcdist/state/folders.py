"""Where this project folder's private state lives: ``.hpcdist/`` (or ``$HPCDIST_HOME/.hpcdist``).

Job records, submitit's folders, secrets, requeue markers and checkpoint digests all sit in
folders of this root, each created private or refused (``state_dir``).
"""

from __future__ import annotations

import os
from pathlib import Path

from hpcdist.state.private import private_dir
from hpcdist.state.statehome import make_state_base, private_state_root, shared_reason, state_base
from hpcdist.state.trustedfile import folder_fd


def project_base(project_dir: Path | None = None) -> Path:
    """The folder whose state this is: ``project_dir``, else ``$HPCDIST_HOME``, else the cwd."""
    base = project_dir if project_dir is not None else Path(os.environ.get("HPCDIST_HOME", "."))
    return base.resolve()


def jobs_root(project_dir: Path | None = None) -> Path:
    """``<base>/.hpcdist``; for a working folder that others can write or own (and no
    ``HPCDIST_HOME``), the user's own state folder for it (``hpcdist.state.statehome``)."""
    base = project_base(project_dir)
    chosen = project_dir is None and os.environ.get("HPCDIST_HOME", "").strip()
    if not chosen and shared_reason(base):
        return private_state_root(base)
    return (base / ".hpcdist").resolve()


def state_dir(*parts: str, project_dir: Path | None = None) -> Path:
    """A folder of the private state (``.hpcdist/<parts>``), created 0700 or checked: a
    folder another user owns or can write is refused (PrivacyError, one line)."""
    root = jobs_root(project_dir)
    top = state_base().parent  # the user's own state folder: every level 0700 from there
    start = make_state_base() if top in root.parents else root
    folder = private_dir(root.joinpath(*parts), "hpcdist's private folder", start)
    # Its files are read checking every folder from the home folder down (for state below
    # it): a folder there that others can write is said now, not when the job starts.
    with folder_fd(folder, what="hpcdist's private folder"):
        return folder
