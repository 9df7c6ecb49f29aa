"""SLURM's grammar of the values hpcdist passes to sbatch (hpcdist.spec.grammar, the time
limits, --after and --array), the sbatch options that change the sbatch client, and log names
SLURM cannot open: what each accepts renders as given, what each refuses is one line naming
the flag and the value, exit 2, nothing written, on render, submit and submit --dry-run alike.
tests/integration/test_grammar_slurm.py asks the testbed's sbatch about the same grammar."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from hpcdist.cli.main import cli
from hpcdist.errors import SpecError
from hpcdist.render.script import render
from hpcdist.spec.dependency import dependency_jobs, dependency_value, parse_after
from hpcdist.spec.grammar import array_last_id, node_count, parse_signal
from hpcdist.spec.options import spec_from_options
from tests.jobs.test_submit import _directives

COMMANDS = (
    ["render"],
    ["submit", "--executor", "local", "--dry-run"],
    ["submit", "--executor", "local"],
)


def _refused(command: list[str], args: list[str], folder: Path) -> str:
    """The one line a refusal prints; asserts exit 2 and nothing written."""
    extra = ["--script", str(folder / "job.sh")] if command == ["render"] else []
    result = CliRunner().invoke(cli, [*command, *args, *extra])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcdist: error: "), result.stderr
    assert "Traceback" not in result.output and result.stdout == ""
    assert list(folder.iterdir()) == []
    return lines[0].removeprefix("hpcdist: error: ")


@pytest.mark.parametrize(
    ("option", "said"),
    [
        ("parsable", "--sbatch 'parsable' makes sbatch print the job id alone"),
        ("pars", "--sbatch 'pars' makes sbatch print the job id alone"),
        ("wait", "--sbatch 'wait' makes sbatch wait for the job's end; use hpcdist submit --wait"),
        ("test-only", "--sbatch 'test-only' makes sbatch queue nothing; use hpcdist submit"),
        ("quiet", "--sbatch 'quiet' hides the job id sbatch prints"),
        ("wrap=hostname", "--sbatch 'wrap=hostname' replaces hpcdist's script by a command"),
        ("version", "--sbatch 'version' makes sbatch print its version and queue nothing"),
        ("clusters=other", "--sbatch 'clusters=other' queues the job on another cluster"),
        ("export=NONE", "--sbatch 'export=NONE' would start the job without the environment"),
        ("export=PATH,HOME", "--sbatch 'export=PATH,HOME' would start the job without the"),
        ("export=nil", "--sbatch 'export=nil' would start the job without the environment"),
    ],
)
@pytest.mark.parametrize("command", COMMANDS)
def test_sbatch_options_that_change_the_sbatch_client_are_refused_everywhere(
    option: str, said: str, command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert _refused(command, ["--mode", "threads", "--sbatch", option], tmp_path).startswith(said)


@pytest.mark.parametrize("option", ["export=ALL", "export=all,OMP_PROC_BIND=close", "hold"])
def test_sbatch_options_that_keep_the_environment_pass_through(option: str) -> None:
    key, _, value = option.partition("=")
    spec = spec_from_options({"profile": None, "sbatch_options": (option,)})
    assert _directives(render(spec))[key] == value


def test_a_profiles_client_option_is_named_as_its_key(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text("sbatch:\n  parsable: null\n")
    site.chmod(0o600)
    with pytest.raises(SpecError) as info:
        spec_from_options({"profile": str(site)})
    assert str(info.value).startswith(f"profile 'site' ({site}) key sbatch 'parsable' makes")


@pytest.mark.parametrize(
    ("flags", "directive", "value"),
    [
        ({"memory": "16g"}, "mem", "16g"),
        ({"memory": "16GB"}, "mem", "16GB"),
        ({"memory": "4000m"}, "mem", "4000m"),
        ({"memory": "1t"}, "mem", "1t"),
        ({"time": "0-24"}, "time", "0-24"),
        ({"time": "00:60:00"}, "time", "00:60:00"),
        ({"mail_type": "end"}, "mail-type", "end"),
        ({"mail_type": "End,Fail"}, "mail-type", "End,Fail"),
        ({"exclusive": "user"}, "exclusive", "user"),
        ({"exclusive": "mcs"}, "exclusive", "mcs"),
        ({"exclusive": ""}, "exclusive", ""),
        ({"nodes": "2-2"}, "nodes", "2"),
        ({"partition": "debug,debug"}, "partition", "debug,debug"),
        ({"array": "0-15:2%4"}, "array", "0-15:2%4"),
        ({"constraint": "[rack1*2&rack2*4]"}, "constraint", "[rack1*2&rack2*4]"),
        ({"after": ("singleton",)}, "dependency", "singleton"),
        ({"after": ("aftercorr:12",)}, "dependency", "aftercorr:12"),
        ({"after": ("afterok:12+10",)}, "dependency", "afterok:12+10"),
        ({"after": ("afterok:12?afternotok:13",)}, "dependency", "afterok:12?afternotok:13"),
        ({"after": ("12", "afterany:13:14")}, "dependency", "afterok:12,afterany:13:14"),
    ],
)
def test_what_sbatch_takes_renders_as_given(
    flags: dict[str, Any], directive: str, value: str
) -> None:
    spec = spec_from_options({"profile": None, "time": "1-00:00:00", **flags})
    assert _directives(render(spec))[directive] == value


@pytest.mark.parametrize(
    ("signal", "name", "batch_shell", "seconds"),
    [
        ("USR2@90", "USR2", False, 90),
        ("SIGUSR2@90", "USR2", False, 90),
        ("12@90", "USR2", False, 90),
        ("R:USR2@90", "USR2", False, 90),
        ("usr2@90", "USR2", False, 90),
        ("B:sigusr1@120", "USR1", True, 120),
        ("rb:10", "USR1", True, 60),  # SLURM's lead where none is given
        ("RB:USR2@60", "USR2", True, 60),
        ("b:USR2@60", "USR2", True, 60),
        ("Br:SIGusr2@0", "USR2", True, 0),
        ("USR2@", "USR2", False, 60),
        ("TERM@65535", "TERM", False, 65535),
    ],
)
def test_every_spelling_of_a_signal_is_the_warning_the_job_catches(
    signal: str, name: str, batch_shell: bool, seconds: int
) -> None:
    assert parse_signal("--signal", signal) == type(parse_signal("--signal", "USR2"))(
        name, batch_shell, seconds
    )
    spec = spec_from_options({"profile": None, "signal": signal, "time": "1-00:00:00"})
    assert (spec.warning_signal, spec.warns_batch_shell) == (name, batch_shell)
    script = render(spec)
    assert f"export HPCDIST_SIGNAL={name}\n" in script
    assert _directives(script)["signal"] == signal


@pytest.mark.parametrize(
    ("value", "count"),
    [(3, 3), ("3", 3), ("3-3", 3), ("2-2:5", 2), ("1,1", 1), ("-3", -3)],
)
def test_a_node_count_that_is_one_count(value: object, count: int) -> None:
    assert node_count("--nodes", value) == count


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("2-4", "--nodes '2-4' lets SLURM choose among 3 node counts"),
        ("1,2", "--nodes '1,2' lets SLURM choose among 2 node counts"),
        ("2-4:2", "--nodes '2-4:2' lets SLURM choose among 2 node counts"),
        ("4-2", "--nodes '4-2': the most nodes 2 is fewer than the least 4"),
        ("2-", "--nodes '2-': the most nodes none is fewer than the least 2"),
        ("two", "--nodes 'two' is not a SLURM node count"),
        ("1,1-3", "--nodes '1,1-3' lets SLURM choose among 3 node counts"),
        ("1-3000000000", "--nodes '1-3000000000' lets SLURM choose among the node counts 1 to "),
        ("9" * 4001, "--nodes '999"),
        ("1-" + "9" * 4001, "--nodes '1-999"),
    ],
)
def test_a_choice_of_node_counts_is_refused_in_one_line(value: str, said: str) -> None:
    with pytest.raises(SpecError) as info:
        node_count("--nodes", value)
    assert str(info.value).startswith(said)


def test_a_profiles_node_range_is_named_as_its_key(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text("defaults:\n  nodes: 2-4\n")
    site.chmod(0o600)
    with pytest.raises(SpecError) as info:
        spec_from_options({"profile": str(site)})
    assert str(info.value).startswith(f"profile 'site' ({site}) key defaults.nodes '2-4' lets")


@pytest.mark.parametrize(
    ("value", "last"),
    [
        ("0-15:2%4", 14),
        ("0-16:2", 16),
        ("3-1002:2", 1001),  # the last step at or below the end
        ("1,3,5-7", 7),
        ("9,3", 9),
        ("7", 7),
        ("0-1000%0", 1000),
        ("0-2147483648", 2147483648),
        ("0-" + "9" * 4000, int("9" * 4000)),
    ],
)
def test_the_last_array_id_is_worked_out_not_listed(value: str, last: int) -> None:
    assert array_last_id("--array", value) == last


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("0-15:00", "--array '0-15:00' is not a SLURM job array"),  # a step of 0
        ("0-" + "9" * 4001, "--array '0-999"),  # more digits than Python reads
        ("0-3%" + "9" * 4001, "--array '0-3%999"),
    ],
)
def test_an_array_python_cannot_read_is_refused_in_one_line(value: str, said: str) -> None:
    with pytest.raises(SpecError) as info:
        array_last_id("--array", value)
    assert str(info.value).startswith(said)


@pytest.mark.parametrize(
    ("after", "terms", "jobs"),
    [
        (("123", "7_2:notok"), ("afterok:123", "afternotok:7_2"), ["123", "7_2"]),
        (("singleton",), ("singleton",), []),
        (("after:5+10:6",), ("after:5+10:6",), ["5", "6"]),
        (("afterok:1?afterany:2",), ("afterok:1?afterany:2",), ["1", "2"]),
    ],
)
def test_after_takes_slurms_dependency_grammar(
    after: tuple[str, ...], terms: tuple[str, ...], jobs: list[str]
) -> None:
    parsed = parse_after(after)
    assert parsed == terms and dependency_jobs(parsed) == jobs
    assert dependency_value(parsed) == ",".join(terms)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--after", "afterok:1?afterany:2", "--after", "3"], "--after 'afterok:1?afterany:2'"),
        (["--after", "afterok:1,afterany:2?after:3"], "joins terms by both , and ?"),
        (["--after", "afterok:1+0"], "--after 'afterok:1+0': 'afterok:1+0' is not a SLURM"),
        (["--after", "afterfoo:1"], "--after 'afterfoo:1': 'afterfoo:1' is not a SLURM"),
        (["--after", "singleton:3"], "--after 'singleton:3': 'singleton:3' is not a SLURM"),
        (["--array", "0-3", "--sweep", "training.lr=1e-3,2e-3"], "--array '0-3' with --sweep"),
        (["--exclusive", "--no-exclusive"], "--exclusive and --no-exclusive contradict"),
        (["--exclusive=topo"], "--exclusive 'topo' is not a SLURM --exclusive kind"),
        (["--time", "UNLIMITED"], "--time 'UNLIMITED' asks SLURM for no time limit; hpcdist"),
        (["--job-name", "a/b"], "--job-name 'a/b' has a '/', and --output '%x-%j.out' puts"),
        (["-o", "."], "--output '.' is a folder; SLURM opens the log as a file there"),
        (["-o", "/tmp"], "--output '/tmp' is a folder; SLURM opens the log as a file there"),
        (["-e", "logs/"], "--error 'logs/' is a folder; SLURM opens the log as a file there"),
        (
            ["--env", "HPCDIST_SIGNAL=USR1"],
            "--env 'HPCDIST_SIGNAL=USR1': hpcdist sets HPCDIST_SIGNAL for every rank itself; "
            "use --signal instead",
        ),
        (
            ["--env", "OMP_NUM_THREADS=7"],
            "--env 'OMP_NUM_THREADS=7': hpcdist sets OMP_NUM_THREADS for every rank of a CPU "
            "job (its CPU layout) itself; use --threads-per-task instead",
        ),
        (["--env", "HPCDIST_CPUS_PER_TASK=3"], "use --cpus-per-task instead"),
        (["--command", "a\nb"], "--command 'a\\nb' contains a newline or NUL; expected one"),
    ],
)
@pytest.mark.parametrize("command", COMMANDS)
def test_refusals_are_one_line_on_every_path(
    args: list[str], said: str, command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert said in _refused(command, ["--mode", "gloo", *args], tmp_path)


def test_a_job_name_with_a_slash_is_fine_where_no_log_name_holds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    spec = spec_from_options({"profile": None, "job_name": "a/b", "output": "job-%j.out"})
    assert _directives(render(spec))["job-name"] == "a/b"
    (tmp_path / "logs").mkdir()
    spec = spec_from_options({"profile": None, "output": "logs/%x-%j.out"})
    assert _directives(render(spec))["output"] == "logs/%x-%j.out"


def test_a_gpu_jobs_thread_count_from_env_reaches_its_ranks() -> None:
    spec = spec_from_options(
        {"profile": None, "mode": "nccl", "gpus_per_node": 1, "env": ("OMP_NUM_THREADS=7",)}
    )
    exports = [ln for ln in render(spec).splitlines() if ln.startswith("export OMP_NUM_THREADS")]
    assert exports[-1] == "export OMP_NUM_THREADS=7"  # after the script's own, so it wins


def test_a_profiles_owned_variable_is_named_as_its_key(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text("gloo_env:\n  OMP_WAIT_POLICY: passive\n")
    site.chmod(0o600)
    with pytest.raises(SpecError) as info:
        spec_from_options({"profile": str(site), "mode": "gloo"})
    assert str(info.value) == (
        f"profile 'site' ({site}) key gloo_env 'OMP_WAIT_POLICY=passive': hpcdist sets "
        "OMP_WAIT_POLICY for every rank of a CPU job (its CPU layout) itself; use "
        "--omp-wait-policy instead"
    )


def test_a_plain_array_needs_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    said = _refused(["submit", "--executor", "local"], ["--array", "0-3"], tmp_path)
    assert said.startswith("--array needs SLURM; the local executor runs on this machine")


def test_a_profiles_unlimited_max_time_is_no_limit_and_its_unlimited_default_is_refused(
    tmp_path: Path,
) -> None:
    site = tmp_path / "site.yaml"
    site.write_text("max_time: UNLIMITED\n")
    site.chmod(0o600)
    spec = spec_from_options({"profile": str(site), "time": "30-00:00:00"})
    assert _directives(render(spec))["time"] == "30-00:00:00"
    site.write_text("defaults:\n  time: infinite\n")
    with pytest.raises(SpecError) as info:
        spec_from_options({"profile": str(site)})
    assert str(info.value).startswith(
        f"profile 'site' ({site}) key defaults.time 'infinite' asks SLURM for no time limit; "
        "hpcdist needs a finite time limit"
    )
