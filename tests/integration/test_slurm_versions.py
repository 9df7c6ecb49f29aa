"""What differs between SLURM versions, on the running testbed (22.05, 24.11 or 26.05, as
HPCDIST_TESTBED_SLURM chose): the doctor's probe, a profile written from it, and the logs of a
job the controller has forgotten (sacct >= 23.02 keeps the unexpanded --output pattern)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcdist.render.script import render
from hpcdist.slurm.probe import parse_version
from hpcdist.slurm.query import from_sacct, sacct_rows
from hpcdist.spec.options import spec_from_options
from tests.integration.conftest import SlurmCluster, run_slurm, sbatch, slurm_env, unlabel

pytestmark = pytest.mark.slurm_versions

HPCDIST = [sys.executable, "-m", "hpcdist.cli.main"]
COMMCHECK = f"{sys.executable} -m hpcdist.distributed.commcheck --timeout 60"


def hpcdist(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HPCDIST, *args],
        cwd=cwd,
        env={**slurm_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _version() -> str:
    found = parse_version(run_slurm("sinfo", "--version").stdout)
    assert found is not None
    return str(found)


def test_doctor_prints_the_version_it_found_and_no_false_alarm(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    run = hpcdist("doctor", "--job", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert re.fullmatch(rf"SLURM version +{re.escape(_version())}", lines[0]), lines[0]
    assert "WARN" not in run.stdout and "FAIL" not in run.stdout, run.stdout
    table = {line.split("  ")[0]: line.split("  ", 1)[1].strip() for line in lines if "  " in line}
    assert table["controller"] == "reachable"
    assert table["accounting"] == "sacct works"
    assert table["JobAcctGather"] == "jobacct_gather/linux"
    assert table["scontrol in a job"] == "works"
    debug = table["partition debug"]
    assert debug.startswith("4 nodes (max all a job), time unlimited, QOS none, CPUs/node 2")
    assert debug.endswith("features testbed [default]"), debug
    assert lines[-1] == "nothing blocks a job"


@pytest.mark.parametrize("profile", [None, "local"])
def test_doctor_finds_nothing_to_report_on_the_plain_testbed(
    slurm_cluster: SlurmCluster, tmp_path: Path, profile: str | None
) -> None:
    # No profile: the cluster alone is checked; `local` is the testbed's profile (the tests').
    args = ("--profile", profile) if profile else ()
    env = {k: v for k, v in slurm_env().items() if k != "HPCDIST_PROFILE"}
    run = subprocess.run(
        [*HPCDIST, "doctor", *args], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "WARN" not in run.stdout and "FAIL" not in run.stdout, run.stdout
    table = {
        line.split("  ")[0]: line.split("  ", 1)[1].strip()
        for line in run.stdout.splitlines()
        if "  " in line
    }
    assert table["accounting enforces"] == "nothing"
    assert table["your accounts"] == "root (default root)"
    assert table["MaxArraySize"] == "1001 (array task ids 0-1000)"
    assert table["requeue"].startswith("JobRequeue=1: ")
    assert run.stdout.splitlines()[-1] == "nothing blocks a job"
    as_json = subprocess.run(
        [*HPCDIST, "doctor", "--json", *args], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert as_json.returncode == 0, as_json.stdout + as_json.stderr
    data = json.loads(as_json.stdout)
    assert (data["problems"], data["exit_status"], data["profile"]) == ([], 0, profile)
    assert data["cluster"]["default_partition"] == "debug"


def test_doctor_names_what_in_the_profile_the_cluster_lacks(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    profile = tmp_path / "wrong.yaml"
    profile.write_text(
        "partition: debug\ncores_per_node: 64\ngpus_per_node: 0\ngpu_types: [h100]\nmax_nodes: 4\n"
    )
    profile.chmod(0o600)
    run = hpcdist("doctor", "--profile", str(profile), cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    where = f"profile 'wrong' ({profile})"
    assert f"{where}  FAIL: cores_per_node 64 > 2 CPUs of debug's nodes" in run.stdout
    assert "advice: set cores_per_node to 2" in run.stdout
    assert "FAIL: GPU type 'h100' not in debug" in run.stdout
    assert "advice: use one of no type (untyped GPUs)" in run.stdout
    assert run.stdout.splitlines()[-1] == "2 problem(s) block a job"


def test_profile_init_writes_a_profile_that_renders_and_submits(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    config = tmp_path / "config"
    env = {"XDG_CONFIG_HOME": str(config)}
    made = hpcdist("profile", "init", "testbed", cwd=tmp_path, env=env)
    assert made.returncode == 0, made.stderr
    written = config / "hpcdist" / "profiles" / "testbed.yaml"
    text = written.read_text()
    assert f"from SLURM {_version()}" in text.splitlines()[0]
    for line in ("partition: debug", "cores_per_node: 2", "gpus_per_node: 0", "max_nodes: 4"):
        assert line in text.splitlines(), text
    assert "features: [testbed]" in text
    again = hpcdist("profile", "init", "testbed", cwd=tmp_path, env=env)
    assert again.returncode == 2
    assert again.stderr == (
        f"hpcdist: error: profile 'testbed' exists ({written}); remove it or choose another name\n"
    )
    script = hpcdist(
        "render", "--profile", "testbed", "--mode", "gloo", "--nodes", "2", cwd=tmp_path, env=env
    )
    assert script.returncode == 0, script.stderr
    assert '#SBATCH --partition="debug"' in script.stdout
    run = hpcdist(
        "submit",
        "--profile",
        "testbed",
        "--nodes=2",
        "--backend=gloo",
        "--wait",
        "--command",
        COMMCHECK,
        cwd=tmp_path,
        env=env,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "COMPLETED" in run.stdout


def _complete_record(job_id: str, name: str, wait_s: float = 60.0) -> list[dict[str, str]]:
    """sacct's rows of a job once slurmdbd has its whole record. The controller sends it
    asynchronously: until then a step's record may stand in for the job, under SLURM's
    placeholder name "allocation" and without WorkDir."""
    deadline = time.monotonic() + wait_s
    while True:
        # Asked of sacct each time: the user's shared view would keep the first answer
        # (the placeholder) for its whole interval, up to 2 minutes once nothing runs.
        os.environ["HPCDIST_SLURM_VIEW"] = "off"
        try:
            rows = sacct_rows(job_id)
        finally:
            del os.environ["HPCDIST_SLURM_VIEW"]
        names = [row.get("JobName") for row in rows if row.get("JobID") == job_id]
        if names == [name] or time.monotonic() > deadline:
            return rows
        time.sleep(0.5)


def test_logs_of_a_job_the_controller_forgot_come_from_sacct(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    job = sbatch(
        "#!/bin/bash\necho from-the-batch-step\n",
        "--job-name=forgot",
        f"--output={tmp_path}/%x-%j.out",
        cwd=tmp_path,
    )
    assert job.returncode == 0, job.stderr
    assert slurm_cluster.job_state(job.job_id) == "COMPLETED"
    real = tmp_path / f"forgot-{job.job_id}.out"
    assert real.read_text() == "from-the-batch-step\n"
    rows = _complete_record(str(job.job_id), "forgot")
    raw = [row.get("StdOut") for row in rows if row.get("JobID") == str(job.job_id)]
    version = parse_version(run_slurm("sinfo", "--version").stdout)
    assert version is not None
    if version.at_least(23, 2):
        assert raw == [f"{tmp_path}/%x-%j.out"]  # the pattern, not the file
    else:
        assert raw == [None]  # no StdOut field: the log is found in the WorkDir
    info = from_sacct(rows, str(job.job_id))
    assert info is not None and (info.stdout or info.guessed_log) == str(real)
    # `hpcdist logs` once scontrol no longer knows the job (MinJobAge after its end).
    logs = hpcdist("logs", str(job.job_id), cwd=tmp_path, env=_forgotten(tmp_path))
    assert logs.returncode == 0, logs.stderr
    assert unlabel(logs.stdout) == "from-the-batch-step\n"


def _forgotten(tmp_path: Path) -> dict[str, str]:
    """An environment whose scontrol has forgotten every job, as it does MinJobAge after
    a job's end: hpcdist then learns of the job from sacct alone."""
    stub = tmp_path / "stub"
    stub.mkdir(exist_ok=True)
    (stub / "scontrol").write_text(
        "#!/bin/sh\necho 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1\n"
    )
    (stub / "scontrol").chmod(0o755)
    # The stub is this command's alone: it does not refresh the user's shared view of the
    # cluster (a refusing scontrol there pauses every other command's questions).
    return {"PATH": f"{stub}{os.pathsep}{os.environ['PATH']}", "HPCDIST_SLURM_VIEW": "off"}


def test_a_forgotten_rendered_jobs_logs_come_from_its_record_rank_by_rank(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """-o o-%j.log -e e-%j.log --rank-logs split: status names both files and logs --rank 1
    shows rank 1's file once scontrol forgot the job; also for an array task, whose record
    the script wrote under the task's own job id."""
    spec = spec_from_options(
        {
            "profile": "local",
            "mode": "gloo",
            "nodes": 2,
            "cpus_per_task": 1,
            "output": "o-%j.log",
            "error": "e-%j.log",
            "rank_logs": "split",
            "command": COMMCHECK,
        }
    )
    script = tmp_path / "job.sh"
    script.write_text(render(spec))
    single = sbatch(script, cwd=tmp_path, wait=False).job_id
    array = sbatch(script, "--array=1", cwd=tmp_path, wait=False).job_id
    env = _forgotten(tmp_path)
    assert slurm_cluster.job_state(single) == "COMPLETED"
    assert slurm_cluster.job_state(array) == "COMPLETED"  # its one task
    _complete_record(str(single), "hpcdist-commcheck")
    status = hpcdist("status", str(single), cwd=tmp_path, env=env)
    assert status.returncode == 0, status.stderr
    assert f"stdout:     {tmp_path}/o-{single}.log\n" in status.stdout, status.stdout
    assert f"stderr:     {tmp_path}/e-{single}.log\n" in status.stdout, status.stdout
    task = f"{array}_1"
    rows = _complete_record(task, "hpcdist-commcheck")
    (own_id,) = [r["JobIDRaw"] for r in rows if r["JobID"] == task]
    for job, own in ((str(single), str(single)), (task, own_id)):
        for rank in (0, 1):
            logs = hpcdist("logs", job, "--rank", str(rank), cwd=tmp_path, env=env)
            assert logs.returncode == 0, logs.stderr
            file = tmp_path / f"o-{own}.rank{rank}.log"
            assert logs.stdout == file.read_text() and f"[Rank {rank}]" in logs.stdout


HOLD_MEMORY = """#!/bin/bash
srun python3 -c '
import os, pathlib, time
held = bytearray(200 * 1024 * 1024)
held[::4096] = b"x" * len(held[::4096])
go = pathlib.Path("release")
while not go.exists():
    time.sleep(0.2)
'
"""


def _step_max_rss_kb(step: str) -> int:
    proc = run_slurm("sstat", "-j", step, "-n", "-P", "-o", "MaxRSS", check=False)
    values = [v.strip().rstrip("K") for v in proc.stdout.splitlines() if v.strip()]
    return int(values[0]) if values and values[0].isdigit() else 0


def test_efficiency_sums_the_memory_of_two_ranks_a_node(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """Each rank holds 200 MB until SLURM has measured it (sstat), then ends: the status
    line counts both ranks of a node against the request per node."""
    job = sbatch(
        HOLD_MEMORY,
        "--nodes=2",
        "--ntasks-per-node=2",
        "--cpus-per-task=1",
        "--mem=1000M",
        "--time=10",
        "--job-name=twoanode",
        cwd=tmp_path,
        wait=False,
    )
    deadline = time.monotonic() + 180
    while _step_max_rss_kb(f"{job.job_id}.0") < 200 * 1024:
        assert time.monotonic() < deadline, "SLURM never measured the ranks' memory"
        time.sleep(0.5)
    (tmp_path / "release").touch()
    assert slurm_cluster.job_state(job.job_id) == "COMPLETED"
    _complete_record(str(job.job_id), "twoanode")
    status = hpcdist("status", str(job.job_id), cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    line = next(ln for ln in status.stdout.splitlines() if "efficiency:" in ln)
    found = re.search(r"memory (\d+\.\d)% \(peak (\d+) MB a node \(2 tasks of up to (\d+) MB", line)
    assert found is not None, line
    percent, node_mb, task_mb = float(found[1]), int(found[2]), int(found[3])
    # The node holds both ranks: its largest and the other's 200 MB at least. Not exactly twice
    # the largest: each figure is rounded on its own (22.05: 421 MB a node, 211 a task), and
    # 24.11 measures the node apart from its tasks (423 MB a node, 205 a task).
    assert 200 <= task_mb < 500 and task_mb + 200 <= node_mb < 1000, line
    assert percent == pytest.approx(node_mb / 10, abs=0.2)  # of 1000 MB a node
    advice = next(ln for ln in status.stdout.splitlines() if "advice:" in ln)
    # A job of no hpcdist record is told --mem and --mem-per-cpu both: --mem here.
    advised = re.search(r"--mem=(\d+)M\b", advice)
    assert advised is not None, advice  # under half of 1000 MB a node was used
    assert node_mb < int(advised[1]) < 1000, advice  # both ranks of the node, with room
