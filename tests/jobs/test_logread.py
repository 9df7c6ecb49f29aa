"""`hpcdist logs` shows only a file the job wrote, with its control characters escaped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpcdist.jobs.logread import ForeignLog, printable, read_log_bytes, read_log_text


def test_log_of_the_user_is_read_from_an_offset(tmp_path: Path) -> None:
    log = tmp_path / "job-5.out"
    log.write_bytes(b"hpcdist: job 5\nPASS\n")
    assert read_log_bytes(log, 15) == b"PASS\n"
    assert read_log_bytes(tmp_path / "absent.out") == b""


def test_link_at_a_log_name_is_never_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("HPCDIST_SECRET=abc\n")
    log = tmp_path / "job-5.out"
    log.symlink_to(secret)
    with pytest.raises(ForeignLog, match=rf"log '{log}' is a symbolic link: not a file the job"):
        read_log_text(log)


def test_log_of_another_user_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "job-5.out"
    log.write_text("hers\n")
    os.chown(log, 4242, -1)
    with pytest.raises(ForeignLog, match=r"is owned by .* \(uid 4242\)"):
        read_log_bytes(log)


def test_hard_link_to_another_file_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("mine\n")
    os.link(secret, tmp_path / "job-5.out")
    with pytest.raises(ForeignLog, match="has 2 names"):
        read_log_bytes(tmp_path / "job-5.out")


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b]0;pwned\x07title", "\\x1b]0;pwned\\x07title"),
        ("\x1b[2J\x1b[Hclear", "\\x1b[2J\\x1b[Hclear"),
        ("step 1\rstep 2", "step 1\\x0dstep 2"),
        ("tab\tand newline\n", "tab\tand newline\n"),
        ("\u009bcsi", "\\x9bcsi"),
    ],
)
def test_control_characters_are_printed_escaped(raw: str, shown: str) -> None:
    assert printable(raw) == shown
