"""slurmrestd's job description from a script's #SBATCH lines, and its answers read as
scontrol's and sacct's records: pure functions, on scripts hpcdist renders and on the answers
recorded from SLURM 22.05, 24.11 and 26.05 (tests/fixtures/slurmrestd)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hpcdist.render.script import render
from hpcdist.slurm.parse import parse_duration
from hpcdist.slurm.probe import Partition, nodes_from_sinfo, partitions_from_json
from hpcdist.slurm.query import from_sacct, from_scontrol
from hpcdist.slurm.restjob import (
    DescriptionError,
    cluster,
    db_rows,
    description,
    exit_code,
    exported,
    job_record,
    legacy_partitions,
    node_rows,
    release,
    sbatch_directives,
)
from hpcdist.spec.options import spec_from_options

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurmrestd"
# Every recorded folder: (version, release).
FOLDERS = sorted((path.parent.name, path.name) for path in FIXTURES.glob("v*/*") if path.is_dir())
SPOKEN_FOLDERS = [(v, r) for v, r in FOLDERS if v >= "v0.0.38"]
NUMBER = {"set": True, "infinite": False, "number": 90}


def _answer(version: str, release_: str, name: str) -> Any:
    return json.loads((FIXTURES / version / release_ / f"{name}.json").read_text())


def _rendered(**flags: Any) -> str:
    """The script hpcdist renders for these flags (profile `local`, as tests/conftest.py)."""
    return render(spec_from_options({"profile": None, "mode": "gloo", **flags}))


def _job(body: dict[str, Any]) -> dict[str, Any]:
    """The description's fields but the script and the environment (checked on their own)."""
    job = dict(body["job"])
    job.pop("script", None)
    job.pop("environment")
    return job


def _script(*directives: str, after: str = "") -> str:
    lines = ["#!/bin/bash", *directives, "srun hostname", after]
    return "\n".join(lines) + "\n"


# ---- a rendered script as the description --------------------------------------------------

RENDER_FLAGS: dict[str, Any] = {
    "job_name": "myrun",
    "nodes": 3,
    "time": "01:30:00",
    "partition": "debug",
    "account": "proj",
    "qos": "normal",
    "constraint": "a100&ib",
    "memory": "16G",
    "exclusive": True,
    "signal": "B:USR1@120",
    "mail_type": "END,FAIL",
    "mail_user": "me@example.org",
}


def test_a_rendered_script_is_described_in_v0_0_38_with_the_values_the_user_gave() -> None:
    # SLURM 22.05's daemon takes no B: (test_flagged_signals_are_refused_on_v0_0_38).
    script = _rendered(**{**RENDER_FLAGS, "signal": "USR1@120"})
    body = description(script, "v0.0.38", {"PATH": "/usr/bin", "A": "1"}, "/home/u/run")
    assert set(body) == {"script", "job"}
    assert body["script"] == script
    assert body["job"]["environment"] == {"PATH": "/usr/bin", "A": "1"}
    assert _job(body) == {
        "current_working_directory": "/home/u/run",
        "name": "myrun",
        "nodes": "3",
        "tasks_per_node": 1,
        "cpus_per_task": 2,
        "time_limit": 90,
        "memory_per_node": 16384,
        "partition": "debug",
        "account": "proj",
        "qos": "normal",
        "constraints": "a100&ib",
        "standard_output": "%x-%j.out",
        "exclusive": "exclusive",
        "mail_type": "END,FAIL",
        "mail_user": "me@example.org",
        "signal": "USR1@120",
        "requeue": True,
        "open_mode": "append",
    }


def test_a_rendered_script_is_described_in_v0_0_42_with_the_values_the_user_gave() -> None:
    script = _rendered(**RENDER_FLAGS)
    body = description(script, "v0.0.42", {"PATH": "/usr/bin", "A": "1"}, "/home/u/run")
    assert set(body) == {"job"}
    assert body["job"]["script"] == script
    assert body["job"]["environment"] == ["PATH=/usr/bin", "A=1"]
    assert _job(body) == {
        "current_working_directory": "/home/u/run",
        "name": "myrun",
        "nodes": "3",
        "tasks_per_node": 1,
        "cpus_per_task": 2,
        "tres_per_task": "cpu=2",
        "time_limit": NUMBER,
        "memory_per_node": {"set": True, "infinite": False, "number": 16384},
        "partition": "debug",
        "account": "proj",
        "qos": "normal",
        "constraints": "a100&ib",
        "standard_output": "%x-%j.out",
        "shared": ["none"],
        "mail_type": ["END", "FAIL"],
        "mail_user": "me@example.org",
        "kill_warning_signal": "USR1",
        "kill_warning_delay": {"set": True, "infinite": False, "number": 120},
        "kill_warning_flags": ["BATCH_JOB"],
        "requeue": True,
        "open_mode": ["APPEND"],
    }


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("v0.0.38", {"gpus_per_node": "2"}),
        ("v0.0.40", {"tres_per_node": "gres/gpu:2"}),
        ("v0.0.45", {"tres_per_node": "gres/gpu:2"}),
    ],
)
def test_a_rendered_gpu_script_asks_for_its_gpus(version: str, expected: dict[str, str]) -> None:
    script = _rendered(mode="nccl", nodes=2, time="00:10:00", gpus_per_node=2)
    job = _job(description(script, version, {}, "/w"))
    assert {key: job.get(key) for key in expected} == expected
    assert "gpus_per_node" not in job or version == "v0.0.38"


@pytest.mark.parametrize(
    ("flags", "fields"),
    [
        ({"nodelist": "node[1-3]"}, {"required_nodes": ["node[1-3]"]}),
        ({"exclude": "node4"}, {"excluded_nodes": ["node4"]}),
    ],
)
def test_node_lists_are_lists_from_v0_0_40(flags: dict[str, str], fields: dict[str, Any]) -> None:
    job = _job(description(_rendered(nodes=3, **flags), "v0.0.42", {}, "/w"))
    assert {key: job[key] for key in fields} == fields


@pytest.mark.parametrize(
    ("flags", "shown"),
    [
        ({"nodelist": "node[1-3]"}, "--nodelist=node[1-3]"),
        ({"exclude": "node4"}, "--exclude=node4"),
    ],
)
def test_node_lists_are_refused_for_v0_0_38(flags: dict[str, str], shown: str) -> None:
    with pytest.raises(DescriptionError) as refused:
        description(_rendered(nodes=3, **flags), "v0.0.38", {}, "/w")
    assert str(refused.value) == (
        f"#SBATCH {shown}: slurmrestd's job description (v0.0.38) has no field for it; "
        "submit with --transport cli, or leave it out"
    )


@pytest.mark.parametrize("version", ["v0.0.38", "v0.0.42"])
def test_a_site_directive_without_a_field_is_refused_in_one_line(version: str) -> None:
    script = _rendered(nodes=2, sbatch_options=("hint=nomultithread",))
    with pytest.raises(DescriptionError) as refused:
        description(script, version, {}, "/w")
    assert str(refused.value) == (
        f"#SBATCH --hint=nomultithread: slurmrestd's job description ({version}) has no "
        "field for it; submit with --transport cli, or leave it out"
    )


# ---- time limits, node counts, signals, GPUs: both sides of each boundary ------------------


@pytest.mark.parametrize(
    ("limit", "minutes"),
    [
        ("00:00:59", 1),
        ("00:01:00", 1),
        ("00:01:01", 2),
        ("01:30:00", 90),
        ("01:29:59", 90),
        ("01:30:01", 91),
        ("90", 90),
        ("1-00:00:00", 1440),
    ],
)
def test_time_is_rounded_up_to_whole_minutes(limit: str, minutes: int) -> None:
    script = _script(f"#SBATCH --time={limit}")
    assert description(script, "v0.0.38", {}, "/w")["job"]["time_limit"] == minutes
    assert description(script, "v0.0.42", {}, "/w")["job"]["time_limit"] == {
        "set": True,
        "infinite": False,
        "number": minutes,
    }


@pytest.mark.parametrize("limit", ["0", "UNLIMITED"])
def test_a_time_without_an_end_is_refused(limit: str) -> None:
    with pytest.raises(DescriptionError) as refused:
        description(_script(f"#SBATCH --time={limit}"), "v0.0.42", {}, "/w")
    assert str(refused.value) == f"#SBATCH --time={limit!r}: expected a finite time limit"


@pytest.mark.parametrize("nodes", ["1", "2-4", "4-4"])
@pytest.mark.parametrize("version", ["v0.0.38", "v0.0.42"])
def test_node_counts_keep_sbatch_text(nodes: str, version: str) -> None:
    job = description(_script(f"#SBATCH --nodes={nodes}"), version, {}, "/w")["job"]
    assert job["nodes"] == nodes


@pytest.mark.parametrize(("nodes", "shown"), [("x", "x"), ("-4", ""), ("2-x", "x")])
def test_a_node_count_that_is_not_a_number_is_refused(nodes: str, shown: str) -> None:
    with pytest.raises(DescriptionError) as refused:
        description(_script(f"#SBATCH --nodes={nodes}"), "v0.0.42", {}, "/w")
    assert str(refused.value) == f"#SBATCH --nodes={shown!r}: expected a whole number"


@pytest.mark.parametrize(
    ("value", "fields"),
    [
        ("USR2@90", {"kill_warning_signal": "USR2", "kill_warning_delay": 90}),
        ("USR2", {"kill_warning_signal": "USR2", "kill_warning_delay": 60}),
        ("12@90", {"kill_warning_signal": "USR2", "kill_warning_delay": 90}),
        ("SIGusr1@30", {"kill_warning_signal": "USR1", "kill_warning_delay": 30}),
        (
            "B:USR1@120",
            {"kill_warning_signal": "USR1", "kill_warning_delay": 120, "flags": ["BATCH_JOB"]},
        ),
        (
            "R:TERM@60",
            {"kill_warning_signal": "TERM", "kill_warning_delay": 60, "flags": ["RESERVATION_JOB"]},
        ),
        (
            "RB:USR2@60",
            {
                "kill_warning_signal": "USR2",
                "kill_warning_delay": 60,
                "flags": ["BATCH_JOB", "RESERVATION_JOB"],
            },
        ),
    ],
)
def test_signal_becomes_the_kill_warning_fields(value: str, fields: dict[str, Any]) -> None:
    job = description(_script(f"#SBATCH --signal={value}"), "v0.0.42", {}, "/w")["job"]
    expected: dict[str, Any] = {
        "kill_warning_signal": fields["kill_warning_signal"],
        "kill_warning_delay": {
            "set": True,
            "infinite": False,
            "number": fields["kill_warning_delay"],
        },
    }
    if "flags" in fields:
        expected["kill_warning_flags"] = fields["flags"]
    assert {key: job[key] for key in job if key.startswith("kill_warning")} == expected
    if "flags" in fields:  # SLURM 22.05's daemon refuses them: test below
        return
    legacy = description(_script(f"#SBATCH --signal={value}"), "v0.0.38", {}, "/w")["job"]
    assert legacy["signal"] == value
    assert not any(key.startswith("kill_warning") for key in legacy)


@pytest.mark.parametrize("value", ["B:USR1@120", "R:TERM@60", "RB:USR2@60"])
def test_flagged_signals_are_refused_on_v0_0_38(value: str) -> None:
    with pytest.raises(DescriptionError) as refused:
        description(_script(f"#SBATCH --signal={value}"), "v0.0.38", {}, "/w")
    assert str(refused.value) == (
        f"#SBATCH --signal={value!r}: slurmrestd v0.0.38 (SLURM 22.05) takes a signal without "
        "B: or R: only; submit with --transport cli"
    )


def test_no_requeue_is_refused_on_v0_0_38_and_sent_after() -> None:
    with pytest.raises(DescriptionError) as refused:
        description(_script("#SBATCH --no-requeue"), "v0.0.38", {}, "/w")
    assert str(refused.value) == (
        "#SBATCH --no-requeue: slurmrestd v0.0.38 (SLURM 22.05) cannot turn requeue off (the "
        "job would be requeued); submit with --transport cli"
    )
    assert (
        description(_script("#SBATCH --no-requeue"), "v0.0.40", {}, "/w")["job"]["requeue"] is False
    )


@pytest.mark.parametrize(
    ("version", "field"), [("v0.0.38", ("exclusive", "user")), ("v0.0.42", ("shared", ["user"]))]
)
def test_exclusive_user_shares_nodes_with_the_users_own_jobs(
    version: str, field: tuple[str, Any]
) -> None:
    job = description(_script("#SBATCH --exclusive=user"), version, {}, "/w")["job"]
    assert job[field[0]] == field[1]


@pytest.mark.parametrize("value", ["USR1@bad", "NOSUCH@60", "X:USR1@60", "0@60"])
@pytest.mark.parametrize("version", ["v0.0.38", "v0.0.42"])
def test_a_signal_slurm_does_not_take_is_refused(value: str, version: str) -> None:
    with pytest.raises(DescriptionError) as refused:
        description(_script(f"#SBATCH --signal={value}"), version, {}, "/w")
    assert str(refused.value) == (f"#SBATCH --signal={value!r}: expected [B:|R:]SIGNAL[@SECONDS]")


@pytest.mark.parametrize(
    ("directive", "legacy", "current"),
    [
        ("--gpus-per-node=4", {"gpus_per_node": "4"}, {"tres_per_node": "gres/gpu:4"}),
        ("--gpus-per-node=a100:4", None, {"tres_per_node": "gres/gpu:a100:4"}),
        ("--gres=gpu:4", {"gpus_per_node": "4"}, {"tres_per_node": "gres/gpu:4"}),
        ("--gres=gpu:a100:4", {"gpus_per_node": "a100:4"}, {"tres_per_node": "gres/gpu:a100:4"}),
        ("--gpus-per-task=1", {"gpus_per_task": "1"}, {"tres_per_task": "gres/gpu:1"}),
    ],
)
def test_gpus_by_version(
    directive: str, legacy: dict[str, str] | None, current: dict[str, str]
) -> None:
    script = _script(f"#SBATCH {directive}")
    job = _job(description(script, "v0.0.42", {}, "/w"))
    assert {key: job[key] for key in current} == current
    if legacy is None:
        with pytest.raises(DescriptionError):
            description(script, "v0.0.38", {}, "/w")
    else:
        old = _job(description(script, "v0.0.38", {}, "/w"))
        assert {key: old[key] for key in legacy} == legacy


def test_a_gres_other_than_gpus_is_refused() -> None:
    script = _script("#SBATCH --gres=shard:2")
    with pytest.raises(DescriptionError) as refused:
        description(script, "v0.0.42", {}, "/w")
    assert str(refused.value) == "#SBATCH --gres='shard:2': only gpu:[TYPE:]N is read here"
    with pytest.raises(DescriptionError) as legacy:
        description(script, "v0.0.38", {}, "/w")
    assert str(legacy.value) == (
        "#SBATCH --gres=shard:2: slurmrestd's job description (v0.0.38) has no field for it; "
        "submit with --transport cli, or leave it out"
    )


@pytest.mark.parametrize(
    ("directive", "message"),
    [
        ("--ntasks=x", "#SBATCH --ntasks='x': expected a whole number"),
        ("--cpus-per-task=-1", "#SBATCH --cpus-per-task='-1': expected a whole number"),
        ("--mem=lots", "#SBATCH --mem='lots': expected a size such as 16G"),
        ("--mem=", "#SBATCH --mem='': expected a size such as 16G"),
        (
            "-N 2",
            "#SBATCH '-N': only long options (--name=value) are read for slurmrestd's job "
            "description",
        ),
        (
            "--exclusive=oversubscribe",
            "#SBATCH --exclusive=oversubscribe: slurmrestd's job description (v0.0.42) has no "
            "field for it; submit with --transport cli, or leave it out",
        ),
        (
            "--open-mode=bogus",
            "#SBATCH --open-mode=bogus: slurmrestd's job description (v0.0.42) has no field for "
            "it; submit with --transport cli, or leave it out",
        ),
    ],
)
def test_a_directive_the_description_cannot_carry_is_refused(directive: str, message: str) -> None:
    with pytest.raises(DescriptionError) as refused:
        description(_script(f"#SBATCH {directive}"), "v0.0.42", {}, "/w")
    assert str(refused.value) == message
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("directive", "legacy", "current"),
    [
        ("--open-mode=append", "append", ["APPEND"]),
        ("--open-mode=truncate", "truncate", ["TRUNCATE"]),
    ],
)
def test_open_mode_by_version(directive: str, legacy: str, current: list[str]) -> None:
    script = _script(f"#SBATCH {directive}")
    assert description(script, "v0.0.38", {}, "/w")["job"]["open_mode"] == legacy
    assert description(script, "v0.0.42", {}, "/w")["job"]["open_mode"] == current


@pytest.mark.parametrize(("flag", "requeue"), [("--requeue", True), ("--no-requeue", False)])
def test_requeue_flags(flag: str, requeue: bool) -> None:
    job = description(_script(f"#SBATCH {flag}"), "v0.0.42", {}, "/w")["job"]
    assert job["requeue"] is requeue


# ---- reading #SBATCH lines as sbatch does ---------------------------------------------------


def test_directives_after_the_first_command_are_ignored() -> None:
    script = _script("#SBATCH --job-name=first", after="#SBATCH --job-name=late\n")
    assert sbatch_directives(script) == [("job-name", "first")]
    job = description(script, "v0.0.42", {}, "/w")["job"]
    assert job["name"] == "first"


def test_blank_lines_and_comments_do_not_end_the_directives() -> None:
    script = "#!/bin/bash\n\n# a comment\n#SBATCH --nodes=2\n   \n#SBATCH --qos=q\nsrun x\n"
    assert sbatch_directives(script) == [("nodes", "2"), ("qos", "q")]


def test_an_indented_sbatch_line_is_a_comment_as_sbatch_reads_it() -> None:
    script = "#!/bin/bash\n#SBATCH --nodes=2\n  #SBATCH --nodes=5\nsrun x\n"
    assert sbatch_directives(script) == [("nodes", "2")]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('#SBATCH --job-name="a \\"b\\" c\\\\d"', [("job-name", 'a "b" c\\d')]),
        ("#SBATCH --job-name='a b'", [("job-name", "a b")]),
        ('#SBATCH --job-name="it\'s"', [("job-name", "it's")]),
        ("#SBATCH --job-name=a\\ b", [("job-name", "a b")]),
        ('#SBATCH --job-name="a#b"', [("job-name", "a#b")]),
        ("#SBATCH --job-name=a#b", [("job-name", "a")]),
        ("#SBATCH --job-name=a # a comment --qos=q", [("job-name", "a")]),
        ("#SBATCH --job-name=a\\#b", [("job-name", "a#b")]),
        ("#SBATCH --nodes=2 --qos=q", [("nodes", "2"), ("qos", "q")]),
        ("#SBATCH\t--requeue", [("requeue", None)]),
        ('#SBATCH --comment=""', [("comment", "")]),
        ("#SBATCH", []),
    ],
)
def test_sbatch_lines_are_split_as_sbatch_splits_them(
    line: str, expected: list[tuple[str, str | None]]
) -> None:
    assert sbatch_directives(_script(line)) == expected


def test_a_rendered_job_name_with_quotes_and_backslashes_comes_back_whole() -> None:
    name = 'a "b" c\\d'
    script = _rendered(nodes=2, job_name=name)
    assert '#SBATCH --job-name="a \\"b\\" c\\\\d"' in script.splitlines()
    assert description(script, "v0.0.42", {}, "/w")["job"]["name"] == name


# ---- overrides: a split sweep's --array, --export, --dependency ---------------------------


SWEEP = _script(
    "#SBATCH --job-name=sweep",
    "#SBATCH --array=0-99%4",
    "#SBATCH --export=ALL,HPCDIST_SWEEP_OFFSET=0",
    "#SBATCH --dependency=afterok:1",
)
ENV = {"PATH": "/usr/bin", "HOME": "/home/u"}


@pytest.mark.parametrize("version", ["v0.0.38", "v0.0.42"])
def test_overrides_replace_the_scripts_own_lines(version: str) -> None:
    overrides = {
        "array": "0-9%2",
        "export": "ALL,HPCDIST_SWEEP_OFFSET=1000",
        "dependency": "afterany:12",
    }
    job = description(SWEEP, version, ENV, "/w", overrides)["job"]
    assert (job["name"], job["array"], job["dependency"]) == ("sweep", "0-9%2", "afterany:12")
    env = {**ENV, "HPCDIST_SWEEP_OFFSET": "1000"}
    assert job["environment"] == (
        env if version == "v0.0.38" else [f"{k}={v}" for k, v in env.items()]
    )


def test_without_overrides_the_scripts_lines_stand() -> None:
    job = description(SWEEP, "v0.0.42", ENV, "/w")["job"]
    assert (job["array"], job["dependency"]) == ("0-99%4", "afterok:1")
    assert job["environment"] == ["PATH=/usr/bin", "HOME=/home/u", "HPCDIST_SWEEP_OFFSET=0"]


def test_export_none_override_starts_from_an_empty_environment() -> None:
    job = description(SWEEP, "v0.0.38", ENV, "/w", {"export": "NONE"})["job"]
    assert job["environment"] == {}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, ENV),
        ("ALL", ENV),
        ("all", ENV),
        ("NONE", {}),
        ("NONE,X=1", {"X": "1"}),
        ("HOME", {"HOME": "/home/u"}),
        ("HOME,MISSING", {"HOME": "/home/u"}),
        ("ALL,X=1,PATH=/opt/bin", {"PATH": "/opt/bin", "HOME": "/home/u", "X": "1"}),
        ("X=a=b", {"X": "a=b"}),
    ],
)
def test_exported_reads_export_as_sbatch(value: str | None, expected: dict[str, str]) -> None:
    assert exported(value, ENV) == expected


# ---- answers: every recorded folder ---------------------------------------------------------


def _stdout(version: str, job: dict[str, Any], short: bool) -> str:
    if version == "v0.0.36":  # v0.0.36's description had no standard_output
        return ""
    name = f"rest-{version}" + ("_short" if short else "")
    return f"/tmp/hpcdist-rest-record/{name}-{job['job_id']}.out"


def _number(raw: Any) -> int:
    return int(raw["number"]) if isinstance(raw, dict) else int(raw)


@pytest.mark.parametrize(
    ("name", "state"),
    [("job_running", "RUNNING"), ("job_completed", "COMPLETED"), ("job_cancelled", "CANCELLED")],
)
@pytest.mark.parametrize(("version", "release_"), FOLDERS)
def test_a_job_answer_reads_as_scontrols_record(
    version: str, release_: str, name: str, state: str
) -> None:
    (raw,) = _answer(version, release_, name)["body"]["jobs"]
    start, end = _number(raw["start_time"]), _number(raw["end_time"])
    now = start + 7  # a running job's end_time is its limit's, still to come
    record = job_record(raw, now)
    assert record["JobId"] == str(raw["job_id"])
    assert record["JobState"] == state
    assert record["NodeList"] == "node1"
    assert record["NumNodes"] == "1"
    assert record["TimeLimit"] == "0:05:00"
    assert record["Restarts"] == "0"
    assert record["WorkDir"] == "/tmp/hpcdist-rest-record"
    assert record["StdOut"] == _stdout(version, raw, name == "job_completed")
    assert "%" not in record["StdOut"]
    ran = 7 if state == "RUNNING" else end - start
    assert parse_duration(record["RunTime"]) == ran
    info = from_scontrol(record)
    assert (info.state, info.nodes, info.num_nodes, info.limit_s) == (state, "node1", 1, 300)
    assert (info.job_id, info.elapsed_s) == (str(raw["job_id"]), ran)
    assert info.stdout == (record["StdOut"] or None)


@pytest.mark.parametrize(("version", "release_"), FOLDERS)
def test_exit_codes_read_as_scontrols(version: str, release_: str) -> None:
    completed = job_record(_answer(version, release_, "job_completed")["body"]["jobs"][0])
    cancelled = job_record(_answer(version, release_, "job_cancelled")["body"]["jobs"][0])
    assert completed["ExitCode"] == "0:0"
    # SLURM 22.05 answers the wait status: 15 is SIGTERM's end, scontrol's 0:15. 24.11 and
    # 26.05 answer SUCCESS with no signal for the same cancelled `sleep 30`.
    assert cancelled["ExitCode"] == ("0:15" if version < "v0.0.40" else "0:0")
    assert (from_scontrol(cancelled).exit_code, from_scontrol(cancelled).signal) == (
        (0, 15) if version < "v0.0.40" else (0, 0)
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (0, "0:0"),
        (15, "0:15"),
        (9, "0:9"),
        (256, "1:0"),
        (255 << 8, "255:0"),
        (None, "0:0"),
        ({"return_code": {"set": True, "infinite": False, "number": 3}}, "3:0"),
        (
            {
                "return_code": {"set": True, "infinite": False, "number": 0},
                "signal": {"id": {"set": True, "infinite": False, "number": 9}, "name": "KILL"},
            },
            "0:9",
        ),
        (
            {
                "return_code": {"set": True, "infinite": False, "number": 0},
                "signal": {"id": {"set": False, "infinite": False, "number": 0}, "name": ""},
            },
            "0:0",
        ),
        ({"status": "SUCCESS", "return_code": 2}, "2:0"),
    ],
)
def test_exit_code_of_either_family(raw: object, expected: str) -> None:
    assert exit_code(raw) == expected


@pytest.mark.parametrize(("version", "release_"), SPOKEN_FOLDERS)
def test_a_job_list_reads_as_records_of_each_job(version: str, release_: str) -> None:
    raw_jobs = _answer(version, release_, "jobs")["body"]["jobs"]
    records = [job_record(job) for job in raw_jobs]
    assert [r["JobId"] for r in records] == [str(job["job_id"]) for job in raw_jobs]
    assert {r["UserName"] for r in records} == {"root"}
    named = [
        (r["JobId"], r["StdOut"])
        for r, job in zip(records, raw_jobs, strict=True)
        if job["standard_output"]
    ]
    assert named
    assert all(out.endswith(f"-{job_id}.out") and "%" not in out for job_id, out in named)


def test_log_names_are_expanded_as_slurm_expands_them() -> None:
    job = {
        "job_id": 107,
        "name": "sweep",
        "user_name": "alice",
        "array_job_id": 100,
        "array_task_id": 7,
        "standard_output": "/r/%x-%A_%a-%j-%u-100%%.out",
        "standard_error": "",
    }
    record = job_record(job, 0)
    assert record["StdOut"] == "/r/sweep-100_7-107-alice-100%.out"
    assert record["StdErr"] == record["StdOut"]
    assert (record["ArrayJobId"], record["ArrayTaskId"]) == ("100", "7")


def test_a_pending_array_keeps_its_task_string() -> None:
    job = {"job_id": 100, "array_job_id": 100, "array_task_id": None, "array_task_string": "0-9%2"}
    record = job_record({**job, "job_state": ["PENDING"], "standard_output": "/r/%A_%a.out"}, 0)
    assert (record["ArrayJobId"], record["ArrayTaskId"], record["RunTime"]) == (
        "100",
        "0-9%2",
        "00:00:00",
    )
    assert record["StdOut"] == "/r/100_0-9%2.out"


@pytest.mark.parametrize(
    ("limit", "shown"),
    [
        ({"set": True, "infinite": True, "number": 0}, "UNLIMITED"),
        ({"set": False, "infinite": False, "number": 0}, "unlimited"),
        (1, "0:01:00"),
        ({"set": True, "infinite": False, "number": 90}, "1:30:00"),
        (1440, "1-0:00:00"),
    ],
)
def test_time_limits_of_either_family(limit: object, shown: str) -> None:
    record = job_record({"job_id": 1, "time_limit": limit}, 0)
    assert record["TimeLimit"] == shown
    assert from_scontrol(record).limit_s == (
        None if shown.lower() == "unlimited" else parse_duration(shown)
    )


@pytest.mark.parametrize(("version", "release_"), FOLDERS)
def test_slurmdbd_answer_reads_as_sacct_rows(version: str, release_: str) -> None:
    answer = _answer(version, release_, "slurmdb_job")
    completed = _answer(version, release_, "job_completed")["body"]["jobs"][0]
    job_id = str(completed["job_id"])
    (row,) = db_rows(answer["body"]["jobs"])
    assert (row["JobID"], row["JobIDRaw"]) == (job_id, job_id)
    assert (row["State"], row["ExitCode"], row["NodeList"]) == ("COMPLETED", "0:0", "node1")
    assert parse_duration(row["Elapsed"]) == answer["body"]["jobs"][0]["time"]["elapsed"]
    assert row["User"] == "root"
    info = from_sacct([row], job_id)
    assert info is not None
    assert (info.job_id, info.state, info.exit_code, info.nodes) == (
        job_id,
        "COMPLETED",
        0,
        "node1",
    )


@pytest.mark.parametrize(("version", "release_"), [f for f in FOLDERS if f[0] >= "v0.0.41"])
def test_slurmdbd_rows_name_the_log_from_v0_0_41(version: str, release_: str) -> None:
    answer = _answer(version, release_, "slurmdb_job")
    (row,) = db_rows(answer["body"]["jobs"])
    job_id = row["JobIDRaw"]
    assert row["STDOUT"] == f"/tmp/hpcdist-rest-record/rest-{version}_short-{job_id}.out"
    assert row["WorkDir"] == "/tmp/hpcdist-rest-record"
    assert row["JobName"] == f"rest-{version}_short"


def test_an_array_task_in_slurmdbd_is_named_job_underscore_task() -> None:
    job = {"job_id": 107, "array": {"job_id": 100, "task_id": {"set": True, "number": 7}}}
    (row,) = db_rows([job])
    assert (row["JobID"], row["JobIDRaw"]) == ("100_7", "107")


# ---- the cluster: release, partitions, nodes ------------------------------------------------

TESTBED_DEBUG = Partition("debug", "node[1-4]", 4, None, None, None, True)


@pytest.mark.parametrize(("version", "release_"), SPOKEN_FOLDERS)
def test_partitions_of_every_version_read_as_one(version: str, release_: str) -> None:
    answer = _answer(version, release_, "partitions")["body"]
    raw = legacy_partitions(answer) if version < "v0.0.40" else answer["partitions"]
    # v0.0.40-44 answer no partition flags: which partition is the default is not said.
    default = True if version in ("v0.0.38", "v0.0.45") else None
    assert partitions_from_json(json.dumps({"partitions": raw})) == [
        replace(TESTBED_DEBUG, default=default)
    ]
    assert release(answer) == release_
    assert cluster(answer) == (None if version == "v0.0.38" else "hpcdist")


@pytest.mark.parametrize(("version", "release_"), SPOKEN_FOLDERS)
def test_nodes_of_every_version_read_as_sinfo_lines(version: str, release_: str) -> None:
    answer = _answer(version, release_, "nodes")["body"]
    lines = node_rows(answer).splitlines()
    assert [line.split("|")[:2] for line in lines] == [[f"node{k}", "debug"] for k in range(1, 5)]
    nodes = nodes_from_sinfo(node_rows(answer))
    assert [node.name for node in nodes] == ["node1", "node2", "node3", "node4"]
    assert {node.features for node in nodes} == {("testbed",)}
