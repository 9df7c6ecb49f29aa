"""`hpcdist status` / `logs` for SLURM jobs without SLURM: the lookups are replaced by
JobInfos read from the captured testbed output in tests/fixtures/slurm."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcdist.cli import follow as cli_follow
from hpcdist.cli.main import cli
from hpcdist.slurm import query as slurmquery
from hpcdist.slurm.parse import parse_sacct, parse_scontrol_records
from hpcdist.slurm.query import JobInfo, from_scontrol

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def _info(fixture: str, **changes: object) -> JobInfo:
    (record,) = parse_scontrol_records((FIXTURES / f"scontrol_{fixture}.txt").read_text())
    return dataclasses.replace(from_scontrol(record), **changes)  # type: ignore[arg-type]


@pytest.fixture
def slurm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, JobInfo]:
    """Job id -> what SLURM says of it; sacct rows from the fixture files."""
    jobs: dict[str, JobInfo] = {}
    monkeypatch.chdir(tmp_path)  # no job records here
    monkeypatch.setenv("HPCDIST_SLURM_VIEW", "off")  # nor this user's view of a cluster
    monkeypatch.setattr(
        cli_follow, "query_jobs", lambda job_id: [jobs[job_id]] if job_id in jobs else []
    )
    monkeypatch.setattr(cli_follow, "query_job", lambda job_id: jobs.get(job_id))
    monkeypatch.setattr(
        slurmquery,
        "sacct_rows",
        lambda job_id, fresh=False: parse_sacct((FIXTURES / f"sacct_{job_id}.txt").read_text()),
    )
    return jobs


def test_status_of_a_completed_job_with_efficiency(slurm: dict[str, JobInfo]) -> None:
    slurm["9569844"] = _info("9569844")
    result = CliRunner().invoke(cli, ["status", "9569844"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "9569844 COMPLETED",
        "  name:       hpcdist-commcheck",
        "  nodes:      node[3-4] (2)",
        "  elapsed:    0:00:04 of 0:30:00",
        "  exit code:  0",
        "  restarts:   0",
        "  stdout:     /tmp/jobsfx/hpcdist-commcheck-9569844.out",
        "  efficiency: CPU not recorded, memory not recorded, wall time 0.2% (0:00:04 of 0:30:00)",
        "  advice:     it used 0.2% of its time limit: --time=0:02:00 would do and starts sooner "
        "(backfill)",
    ]


@pytest.mark.parametrize(
    ("controller_limit", "shown"), [(1800.0, "of 0:30:00"), (None, "no limit")]
)
def test_a_limit_missing_from_the_database_row_is_the_controller_s(
    slurm: dict[str, JobInfo],
    monkeypatch: pytest.MonkeyPatch,
    controller_limit: float | None,
    shown: str,
) -> None:
    # sacct's row of a job that just ended can lack its Timelimit for a moment.
    text = (FIXTURES / "sacct_9569844.txt").read_text().replace("|00:30:00|", "||")
    monkeypatch.setattr(slurmquery, "sacct_rows", lambda job_id, fresh=False: parse_sacct(text))
    slurm["9569844"] = _info("9569844", limit_s=controller_limit)
    result = CliRunner().invoke(cli, ["status", "9569844"])
    assert result.exit_code == 0, result.output
    efficiency = [line for line in result.stdout.splitlines() if "efficiency:" in line]
    assert len(efficiency) == 1 and efficiency[0].endswith(f"{shown})"), result.stdout


def test_status_of_a_pending_job_names_its_reason(slurm: dict[str, JobInfo]) -> None:
    slurm["9569845"] = _info("9569845")
    result = CliRunner().invoke(cli, ["status", "--json", "9569845"])
    data = json.loads(result.stdout)
    assert (data["state"], data["reason"], data["nodes"], data["efficiency"]) == (
        "PENDING",
        "BeginTime (starts no earlier than 2026-11-26T11:20:51)",
        None,
        None,
    )


@pytest.mark.parametrize("job_id", ["abc", "12x", "1_2_3", "-5"])
def test_malformed_job_id_is_one_line(slurm: dict[str, JobInfo], job_id: str) -> None:
    result = CliRunner().invoke(cli, ["status", "--", job_id])
    assert result.exit_code == 2
    assert result.stderr == (
        f"hpcdist: error: {job_id!r} is neither a job id (1234, 1234_5) nor a run started "
        "from this folder; expected one of `hpcdist list`\n"
    )


def test_logs_of_a_slurm_job_and_one_rank(slurm: dict[str, JobInfo], tmp_path: Path) -> None:
    log = tmp_path / "job.out"
    log.write_text("hpcdist: job 5\n[Rank 0] host a\n[Rank 1] host b\nPASS: world size 2\n")
    slurm["5"] = _info("9569844", job_id="5", stdout=str(log), stderr=str(log))
    assert CliRunner().invoke(cli, ["logs", "5"]).stdout == log.read_text()
    assert CliRunner().invoke(cli, ["logs", "5", "--rank", "1"]).stdout == "[Rank 1] host b\n"


def test_logs_that_hold_nothing_for_the_rank_say_where_they_looked(
    slurm: dict[str, JobInfo], tmp_path: Path
) -> None:
    log, err = tmp_path / "o-5.log", tmp_path / "e-5.log"
    log.write_text("[Rank 0] host a\n")
    err.write_text("")
    slurm["5"] = _info("9569844", job_id="5", stdout=str(log), stderr=str(err))
    result = CliRunner().invoke(cli, ["logs", "5", "--rank", "1"])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == (
        f"hpcdist: error: nothing for rank 1 of job 5 (COMPLETED) in {log}, {err}\n"
    )
    assert CliRunner().invoke(cli, ["logs", "5", "--rank", "0"]).stdout == "[Rank 0] host a\n"


def test_logs_of_a_job_that_has_not_written_yet(slurm: dict[str, JobInfo], tmp_path: Path) -> None:
    slurm["5"] = _info("9569845", job_id="5", stdout=str(tmp_path / "none.out"), stderr=None)
    result = CliRunner().invoke(cli, ["logs", "5"])
    assert result.exit_code == 2
    assert result.stderr == (
        f"hpcdist: error: job 5 has not started (PENDING): no log yet; it will be "
        f"{tmp_path / 'none.out'}\n"
    )


def test_an_ended_jobs_missing_log_is_not_said_to_come_yet(
    slurm: dict[str, JobInfo], tmp_path: Path
) -> None:
    slurm["5"] = _info("9569844", job_id="5", stdout=str(tmp_path / "gone.out"), stderr=None)
    for argv in (["logs", "5"], ["logs", "5", "--follow"]):
        result = CliRunner().invoke(cli, argv)
        assert result.exit_code == 2, argv
        assert result.stderr == (
            f"hpcdist: error: job 5 (COMPLETED) left no log at {tmp_path / 'gone.out'} "
            "(never written, or removed since)\n"
        )
        assert "yet" not in result.stderr


def test_logs_of_an_arrays_id_name_its_tasks_and_how_to_pick_one(
    slurm: dict[str, JobInfo], monkeypatch: pytest.MonkeyPatch
) -> None:
    done = [_info("9569844", job_id=f"7_{task}", state="COMPLETED") for task in range(8)]
    waiting = _info("9569845", job_id="7_[8-9%2]")
    monkeypatch.setattr(cli_follow, "query_jobs", lambda job_id: [*done, waiting])
    result = CliRunner().invoke(cli, ["logs", "7"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == (
        "hpcdist: error: job 7 is a job array; each task has a log of its own: hpcdist logs "
        "7_<task>, e.g. hpcdist logs 7_0 (tasks: 7_0 COMPLETED, 7_1 COMPLETED, 7_2 COMPLETED, "
        "7_3 COMPLETED, 7_4 COMPLETED, 7_5 COMPLETED and 3 more)\n"
    )
    monkeypatch.setattr(cli_follow, "query_jobs", lambda job_id: [waiting])
    result = CliRunner().invoke(cli, ["logs", "7"])
    assert result.stderr == (
        "hpcdist: error: job 7 is a job array whose tasks have not started (7_[8-9%2] "
        "PENDING); each task will have a log of its own: hpcdist logs 7_<task>, e.g. 7_0\n"
    )


def test_follow_prints_whole_lines_until_the_job_ends(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "job.out"
    writes = iter(["[Rank 0] one\n[Rank 1] two\n[Rank 0] thr", "ee\n[Rank 0] last"])
    states = iter(["PENDING", "RUNNING", "RUNNING", "COMPLETED"])

    def state() -> str:
        current = next(states)
        if current != "PENDING":
            with log.open("a") as handle:
                handle.write(next(writes, ""))
        return current

    final = cli_follow.follow_files([(log, False)], state, lambda line: "Rank 0" in line, poll_s=0)
    assert final == "COMPLETED"
    assert capsys.readouterr().out == "[Rank 0] one\n[Rank 0] three\n[Rank 0] last\n"


def test_a_forgotten_rendered_job_with_split_logs_finds_each_ranks_file(
    slurm: dict[str, JobInfo], tmp_path: Path
) -> None:
    # Rendered with -o o-%j.log -e e-%j.log --rank-logs split; SLURM (sacct, before 23.02)
    # no longer says where its logs are: the script's log record does.
    import json as _json

    from hpcdist.state.folders import state_dir

    record = state_dir("logs", project_dir=tmp_path) / "9569844"
    record.write_text(
        _json.dumps(
            {"output": "o-%j.log", "error": "e-%j.log", "name": "emu", "rank_logs": "split"}
        )
    )
    record.chmod(0o600)
    (tmp_path / "o-9569844.log").write_text("hpcdist: job 9569844\n")
    (tmp_path / "e-9569844.log").write_text("")
    (tmp_path / "o-9569844.rank1.log").write_text("[Rank 1] host b\n")
    (tmp_path / "e-9569844.rank1.log").write_text("rank 1 warning\n")
    slurm["9569844"] = _info("9569844", stdout=None, stderr=None, workdir=str(tmp_path))
    result = CliRunner().invoke(cli, ["logs", "9569844", "--rank", "1"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "[Rank 1] host b\nrank 1 warning\n"
    status = CliRunner().invoke(cli, ["status", "9569844"])
    assert f"stdout:     {tmp_path / 'o-9569844.log'}" in status.stdout
    assert f"stderr:     {tmp_path / 'e-9569844.log'}" in status.stdout
    missing = CliRunner().invoke(cli, ["logs", "9569844", "--rank", "2"])
    assert missing.exit_code == 2
    assert missing.stderr == (
        f"hpcdist: error: rank 2 of job 9569844 (COMPLETED) left no log at "
        f"{tmp_path / 'o-9569844.rank2.log'}, {tmp_path / 'e-9569844.rank2.log'}; rank 1 of "
        "the job wrote one: is 2 a rank of job 9569844?\n"
    )
    assert "yet" not in missing.stderr


def test_only_sruns_label_at_the_start_of_a_line_is_removed() -> None:
    shown = cli_follow._unlabel(0)
    assert shown("0: [Rank 0] epoch 1\n") == "[Rank 0] epoch 1\n"
    assert shown("  0: x\n") == "x\n"
    # srun's own line names node1: it keeps its words ("nodetask 0" before).
    line = "srun: error: node1: task 0: Terminated\n"
    assert shown(line) == line


def _at(clock: str) -> float:
    import time

    return time.mktime(time.strptime(f"2026-12-07T{clock}", "%Y-%m-%dT%H:%M:%S"))


@pytest.mark.parametrize(
    ("age_s", "head"),
    [
        (10.0, "9569853 RUNNING"),
        (40.0, "9569853 RUNNING (as of 12:02:58, 40 s ago)"),
    ],
)
def test_status_says_how_old_a_state_is_past_ten_seconds(
    slurm: dict[str, JobInfo], monkeypatch: pytest.MonkeyPatch, age_s: float, head: str
) -> None:
    from hpcdist.slurm.freshness import Seen

    monkeypatch.setattr("time.time", lambda: _at("12:02:58") + age_s)
    slurm["9569853"] = _info("9569853", state="RUNNING", seen=Seen(_at("12:02:58")))
    result = CliRunner().invoke(cli, ["status", "9569853"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == head


def test_status_of_a_silent_controller_gives_the_last_state_seen(
    slurm: dict[str, JobInfo],
) -> None:
    from hpcdist.slurm.freshness import Seen

    seen = Seen(_at("12:02:58"), silent_since=_at("12:03:10"))
    slurm["9569853"] = _info("9569853", state="RUNNING", seen=seen)
    result = CliRunner().invoke(cli, ["status", "9569853"])
    assert result.stdout.splitlines()[0] == (
        "9569853 RUNNING (controller not answering since 12:03:10; last seen RUNNING at 12:02:58)"
    )
    slurm["9569853"] = _info("9569853", state="UNANSWERED", seen=Seen(None, _at("12:03:10")))
    result = CliRunner().invoke(cli, ["status", "9569853"])
    assert result.stdout.splitlines() == [
        "9569853 UNANSWERED (controller not answering since 12:03:10; job not seen since it "
        "was submitted)",
        "  name:       wrap",
    ]


def test_efficiency_is_never_read_from_a_record_written_before_the_end(
    slurm: dict[str, JobInfo], monkeypatch: pytest.MonkeyPatch
) -> None:
    running = (FIXTURES / "sacct_9569844.txt").read_text().replace("COMPLETED", "RUNNING")
    monkeypatch.setattr(slurmquery, "sacct_rows", lambda job_id, fresh=False: parse_sacct(running))
    monkeypatch.setattr(cli_follow, "FINAL_RECORD_WAIT_S", 0.0)
    slurm["9569844"] = _info("9569844")
    result = CliRunner().invoke(cli, ["status", "9569844"])
    assert result.exit_code == 0, result.output
    assert (
        "  efficiency: not final yet: SLURM's database has not finished the job's record; "
        "ask again in a few seconds" in result.stdout.splitlines()
    )
    assert not any(line.startswith("  advice:") for line in result.stdout.splitlines())


@pytest.mark.parametrize(
    ("states", "seen", "now", "said"),
    [
        (["RUNNING"], (_at("12:02:58"), None), "12:03:08", ""),
        (
            ["RUNNING"],
            (_at("12:02:58"), None),
            "12:03:09",
            "states of jobs not ended: as of 12:02:58, 11 s ago",
        ),
        ([], (_at("12:02:58"), None), "12:09:00", ""),
        (
            ["RUNNING"],
            (_at("12:02:58"), _at("12:03:10")),
            "12:03:11",
            "controller not answering since 12:03:10; states as last seen at 12:02:58",
        ),
    ],
)
def test_lists_note_says_how_old_the_states_are(
    states: list[str], seen: tuple[float, float | None], now: str, said: str
) -> None:
    from hpcdist.slurm.freshness import Seen

    assert cli_follow.list_note(states, Seen(*seen), _at(now)) == said


def test_a_forgotten_plain_jobs_logs_are_every_file_named_for_it_never_one_as_stdout(
    slurm: dict[str, JobInfo], tmp_path: Path
) -> None:
    # sbatch -o aa-%j.txt -e aa-%j.out, no log record; SLURM (sacct, before 23.02) no longer
    # names its logs. The .out file is its stderr: neither is shown as the job's stdout.
    (tmp_path / "aa-9569844.txt").write_text("OUT-LINE\n")
    (tmp_path / "aa-9569844.out").write_text("ERR-LINE\n")
    slurm["9569844"] = _info(
        "9569844", stdout=None, stderr=None, workdir=str(tmp_path), source="sacct"
    )
    status = CliRunner().invoke(cli, ["status", "9569844"])
    assert status.exit_code == 0, status.output
    assert "stdout:" not in status.stdout and "stderr:" not in status.stdout
    assert (
        f"  logs:       {tmp_path / 'aa-9569844.out'}, {tmp_path / 'aa-9569844.txt'} (files "
        "named for the job: SLURM no longer names its logs, and which of them is its stdout "
        "is not known)"
    ) in status.stdout.splitlines()
    logs = CliRunner().invoke(cli, ["logs", "9569844"])
    assert (logs.exit_code, logs.stdout) == (0, "ERR-LINE\nOUT-LINE\n")


def test_status_advice_keeps_the_warning_lead_of_the_jobs_record(
    slurm: dict[str, JobInfo], tmp_path: Path
) -> None:
    # Rendered with --signal USR2@600: 4 s of 0:30:00 used, and 0:02:00 would be refused.
    from hpcdist.state.folders import state_dir

    record = state_dir("logs", project_dir=tmp_path) / "9569844"
    record.write_text(
        json.dumps(
            {"output": "%x-%j.out", "error": None, "name": "c", "rank_logs": "label", "lead": 600}
        )
    )
    record.chmod(0o600)
    slurm["9569844"] = _info("9569844", workdir=str(tmp_path))
    status = CliRunner().invoke(cli, ["status", "9569844"])
    assert status.exit_code == 0, status.output
    assert (
        "  advice:     it used 0.2% of its time limit: --time=0:11:00 would do and starts "
        "sooner (backfill)"
    ) in status.stdout.splitlines()
