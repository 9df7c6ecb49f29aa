"""Private state: folders and files only their owner may write, atomic writes, checkpoint
digests, and files opened once and checked on the descriptor.

A bottom layer: imports only ``errors`` (and the standard library). What a workload uses
to keep its own files safe (the README's "A workload of your own") is listed in
``__all__`` and importable from here; the modules below are hpcdist's own.
"""

from hpcdist.state.digests import DigestBook, default_book, sha256_bytes
from hpcdist.state.fileutil import umask_mode, write_atomic
from hpcdist.state.outputs import OutputRefused, book_for, output_mode, read_output, write_output
from hpcdist.state.private import PrivacyError, create_exclusive, private_dir
from hpcdist.state.statehome import make_state_base
from hpcdist.state.trustedfile import (
    Refused,
    TrustedBytes,
    folder_fd,
    open_folder,
    pause,
    read_at,
    read_once,
    write_at,
)

__all__ = [
    "DigestBook",
    "OutputRefused",
    "PrivacyError",
    "Refused",
    "TrustedBytes",
    "book_for",
    "create_exclusive",
    "default_book",
    "folder_fd",
    "make_state_base",
    "open_folder",
    "output_mode",
    "pause",
    "private_dir",
    "read_at",
    "read_once",
    "read_output",
    "sha256_bytes",
    "umask_mode",
    "write_at",
    "write_atomic",
    "write_output",
]
