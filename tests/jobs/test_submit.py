"""hpcdist submit: the same request as render, a dry run, local runs, env hygiene."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from hpcdist.cli.main import cli
from hpcdist.jobs.records import load_record, wait_for_final_state
from hpcdist.jobs.submit import (
    clean_slurm_environment,
    describe,
    plan_submission,
    submit,
)
from hpcdist.render.directives import srun_options
from hpcdist.render.script import render
from hpcdist.spec.joboption import JobOption
from hpcdist.spec.jobspec import JOB_OPTIONS, JobSpec
from hpcdist.spec.options import spec_from_options

REPO = Path(__file__).resolve().parents[2]
_DIRECTIVE = re.compile(r"^#SBATCH --([a-z-]+)(?:=(.*))?$")


def _directives(script: str) -> dict[str, str]:
    found = {}
    for line in script.splitlines():
        match = _DIRECTIVE.match(line)
        if match:
            found[match.group(1)] = _sbatch_value(match.group(2) or "")
    return found


def _sbatch_value(text: str) -> str:
    """A #SBATCH value as sbatch's parser reads it (seen on the testbed: a backslash escapes
    the next character everywhere, inside single quotes too; both quotes group)."""
    out, quote, chars = [], "", iter(text)
    for char in chars:
        if char == "\\":
            out.append(next(chars, ""))
        elif char in "'\"" and quote in ("", char):
            quote = "" if quote else char
        elif char.isspace() and not quote:
            break
        else:
            out.append(char)
    return "".join(out)


def _planned(spec: JobSpec) -> str:
    """The script a SLURM submit would check and queue (no cluster needed to plan it)."""
    return describe(spec, "slurm")["script"]


@pytest.mark.parametrize(
    "flags",
    [
        {"mode": "gloo", "nodes": 4, "job_name": "emu run #1"},
        {
            "mode": "gloo",
            "job_name": "a b\\c 'it's' \"x\"; rm -rf ~ #",
            "output": "o\\%j.log",
            "error": "e-%j.err",
        },
        {"mode": "test", "nodes": 2, "tasks_per_node": 2, "cpus_per_task": 1},
        {
            "mode": "threads",
            "profile": "cpu-cluster",
            "account": "proj",
            "qos": "high",
            "memory": "64G",
            "time": "1-12",
        },
        {"mode": "nccl", "profile": "gpu-cluster", "nodes": 2, "time": "90"},
        {"mode": "nccl", "profile": "gpu-cluster", "nodes": 2, "launcher": "torchrun"},
        {"mode": "test", "profile": "gpu-cluster", "nodes": 2, "gpus_per_node": 2},
        {
            "mode": "gloo",
            "nodes": 2,
            "requeue": False,
            "workdir": "scratch/me",
            "memory": "1500M",
            "max_restarts": 0,
        },
        {
            "mode": "nccl",
            "profile": "gpu-cluster",
            "gpus_per_node": 2,
            "nodes": 2,
            "gpu_type": "a100",
            "constraint": "a100&ib",
            "exclusive": True,
            "reservation": "maint 2",
            "mail_type": "END,FAIL",
            "mail_user": "me@site.org",
            "nodelist": "gpu[01-02]",
            "exclude": "gpu07",
            "sbatch_options": ("comment=site test", "hint=nomultithread"),
            "srun_args": ("--cpu-bind=cores", "--export=ALL,X=a b"),
        },
    ],
)
def test_submit_queues_the_script_render_prints_with_the_values_given(
    flags: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(shutil, "which", lambda tool: f"/usr/bin/{tool}")  # sbatch "exists"
    if "workdir" in flags:  # --chdir must name an existing folder (relative: from the cwd)
        (tmp_path / flags["workdir"]).mkdir(parents=True)
    spec = spec_from_options({"profile": None, **flags})
    script = _planned(spec)
    assert script == render(spec)  # one artefact: byte for byte
    submitted = _directives(script)
    given = {
        "nodes": "nodes",
        "job_name": "job-name",
        "account": "account",
        "qos": "qos",
        "memory": "mem",
        "workdir": "chdir",
        "output": "output",
        "error": "error",
        "constraint": "constraint",
        "reservation": "reservation",
        "mail_type": "mail-type",
        "mail_user": "mail-user",
        "nodelist": "nodelist",
        "exclude": "exclude",
    }
    for flag, directive in given.items():
        if flag in flags:
            assert submitted[directive] == str(flags[flag])
    for key, _, value in (item.partition("=") for item in flags.get("sbatch_options", ())):
        assert submitted[key] == value
    if flags.get("gpu_type"):
        assert submitted["gres"] == f"gpu:{flags['gpu_type']}:2"
    if flags.get("exclusive"):
        assert submitted["exclusive"] == ""
    assert ("no-requeue" in submitted) == (flags.get("requeue") is False or spec.mode == "test")
    assert ("requeue" in submitted) == spec.requeue
    words = shlex.split(_srun_line(script))
    for option in srun_options(spec):
        assert option in words
    for arg in flags.get("srun_args", ()):
        assert arg in words


def _srun_line(script: str) -> str:
    """srun's options as one line: the script continues them over several."""
    joined = script.replace("\\\n", " ")
    line = next(line for line in joined.splitlines() if "srun --" in line)
    return line[line.index("srun --") :]


@pytest.mark.parametrize("executor", ["local", "slurm"])
def test_submit_counts_gpus_in_the_job_as_render_does(
    executor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "which", lambda tool: f"/usr/bin/{tool}")
    spec = spec_from_options({"profile": None, "mode": "nccl", "nodes": 2})
    script = describe(spec, executor)["script"]
    assert script == render(spec)
    assert "hpcdist.distributed.jobstep gpus" in script


def test_dry_run_prints_parameters_and_submits_nothing(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["submit", "--nodes", "2", "--backend", "gloo", "--executor", "local", "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["executor"] == "local"
    spec = spec_from_options({"profile": None, "nodes": 2, "backend": "gloo"})
    assert shown["script"] == render(spec)
    assert "--nodes=2 --ntasks-per-node=1" in shown["script"]
    assert not (tmp_path / ".hpcdist").exists()


def test_submit_hides_the_surrounding_jobs_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "999")
    monkeypatch.setenv("SLURM_NODELIST", "old[1-8]")
    monkeypatch.setenv("SBATCH_PARTITION", "wrong")
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/slurm.conf")
    with clean_slurm_environment():
        assert "SLURM_JOB_ID" not in os.environ
        assert "SLURM_NODELIST" not in os.environ
        assert "SBATCH_PARTITION" not in os.environ
        assert os.environ["SLURM_CONF"] == "/etc/slurm/slurm.conf"
    assert os.environ["SLURM_JOB_ID"] == "999"


def _local(flags: dict[str, Any], project: Path) -> tuple[str, str]:
    spec = spec_from_options({"profile": None, "mode": "gloo", **flags})
    record = submit(spec, "local", project_dir=project).record
    return record.job_id, wait_for_final_state(record, timeout_s=120, poll_s=0.2)


def test_local_executor_runs_every_rank_and_completes(tmp_path: Path) -> None:
    probe = (
        "import os; print('rank', os.environ['SUBMITIT_LOCAL_GLOBALID'], "
        "'of', os.environ['SUBMITIT_LOCAL_NTASKS'], 'signal', os.environ['HPCDIST_SIGNAL'])"
    )
    job_id, state = _local({"nodes": 2, "command": f'{sys.executable} -c "{probe}"'}, tmp_path)
    assert state == "COMPLETED"
    record = load_record(job_id, tmp_path)
    logs = [record.log_path(r).read_text() for r in range(2)]
    assert "rank 0 of 2 signal USR2" in logs[0]
    assert "rank 1 of 2 signal USR2" in logs[1]


def test_local_job_that_raises_is_failed_with_its_traceback(tmp_path: Path) -> None:
    command = f"{sys.executable} -c \"raise ValueError('bad input 42')\""
    job_id, state = _local({"nodes": 1, "command": command}, tmp_path)
    assert state == "FAILED"
    err = load_record(job_id, tmp_path).log_path(0, "err").read_text()
    assert "ValueError: bad input 42" in err


def test_cli_local_submit_wait_status_logs_list(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PATH"] = os.path.dirname(sys.executable) + ":/usr/bin:/bin"  # no sbatch on PATH
    hpcdist = [sys.executable, "-m", "hpcdist.cli.main"]
    command = f"{sys.executable} -c \"print('hello from the job')\""
    run = subprocess.run(
        [*hpcdist, "submit", "--nodes", "2", "--backend", "gloo", "--wait", "--command", command],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr
    assert "(local, gloo, 2 nodes x 1 tasks)" in run.stdout
    assert "hello from the job" in run.stdout
    job_id = re.search(r"Submitted job (\d+)", run.stdout).group(1)  # type: ignore[union-attr]
    status = subprocess.run(
        [*hpcdist, "status", job_id], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert status.stdout.splitlines()[0] == f"{job_id} COMPLETED"
    logs = subprocess.run(
        [*hpcdist, "logs", job_id, "--rank", "1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert "hello from the job" in logs.stdout
    listing = subprocess.run(
        [*hpcdist, "list"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert re.search(rf"{job_id}\s+COMPLETED", listing.stdout)
    bad_rank = subprocess.run(
        [*hpcdist, "logs", job_id, "--rank", "5"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert bad_rank.returncode == 2
    assert "5 is not a rank of job" in bad_rank.stderr


def test_cancel_local_job_shows_cancelled(tmp_path: Path) -> None:
    spec = spec_from_options(
        {
            "profile": None,
            "mode": "gloo",
            "nodes": 1,
            "command": f'{sys.executable} -c "import time; time.sleep(60)"',
        }
    )
    record = submit(spec, "local", project_dir=tmp_path).record
    from hpcdist.jobs.records import cancel

    cancel(record)
    assert wait_for_final_state(record, timeout_s=30, poll_s=0.2) == "CANCELLED"


def test_status_of_unknown_job_is_a_user_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["status", "424242"])
    assert result.exit_code == 2
    assert "job '424242' was not submitted from this folder" in result.stderr


@pytest.mark.parametrize(
    "option", [o for o in JOB_OPTIONS if o.sbatch is not None], ids=lambda o: o.name
)
def test_every_pass_through_option_reaches_render_and_submit_with_its_value(
    option: JobOption, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    value: Any = {
        "memory": "1500M",
        "partition": "debug",
        "mem_per_gpu": "40G",
        "mail_type": "END,FAIL",
        "constraint": "testbed&ib",
        "exclusive": True,
        # a log file name (site-value-7 is a folder here, for --chdir)
        "output": "site-value-7/o.log",
        "error": "site-value-7/e.log",
    }.get(option.name, "site-value-7")
    # --chdir site-value-7 must exist (hpcdist.spec.loginpaths): a folder of that name here.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "site-value-7").mkdir()
    # Memory per GPU needs GPUs (and replaces the GPU profile's --mem).
    gpus = {"profile": "gpu-cluster", "mode": "nccl"}
    base = gpus if option.name == "mem_per_gpu" else {"profile": None, "mode": "gloo"}
    spec = spec_from_options({**base, option.name: value})
    shown = "" if value is True else value  # a flag: --exclusive, no value
    assert _directives(render(spec))[option.sbatch] == shown
    monkeypatch.setattr(shutil, "which", lambda tool: f"/usr/bin/{tool}")
    assert _directives(_planned(spec))[option.sbatch] == shown
    unset = spec_from_options({"profile": None, "mode": "gloo"})
    # Unset: no directive, unless a default or the profile (its partition) gives a value.
    assert (option.sbatch in _directives(render(unset))) == (
        getattr(unset, option.name) not in (None, False)
    )


@pytest.mark.parametrize(
    ("flags", "tasks"),
    [
        ({"nodes": 2, "tasks_per_node": 2}, 4),
        ({"nodes": 2, "ntasks": 3}, 3),
        # One torchrun per node: a label (SLURM) or a log (local) per node, not per rank.
        ({"nodes": 2, "tasks_per_node": 2, "launcher": "torchrun"}, 2),
    ],
)
def test_a_job_has_a_log_or_label_per_srun_task(flags: dict[str, Any], tasks: int) -> None:
    spec = spec_from_options({"profile": None, "mode": "gloo", "cpus_per_task": 1, **flags})
    assert plan_submission(spec, "local").tasks == tasks
