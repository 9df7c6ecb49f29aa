"""Checkpoint digests, kept in the user's private state: resume only what this user wrote.

A job id is public and a run folder may sit in a shared project folder, so a file named
``runs/<job id>/checkpoint.pt`` proves nothing about who wrote it. The writer records the
SHA-256 of every checkpoint it writes, in a private folder (``.hpcdist/digests``, 0700),
and auto-resume accepts a checkpoint only if its digest is recorded there.

A record is kept under the path the file was written at as the walk to its folder reached
it (``hpcdist.state.runroot.walked_path``), never through a link: another run's file, put
at this name by a rename or reached through a link, has its own record, not this one's.

The record is updated around the atomic rename (``expect`` before, ``settle`` after), so
a crash between the two leaves both the old and the new file acceptable.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from hpcdist.state.folders import jobs_root
from hpcdist.state.private import PrivacyError, write_private
from hpcdist.state.runroot import walked_path
from hpcdist.state.trustedfile import read_once, read_private


def sha256_bytes(data: bytes) -> str:
    """The SHA-256 of bytes, as hex: of the very bytes that are then written or loaded."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file's bytes, as hex (one open, one read; for reports and tests:
    what is loaded is hashed from its own bytes, never by path)."""
    return read_once(Path(path)).sha256


@dataclass(frozen=True)
class DigestBook:
    """Accepted digests of checkpoint files, one private JSON file per checkpoint path."""

    folder: Path  # e.g. <project>/.hpcdist/digests
    root: Path | None = None  # the private state's top folder, checked down to ``folder``

    def record_path(self, target: Path) -> Path:
        key = str(walked_path(Path(target)))
        return self.folder / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"

    def accepted(self, target: Path) -> list[str]:
        """The digests recorded for ``target``; none if there is no record."""
        path = self.record_path(Path(target))
        if not os.path.lexists(path):
            return []
        data = json.loads(read_private(path, "checkpoint digest record", self.root))
        return [d for d in data.get("sha256", []) if isinstance(d, str)]

    def expect(self, target: Path, digest: str) -> None:
        """About to replace ``target`` with a file of this digest (the old one still counts)."""
        self._write(target, [digest, *self.accepted(target)][:2])

    def settle(self, target: Path, digest: str) -> None:
        """``target`` now holds the file of this digest."""
        self._write(target, [digest])

    def problem(self, target: Path, actual: str) -> str:
        """Why ``target``, read as bytes of SHA-256 ``actual``, must not be resumed; "" if
        that digest is the recorded one."""
        try:
            accepted = self.accepted(target)
        except (OSError, ValueError, PrivacyError) as exc:
            return f"its digest record cannot be trusted ({exc})"
        if not accepted:
            return f"no digest of it was recorded in {str(self.folder)!r} (not written by you)"
        if actual not in accepted:
            return (
                f"its SHA-256 {actual[:12]}... differs from the recorded {accepted[0][:12]}... "
                "(changed since it was written)"
            )
        return ""

    def _write(self, target: Path, digests: list[str]) -> None:
        record = {"file": str(walked_path(Path(target))), "sha256": digests}
        write_private(
            self.record_path(Path(target)),
            json.dumps(record) + "\n",
            "checkpoint digests",
            self.root,
        )


def default_book() -> DigestBook:
    """The book of this project folder's private state (``$HPCDIST_HOME`` or the cwd)."""
    root = jobs_root()
    return DigestBook(root / "digests", root)
