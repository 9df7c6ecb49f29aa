"""Where this project folder's private state lives: ``.hpcdist/`` (or ``$HPCDIST_HOME/.hpcdist``).

Job records, submitit's folders, secrets, requeue markers and checkpoint digests all sit in
folders of this root, each created private or refused (``state_dir``).
"""

from __future__ import annotations

import os
from pathlib import Path

from hpcdist.state.private import private_dir


def jobs_root(project_dir: Path | None = None) -> Path:
    base = project_dir if project_dir is not None else Path(os.environ.get("HPCDIST_HOME", "."))
    return (base / ".hpcdist").resolve()


def state_dir(*parts: str, project_dir: Path | None = None) -> Path:
    """A folder of the private state (``.hpcdist/<parts>``), created 0700 or checked: a
    folder another user owns or can write is refused (PrivacyError, one line)."""
    root = jobs_root(project_dir)
    return private_dir(root.joinpath(*parts), "hpcdist's private folder", root)
