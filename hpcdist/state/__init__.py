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
from hpcdist.state.runroot import (
    RUN_ROOTS_VAR,
    open_run_folder,
    run_folder_fd,
    start_of,
    walked_path,
)
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
    "RUN_ROOTS_VAR",
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
    "open_run_folder",
    "output_mode",
    "pause",
    "private_dir",
    "read_at",
    "read_once",
    "read_output",
    "run_folder_fd",
    "sha256_bytes",
    "start_of",
    "umask_mode",
    "walked_path",
    "write_at",
    "write_atomic",
    "write_output",
]
