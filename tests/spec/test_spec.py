"""Validation rules of JobSpec: each bad request names the value and what was expected."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import hpcdist.spec.validate as validate_module
from hpcdist.cli.main import cli
from hpcdist.errors import ProfileError, SpecError
from hpcdist.facts.protocol import COLLECTIVE_TIMEOUT_ENV
from hpcdist.slurm.timelimit import time_limit_minutes, time_limit_seconds
from hpcdist.spec.build import build_spec
from hpcdist.spec.jobspec import (
    COMMCHECK_COMMAND,
    TRAIN_COMMAND,
    JobSpec,
    default_job_name,
)
from hpcdist.spec.options import spec_from_options
from hpcdist.spec.profiles import Profile, load_profile, profile_from_mapping, shipped_profiles
from tests.conftest import TEST_CONFIG_HOME

REPO_ROOT = Path(__file__).resolve().parents[2]

# (flags for `hpcdist render`, the whole one-line error after "hpcdist: error: ")
_MEM_EXPECTED = (
    " expected a number with an optional unit K, M, G or T (either case), e.g. 4000M, 16g or "
    "0 (all of it)"
)
_SIGNAL_EXPECTED = (
    " expected [B:|R:]SIGNAL[@SECONDS] with a signal name or number and 0-65535 seconds, "
    "e.g. USR2@90"
)
_NO_LIMIT = (
    " asks SLURM for no time limit; hpcdist needs a finite time limit to warn the job before "
    "its end: expected e.g. 04:00:00 or 2-00:00:00"
)
BAD_REQUESTS: list[tuple[list[str], str]] = [
    (["--nodes", "0"], "--nodes must be >= 1, got 0"),
    (["--nodes", "-3"], "--nodes must be >= 1, got -3"),
    (
        ["--nodes", "five"],
        "--nodes 'five' is not a SLURM node count; expected a number such as 4 (or a range "
        "MIN-MAX)",
    ),
    (
        ["--nodes", "2-4"],
        "--nodes '2-4' lets SLURM choose among 3 node counts; hpcdist lays the ranks out "
        "(world size, rank 0's node) before the job starts and needs one count: expected e.g. "
        "--nodes 2",
    ),
    (
        ["--nodes", "4-2"],
        "--nodes '4-2': the most nodes 2 is fewer than the least 4 (SLURM refuses it); "
        "expected MIN-MAX with MIN <= MAX",
    ),
    (["--nodes", "5"], "--nodes 5 exceeds profile 'local' limit of 4 nodes"),
    (["--mode", "threads", "--nodes", "2"], "--mode threads runs on exactly 1 node, got --nodes 2"),
    (
        ["--mode", "threads", "--tasks-per-node", "2"],
        "--mode threads runs 1 task, got --tasks-per-node 2",
    ),
    (
        ["--mode", "gloo", "--gpus-per-node", "1"],
        "--gpus-per-node 1 needs --mode nccl or --mode test, got --mode gloo",
    ),
    (
        ["--mode", "threads", "--gpus-per-node", "2"],
        "--gpus-per-node 2 needs --mode nccl or --mode test, got --mode threads",
    ),
    # No GPU count anywhere means "count them at run time"; half a count is a mistake.
    (
        ["--mode", "nccl", "--tasks-per-node", "2"],
        "--tasks-per-node 2 with --mode nccl needs a GPU count: pass --gpus-per-node 2 (one "
        "task per GPU), or neither to use every GPU of each node, counted when the job starts",
    ),
    (
        ["--mode", "nccl", "--gpus-per-node", "0"],
        "--gpus-per-node must be >= 1 for --mode nccl, got 0; leave it out (or pass 'auto') to "
        "use every GPU of each node, counted when the job starts",
    ),
    (
        ["--profile", "gpu-cluster", "--mode", "nccl", "--gpus-per-node", "-1"],
        "--gpus-per-node must be >= 1 for --mode nccl, got -1; leave it out (or pass 'auto') "
        "to use every GPU of each node, counted when the job starts",
    ),
    (
        ["--mode", "nccl", "--cpus-per-task", "3"],
        "--cpus-per-task 3 exceeds profile 'local' limit of 2 cores per node",
    ),
    (["--mode", "nccl", "--cpus-per-task", "0"], "--cpus-per-task must be >= 1, got 0"),
    (["--mode", "test", "--gpus-per-node", "-1"], "--gpus-per-node must be >= 0, got -1"),
    (
        ["--mode", "test", "--gpus-per-node", "2", "--tasks-per-node", "1"],
        "--mode test runs one task per GPU: --tasks-per-node 1 != --gpus-per-node 2",
    ),
    (
        ["--profile", "gpu-cluster", "--mode", "test", "--gpus-per-node", "8"],
        "--gpus-per-node 8 exceeds profile 'gpu-cluster' limit of 4 GPUs per node",
    ),
    (
        ["--profile", "gpu-cluster", "--mode", "nccl", "--gpus-per-node", "5"],
        "--gpus-per-node 5 exceeds profile 'gpu-cluster' limit of 4 GPUs per node",
    ),
    (
        ["--profile", "gpu-cluster", "--mode", "nccl", "--tasks-per-node", "2"],
        "--mode nccl runs one task per GPU: --tasks-per-node 2 != --gpus-per-node 4",
    ),
    (
        ["--cpus-per-task", "3"],
        "1 tasks x --cpus-per-task 3 = 3 CPUs per node exceeds profile 'local' limit of 2 "
        "cores per node",
    ),
    (
        ["--tasks-per-node", "2", "--cpus-per-task", "2"],
        "2 tasks x --cpus-per-task 2 = 4 CPUs per node exceeds profile 'local' limit of 2 "
        "cores per node",
    ),
    (["--cpus-per-task", "0"], "--cpus-per-task must be >= 1, got 0"),
    (["--tasks-per-node", "0"], "--tasks-per-node must be >= 1, got 0"),
    (
        ["--time", "1:2:3:4"],
        "--time '1:2:3:4' is not a SLURM time limit; expected one of MM, MM:SS, HH:MM:SS, "
        "D-HH, D-HH:MM, D-HH:MM:SS",
    ),
    (
        ["--time", "ten"],
        "--time 'ten' is not a SLURM time limit; expected one of MM, MM:SS, HH:MM:SS, D-HH, "
        "D-HH:MM, D-HH:MM:SS",
    ),
    (
        ["--time", "1:2:3:4"],
        "--time '1:2:3:4' is not a SLURM time limit; expected one of MM, MM:SS, HH:MM:SS, "
        "D-HH, D-HH:MM, D-HH:MM:SS",
    ),
    (
        ["--time", "0"],
        "--time '0'" + _NO_LIMIT,
    ),
    (
        ["--time", "UNLIMITED"],
        "--time 'UNLIMITED'" + _NO_LIMIT,
    ),
    (["--time", "2-00:00:00"], "--time '2-00:00:00' exceeds profile 'local' limit of 1-00:00:00"),
    (
        ["--partition", "gpu"],
        "--partition 'gpu': 'gpu' is not in profile 'local'; expected one or a comma list of debug",
    ),
    (
        ["--partition", "debug,gpu"],
        "--partition 'debug,gpu': 'gpu' is not in profile 'local'; expected one or a comma "
        "list of debug",
    ),
    (
        ["--mem", "lots"],
        "--mem 'lots' is not a SLURM memory size;" + _MEM_EXPECTED,
    ),
    (
        ["--mem", "16b"],
        "--mem '16b' is not a SLURM memory size;" + _MEM_EXPECTED,
    ),
    (
        ["--mem", "99999999999999999999T"],
        "--mem '99999999999999999999T' is not a SLURM memory size;" + _MEM_EXPECTED,
    ),
    (
        ["--signal", "KILL@5"],
        "--signal 'KILL@5': SLURM would send KILL, which the job cannot catch to checkpoint; "
        "hpcdist needs one of USR1, USR2, TERM, INT, HUP, URG, CONT, e.g. USR2@90",
    ),
    (
        ["--signal", "USR2@65536"],
        "--signal 'USR2@65536' is not a SLURM signal;" + _SIGNAL_EXPECTED,
    ),
    (
        ["--signal", "PIPE@5"],
        "--signal 'PIPE@5': SLURM would send PIPE, which the job cannot catch to checkpoint; "
        "hpcdist needs one of USR1, USR2, TERM, INT, HUP, URG, CONT, e.g. USR2@90",
    ),
    (["--env", "NOEQUALS"], "--env 'NOEQUALS'; expected KEY=VALUE"),
    (["--env", "1BAD=x"], "--env '1BAD' is not a variable name; expected [A-Za-z_][A-Za-z0-9_]*"),
    (["--job-name", "a\nb"], "--job-name 'a\\nb' contains a newline or NUL; expected one line"),
    (["--output", "x\x00y"], "--output 'x\\x00y' contains a newline or NUL; expected one line"),
    (["--job-name", " "], "--job-name is empty (' '); leave it out or give a value"),
    (
        ["--mode", "mpi"],
        "Invalid value for '--mode': 'mpi' is not one of 'threads', 'gloo', 'nccl', 'test'.",
    ),
    (["--backend", "nccl", "--mode", "gloo"], "--backend 'nccl' contradicts --mode 'gloo'"),
    (
        ["--profile", "nosuch"],
        "--profile 'nosuch' is not a shipped profile (generic) "
        f"nor one of '{TEST_CONFIG_HOME}/hpcdist/profiles'",
    ),
    (["--profile", "/nonexistent/p.yaml"], "--profile '/nonexistent/p.yaml': no such file"),
    (
        ["--command", "python3 'unclosed"],
        '--command "python3 \'unclosed" cannot be split into words: No closing quotation',
    ),
    (["--max-restarts", "-1"], "--max-restarts must be >= 0, got -1"),
    (["--bogus"], "No such option '--bogus'. Did you mean '--qos'?"),
    # Values sbatch would refuse, refused first.
    (
        ["--time", "\u0663\u0660"],
        "--time '\u0663\u0660' is not a SLURM time limit; "
        "expected one of MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS",
    ),
    (
        ["--time", " 30"],
        "--time ' 30' is not a SLURM time limit; expected one of MM, MM:SS, HH:MM:SS, D-HH, "
        "D-HH:MM, D-HH:MM:SS",
    ),
    (
        ["--mem", "\u0661\u0666G"],
        "--mem '\u0661\u0666G' is not a SLURM memory size;" + _MEM_EXPECTED,
    ),
    (
        ["--mem", "16G "],
        "--mem '16G ' is not a SLURM memory size;" + _MEM_EXPECTED,
    ),
    (
        ["--signal", "USR2@\u0669\u0660"],
        "--signal 'USR2@\u0669\u0660' is not a SLURM signal;" + _SIGNAL_EXPECTED,
    ),
    (
        ["--job-name", "x" * 1025],
        "--job-name is 1025 bytes long (1025 characters); SLURM takes at most 1024 bytes",
    ),
    (
        ["--job-name", "\u00e9" * 513],
        "--job-name is 1026 bytes long (513 characters); SLURM takes at most 1024 bytes",
    ),
    (
        ["--output", "/" + "o" * 4096],
        "--output is 4097 bytes long (4097 characters); SLURM takes at most 4096 bytes",
    ),
    (
        ["--chdir", "/" + "d" * 4096],
        "--chdir is 4097 bytes long (4097 characters); SLURM takes at most 4096 bytes",
    ),
    (
        ["--setup", 'x"; rm -rf ~ #'],
        "--setup 'x\"; rm -rf ~ #' is not a complete shell line (line 1: unexpected EOF while "
        "looking for matching `\"'); expected e.g. 'module load cuda'",
    ),
    (
        ["--setup", "if true"],
        "--setup 'if true' is not a complete shell line (line 2: syntax error: unexpected end "
        "of file); expected e.g. 'module load cuda'",
    ),
    (
        ["--command", ""],
        "--command '' is empty; expected the command each rank runs (leave the flag out for "
        "the emulator training)",
    ),
    (
        ["--command", "   "],
        "--command '   ' is empty; expected the command each rank runs (leave the flag out for "
        "the emulator training)",
    ),
    (
        ["--output", "job.sh"],
        "--output 'job.sh' names the job's log, as in sbatch; expected a log name such as "
        "%x-%j.out (render writes the script with --script)",
    ),
    (["--collective-timeout", "0"], "--collective-timeout must be >= 1 second, got 0"),
    (
        ["--gpus-per-node", "auto"],
        "--gpus-per-node auto needs --mode nccl, got --mode gloo; expected a GPU count",
    ),
    (
        ["--gpus-per-node", "many"],
        "Invalid value for '--gpus-per-node': 'many' is not an integer nor 'auto'",
    ),
]


@pytest.mark.parametrize(("args", "message"), BAD_REQUESTS)
def test_bad_request_is_one_line_exit_2_nothing_written(
    args: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The tests' own profiles (tests/conftest.py): `local` unless --profile names another.
    monkeypatch.setenv("XDG_CONFIG_HOME", str(TEST_CONFIG_HOME))
    out = tmp_path / "job.sh"
    result = CliRunner().invoke(cli, ["render", *args, "--script", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0] == f"hpcdist: error: {message}"
    assert "Traceback" not in result.output
    assert result.stdout == ""
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("30", 1800),
        ("90", 5400),
        ("10:30", 630),
        ("01:00:00", 3600),
        ("2-12", 2 * 86400 + 12 * 3600),
        ("1-02:03", 86400 + 2 * 3600 + 3 * 60),
        ("1-02:03:04", 86400 + 2 * 3600 + 3 * 60 + 4),
    ],
)
def test_time_limit_accepts_every_slurm_format(value: str, seconds: int) -> None:
    assert time_limit_seconds(value) == seconds


def test_time_limit_minutes_round_up() -> None:
    assert time_limit_minutes("0:30") == 1
    assert time_limit_minutes("01:00:01") == 61


def _flags(**overrides: Any) -> dict[str, Any]:
    return {"profile": None, **overrides}


def test_merge_order_defaults_then_profile_then_flags(tmp_path: Path) -> None:
    profile = tmp_path / "site.yaml"
    profile.write_text(
        "partition: short\npartitions: [short, long]\ncores_per_node: 8\n"
        "defaults: {time: '02:00:00', memory: 8G}\nenv: {SITE: 'yes'}\n"
    )
    spec = spec_from_options(_flags(profile=str(profile), nodes=2, memory="16G"))
    assert spec.time == "02:00:00"  # profile beats the built-in default
    assert spec.memory == "16G"  # the flag beats the profile
    assert spec.partition == "short"
    assert spec.cpus_per_task == 8  # the node's cores for its one gloo task
    assert ("SITE", "yes") in spec.env
    assert spec.signal == "USR2@90"  # built-in default survives


@pytest.mark.parametrize(
    ("mode", "gpus", "tasks"), [("threads", 0, 1), ("gloo", 0, 1), ("test", 0, 1), ("nccl", 4, 4)]
)
def test_tasks_per_node_follow_the_mode(mode: str, gpus: int, tasks: int) -> None:
    spec = spec_from_options(_flags(profile="gpu-cluster", mode=mode))
    assert (spec.gpus_per_node, spec.tasks_per_node) == (gpus, tasks)


@pytest.mark.parametrize("profile", ["local", "cpu-cluster"])
def test_nccl_without_a_gpu_count_anywhere_counts_them_at_run_time(profile: str) -> None:
    spec = spec_from_options(_flags(profile=profile, mode="nccl", nodes=2))
    assert spec.gpus_auto and spec.cpus_auto
    assert (spec.gpus_per_node, spec.tasks_per_node, spec.cpus_per_task) == ("auto", "auto", "auto")
    assert spec.world_size is None
    env = dict(spec.env)
    assert (
        env["NCCL_NVLS_ENABLE"],
        env["TORCH_SYMM_MEM_DISABLE_MULTICAST"],
        env["NVSHMEM_DISABLE_NVLS"],
    ) == ("0", "1", "1")


def test_nccl_auto_keeps_an_explicit_cpus_per_task() -> None:
    spec = spec_from_options(_flags(mode="nccl", cpus_per_task=2))
    assert spec.gpus_auto and not spec.cpus_auto
    assert (spec.tasks_per_node, spec.cpus_per_task) == ("auto", 2)


def test_a_gpu_count_from_the_flag_or_profile_is_not_auto(tmp_path: Path) -> None:
    assert not spec_from_options(_flags(profile="gpu-cluster", mode="nccl")).gpus_auto
    # A profile without a GPU count states no limit: a flag's count is taken as given.
    spec = spec_from_options(_flags(mode="nccl", gpus_per_node=2, cpus_per_task=1))
    assert (spec.gpus_auto, spec.tasks_per_node, spec.world_size) == (False, 2, 2)
    profile = tmp_path / "site.yaml"
    profile.write_text("cores_per_node: 32\ndefaults: {gpus_per_node: 2}\n")
    spec = spec_from_options(_flags(profile=str(profile), mode="nccl"))
    assert (spec.gpus_auto, spec.gpus_per_node, spec.tasks_per_node) == (False, 2, 2)


def test_test_mode_with_gpus_is_the_nccl_check_one_task_per_gpu() -> None:
    spec = spec_from_options(_flags(profile="gpu-cluster", mode="test", gpus_per_node=2))
    assert (spec.gpus_per_node, spec.tasks_per_node, spec.cpus_per_task) == (2, 2, 32)
    assert not spec.gpus_auto
    env = dict(spec.env)
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert env["NCCL_NVLS_ENABLE"] == "0"


def test_test_mode_without_gpus_stays_the_gloo_cpu_check() -> None:
    spec = spec_from_options(_flags(profile="gpu-cluster", mode="test", nodes=2))
    assert (spec.gpus_per_node, spec.tasks_per_node) == (0, 1)
    assert "NCCL_NVLS_ENABLE" not in dict(spec.env)


def test_nccl_on_8_gpus_per_node_is_allowed_by_a_profile_that_has_them(tmp_path: Path) -> None:
    profile = tmp_path / "big.yaml"
    profile.write_text("cores_per_node: 128\ngpus_per_node: 8\nmax_nodes: 2\n")
    spec = spec_from_options(_flags(profile=str(profile), mode="nccl", nodes=2))
    assert (spec.tasks_per_node, spec.world_size, spec.cpus_per_task) == (8, 16, 16)


def test_backend_is_the_spelling_of_mode() -> None:
    spec = spec_from_options(_flags(backend="gloo", nodes=4))
    assert (spec.mode, spec.nodes, spec.world_size) == ("gloo", 4, 4)


def test_test_mode_neither_signals_nor_requeues() -> None:
    spec = spec_from_options(_flags(mode="test", nodes=2))
    assert (spec.signal, spec.requeue) == (None, False)


def test_the_only_shipped_profile_assumes_no_hardware_and_no_network() -> None:
    assert shipped_profiles() == ["generic"]
    generic = load_profile("generic")
    assert (generic.cores_per_node, generic.max_nodes, generic.max_time) == (None, None, None)
    assert (generic.partition, dict(generic.env), dict(generic.gloo_env)) == (None, {}, {})


@pytest.mark.parametrize("name", ["cpu-cluster", "gpu-cluster"])
def test_example_profiles_load_and_pin_no_interface(name: str) -> None:
    example = REPO_ROOT / "examples" / "profiles" / f"{name}.yaml"
    assert load_profile(str(example)).name == name
    assert "SOCKET_IFNAME" not in "".join(
        line for line in example.read_text().splitlines() if not line.lstrip().startswith("#")
    )
    # The tests name them as a user's own profiles (tests/conftest.py): the same bytes.
    fixture = TEST_CONFIG_HOME / "hpcdist" / "profiles" / f"{name}.yaml"
    assert fixture.read_bytes() == example.read_bytes()


def test_gpu_profile_carries_nccl_environment_not_the_template() -> None:
    spec = spec_from_options(_flags(profile="gpu-cluster", mode="nccl"))
    env = dict(spec.env)
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert env["NVSHMEM_DISABLE_NVLS"] == "1"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert "NCCL_ASYNC_ERROR_HANDLING" not in env  # deprecated by torch for the TORCH_ name


def test_a_profile_may_turn_multicast_back_on(tmp_path: Path) -> None:
    profile = tmp_path / "nvls.yaml"
    profile.write_text("gpus_per_node: 8\nnccl_env: {NCCL_NVLS_ENABLE: '1'}\n")
    env = dict(spec_from_options(_flags(profile=str(profile), mode="nccl")).env)
    assert (env["NCCL_NVLS_ENABLE"], env["NVSHMEM_DISABLE_NVLS"]) == ("1", "1")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"partiton": "x"}, "unknown key 'partiton'; allowed: description, partition"),
        ({"defaults": {"nodez": 2}}, "unknown key 'defaults.nodez'; allowed: mode, nodes"),
        ({"max_nodes": "many"}, "max_nodes must be an integer >= 0, got 'many'"),
        ({"env": ["A"]}, "env must be a mapping, got list"),
        ({"trust_folder": "yes"}, "'p.yaml': trust_folder must be true or false, got 'yes'"),
        ({"trust_folder": 1}, "'p.yaml': trust_folder must be true or false, got 1"),
        (["a", "b"], "must be a mapping of keys, got list"),
    ],
)
def test_bad_profile_names_the_key(raw: object, message: str) -> None:
    with pytest.raises(ProfileError, match=None) as info:
        profile_from_mapping("p", raw, source="p.yaml")
    assert message in str(info.value)


@pytest.mark.parametrize(("raw", "trusted"), [({}, False), ({"trust_folder": True}, True)])
def test_trust_folder_is_a_profile_key_off_by_default(raw: object, trusted: bool) -> None:
    assert profile_from_mapping("p", raw, source="p.yaml").trust_folder is trusted


def test_unreadable_profile_yaml_is_a_user_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("partition: [unclosed\n")
    result = CliRunner().invoke(cli, ["render", "--profile", str(bad)])
    assert result.exit_code == 2
    assert "is not valid YAML at line" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_profile_yaml_is_safe_loaded(tmp_path: Path) -> None:
    evil = tmp_path / "evil.yaml"
    evil.write_text("partition: !!python/object/apply:os.system ['touch pwned']\n")
    with pytest.raises(ProfileError):
        load_profile(str(evil))
    assert not (tmp_path / "pwned").exists()


def test_spec_is_frozen() -> None:
    spec = spec_from_options(_flags())
    with pytest.raises(AttributeError):
        spec.nodes = 3  # type: ignore[misc]


def test_spec_error_is_a_value_error() -> None:
    assert issubclass(SpecError, ValueError)


@pytest.mark.parametrize(
    ("length", "ok"), [(1024, True), (1025, False)], ids=["at-limit", "over-limit"]
)
def test_job_name_length_limit_both_sides(length: int, ok: bool) -> None:
    flags = {"profile": None, "mode": "gloo", "job_name": "n" * length}
    if ok:
        assert spec_from_options(flags).job_name == "n" * length
    else:
        with pytest.raises(SpecError, match=f"is {length} bytes long .* at most 1024 bytes"):
            spec_from_options(flags)


def test_setup_adds_to_the_profiles_lines() -> None:
    profile = load_profile("cpu-cluster")
    spec = spec_from_options(
        {"profile": "cpu-cluster", "mode": "gloo", "setup": ("module load mine",)}
    )
    assert spec.setup == (*profile.setup, "module load mine")
    assert len(profile.setup) == 2  # the environment's activation stays


def test_a_wrong_typed_profile_default_is_refused(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text('defaults:\n  requeue: "no"\n')
    with pytest.raises(ProfileError, match=r"defaults\.requeue must be true or false, got 'no'"):
        spec_from_options({"profile": str(site), "mode": "gloo"})


# ------------------------------------------------- build_spec: the values the user gave


def _site(**fields: Any) -> Profile:
    return Profile(name="site", **fields)


def _build(profile: Profile | None = None, **flags: Any) -> JobSpec:
    return build_spec(profile or _site(), flags)


def test_site_values_come_from_the_profile() -> None:
    spec = _build(_site(partition="p1", partitions=("p1",), account="acct-a", qos="q-high"))
    assert (spec.partition, spec.account, spec.qos) == ("p1", "acct-a", "q-high")
    assert spec.profile == "site"


def test_flags_beat_the_profiles_site_values() -> None:
    profile = _site(partition="p1", partitions=("p1", "p2"), account="acct-a", qos="q-high")
    spec = _build(profile, partition="p2", account="acct-b", qos="q-low")
    assert (spec.partition, spec.account, spec.qos) == ("p2", "acct-b", "q-low")


def test_every_user_value_reaches_the_spec(tmp_path: Path) -> None:
    workdir = tmp_path / "scratch me"
    (workdir / "logs").mkdir(parents=True)  # --chdir and the logs' folder must exist
    spec = _build(
        mode="gloo",
        nodes=3,
        tasks_per_node=2,
        cpus_per_task=1,
        time="01:30:00",
        job_name="my-run",
        output="logs/o-%j.txt",
        error="logs/e-%j.txt",
        workdir=str(workdir),
        memory="4G",
        command=("python3", "train.py"),
        launcher="torchrun",
        env=(("A", "1"),),
        setup=("module load x",),
        signal="B:USR1@30",
        requeue=False,
        max_restarts=7,
    )
    assert (spec.mode, spec.nodes, spec.tasks_per_node, spec.cpus_per_task) == ("gloo", 3, 2, 1)
    assert (spec.time, spec.job_name, spec.memory) == ("01:30:00", "my-run", "4G")
    assert (spec.output, spec.error, spec.workdir) == (
        "logs/o-%j.txt",
        "logs/e-%j.txt",
        str(workdir),
    )
    assert (spec.command, spec.launcher) == (("python3", "train.py"), "torchrun")
    assert ("A", "1") in spec.env
    assert spec.setup == ("module load x",)
    assert (spec.signal, spec.requeue, spec.max_restarts) == ("B:USR1@30", False, 7)


def test_defaults_when_the_user_gives_nothing() -> None:
    spec = _build()
    assert (spec.mode, spec.job_name, spec.command) == ("gloo", "ufsemulator-gloo", TRAIN_COMMAND)
    assert (spec.requeue, spec.error, spec.workdir, spec.account, spec.qos) == (
        True,
        None,
        None,
        None,
        None,
    )


@pytest.mark.parametrize(
    ("mode", "name"),
    [("test", "hpcdist-commcheck"), ("gloo", "ufsemulator-gloo"), ("nccl", "ufsemulator-nccl")],
)
def test_default_job_name_per_mode(mode: str, name: str) -> None:
    assert default_job_name(mode) == name


@pytest.mark.parametrize(
    ("command", "name"),
    [
        ("python3 -m pkg.train --lr 1", "train"),
        ("python train.py", "train"),
        ("torchrun --nproc-per-node 2 fit.py", "fit"),
        ("accelerate launch --num_processes 2 run_glue.py", "run_glue"),
        ("env A=1 /opt/venv/bin/python3 x.py", "x"),
        ("'./my job.sh' --fast", "my-job"),
        ("python3 -c 'print(1)'", "hpcdist-gloo"),
        # hpcdist's own programs keep their names.
        ("python3 -m ufsemulator train --config c.yaml", "ufsemulator-gloo"),
        ("/usr/bin/python3 -m hpcdist.distributed.commcheck", "hpcdist-commcheck"),
    ],
)
def test_a_commands_job_is_named_for_its_program(command: str, name: str) -> None:
    spec = spec_from_options({"profile": None, "mode": "gloo", "command": command})
    assert spec.job_name == name
    named = spec_from_options({**_flags(), "command": command, "job_name": "mine"})
    assert named.job_name == "mine"


def test_test_mode_runs_the_communication_check_by_default() -> None:
    spec = _build(mode="test")
    assert (spec.command, spec.job_name) == (COMMCHECK_COMMAND, "hpcdist-commcheck")


def test_collective_timeout_reaches_the_check_and_the_environment() -> None:
    spec = _build(mode="test", collective_timeout=7)
    assert spec.command == ("python3", "-m", "hpcdist.distributed.commcheck", "--timeout", "7")
    assert (COLLECTIVE_TIMEOUT_ENV, "7") in spec.env
    assert spec.collective_timeout == 7


def test_collective_timeout_leaves_the_training_command_alone() -> None:
    spec = _build(mode="gloo", collective_timeout=7)
    assert spec.command == TRAIN_COMMAND
    assert (COLLECTIVE_TIMEOUT_ENV, "7") in spec.env


def test_a_users_command_is_kept_in_test_mode() -> None:
    spec = _build(mode="test", command=("python3", "mine.py"), collective_timeout=7)
    assert spec.command == ("python3", "mine.py")


def test_unknown_mode_names_the_value_and_every_mode() -> None:
    with pytest.raises(SpecError) as info:
        _build(mode="mpi")
    assert (
        str(info.value) == "--mode 'mpi' is not a mode; expected one of threads, gloo, nccl, test"
    )


def test_nccl_accepts_one_gpu_per_node() -> None:
    spec = _build(mode="nccl", gpus_per_node=1)
    assert (spec.gpus_per_node, spec.tasks_per_node) == (1, 1)


def test_nccl_refuses_zero_gpus_with_the_whole_advice() -> None:
    with pytest.raises(SpecError) as info:
        _build(mode="nccl", gpus_per_node=0)
    assert str(info.value) == (
        "--gpus-per-node must be >= 1 for --mode nccl, got 0; leave it out (or pass 'auto') "
        "to use every GPU of each node, counted when the job starts"
    )


@pytest.mark.parametrize(
    ("cores", "tasks", "cpus"),
    [(8, 1, 8), (8, 2, 4), (8, 3, 2), (8, 8, 1), (None, 1, 1), (None, 2, 1), (9, 2, 4)],
)
def test_cpus_per_task_share_the_nodes_cores(cores: int | None, tasks: int, cpus: int) -> None:
    profile = _site(cores_per_node=cores, max_nodes=4)
    assert _build(profile, mode="gloo", tasks_per_node=tasks).cpus_per_task == cpus


# ------------------------------------------------------- time limits, both sides of each bound


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("0:59", 59),
        ("1:00", 60),
        ("00:59:59", 3599),
        ("23:59:59", 86399),  # the last second before the hours field would overflow
        ("24:00:00", 86400),  # the leading field may overflow
        ("0-23", 23 * 3600),
        ("1-00:59", 86400 + 59 * 60),
        ("0-00:00:01", 1),
        ("0:01", 1),
        # sbatch bounds no field: an hour of 60 minutes, a day of 24 hours
        ("00:60:00", 3600),
        ("0:60", 60),
        ("1-24", 2 * 86400),
        ("1-00:00:60", 86460),
        ("1-", 86400),
        ("5000000000", 5000000000 * 60),
        ("1", 60),
        ("0-0:0:1", 1),
    ],
)
def test_time_limit_field_bounds_accepted(value: str, seconds: int) -> None:
    assert time_limit_seconds(value) == seconds


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "--time '0' asks SLURM for no time limit; hpcdist needs a finite time limit"),
        ("0-00:00:00", "--time '0-00:00:00' asks SLURM for no time limit; hpcdist needs"),
        ("INFINITE", "--time 'INFINITE' asks SLURM for no time limit; hpcdist needs"),
        ("-1", "--time '-1' asks SLURM for no time limit; hpcdist needs"),
        (
            "1h",
            "--time '1h' is not a SLURM time limit; "
            "expected one of MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS",
        ),
    ],
)
def test_time_limit_field_bounds_refused(value: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        time_limit_seconds(value)
    assert str(info.value).startswith(message)


@pytest.mark.parametrize(("value", "minutes"), [("0:59", 1), ("1:00", 1), ("1:01", 2), ("2", 2)])
def test_time_limit_minutes_round_up_at_the_boundary(value: str, minutes: int) -> None:
    assert time_limit_minutes(value) == minutes


# ------------------------------------------------- validate: bounds and messages, both sides


@pytest.mark.parametrize(("time", "ok"), [("1-00:00:00", True), ("1-00:00:01", False)])
def test_time_limit_equal_to_the_profiles_maximum_is_allowed(time: str, ok: bool) -> None:
    profile = _site(max_time="1-00:00:00")
    if ok:
        assert _build(profile, time=time).time == time
        return
    with pytest.raises(SpecError) as info:
        _build(profile, time=time)
    assert str(info.value) == "--time '1-00:00:01' exceeds profile 'site' limit of 1-00:00:00"


def test_partition_outside_the_profile_lists_every_allowed_one() -> None:
    profile = _site(partitions=("short", "long"))
    with pytest.raises(SpecError) as info:
        _build(profile, partition="gpu")
    assert str(info.value) == (
        "--partition 'gpu': 'gpu' is not in profile 'site'; expected one or a comma list of "
        "short, long"
    )


def test_unknown_launcher_names_every_launcher() -> None:
    with pytest.raises(SpecError) as info:
        _build(launcher="mpirun")
    assert str(info.value) == "--launcher 'mpirun'; expected one of srun, torchrun"


@pytest.mark.parametrize(("seconds", "ok"), [(1, True), (0, False)])
def test_collective_timeout_lower_bound(seconds: int, ok: bool) -> None:
    if ok:
        assert _build(collective_timeout=seconds).collective_timeout == seconds
        return
    with pytest.raises(SpecError, match=r"^--collective-timeout must be >= 1 second, got 0$"):
        _build(collective_timeout=seconds)


@pytest.mark.parametrize(("restarts", "ok"), [(0, True), (-1, False)])
def test_max_restarts_lower_bound(restarts: int, ok: bool) -> None:
    if ok:
        assert _build(max_restarts=restarts).max_restarts == 0
        return
    with pytest.raises(SpecError, match=r"^--max-restarts must be >= 0, got -1$"):
        _build(max_restarts=restarts)


@pytest.mark.parametrize(
    ("flags", "profile_name", "message"),
    [
        (
            {"workdir": "a\nb"},
            "site",
            "--chdir 'a\\nb' contains a newline or NUL; expected one line",
        ),
        (
            {"job_name": "a\rb"},
            "site",
            "--job-name 'a\\rb' contains a newline or NUL; expected one line",
        ),
        (
            {"env": (("A", "x\ny"),)},
            "site",
            "--env A 'A=x\\ny' contains a newline or NUL; expected one line",
        ),
        (
            {"setup": ("echo a\necho b",)},
            "site",
            "--setup 'echo a\\necho b' contains a newline or NUL; expected one line",
        ),
        ({}, "a\nb", "--profile 'a\\nb' contains a newline or NUL; expected one line"),
    ],
)
def test_newline_in_any_text_value_names_its_flag(
    flags: dict[str, Any], profile_name: str, message: str
) -> None:
    with pytest.raises(SpecError) as info:
        build_spec(Profile(name=profile_name), flags)
    assert str(info.value) == message


def test_setup_is_judged_by_quotes_alone_where_bash_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_bash(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError("bash")

    monkeypatch.setattr(validate_module.subprocess, "run", no_bash)
    assert _build(setup=("module load 'x y'",)).setup == ("module load 'x y'",)
    # A quote inside a comment is no open quote.
    assert _build(setup=("module load x  # it's fine",)).setup == ("module load x  # it's fine",)
    with pytest.raises(SpecError) as info:
        _build(setup=("echo 'open",))
    assert str(info.value) == (
        '--setup "echo \'open" is not a complete shell line (No closing quotation); '
        "expected e.g. 'module load cuda'"
    )


def test_setup_refused_by_a_silent_bash_still_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    def silent_failure(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 2, "", "")

    monkeypatch.setattr(validate_module.subprocess, "run", silent_failure)
    with pytest.raises(SpecError) as info:
        _build(setup=("true",))
    assert str(info.value) == (
        "--setup 'true' is not a complete shell line (syntax error); "
        "expected e.g. 'module load cuda'"
    )


def test_tasks_per_node_from_the_api_must_be_a_number() -> None:
    with pytest.raises(SpecError) as info:
        _build(mode="gloo", tasks_per_node="auto")
    assert str(info.value) == "--tasks-per-node 'auto'; expected a number of tasks per node"


def test_a_profiles_gpu_defaults_do_not_reach_its_cpu_jobs() -> None:
    profile = _site(gpus_per_node=4, defaults={"mem_per_gpu": "40G", "gpu_type": "a100"})
    cpu = _build(profile, mode="gloo")
    assert (cpu.mem_per_gpu, cpu.gpu_type) == (None, None)
    gpu = _build(profile, mode="nccl")
    assert (gpu.mem_per_gpu, gpu.gpu_type) == ("40G", "a100")


def test_the_spec_names_the_profiles_file() -> None:
    assert _build(_site(source="/home/me/site.yaml")).profile_source == "/home/me/site.yaml"


def test_newline_in_a_valueless_sbatch_option_names_the_option() -> None:
    with pytest.raises(SpecError) as info:
        _build(sbatch_options=(("hint\nx", None),))
    assert str(info.value) == "--sbatch 'hint\\nx' contains a newline or NUL; expected one line"
