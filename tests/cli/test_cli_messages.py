"""Messages that point the right way: a stopped --wait, an array's cancel."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcdist.cli import jobs as cli_jobs
from hpcdist.cli.main import main
from hpcdist.jobs.records import JobRecord


@pytest.mark.parametrize(
    ("state", "said"),
    [
        (
            "RUNNING",
            "hpcdist: aborted; job {job} keeps running (RUNNING): hpcdist status {job}, "
            "hpcdist logs {job} --follow, hpcdist cancel {job}",
        ),
        ("FAILED", "hpcdist: aborted; job {job} ended FAILED"),
    ],
)
def test_ctrl_c_during_wait_tells_the_truth_about_the_job(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    state: str,
    said: str,
) -> None:
    monkeypatch.chdir(tmp_path)

    def interrupted(record: object, rank: int, poll_s: float = 1.0, within: object = None) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_jobs, "follow", interrupted)
    monkeypatch.setattr(cli_jobs, "job_state", lambda record: state)
    code = main(
        [
            "submit",
            "--executor",
            "local",
            "--mode",
            "threads",
            "--wait",
            "--command",
            f"{sys.executable} -c pass",
        ]
    )
    err = capsys.readouterr().err
    assert code == 130
    job = err.split("job ")[1].split()[0]
    assert err.splitlines()[-1] == said.format(job=job)


_LONG = ("--time", "10", "--command", "sleep 120")


def _sigint_by_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_of_the_terminal_during_a_local_wait_leaves_the_job_running(tmp_path: Path) -> None:
    """The terminal's Ctrl-C reaches every process of its foreground group: the local job
    (its controller, batch shell and ranks) is not among them, as a SLURM job is not."""
    hpcdist = [sys.executable, "-m", "hpcdist.cli.main"]
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("w") as stdout, err.open("w") as stderr:
        waiter = subprocess.Popen(
            [*hpcdist, "submit", "--executor", "local", "--mode", "threads", "--wait", *_LONG],
            cwd=tmp_path,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,  # its own group, as a terminal's foreground job has
            # So that a waiter that does not end dumps where it is (SIGABRT, below).
            env={**os.environ, "PYTHONFAULTHANDLER": "1"},
            # A terminal's foreground job starts with SIGINT at its default (a process
            # started with it ignored, as by nohup, keeps it ignored: Python's rule).
            preexec_fn=_sigint_by_default,
        )
    deadline = time.monotonic() + 60
    while "hpcdist: job " not in out.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    job = out.read_text().split("Submitted job ")[1].split()[0]
    try:
        assert "hpcdist: job " in out.read_text()  # the batch shell runs
        os.killpg(waiter.pid, signal.SIGINT)
        try:
            waiter.wait(timeout=120)
        except subprocess.TimeoutExpired:
            waiter.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
            waiter.wait(timeout=60)
            raise AssertionError(f"Ctrl-C did not end the waiter: {err.read_text()}") from None
        assert waiter.returncode == 130, err.read_text()
        said = err.read_text()
        assert "Traceback" not in said, said
        assert said.strip().splitlines() == [
            f"hpcdist: aborted; job {job} keeps running (RUNNING): hpcdist status {job}, "
            f"hpcdist logs {job} --follow, hpcdist cancel {job}"
        ]
        status = subprocess.run(
            [*hpcdist, "status", job], cwd=tmp_path, capture_output=True, text=True, check=False
        )
        assert status.stdout.startswith(f"{job} RUNNING"), status.stdout + status.stderr
    finally:
        subprocess.run([*hpcdist, "cancel", job], cwd=tmp_path, capture_output=True, check=False)


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ("CANCELLED\nRUNNING\nRUNNING\n", "(was CANCELLED, RUNNING)"),
        ("RUNNING", "(was RUNNING)"),
    ],
)
def test_cancel_says_each_state_once_on_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], answer: str, said: str
) -> None:
    monkeypatch.setattr(cli_jobs, "find_record", lambda job_id: object())
    monkeypatch.setattr(cli_jobs, "cancel", lambda record: answer)
    assert main(["cancel", "42"]) == 0
    out = capsys.readouterr().out
    assert out == f"Cancelled job 42 {said}\n"


@pytest.mark.parametrize(
    ("profile_text", "flags", "said"),
    [
        ("max_time: forever", [], "key max_time 'forever' is not a SLURM time limit"),
        ("sbatch: {nodes: 4}", [], "key sbatch 'nodes' is hpcdist's own option"),
        ("defaults: {nodes: 0}", [], "key defaults.nodes must be >= 1, got 0"),
    ],
)
def test_a_bad_profile_value_is_named_as_the_profiles_key_not_a_flag(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    profile_text: str,
    flags: list[str],
    said: str,
) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(f"partition: debug\npartitions: [debug]\n{profile_text}\n")
    site.chmod(0o600)
    assert main(["render", "--profile", str(site), *flags]) == 2
    err = capsys.readouterr().err
    assert err == f"hpcdist: error: profile 'site' ({site}) {said}" + err.split(said, 1)[1]
    assert err.count("\n") == 1


def test_the_users_own_flag_is_named_as_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = tmp_path / "site.yaml"
    site.write_text("partition: debug\npartitions: [debug]\ndefaults: {nodes: 0}\n")
    site.chmod(0o600)
    assert main(["render", "--profile", str(site), "--nodes", "0"]) == 2
    assert capsys.readouterr().err == "hpcdist: error: --nodes must be >= 1, got 0\n"


@pytest.mark.parametrize(
    ("code", "number", "reason", "said"),
    [
        (3, 0, None, "3"),
        (
            0,
            9,
            None,
            "0, killed by signal 9 (SIGKILL): likely out of memory (the OOM killer's signal), "
            "see the memory under efficiency",
        ),
        (0, 15, None, "0, killed by signal 15 (SIGTERM)"),
        # The runner exits 137 where srun saw a rank die of SIGKILL.
        (
            137,
            0,
            "NonZeroExitCode",
            "137 (128 + 9: a rank was killed by signal 9, SIGKILL): likely out of memory (the "
            "OOM killer's signal), see the memory under efficiency",
        ),
        (143, 0, None, "143 (128 + 15: a rank was killed by signal 15, SIGTERM)"),
        (128, 0, None, "128"),
        (255, 0, None, "255"),  # 128 + 127: no signal of this machine
        (
            0,
            53,
            "JobLaunchFailure",
            "0 (no signal: SLURM's signal field reads 53; reason JobLaunchFailure)",
        ),
        (0, 53, None, "0 (no signal: SLURM's signal field reads 53)"),
    ],
)
def test_status_says_a_signal_only_where_one_ended_the_job(
    code: int, number: int, reason: str | None, said: str
) -> None:
    from hpcdist.cli.follow import exit_text

    assert exit_text(code, number, reason) == said


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        (
            {"Reason": "BeginTime", "StartTime": "2026-11-27T03:00:00"},
            "BeginTime (starts no earlier than 2026-11-27T03:00:00)",
        ),
        (
            {"Reason": "Dependency", "Dependency": "afterok:41(unfulfilled)"},
            "Dependency (afterok:41(unfulfilled))",
        ),
        ({"Reason": "Dependency", "Dependency": "(null)"}, "Dependency"),
        ({"Reason": "Priority"}, "Priority"),
    ],
)
def test_a_pending_jobs_reason_names_what_it_waits_for(fields: dict[str, str], reason: str) -> None:
    from hpcdist.slurm.query import from_scontrol

    record = {"JobId": "42", "JobName": "x", "JobState": "PENDING", **fields}
    assert from_scontrol(record).reason == reason


def test_cancel_reaches_a_slurm_job_this_folder_has_no_record_of(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `hpcdist list` shows this user's SLURM jobs too (sbatch hpc/train.sh): cancel them.
    import subprocess

    from hpcdist.slurm import cluster
    from hpcdist.slurm import query as slurmquery

    asked: list[list[str]] = []
    monkeypatch.setattr(cli_jobs, "find_record", lambda job_id: None)
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    info = type("Info", (), {"state": "RUNNING"})()
    monkeypatch.setattr(slurmquery, "query_jobs", lambda job_id: [info] if job_id == "7" else [])

    def scancel(argv: list[str]) -> subprocess.CompletedProcess[str]:
        asked.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(cluster, "slurm_tool", scancel)
    assert main(["cancel", "7"]) == 0
    assert capsys.readouterr().out == "Cancelled job 7 (was RUNNING)\n"
    assert asked == [["scancel", "7"]]
    assert main(["cancel", "8"]) == 2
    assert capsys.readouterr().err == (
        "hpcdist: error: job '8' was not submitted from this folder and SLURM does not know "
        "it (scontrol show job, sacct); expected an id from `hpcdist list`\n"
    )


@pytest.mark.parametrize(
    ("states", "said"),
    [
        # A running array that sbatch queued: the tasks' states, never the waiting record's.
        (["RUNNING", "RUNNING"], "Cancelled job 9 (was RUNNING)\n"),
        (["RUNNING", "PENDING"], "Cancelled job 9 (was RUNNING, PENDING)\n"),
        (
            ["COMPLETED", "FAILED"],
            "Job 9 had already ended (COMPLETED, FAILED); nothing to cancel\n",
        ),
    ],
)
def test_cancel_of_an_array_without_a_record_says_its_tasks_states(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    states: list[str],
    said: str,
) -> None:
    import subprocess

    from hpcdist.slurm import cluster
    from hpcdist.slurm import query as slurmquery

    monkeypatch.setattr(cli_jobs, "find_record", lambda job_id: None)
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    tasks = [type("Info", (), {"state": state})() for state in states]
    monkeypatch.setattr(slurmquery, "query_jobs", lambda job_id: tasks)
    asked: list[list[str]] = []
    monkeypatch.setattr(
        cluster,
        "slurm_tool",
        lambda argv: asked.append(argv) or subprocess.CompletedProcess(argv, 0),
    )
    assert main(["cancel", "9"]) == 0
    assert capsys.readouterr().out == said
    assert asked == ([] if "already" in said else [["scancel", "9"]])


@pytest.mark.parametrize(
    ("sacct", "state"),
    [
        # sacct -X of 22.05 while both tasks run: the array's own row still reads PENDING.
        ("11581349|PENDING\n", "PENDING"),
        ("11581349_1|RUNNING\n11581349_0|RUNNING\n11581349|PENDING\n", "RUNNING\nRUNNING"),
        (
            "11581349_1|CANCELLED by 0\n11581349_0|CANCELLED by 0\n11581349|CANCELLED by 0\n",
            "CANCELLED\nCANCELLED",
        ),
        ("12|REQUEUED\n12|COMPLETED\n", "COMPLETED"),  # the latest attempt
        ("", "UNKNOWN"),
    ],
)
def test_sacct_state_of_an_array_is_its_tasks(sacct: str, state: str) -> None:
    from hpcdist.slurm.query import sacct_state

    job = "12" if sacct.startswith("12|") else "11581349"
    assert sacct_state(sacct, job) == state


def test_ctrl_c_while_the_command_line_loads_is_one_line_and_exit_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import builtins

    from hpcdist.cli import entry

    real = builtins.__import__

    def interrupted(name: str, *args: object, **kwargs: object) -> object:
        if name == "hpcdist.cli.main":  # Ctrl-C in the first moment of `hpcdist submit`
            raise KeyboardInterrupt
        return real(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", interrupted)
    assert entry.main() == 130
    assert capsys.readouterr().err == "hpcdist: aborted\n"


@pytest.mark.parametrize(
    ("state", "line"),
    [
        ("RUNNING", "RUNNING"),
        ("PENDING\nPENDING\nPENDING\nPENDING", "4 PENDING (4 tasks)"),
        ("PENDING\nRUNNING\nPENDING", "2 PENDING, 1 RUNNING (3 tasks)"),
    ],
)
def test_an_arrays_state_is_one_line(state: str, line: str) -> None:
    assert cli_jobs.states_line(state) == line


def _array_record(tmp_path: Path) -> JobRecord:
    return JobRecord(
        job_id="500",
        executor="slurm",
        name="sweep",
        mode="gloo",
        nodes=1,
        tasks=1,
        folder=str(tmp_path / "submitit"),
        submitted=0.0,
        command=["python3"],
        workdir=str(tmp_path),
    )


@pytest.mark.parametrize(
    ("output", "log"),
    [
        ("%x-%j.out", None),  # the task's own job id: given when it starts
        ("%x-%8J.log", None),
        ("%x-%A_%a.out", "sweep-500_2.out"),
        ("logs/%a.out", "logs/2.out"),
        ("/abs/%A-%a.out", "/abs/500-2.out"),
    ],
)
def test_a_tasks_log_is_named_only_where_its_name_is_known(
    tmp_path: Path, output: str, log: str | None
) -> None:
    found = cli_jobs.task_log(_array_record(tmp_path), output, "500_2")
    assert found == (None if log is None else str(tmp_path / log))
    said = cli_jobs.tasks_logs(_array_record(tmp_path), output)
    assert said.endswith("hpcdist logs 500_<task>")
    assert ("named by the job id SLURM gives the task" in said) is (log is None)


def test_ctrl_c_after_every_task_of_an_array_ended_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli_jobs, "job_state", lambda record: "COMPLETED\nFAILED\nCOMPLETED")
    assert cli_jobs._stopped_following(_array_record(tmp_path)) == 130
    said = "hpcdist: aborted; job 500 ended 2 COMPLETED, 1 FAILED (3 tasks)"
    assert capsys.readouterr().err.strip() == said


@pytest.mark.parametrize(
    ("signal_number", "elapsed_s", "explained"),
    [(9, 6.0, True), (9, 0.0, False), (0, 6.0, False)],  # a true launch failure: plain
)
def test_a_batch_shell_killed_after_it_ran_is_not_said_to_have_failed_to_launch(
    signal_number: int, elapsed_s: float, explained: bool
) -> None:
    from hpcdist.cli.follow import reason_text
    from hpcdist.slurm.query import JobInfo

    info = JobInfo(
        job_id="7",
        name="kb",
        state="FAILED",
        reason="JobLaunchFailure",
        nodes="node1",
        num_nodes=1,
        elapsed_s=elapsed_s,
        limit_s=None,
        exit_code=0,
        signal=signal_number,
        restarts=0,
        stdout=None,
        stderr=None,
        workdir=None,
        source="scontrol",
    )
    said = reason_text(info)
    assert said.startswith("JobLaunchFailure")
    assert (
        said == "JobLaunchFailure (SLURM's word here for a batch shell killed by signal 9 after it "
        "ran 0:00:06: the job did launch)"
    ) is explained


@pytest.mark.parametrize(
    ("message", "said"),
    [
        ("log /tmp/a\x1b]0;pwned\x07 is gone", "log /tmp/a\\x1b]0;pwned\\x07 is gone"),
        ("job 5 (FAILED\non node3) left no log", "job 5 (FAILED\\x0aon node3) left no log"),
        ("job 5 left no log at /tmp/a b", "job 5 left no log at /tmp/a b"),
    ],
)
def test_an_error_is_one_line_whatever_it_quotes(
    message: str, said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A path or a reason in a message may be another user's text (SLURM's StdOut, a name).
    from hpcdist.errors import UserError

    def refuse(job_id: str) -> None:
        raise UserError(message)

    monkeypatch.setattr("hpcdist.jobs.report.collect", refuse)
    assert main(["report", "5"]) == 2
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", f"hpcdist: error: {said}\n")


@pytest.mark.parametrize(
    ("state", "said"),
    [
        ("FAILED\x1b[2J\n5_1 COMPLETED", "  5_0 FAILED\\x1b[2J\\x0a5_1 COMPLETED\n"),
        ("FAILED", "  5_0 FAILED\n"),
    ],
)
def test_a_sweeps_task_states_are_printed_escaped(
    state: str, said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli_jobs, "seen", lambda: None)
    cli_jobs._task_reporter(3)("5_0", state)
    assert capsys.readouterr().out == said


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ("RUNNING\x1b]0;pwned\x07", "Cancelled job 5 (was RUNNING\\x1b]0;pwned\\x07)\n"),
        ("RUNNING", "Cancelled job 5 (was RUNNING)\n"),
    ],
)
def test_cancel_prints_slurms_states_escaped(
    answer: str, said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli_jobs, "find_record", lambda job_id: None)
    monkeypatch.setattr(cli_jobs, "_cancel_slurm_job", lambda job_id: answer)
    assert main(["cancel", "5"]) == 0
    assert capsys.readouterr().out == said
