"""Where a job's logs are once SLURM has forgotten it: the job's log record, its patterns
expanded as SLURM expands them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hpcdist.jobs.logpaths import expand_pattern, job_logs
from hpcdist.slurm.query import JobInfo, from_sacct
from hpcdist.state.folders import state_dir


@pytest.mark.parametrize(
    ("pattern", "expanded"),
    [
        ("o-%j.log", "o-123.log"),
        ("%x-%j.out", "emu run-123.out"),
        ("%x-%j.rank%t.out", "emu run-123.rank%t.out"),  # no rank asked: %t stays
        ("%4j.out", "0123.out"),  # a width zero-pads
        ("%A_%a.out", "123_4294967294.out"),  # not an array task: SLURM's NO_VAL
        ("logs/%u/%j.out", "logs/alice/123.out"),
        ("100%%-%j.out", "100%-123.out"),
        ("%N-%j.out", "%N-123.out"),  # node names are SLURM's alone
    ],
)
def test_patterns_expand_as_slurm_does(pattern: str, expanded: str) -> None:
    assert expand_pattern(pattern, "123", "emu run", user="alice") == expanded


def test_an_array_tasks_patterns_name_the_array_and_the_task() -> None:
    assert expand_pattern("%A-%a-%3a.out", "77_5", "x", user="u") == "77-5-005.out"
    assert expand_pattern("%x.rank%t.out", "77_5", "x", rank=3, user="u") == "x.rank3.out"


def _info(job_id: str, workdir: Path, stdout: str | None = None) -> JobInfo:
    return JobInfo(
        job_id=job_id,
        name="sweep",
        state="COMPLETED",
        reason=None,
        nodes="node[1-2]",
        num_nodes=2,
        elapsed_s=10.0,
        limit_s=60.0,
        exit_code=0,
        signal=0,
        restarts=0,
        stdout=stdout,
        stderr=stdout,
        workdir=str(workdir),
        source="sacct" if stdout is None else "scontrol",
    )


def _record(folder: Path, job_id: str, **fields: object) -> None:
    logs = state_dir("logs", project_dir=folder)
    path = logs / job_id
    record = {"output": "o-%j.log", "error": "e-%j.log", "name": "sweep", "rank_logs": "split"}
    path.write_text(json.dumps({**record, **fields}))
    path.chmod(0o600)


def test_a_forgotten_jobs_logs_come_from_its_record_stdout_and_stderr_apart(
    tmp_path: Path,
) -> None:
    _record(tmp_path, "123")
    found = job_logs(_info("123", tmp_path), None, [tmp_path])
    assert (found.stdout, found.stderr) == (tmp_path / "o-123.log", tmp_path / "e-123.log")
    assert not found.per_rank
    rank1 = job_logs(_info("123", tmp_path), 1, [tmp_path])
    assert (rank1.stdout, rank1.stderr, rank1.per_rank) == (
        tmp_path / "o-123.rank1.log",
        tmp_path / "e-123.rank1.log",
        True,
    )


def test_labelled_logs_keep_the_jobs_file_for_a_rank(tmp_path: Path) -> None:
    _record(tmp_path, "124", rank_logs="label", error=None)
    found = job_logs(_info("124", tmp_path), 1, [tmp_path])
    assert (found.stdout, found.stderr, found.per_rank) == (
        tmp_path / "o-124.log",
        tmp_path / "o-124.log",
        False,
    )


def test_without_a_record_slurms_paths_are_used_and_without_either_it_says_where_it_looked(
    tmp_path: Path,
) -> None:
    known = job_logs(_info("125", tmp_path, stdout=str(tmp_path / "s.out")), None, [tmp_path])
    assert known.stdout == tmp_path / "s.out"
    lost = job_logs(_info("126", tmp_path), None, [tmp_path])
    assert lost.stdout is None
    assert lost.looked[-1] == "SLURM's StdOut of job 126 (unknown)"
    assert any(str(tmp_path / ".hpcdist" / "logs" / "126") == place for place in lost.looked)


def test_a_record_another_user_could_write_is_not_read(tmp_path: Path) -> None:
    _record(tmp_path, "127")
    (state_dir("logs", project_dir=tmp_path) / "127").chmod(0o666)
    found = job_logs(dataclasses.replace(_info("127", tmp_path)), None, [tmp_path])
    assert found.stdout is None  # refused, never trusted


def _sacct_info(job_id: str, workdir: Path, raw_id: str | None = None) -> JobInfo:
    """A job the controller forgot, as sacct before 23.02 shows it (no StdOut field)."""
    rows = [
        {
            "JobID": job_id,
            "JobIDRaw": raw_id or job_id,
            "JobName": "sweep",
            "State": "COMPLETED",
            "ExitCode": "0:0",
            "WorkDir": str(workdir),
        }
    ]
    info = from_sacct(rows, job_id)
    assert info is not None
    return info


def test_a_name_guessed_from_sacct_is_never_taken_for_slurms_and_the_record_wins(
    tmp_path: Path,
) -> None:
    for name in ("e-140.log", "o-140.log", "e-140.rank1.log", "o-140.rank1.log"):
        (tmp_path / name).write_text(name)
    info = _sacct_info("140", tmp_path)
    assert info.stdout is None  # sacct named nothing: a guess is no SLURM path
    assert info.guessed_log == str(tmp_path / "o-140.log")  # not the stderr file
    _record(tmp_path, "140")
    found = job_logs(info, None, [tmp_path])
    assert (found.stdout, found.stderr, found.guessed) == (
        tmp_path / "o-140.log",
        tmp_path / "e-140.log",
        False,
    )
    rank1 = job_logs(info, 1, [tmp_path])
    assert (rank1.stdout, rank1.stderr, rank1.per_rank) == (
        tmp_path / "o-140.rank1.log",
        tmp_path / "e-140.rank1.log",
        True,
    )


def test_without_a_record_the_guess_is_used_and_said_to_be_one(tmp_path: Path) -> None:
    (tmp_path / "slurm-141.out").write_text("x")
    found = job_logs(_sacct_info("141", tmp_path), None, [tmp_path])
    assert (found.stdout, found.guesses) == (None, (tmp_path / "slurm-141.out",))
    assert found.files() == [(tmp_path / "slurm-141.out", False)]
    assert found.looked[-1].endswith("(a guess)")
    assert job_logs(_sacct_info("142", tmp_path), None, [tmp_path]).files() == []


@pytest.mark.parametrize(
    ("names", "guesses"),
    [
        # -o aa-%j.txt -e aa-%j.out: the .out file is its stderr; neither is called stdout.
        (["aa-143.txt", "aa-143.out"], ["aa-143.out", "aa-143.txt"]),
        (["bb-143.out", "bb-143.err"], ["bb-143.out", "bb-143.err"]),
        (["e-143.log", "o-143.log", "o-143.rank1.log"], ["o-143.log", "e-143.log"]),
        (["x-1430.out", "checkpoint-143.pt", "y-143.out"], ["y-143.out"]),
    ],
)
def test_every_file_named_for_a_forgotten_job_is_shown_as_a_guess(
    tmp_path: Path, names: list[str], guesses: list[str]
) -> None:
    for name in names:
        (tmp_path / name).write_text(name)
    found = job_logs(_sacct_info("143", tmp_path), None, [tmp_path])
    assert (found.stdout, found.stderr) == (None, None)
    assert [path.name for path, _ in found.files()] == guesses


def test_an_array_tasks_record_is_found_under_its_own_job_id(tmp_path: Path) -> None:
    # SLURM_JOB_ID of task 150_1 is its own id (152): the script wrote logs/152.
    _record(tmp_path, "152", output="o-%j-%A_%a.log", error=None)
    found = job_logs(_sacct_info("150_1", tmp_path, raw_id="152"), None, [tmp_path])
    assert found.stdout == tmp_path / "o-152-150_1.log"
    assert found.stderr == found.stdout
    scontrol = dataclasses.replace(_info("150_1", tmp_path), raw_id="152")
    assert job_logs(scontrol, None, [tmp_path]).stdout == tmp_path / "o-152-150_1.log"
