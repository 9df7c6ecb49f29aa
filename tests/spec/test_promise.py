"""The promise, tried with values nobody chose: for generated flags, profiles and job records,
every run ends with exit 0, or with exit 2 and exactly one line on stderr (never a
traceback), writes nothing when it fails, and what it renders passes ``bash -n``.

Flags and profile keys are generated from the option table itself, so a new option is tried
without touching this file. CI runs a fixed, bounded set of examples; set
``HPCDIST_PROPERTY_EXAMPLES`` (e.g. 5000) and ``HPCDIST_PROPERTY_RANDOM=1`` for a longer,
randomised run.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcdist.cli.main import cli
from hpcdist.spec.jobspec import JOB_OPTIONS
from hpcdist.spec.profiles import Profile

EXAMPLES = int(os.environ.get("HPCDIST_PROPERTY_EXAMPLES", "120"))
RANDOM = os.environ.get("HPCDIST_PROPERTY_RANDOM") == "1"
SETTINGS = settings(
    max_examples=EXAMPLES,
    derandomize=not RANDOM,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

NASTY = [
    'x"; rm -rf ~ #',
    "$(touch pwned)",
    "`touch pwned`",
    "a\\b",
    "it's",
    "\n",
    "\x00",
    " 30",
    "٣٠",
    "-1",
    "0",
    "",
    "%j",
    "auto",
    "1-12",
    "USR2@90",
    "B:USR1@60",
    "16G",
    "x" * 1025,
    "../../etc",
    "né",
    "\t",
    "--nodes=3",
    "$(echo",
    "if true",
    "{",
    "esac",
]
WORDS = st.one_of(st.sampled_from(NASTY), st.text(max_size=12), st.integers(-3, 70).map(str))
OPTION_VALUES = {
    "mode": st.sampled_from(["gloo", "nccl", "threads", "test", "mpi"]),
    "launcher": st.sampled_from(["srun", "torchrun", "mpirun"]),
    "time": st.one_of(st.sampled_from(["30", "00:30:00", "1-12", "24:00:00", "0", "60:00"]), WORDS),
}


def _flag_args(option: Any, value: str) -> list[str]:
    if option.value_type == "bool":
        return ["--requeue" if value.startswith("1") else "--no-requeue"]
    return [f"{option.flag}={value}"]


@st.composite
def job_flags(draw: st.DrawFn) -> list[str]:
    chosen = draw(st.lists(st.sampled_from(JOB_OPTIONS), max_size=6, unique_by=lambda o: o.name))
    args: list[str] = []
    for option in chosen:
        value = draw(OPTION_VALUES.get(option.name, WORDS))
        args += _flag_args(option, value)
    if draw(st.booleans()):
        args += [
            "--profile",
            draw(st.sampled_from(["local", "cpu-cluster", "gpu-cluster", "nope", "site.yaml"])),
        ]
    return args


PROFILE_KEYS = [k for k in Profile.__dataclass_fields__ if k != "name"]
YAML_VALUES = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(-5, 100), st.text(max_size=8), st.sampled_from(NASTY)
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.sampled_from([*PROFILE_KEYS, "x", "mode", "nodes", "requeue"]), inner, max_size=3
        ),
    ),
    max_leaves=6,
)


@st.composite
def profile_text(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["mapping", "defaults", "bytes", "yaml"]))
    if kind == "bytes":
        return draw(st.binary(max_size=40))
    if kind == "yaml":
        return draw(st.text(max_size=40)).encode()
    keys = [*PROFILE_KEYS] if kind == "mapping" else ["defaults"]
    data = draw(st.dictionaries(st.sampled_from(keys), YAML_VALUES, max_size=4))
    if kind == "defaults":
        names = [o.name for o in JOB_OPTIONS] + ["bogus"]
        data = {"defaults": draw(st.dictionaries(st.sampled_from(names), YAML_VALUES, max_size=4))}
    return yaml.safe_dump(data).encode()


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def _assert_promise(result: Any, before: set[str], folder: Path) -> None:
    assert result.exit_code in (0, 2), (result.exit_code, result.output, result.exception)
    if result.exception is not None:
        assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.stderr
    if result.exit_code == 2:
        assert result.stderr.count("\n") == 1 and result.stderr.endswith("\n"), result.stderr
        assert result.stderr.startswith("hpcdist: error: "), result.stderr
        assert _files(folder) == before, "a failed command wrote files"


@SETTINGS
@given(args=job_flags(), profile=profile_text())
def test_render_keeps_the_promise(args: list[str], profile: bytes, tmp_path_factory: Any) -> None:
    folder = tmp_path_factory.mktemp("render")
    (folder / "site.yaml").write_bytes(profile)
    before = _files(folder)
    env = {"HPCDIST_PROFILE": "", "HPCDIST_HOME": str(folder)}
    with _chdir(folder):
        result = CliRunner().invoke(cli, ["render", *args], env=env)
    _assert_promise(result, before, folder)
    if result.exit_code == 0:
        check = subprocess.run(["bash", "-n"], input=result.stdout, text=True, capture_output=True)
        assert check.returncode == 0, check.stderr
        assert _files(folder) == before  # render changes nothing


@SETTINGS
@given(args=job_flags())
def test_submit_dry_run_keeps_the_promise(args: list[str], tmp_path_factory: Any) -> None:
    folder = tmp_path_factory.mktemp("submit")
    (folder / "site.yaml").write_text("partition: debug\n")
    before = _files(folder)
    env = {"HPCDIST_PROFILE": "", "HPCDIST_HOME": str(folder)}
    with _chdir(folder):
        result = CliRunner().invoke(
            cli, ["submit", *args, "--executor", "local", "--dry-run"], env=env
        )
    _assert_promise(result, before, folder)
    if result.exit_code == 0:
        assert json.loads(result.stdout)["executor"] == "local"


RECORD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 10**6),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.lists(st.text(max_size=3), max_size=2),
    st.sampled_from(NASTY),
)
RECORD_KEYS = [
    "job_id",
    "executor",
    "name",
    "mode",
    "nodes",
    "tasks",
    "folder",
    "submitted",
    "command",
    "start_ticks",
    "extra",
]


@st.composite
def record_bytes(draw: st.DrawFn) -> bytes:
    if draw(st.booleans()):
        return draw(st.binary(max_size=60))
    good: dict[str, Any] = {
        "job_id": "4242",
        "executor": "local",
        "name": "x",
        "mode": "gloo",
        "nodes": 1,
        "tasks": 1,
        "folder": "/nonexistent",
        "submitted": 1.0,
        "command": ["true"],
        "start_ticks": None,
    }
    changes = draw(st.dictionaries(st.sampled_from(RECORD_KEYS), RECORD_VALUES, max_size=3))
    drop = draw(st.lists(st.sampled_from(RECORD_KEYS), max_size=2))
    data = {k: v for k, v in {**good, **changes}.items() if k not in drop}
    return json.dumps(data).encode()


@SETTINGS
@given(record=record_bytes(), command=st.sampled_from(["status", "list", "logs"]))
def test_job_commands_keep_the_promise_on_any_record(
    record: bytes, command: str, tmp_path_factory: Any
) -> None:
    folder = tmp_path_factory.mktemp("records")
    jobs = folder / ".hpcdist" / "jobs"
    jobs.mkdir(parents=True)
    (jobs / "4242.json").write_bytes(record)
    before = _files(folder)
    args = {"status": ["status", "4242"], "list": ["list"], "logs": ["logs", "4242"]}[command]
    with _chdir(folder):
        result = CliRunner().invoke(cli, args, env={"HPCDIST_HOME": str(folder)})
    if command == "logs" and result.exit_code == 1:  # a readable record without a log yet
        assert result.stderr.startswith("hpcdist: no log yet")
        return
    _assert_promise(result, before, folder)


class _chdir:
    def __init__(self, path: Path) -> None:
        self.path, self.old = path, ""

    def __enter__(self) -> None:
        self.old = os.getcwd()
        os.chdir(self.path)

    def __exit__(self, *exc: object) -> None:
        os.chdir(self.old)
