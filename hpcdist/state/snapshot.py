"""What a state folder held before an attempt, so that a refused attempt leaves nothing.

A submission creates the private state folder (and, for a shared working folder, the
user's state folders above it), the secrets and submitit's folders, then asks sbatch. When
sbatch refuses, every folder and file made since the snapshot goes again; what existed
before is never touched, and a folder is only removed when it is empty.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class FolderSnapshot:
    root: Path
    existing: frozenset[Path]  # root and everything under it, as it was
    missing: tuple[Path, ...]  # root and the folders above it that did not exist, deepest first

    @classmethod
    def take(cls, root: Path) -> FolderSnapshot:
        """Take the snapshot before anything under (or above) ``root`` is created."""
        missing = []
        folder = Path(os.path.abspath(root))
        while not os.path.lexists(folder) and folder != folder.parent:
            missing.append(folder)
            folder = folder.parent
        return cls(Path(os.path.abspath(root)), frozenset(_paths_under(root)), tuple(missing))

    def made_since(self) -> list[Path]:
        """What was made since the snapshot, deepest first (a folder after its contents)."""
        made = set(_paths_under(self.root)) - self.existing
        made.update(folder for folder in self.missing if os.path.lexists(folder))
        return sorted(made, key=lambda p: len(p.parts), reverse=True)

    def remove_made(self) -> None:
        """Remove what was made since the snapshot; a folder that is not empty (someone
        else's file landed in it meanwhile) stays."""
        for path in self.made_since():
            with contextlib.suppress(OSError):
                if path.is_dir() and not path.is_symlink():
                    path.rmdir()
                else:
                    path.unlink()


def _paths_under(root: Path) -> set[Path]:
    root = Path(os.path.abspath(root))
    if not os.path.isdir(root):
        return {root} if os.path.lexists(root) else set()
    return {root} | set(root.rglob("*"))
