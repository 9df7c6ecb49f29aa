"""Properties over the flag space, with inputs Hypothesis makes: submit plans the very script
render prints, and a refused request is one line that writes nothing, in both."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from hpcdist.cli.main import cli
from hpcdist.errors import UserError
from hpcdist.jobs.submit import plan_submission
from hpcdist.render.script import render
from hpcdist.spec.options import spec_from_options
from tests.jobs.test_submit import _directives

# Values a user types, the awkward ones included: empty, blank, quotes, shell syntax,
# newlines, sizes and signals SLURM refuses.
WORDS = st.sampled_from(
    ["x", "emu run #1", "", " ", "a'b", 'a"b', "$(id)", "a;b", "é日本", "a\nb", "-x", "a b\\c"]
)
FLAGS: dict[str, Any] = {
    "mode": st.sampled_from(["threads", "gloo", "test", "nccl", "mpi"]),
    "nodes": st.integers(-1, 5),
    "tasks_per_node": st.integers(0, 3),
    "cpus_per_task": st.integers(0, 3),
    "threads_per_task": st.integers(0, 4),
    "omp_wait_policy": st.sampled_from(["passive", "active"]),
    "gpus_per_node": st.integers(0, 4),
    "time": st.sampled_from(["1", "2", "90", "0:30:00", "1-12", "1:30", "forever", ""]),
    "job_name": WORDS,
    # A log's folder must exist ("nolog/" does not; "%u/" is the job's to make), and so must
    # --chdir's ("run" is made by the test, "no run" is not).
    "output": st.sampled_from(
        ["%x-%j.out", "o-%j.log", "", "a b.log", "job.sh", "o\nx", "nolog/o-%j.log", "%u/o.log"]
    ),
    "workdir": st.sampled_from(["run", "no run", "/nonexistent"]),
    "error": st.sampled_from(["e-%j.err", "", "x y.err"]),
    "account": WORDS,
    "qos": WORDS,
    "memory": st.sampled_from(["4G", "1500M", "0", "lots", "", "-1G"]),
    "signal": st.sampled_from(["USR2@90", "USR1@30", "B:USR2@60", "USR2", "", "KILL", "USR2@600"]),
    "requeue": st.booleans(),
    "max_restarts": st.integers(-1, 3),
    "launcher": st.sampled_from(["srun", "torchrun", "mpirun"]),
    "constraint": WORDS,
    "reservation": WORDS,
    "env": st.lists(
        st.builds(lambda k, v: f"{k}={v}", st.sampled_from(["A", "B_1", "1BAD", "", "X-Y"]), WORDS),
        max_size=2,
    ),
    "setup": st.lists(
        st.sampled_from(["module load x", "", "if true; then", "echo 'a b'"]), max_size=2
    ),
}


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    chosen = draw(st.sets(st.sampled_from(sorted(FLAGS)), max_size=6))
    flags = {name: draw(FLAGS[name]) for name in chosen}
    for name in ("env", "setup"):
        if name in flags:
            flags[name] = tuple(flags[name])
    return flags


def _refusal(flags: dict[str, Any]) -> str | None:
    """The one line a refused request gets (None: accepted)."""
    try:
        spec_from_options({"profile": None, **flags})
    except (UserError, ValueError) as exc:
        return str(exc)
    return None


def _argv(flags: dict[str, Any]) -> list[str]:
    words: list[str] = []
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        flag = {"memory": "--mem", "workdir": "--chdir"}.get(name, flag)
        if isinstance(value, bool):
            words.append(flag if value else f"--no-{name.replace('_', '-')}")
        elif isinstance(value, tuple):
            words += [f"{flag}={item}" for item in value]
        else:
            words.append(f"{flag}={value}")
    return words


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(flags=requests())
@example(flags={"signal": "USR1@30"})
@example(flags={"mode": "gloo", "nodes": 2, "threads_per_task": 1, "env": ("A=x",)})
@example(flags={"job_name": ""})
@example(flags={"workdir": "no run"})  # sbatch would queue it; the job would fail at launch
@example(flags={"workdir": "run", "output": "nolog/o-%j.log"})
def test_submit_queues_what_render_prints_or_both_refuse_writing_nothing(
    flags: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir(exist_ok=True)
    before = set(os.listdir(tmp_path))
    refusal = _refusal(flags)
    event("refused" if refusal is not None else "accepted")
    runner = CliRunner()
    if refusal is not None:
        assert "\n" not in refusal.strip(), refusal
        for command in (["render"], ["submit", "--executor", "local"]):
            result = runner.invoke(cli, [*command, *_argv(flags)])
            assert result.exit_code == 2, (command, flags, result.output)
            assert "Traceback" not in result.output
            assert len(result.stderr.strip().splitlines()) == 1, result.stderr
            assert set(os.listdir(tmp_path)) == before  # nothing written, nothing queued
        return
    spec = spec_from_options({"profile": None, **flags})
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")  # a login node
    planned = plan_submission(spec, "slurm", preflight_check=False)
    # One artefact: what submit checks and queues is what render prints, byte for byte.
    assert planned.script == render(spec), flags
    if "job_name" in flags:
        assert _directives(planned.script)["job-name"] == flags["job_name"]
