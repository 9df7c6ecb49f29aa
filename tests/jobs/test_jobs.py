"""Job records and local jobs: a real identity, a cancel that stops the whole tree, a finished
job never rewritten, and one line for every bad record or job id."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from hpcdist.jobs.localjob import ProcessIdentity, identify, process_tree
from hpcdist.jobs.records import (
    JobRecord,
    cancel,
    job_state,
    load_record,
    save_record,
    scan_records,
    wait_for_final_state,
)
from hpcdist.jobs.submit import submit
from hpcdist.spec.options import spec_from_options

HPCDIST = [sys.executable, "-m", "hpcdist.cli.main"]


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "HPCDIST"))}
    return subprocess.run(
        [*HPCDIST, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def _sleeper(tmp_path: Path, nodes: int = 2) -> JobRecord:
    command = f'{sys.executable} -c "import time; time.sleep(300)"'
    spec = spec_from_options({"profile": None, "mode": "gloo", "nodes": nodes, "command": command})
    return submit(spec, "local", project_dir=tmp_path).record


def _record(tmp_path: Path, **changes: object) -> JobRecord:
    base = JobRecord(
        job_id="4242",
        executor="local",
        name="x",
        mode="gloo",
        nodes=1,
        tasks=1,
        folder=str(tmp_path / "f"),
        submitted=time.time(),
        command=["true"],
        start_ticks=1,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_cancel_of_a_local_job_leaves_no_process_of_it_within_10_s(tmp_path: Path) -> None:
    record = _sleeper(tmp_path)
    assert record.local_process is not None
    # Both ranks' commands (python -c ... sleep) are running under the controller, beside
    # the batch shell, its runner and the srun stand-in (whose arguments name the command).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        tree = process_tree(record.local_process)
        if sum(_is_rank(p.pid) for p in tree) == 2:
            break
        time.sleep(0.2)
    assert sum(_is_rank(p.pid) for p in tree) == 2
    assert len(tree) > 2
    started = time.monotonic()
    assert cancel(record) == "RUNNING"
    while any(p.is_running() for p in tree) and time.monotonic() - started < 10:
        time.sleep(0.1)
    assert [p for p in tree if p.is_running()] == []
    assert job_state(record) == "CANCELLED"


def _is_rank(pid: int) -> bool:
    return _cmdline(pid).startswith(f"{sys.executable} -c import time; time.sleep(300)")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_cancel_of_a_finished_job_keeps_its_state(tmp_path: Path) -> None:
    spec = spec_from_options({"profile": None, "mode": "gloo", "nodes": 1, "command": "true"})
    record = submit(spec, "local", project_dir=tmp_path).record
    assert wait_for_final_state(record, timeout_s=60, poll_s=0.2) == "COMPLETED"
    result = _cli(["cancel", record.job_id], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"Job {record.job_id} had already ended (COMPLETED); nothing to cancel"
    )
    assert job_state(load_record(record.job_id, tmp_path)) == "COMPLETED"
    assert not (Path(record.folder) / "cancelled").exists()


def test_a_reused_pid_is_neither_running_nor_signalled(tmp_path: Path) -> None:
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        identity = identify(stranger.pid)
        assert identity is not None
        # The job's controller had this pid once, but started at another time.
        record = _record(tmp_path, job_id=str(stranger.pid), start_ticks=identity.start_ticks - 1)
        save_record(record, tmp_path)
        assert job_state(record) == "FAILED"  # ended without exit records
        assert cancel(record) == "FAILED"
        time.sleep(0.2)
        assert stranger.poll() is None  # untouched
        assert ProcessIdentity(stranger.pid, identity.start_ticks).is_running()
    finally:
        stranger.kill()
        stranger.wait()


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("", "cannot be read (JSONDecodeError)"),
        ('{"job_id": "12', "cannot be read (JSONDecodeError)"),
        ("[1, 2]", "is corrupt: expected a JSON object, got list"),
        ("\xff\xfe", "cannot be read (UnicodeDecodeError)"),
        ("JOB:-1", "is corrupt: job '-1' of executor 'local'"),
        ("JOB:0", "is corrupt: job '0' of executor 'local'"),
        ("TASKS:0", "is corrupt: 1 nodes, 0 tasks"),
        ("TASKS:'2'", "is corrupt: tasks is '2'"),
        ("TASKS:true", "is corrupt: tasks is True"),
        ("EXECUTOR:'pbs'", "is corrupt: job '4242' of executor 'pbs'"),
    ],
)
def test_a_bad_record_is_one_line_and_spares_the_others(
    tmp_path: Path, content: str, reason: str
) -> None:
    good = _record(tmp_path, job_id="1111", executor="slurm", start_ticks=None)
    save_record(good, tmp_path)
    bad = tmp_path / ".hpcdist" / "jobs" / "4242.json"
    if content.startswith(("JOB:", "TASKS:", "EXECUTOR:")):
        key, _, value = content.partition(":")
        field = {"JOB": "job_id", "TASKS": "tasks", "EXECUTOR": "executor"}[key]
        data = asdict(_record(tmp_path))
        data[field] = json.loads(value.replace("'", '"')) if key != "JOB" else value
        bad.write_text(json.dumps(data))
    elif content == "\xff\xfe":
        bad.write_bytes(b"\xff\xfe")
    else:
        bad.write_text(content)
    records, problems = scan_records(tmp_path)
    assert [r.job_id for r in records] == ["1111"]
    assert problems == [
        f"job record {str(bad)!r} {reason}"
        + ("; remove it or submit the job again" if "cannot be read" in reason else "; remove it")
    ]
    status = _cli(["status", "4242"], tmp_path)
    assert status.returncode == 2
    assert status.stderr.count("\n") == 1 and "Traceback" not in status.stderr
    assert reason in status.stderr


@pytest.mark.parametrize("job_id", ["../../x", "", "-1", "0", "12/34", "1 2", "1_", "x1"])
def test_status_logs_and_cancel_refuse_what_is_not_a_job_id(tmp_path: Path, job_id: str) -> None:
    not_a_job = (
        f"hpcdist: error: job id {job_id!r} is not a job id; "
        "expected digits such as 1234 (or 1234_5 for an array task)\n"
    )
    # status and logs also take a run id (RUN of `hpcdist list`), and say so.
    neither = (
        f"hpcdist: error: {job_id!r} is neither a job id (1234, 1234_5) nor a run started "
        "from this folder; expected one of `hpcdist list`\n"
    )
    for command in (["status", "--", job_id], ["logs", "--", job_id], ["cancel", "--", job_id]):
        result = _cli(command, tmp_path)
        assert result.returncode == 2, (command, result.stdout)
        looks_like_a_job = job_id == "0"  # digits: refused as a job id
        said = not_a_job if command[0] == "cancel" or looks_like_a_job else neither
        assert result.stderr == said


@pytest.mark.parametrize("job_id", ["1", "123456", "1234_5", "999999999999999999"])
def test_well_formed_job_ids_reach_the_record_lookup(tmp_path: Path, job_id: str) -> None:
    result = _cli(["status", job_id], tmp_path)
    assert result.returncode == 2
    assert f"job {job_id!r} was not submitted from this folder" in result.stderr


def test_logs_of_a_job_without_log_files_says_so(tmp_path: Path) -> None:
    record = _record(tmp_path, job_id="4243", start_ticks=None)
    save_record(record, tmp_path)
    result = _cli(["logs", "4243"], tmp_path)
    assert result.returncode == 2
    # An ended job's log will not come: never "does not exist yet".
    assert result.stderr == (
        f"hpcdist: error: rank 0 of job 4243 (FAILED) left no log at {record.log_path(0)} "
        "(never written, or removed since)\n"
    )
    assert result.stdout == ""
    record.log_path(0).parent.mkdir(parents=True, exist_ok=True)
    record.log_path(0).write_text("")  # there, but empty: said, not printed as nothing
    result = _cli(["logs", "4243"], tmp_path)
    assert result.returncode == 2
    assert "its log" in result.stderr and result.stderr.endswith(" is empty\n")
