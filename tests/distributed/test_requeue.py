"""The requeue decision (hpcdist.distributed.requeue), the one both a rendered script's runner
and hpcdist's submitit task make: both sides of each boundary, then with stand-in SLURM tools."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcdist.cli.follow import exit_text, warning_killed
from hpcdist.distributed.requeue import (
    SignalRelay,
    array_task,
    checkpointed,
    refusal,
    requeue_job,
    restarts_so_far,
    resubmit_env,
    warning_death,
)
from hpcdist.facts.launch import ignoring
from hpcdist.facts.protocol import REQUEUE_EXIT_CODE, WARNING_KILLED
from hpcdist.render.script import quote


@pytest.mark.parametrize(
    ("restarts", "max_restarts", "terminated", "preempted", "why"),
    [
        (1, 2, False, False, ""),  # warned, one restart left
        (2, 2, False, False, "restart 2 reached --max-restarts 2"),
        (3, 2, False, False, "restart 3 reached --max-restarts 2"),
        (0, 0, False, False, "restart 0 reached --max-restarts 0"),
        (99, None, False, False, ""),  # submitit's task without a limit of ours
        (0, 3, True, True, ""),  # TERM of a preemption
        (0, 3, True, False, "job 77 was ended (TERM) without a preemption"),  # scancel
        (3, 3, True, False, "job 77 was ended (TERM) without a preemption"),  # TERM says first
        (3, 3, True, True, "restart 3 reached --max-restarts 3"),
    ],
)
def test_refusal_says_why_a_job_that_checkpointed_stays_down(
    restarts: int, max_restarts: int | None, terminated: bool, preempted: bool, why: str
) -> None:
    assert refusal("77", restarts, max_restarts, terminated, preempted) == why


@pytest.mark.parametrize(
    ("status", "marker", "asked"),
    [
        (REQUEUE_EXIT_CODE, False, True),
        (143, True, True),  # srun reports the rank it killed last; rank 0 left the marker
        (1, True, True),  # torchrun's own failure for rank 0's 85
        (0, False, False),
        (1, False, False),
        (143, False, False),
        (REQUEUE_EXIT_CODE + 1, False, False),
    ],
)
def test_checkpointed_reads_the_marker_or_the_exit_code(
    status: int, marker: bool, asked: bool, tmp_path: Path
) -> None:
    path = tmp_path / "requeue" / "77"
    if marker:
        path.parent.mkdir()
        path.write_text("runs/77\n")
    assert checkpointed(status, path) is asked
    assert checkpointed(status, None) is (status == REQUEUE_EXIT_CODE)


@pytest.mark.parametrize(
    ("env", "restarts"),
    [
        ({}, 0),
        ({"SLURM_RESTART_COUNT": "2"}, 2),
        ({"HPCDIST_RESTARTS": "1"}, 1),
        ({"SLURM_RESTART_COUNT": "1", "HPCDIST_RESTARTS": "2"}, 3),
        ({"SLURM_RESTART_COUNT": "", "HPCDIST_RESTARTS": " "}, 0),
    ],
)
def test_restarts_count_requeues_and_resubmissions(env: dict[str, str], restarts: int) -> None:
    assert restarts_so_far(env) == restarts


def test_an_array_task_is_named_alone() -> None:
    assert array_task({"SLURM_JOB_ID": "80", "SLURM_ARRAY_JOB_ID": "77"}) is None
    env = {"SLURM_JOB_ID": "80", "SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "3"}
    assert array_task(env) == "77_3"


def test_resubmission_hides_this_jobs_slurm_variables() -> None:
    env = {
        "SLURM_JOB_ID": "77",
        "SLURM_NODELIST": "node[1-2]",
        "SBATCH_PARTITION": "debug",
        "SRUN_CPUS_PER_TASK": "2",
        "SALLOC_ACCOUNT": "a",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "PATH": "/usr/bin",
        "HPCDIST_RESTARTS": "1",
    }
    new = resubmit_env(env, restarts=2)
    assert new == {
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "PATH": "/usr/bin",
        "HPCDIST_RUN_DIR": "runs/77",
        "HPCDIST_RESTARTS": "3",
    }
    # A job that was itself resubmitted keeps resuming the first one's folder; a sweep's
    # array task resumes its own.
    assert resubmit_env({**env, "HPCDIST_RUN_DIR": "runs/5"}, 0)["HPCDIST_RUN_DIR"] == "runs/5"
    task = {**env, "SLURM_ARRAY_JOB_ID": "70", "SLURM_ARRAY_TASK_ID": "4"}
    assert resubmit_env(task, 0)["HPCDIST_RUN_DIR"] == "runs/70_4"


# ------------------------------------------------------------ with stand-in SLURM tools


def _tools(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    preempt_time: str | None,
    requeue_rc: int,
    shown: str = "JobState=RUNNING Reason=None",
    restarts: int | str = 0,
) -> Path:
    """scontrol (None: missing) and sbatch stand-ins that record their calls; PATH holds
    nothing else of SLURM's. ``shown`` and ``restarts``: what ``scontrol show job`` says."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    tools = {
        "sbatch": f'echo "sbatch $* run_dir=$HPCDIST_RUN_DIR restarts=$HPCDIST_RESTARTS '
        f'job=${{SLURM_JOB_ID:-unset}} conf=$SLURM_CONF" >> {quote(str(calls))}',
    }
    if preempt_time is not None:
        tools["scontrol"] = (
            f'echo "scontrol $*" >> {quote(str(calls))}; '
            f'if [ "$1" = show ]; then echo "   {shown}"; '
            f'echo "   Requeue=1 Restarts={restarts} BatchFlag=1"; '
            f'echo "   PreemptTime={preempt_time} SuspendTime=None"; '
            f"exit 0; fi; exit {requeue_rc}"
        )
    for name, body in tools.items():
        (bindir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bindir / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(bindir))
    return calls


def _calls(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _job(**extra: str) -> dict[str, str]:
    """A job's environment, with the stand-ins' PATH (sbatch is looked up in it)."""
    job = {"SLURM_JOB_ID": "77", "SLURM_CONF": "/etc/slurm/slurm.conf", "SLURM_NODELIST": "n1"}
    return {**job, "PATH": os.environ["PATH"], **extra}


RESUBMITTED = "job.sh run_dir={} restarts=2 job=unset conf=/etc/slurm/slurm.conf"


@pytest.mark.parametrize(
    ("preempt_time", "terminated", "expected", "calls"),
    [
        ("2026-11-26T13:41:02", True, True, ["scontrol show job 77", "scontrol requeue 77"]),
        # scancel or the time limit: neither preempted nor requeued by SLURM
        ("None", True, False, ["scontrol show job 77"]),
        ("None", False, True, ["scontrol show job 77", "scontrol requeue 77"]),  # the warning
    ],
)
def test_requeue_after_term_only_when_preempted(
    preempt_time: str,
    terminated: bool,
    expected: bool,
    calls: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorded = _tools(tmp_path, monkeypatch, preempt_time, requeue_rc=0)
    assert requeue_job(_job(), 3, terminated, resubmit="job.sh") is expected
    assert _calls(recorded) == calls


@pytest.mark.parametrize(
    ("slurm_restarts", "own", "by_slurm"),
    [(1, "", True), (3, "2", True), (0, "", False), (2, "2", False)],
)
def test_a_requeue_by_slurm_itself_is_said_as_such(
    slurm_restarts: int,
    own: str,
    by_slurm: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """scontrol requeue or a node that failed: TERM without a preemption, and SLURM's
    Restarts already one ahead of the job's SLURM_RESTART_COUNT."""
    recorded = _tools(tmp_path, monkeypatch, "None", requeue_rc=0, restarts=slurm_restarts)
    assert requeue_job(_job(SLURM_RESTART_COUNT=own), 9, True, "job.sh") is by_slurm
    err = capsys.readouterr().err
    assert ("job 77 is requeued by SLURM itself" in err) is by_slurm
    assert ("not requeueing: job 77 was ended (TERM) without a preemption" in err) is not by_slurm
    assert "scontrol requeue 77" not in _calls(recorded)


@pytest.mark.parametrize(("restarts", "expected"), [("2", True), ("3", False)])
def test_requeue_stops_at_max_restarts(
    restarts: str,
    expected: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    recorded = _tools(tmp_path, monkeypatch, "None", requeue_rc=0)
    assert requeue_job(_job(SLURM_RESTART_COUNT=restarts), 3, False, "job.sh") is expected
    show = ["scontrol show job 77"]
    assert _calls(recorded) == ([*show, "scontrol requeue 77"] if expected else show)
    if not expected:
        assert "not requeueing: restart 3 reached --max-restarts 3" in capsys.readouterr().err


def test_array_task_requeues_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recorded = _tools(tmp_path, monkeypatch, "None", requeue_rc=0)
    env = _job(SLURM_ARRAY_JOB_ID="70", SLURM_ARRAY_TASK_ID="4")
    assert requeue_job(env, 3, False, "job.sh")
    assert _calls(recorded) == ["scontrol show job 77", "scontrol requeue 70_4"]


@pytest.mark.parametrize(
    ("preempt_time", "array", "calls"),
    [
        # No scontrol on the node: submitted again, without this job's SLURM_* variables.
        (None, False, ["sbatch " + RESUBMITTED.format("runs/77")]),
        # The site refuses the requeue: the same.
        (
            "None",
            False,
            [
                "scontrol show job 77",
                "scontrol requeue 77",
                "sbatch " + RESUBMITTED.format("runs/77"),
            ],
        ),
        # An array task: a one-task array with the same task id.
        (None, True, ["sbatch --array=4 " + RESUBMITTED.format("runs/70_4")]),
    ],
)
def test_without_a_requeue_the_script_is_submitted_again(
    preempt_time: str | None,
    array: bool,
    calls: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    recorded = _tools(tmp_path, monkeypatch, preempt_time, requeue_rc=1)
    env = _job(SLURM_RESTART_COUNT="1")
    if array:
        env.update(SLURM_ARRAY_JOB_ID="70", SLURM_ARRAY_TASK_ID="4")
    assert requeue_job(env, 3, False, resubmit="job.sh")
    assert _calls(recorded) == calls
    assert (
        "no requeue (scontrol missing or refused), resubmitting job.sh" in capsys.readouterr().err
    )


@pytest.mark.parametrize("preempt_time", [None, "None"])
def test_a_submitit_task_leaves_a_refused_requeue_to_slurm(
    preempt_time: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded = _tools(tmp_path, monkeypatch, preempt_time, requeue_rc=1)
    assert not requeue_job(_job(), None, False)
    assert [c for c in _calls(recorded) if c.startswith("sbatch")] == []


@pytest.mark.parametrize(
    ("shown", "restarts", "terminated", "why"),
    [
        # A scancel while the ranks wrote the checkpoint: the controller ends the job before
        # its TERM reaches this process; scontrol requeue would bring it back.
        ("JobState=COMPLETING Reason=None", "1", False, "job 77 is COMPLETING: cancelled"),
        # The command requeued the job itself (Lightning), its TERM not here yet: neither
        # requeued nor resubmitted (after the TERM: "requeued by SLURM itself", above).
        ("JobState=COMPLETING Reason=None", "2", False, "job 77 was requeued already"),
        ("JobState=RUNNING Reason=None", "2", False, "job 77 was requeued already"),
    ],
)
def test_a_job_slurm_is_ending_or_was_requeued_is_never_requeued(
    shown: str,
    restarts: str,
    terminated: bool,
    why: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    recorded = _tools(tmp_path, monkeypatch, "None", 0, shown, restarts)
    assert not requeue_job(_job(SLURM_RESTART_COUNT="1"), 3, terminated, resubmit="job.sh")
    assert _calls(recorded) == ["scontrol show job 77"]  # no requeue, no sbatch
    assert f"not requeueing: {why}" in capsys.readouterr().err
    # The other side: the same run, still RUNNING and not requeued by anyone, is requeued.
    recorded.unlink()
    (tmp_path / "bin" / "scontrol").write_text(
        f'#!/bin/bash\necho "scontrol $*" >> {quote(str(recorded))}\n'
        'if [ "$1" = show ]; then echo "JobState=RUNNING Restarts=1 PreemptTime=None"; fi\n'
    )
    assert requeue_job(_job(SLURM_RESTART_COUNT="1"), 3, False, resubmit="job.sh")
    assert _calls(recorded) == ["scontrol show job 77", "scontrol requeue 77"]


def test_no_job_id_no_requeue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recorded = _tools(tmp_path, monkeypatch, "2026-11-26T13:41:02", requeue_rc=0)
    assert not requeue_job({}, 3, True, "job.sh")
    assert _calls(recorded) == []


# ------------------------------------------------------------ passing a signal on


def _child(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    got = tmp_path / "got"
    code = (
        "import signal, sys, time, pathlib\n"
        f"signal.signal(signal.SIGUSR1, lambda *a: pathlib.Path({str(got)!r}).touch())\n"
        f"pathlib.Path({str(tmp_path / 'ready')!r}).touch()\n"
        "time.sleep(5)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 10
    while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return child, got


@pytest.mark.parametrize("early", [False, True], ids=["while-it-runs", "before-it-starts"])
def test_relay_passes_the_signal_on(early: bool, tmp_path: Path) -> None:
    relay = SignalRelay(signal.SIGUSR2, signal.SIGUSR1)
    if early:
        relay.forward()  # caught before the child exists: kept for it
    child, got = _child(tmp_path)
    try:
        relay.attach(child.pid, settle_s=0.0)
        if not early:
            relay.forward()
        deadline = time.monotonic() + 10
        while not got.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert got.exists()
    finally:
        child.kill()
        child.wait()


def test_relay_to_a_child_that_has_ended_is_quiet(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    relay = SignalRelay(signal.SIGUSR2)
    relay.attach(child.pid, settle_s=0.0)
    relay.forward()  # raises nothing: it has nobody left to warn
    assert not relay.pending


_SELF_SIGNAL = "import os, signal; os.kill(os.getpid(), signal.SIGUSR1); print('alive')"


def test_ignoring_starts_a_command_that_outlives_the_named_warning() -> None:
    argv = ignoring(["USR1", "TERM"], [sys.executable, "-c", _SELF_SIGNAL])
    assert argv[:2] == ["bash", "-c"] and argv[3:] == [
        sys.executable,
        sys.executable,
        "-c",
        _SELF_SIGNAL,
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert (proc.returncode, proc.stdout) == (0, "alive\n"), proc.stderr
    # The other side: a signal it was not told to ignore still ends the command.
    other = subprocess.run(
        ignoring(["USR2"], [sys.executable, "-c", _SELF_SIGNAL]), capture_output=True, text=True
    )
    assert other.returncode == -10 and other.stdout == ""


def test_a_resubmitted_job_carries_its_run_on() -> None:
    env = {"SLURM_JOB_ID": "77", "HPCDIST_RUN_ID": "77-ab12cd", "WANDB_RUN_ID": "77-ab12cd"}
    new = resubmit_env(env, restarts=0)
    assert new["HPCDIST_RUN_ID"] == "77-ab12cd" and new["WANDB_RUN_ID"] == "77-ab12cd"


# ------------------------------------------------------------ the warning, the user's


@pytest.mark.parametrize(
    ("status", "given", "said"),
    [
        (140, "USR2@90", True),  # 128 + SIGUSR2: the command did not catch it
        (138, "B:USR1@60", True),
        (140, "USR1@60", False),  # killed by another signal than the warning
        (REQUEUE_EXIT_CODE, "USR2@90", False),  # it caught the warning and asked a requeue
        (0, "USR2@90", False),
        (1, "USR2@90", False),
        (140, None, False),  # no warning: nothing to say
    ],
)
def test_the_runner_says_when_the_warning_killed_the_command(
    status: int, given: str | None, said: bool
) -> None:
    line = warning_death(status, given)
    assert bool(line) is said
    if said:
        name = "SIGUSR2" if "USR2" in str(given) else "SIGUSR1"
        assert line.startswith(f"{WARNING_KILLED} {name} (--signal {given}): it does not catch")
        # What makes it checkpoint: Lightning's setting, or the protocol for other code.
        if name == "SIGUSR2":
            assert "Trainer(plugins=[SLURMEnvironment(requeue_signal=signal.SIGUSR2)])" in line
            assert "--signal USR1@<seconds>" in line
        else:  # Lightning's own signal: it catches it under srun's launcher only
            assert "on SIGUSR1 under the srun launcher" in line and "Trainer(" not in line
        assert f"catch {name} (named in $HPCDIST_SIGNAL)" in line
        assert "exit 85 or create the file $HPCDIST_REQUEUE_MARKER" in line


def test_status_shows_the_runners_line_about_the_warning(tmp_path: Path) -> None:
    log = tmp_path / "job.out"
    line = warning_death(140, "USR2@90")
    log.write_text(f"hpcdist: job 7 on node1, restart 0\nsrun: error: task 0\nhpcdist: {line}\n")
    assert warning_killed(str(log)) == line
    log.write_text("hpcdist: job 7 on node1, restart 0\n")
    assert warning_killed(str(log)) is None
    assert warning_killed(None) is None


@pytest.mark.parametrize(
    ("report", "said"),
    [
        ("srun: error: node1: task 0: Exited with exit code 138", True),  # torchrun's agent
        ("srun: error: node1: task 0: User defined signal 1", True),  # a rank, under srun
        ("srun: error: node1: task 0: User defined signal 2", False),  # another signal
        ("srun: error: node1: task 0: Exited with exit code 1", False),
        ("0: srun: error: node1: task 0: User defined signal 1", False),  # a rank's own line
    ],
)
def test_the_warning_death_of_one_task_is_found_in_sruns_report(report: str, said: bool) -> None:
    # --kill-on-bad-exit ended the other task: srun exits with that one's status (143).
    ended = "srun: error: node2: task 1: Terminated"
    log = f"hpcdist: job 7 on node[1-2], restart 0\n{report}\n{ended}\n"
    assert bool(warning_death(143, "USR1@60", log)) is said
    assert warning_death(0, "USR1@60", log) == ""  # the step ended well: nothing killed it


@pytest.mark.parametrize(
    ("restarts", "requeued"),
    [("3", True), ("2", False)],  # SLURM's count of restarts, this run's is 2
)
def test_a_refused_request_says_what_became_of_the_job(
    restarts: str,
    requeued: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--max-restarts reached, then scontrol requeue by hand: SLURM requeued the job all
    the same, so no resubmission is advised; else exit 85 is said to be the request."""
    from hpcdist.distributed import jobstep
    from hpcdist.distributed.badnodes import LogMark

    _tools(tmp_path, monkeypatch, "None", 0, "JobState=COMPLETING Reason=None", restarts)
    for name, value in _job(SLURM_RESTART_COUNT="2", HPCDIST_RUN_DIR="runs/r").items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "r").mkdir(parents=True)
    (tmp_path / "runs" / "r" / "checkpoint.pt").write_bytes(b"x")
    assert jobstep._not_requeued(LogMark(()), REQUEUE_EXIT_CODE) == REQUEUE_EXIT_CODE
    err = capsys.readouterr().err
    assert ("job 77 was requeued by scontrol requeue (restart 3): by the command" in err) is (
        requeued
    )
    assert ("resume it by submitting the job again" in err) is not requeued
    assert ("exit code 85: the command checkpointed and asked for a requeue" in err) is not (
        requeued
    )


def test_status_says_what_exit_code_85_is() -> None:
    assert exit_text(REQUEUE_EXIT_CODE, 0, None).startswith(
        "85 (the command checkpointed and asked for a requeue, which was not made"
    )
