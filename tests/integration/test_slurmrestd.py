"""slurmrestd on the testbed (HPCDIST_TESTBED_SLURMRESTD=1): it answers a token from
`scontrol token` in every OpenAPI version it serves and refuses a request without one. The
answers' shapes per version are recorded in tests/fixtures/slurmrestd (scripts/slurmrestd-record).
"""

from __future__ import annotations

import http.client
import json
import os
import pwd
import random
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.integration.conftest import slurm_env
from tests.integration.sidebed import FINAL, SideBed, side_testbed

pytestmark = [pytest.mark.slurm, pytest.mark.slurm_versions, pytest.mark.xdist_group("rest")]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def restbed() -> Iterator[SideBed]:
    with side_testbed("rest", 78, slurmrestd="1") as bed:
        yield bed


def get(bed: SideBed, path: str, headers: dict[str, str]) -> tuple[int, Any]:
    url = urlsplit(bed.exports["HPCDIST_SLURMRESTD"])
    assert url.hostname == "127.0.0.1" and url.port
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        conn.request("GET", path, headers=headers)
        answer = conn.getresponse()
        raw = answer.read().decode(errors="replace")
    finally:
        conn.close()
    try:
        return answer.status, json.loads(raw)
    except ValueError:
        return answer.status, raw


def slurm(bed: SideBed, *argv: str) -> str:
    env = slurm_env({"SLURM_CONF": str(bed.slurm_conf)})
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout


def auth(bed: SideBed, lifespan: int = 300) -> dict[str, str]:
    me = pwd.getpwuid(os.getuid()).pw_name
    printed = slurm(bed, "scontrol", "token", f"username={me}", f"lifespan={lifespan}").strip()
    assert printed.startswith("SLURM_JWT=")
    return {"X-SLURM-USER-NAME": me, "X-SLURM-USER-TOKEN": printed.split("=", 1)[1]}


def test_every_served_version_pings_with_a_token_of_scontrol(restbed: SideBed) -> None:
    headers = auth(restbed)
    status, spec = get(restbed, "/openapi/v3", headers)
    assert status == 200
    versions = sorted({p.split("/")[2] for p in spec["paths"] if p.startswith("/slurm/v0.0.")})
    assert versions, spec["paths"]
    release = slurm(restbed, "scontrol", "--version").split()[-1]
    for version in versions:
        ping = next(p for p in spec["paths"] if p.rstrip("/") == f"/slurm/{version}/ping")
        status, body = get(restbed, ping, headers)
        assert status == 200, (version, body)
        meta = body["meta"]
        assert (meta.get("slurm") or meta.get("Slurm"))["release"] == release


def test_a_request_without_a_token_or_with_garbage_is_refused(restbed: SideBed) -> None:
    status, spec = get(restbed, "/openapi/v3", auth(restbed))
    jobs = max(p for p in spec["paths"] if p.rstrip("/").endswith("/jobs") and "/slurm/" in p)
    assert get(restbed, jobs, {}) == (401, "Authentication failure")
    me = pwd.getpwuid(os.getuid()).pw_name
    status, body = get(restbed, jobs, {"X-SLURM-USER-NAME": me, "X-SLURM-USER-TOKEN": "x"})
    # 22.05 answers 500, 24.11 on 511; both say so in the errors of the version's body.
    assert status in (500, 511) and body["jobs"] == [], body


# ---- hpcdist over slurmrestd (--transport rest) ----------------------------------------

HPCDIST = [sys.executable, "-m", "hpcdist.cli.main"]
# SLURM's commands the client machine does not have: each records its call and fails,
# except inside a job (SLURM_JOB_ID set), whose nodes have SLURM's commands.
NO_CLI = ("sbatch", "squeue", "scontrol", "sacct", "scancel", "sinfo", "sacctmgr", "srun")
SHIM = """#!/bin/sh
if [ -n "$SLURM_JOB_ID" ]; then
  PATH="${PATH#*:}" exec "$(basename "$0")" "$@"
fi
echo "$(basename "$0") $*" >> "$(dirname "$0")/called"
echo "$(basename "$0"): not on this machine" >&2
exit 127
"""


@dataclass
class RestUser:
    """A client with slurmrestd's address and a token, and no SLURM commands of its own."""

    env: dict[str, str]
    shims: Path
    work: Path

    def run(self, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*HPCDIST, *argv],
            env=self.env,
            cwd=self.work,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def called(self) -> str:
        log = self.shims / "called"
        return log.read_text() if log.exists() else ""


@pytest.fixture
def rest_user(restbed: SideBed, tmp_path: Path) -> RestUser:
    shims = tmp_path / "shims"
    shims.mkdir()
    for tool in NO_CLI:
        (shims / tool).write_text(SHIM)
        (shims / tool).chmod(0o755)
    env = slurm_env({"SLURM_CONF": str(restbed.slurm_conf)})
    for key in ("HPCDIST_PROFILE", "HPCDIST_TRANSPORT"):
        env.pop(key, None)
    token = auth(restbed, lifespan=3600)["X-SLURM-USER-TOKEN"]
    env.update(
        {
            "PATH": f"{shims}:{env['PATH']}",
            "HPCDIST_SLURMRESTD": restbed.exports["HPCDIST_SLURMRESTD"],
            "SLURM_JWT": token,
            "XDG_CONFIG_HOME": str(tmp_path / "config"),  # no profile: the cluster's own
            "HPCDIST_HOME": str(tmp_path / "state"),
        }
    )
    work = tmp_path / "work"
    work.mkdir()
    return RestUser(env, shims, work)


def submitted_id(out: str) -> str:
    match = re.search(r"^Submitted job (\S+)", out, re.MULTILINE)
    assert match, out
    return match[1]


def test_a_gloo_job_completes_over_rest_without_slurm_commands(rest_user: RestUser) -> None:
    done = rest_user.run(
        "submit", "--transport", "rest", "--nodes", "2", "--backend", "gloo", "--wait"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    job = submitted_id(done.stdout)
    assert f"Job {job} ended COMPLETED" in done.stdout
    status = rest_user.run("status", "--transport", "rest", job)
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith(f"{job} COMPLETED"), status.stdout
    assert re.search(r"nodes:\s+node\[1-2\] \(2\)", status.stdout), status.stdout
    listed = rest_user.run("list", "--transport", "rest")
    assert re.search(rf"^\s*{job}\s+COMPLETED", listed.stdout, re.MULTILINE), listed.stdout
    assert rest_user.called() == ""  # no SLURM command was run outside the job
    # The token reached no file of the job's: its script, log and run folder.
    token = rest_user.env["SLURM_JWT"]
    for path in rest_user.work.rglob("*"):
        if path.is_file():
            assert token.encode() not in path.read_bytes(), path


def test_a_job_is_cancelled_over_rest(rest_user: RestUser, restbed: SideBed) -> None:
    queued = rest_user.run(
        "submit", "--transport", "rest", "--nodes", "1", "--time", "5", "--command", "sleep 300"
    )
    assert queued.returncode == 0, queued.stderr
    job = submitted_id(queued.stdout)
    state = ""
    for _ in range(240):  # a job that never starts: 2 minutes at most
        state = rest_user.run("status", "--transport", "rest", job).stdout.split("\n")[0]
        if "RUNNING" in state or any(final in state for final in FINAL):
            break
        time.sleep(0.5)
    assert state == f"{job} RUNNING", state
    cancelled = rest_user.run("cancel", "--transport", "rest", job)
    assert cancelled.stdout.strip() == f"Cancelled job {job} (was RUNNING)", cancelled
    shown = slurm(restbed, "scontrol", "show", "job", "-o", job)
    assert re.search(r"JobState=(CANCELLED|COMPLETING)", shown), shown
    assert rest_user.called() == ""


def test_a_three_point_sweep_and_its_report_over_rest(rest_user: RestUser) -> None:
    done = rest_user.run(
        "submit",
        "--transport",
        "rest",
        "--nodes",
        "1",
        "--backend",
        "gloo",
        "--sweep",
        "training.lr=1e-3,2e-3,3e-3",
        "--set",
        "training.epochs=5",
        "--wait",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    job = submitted_id(done.stdout)
    report = rest_user.run("report", "--transport", "rest", job, "--json")
    assert report.returncode == 0, report.stderr
    rows = json.loads(report.stdout)
    points = rows["points"] if isinstance(rows, dict) else rows
    assert len(points) == 3, rows
    assert rest_user.called() == ""


# ---- the same job over both transports -------------------------------------------------

SHAPES = (
    ("--nodes", "1"),
    ("--nodes", "2"),
    ("--nodes", "2", "--tasks-per-node", "2", "-c", "1"),
    ("--nodes", "2", "--ntasks", "3", "-c", "1"),
)
CHOICES = (
    ((), ("--time", "5"), ("--time", "00:10:00"), ("--time", "0-01")),
    ((), ("--signal", "USR1@60"), ("--signal", "B:USR2@120"), ("--signal", "RB:USR2@90")),
    ((), ("-J", "a b"), ("-J", 'q"uo\\te'), ("-J", "ünï-code")),
    ((), ("-o", "out-%j.log"), ("-o", "%x.%j.out", "-e", "%x.%j.err")),
    ((), ("--mem", "500M"), ("--mem", "1G")),
    (
        (),
        ("--constraint", "testbed"),
        ("--exclusive",),
        ("--mail-type", "END,FAIL", "--mail-user", "someone@example.org"),
        ("--no-requeue",),
        ("--max-restarts", "2"),
        ("--partition", "debug"),
        ("--sweep", "training.lr=1e-3,2e-3"),
        ("--array", "0-3%2"),
        ("--env", "ANSWER=42"),
    ),
)
# Fields that differ between two submissions of one script: ids, times, where submitit
# keeps its copy (Command; none over REST), the submitting host (AllocNode: the daemon's;
# SubmitLine: sbatch's own argv, none over REST)
# and what the scheduler estimates for a pending job once it has looked at it (NumCPUs,
# TRES: 2 CPUs before, 4 after, for 2 nodes x 2 CPUs); what was asked (NumNodes, NumTasks,
# CPUs/Task, MinCPUsNode, MinMemoryNode, ...) is compared.
OWN_FIELDS = {
    "JobId", "ArrayJobId", "ArrayTaskId", "SubmitTime", "EligibleTime", "AccrueTime",
    "LastSchedEval", "StartTime", "EndTime", "Priority", "Command", "RunTime", "Reason",
    "AllocNode:Sid", "NumCPUs", "TRES", "SubmitLine",
}  # fmt: skip


def flag_sets(count: int) -> list[tuple[str, ...]]:
    """``count`` different sets of submit flags, the same on every run (a fixed seed)."""
    rng = random.Random(2026)
    found: dict[tuple[str, ...], None] = {}
    while len(found) < count:
        flags = [*rng.choice(SHAPES)]
        for group in CHOICES:
            flags += rng.choice(group)
        found[tuple(flags)] = None
    return list(found)


def legacy_refusal(flags: tuple[str, ...]) -> str | None:
    """What SLURM 22.05's daemon cannot be asked (its parser, not its schema, decides):
    hpcdist says so in one line and queues nothing; None where it can."""
    flagged = next((f for f in flags if f.startswith(("B:", "RB:"))), None)
    if flagged:
        return (
            f"hpcdist: error: #SBATCH --signal='{flagged}': slurmrestd v0.0.38 (SLURM 22.05) "
            "takes a signal without B: or R: only; submit with --transport cli\n"
        )
    if "--no-requeue" in flags:
        return (
            "hpcdist: error: #SBATCH --no-requeue: slurmrestd v0.0.38 (SLURM 22.05) cannot turn "
            "requeue off (the job would be requeued); submit with --transport cli\n"
        )
    return None


def legacy(bed: SideBed) -> bool:
    """SLURM 22.05: its daemon speaks v0.0.38 only."""
    return slurm(bed, "scontrol", "--version").split()[-1].startswith("22.05")


def shown_fields(bed: SideBed, job: str) -> dict[str, str]:
    text = slurm(bed, "scontrol", "show", "job", "-o", job).splitlines()[0]
    fields = dict(word.split("=", 1) for word in text.split() if "=" in word)
    if fields.get("OOMKillStep") == "0":  # the daemon states SLURM's default, sbatch does not
        del fields["OOMKillStep"]
    return {k: v.replace(job, "<id>") for k, v in fields.items() if k not in OWN_FIELDS}


def test_fifty_flag_sets_queue_the_rendered_bytes_and_fields_over_both_transports(
    restbed: SideBed, tmp_path: Path
) -> None:
    env = slurm_env({"SLURM_CONF": str(restbed.slurm_conf)})
    env["HPCDIST_HOME"] = str(tmp_path / "state")
    token = auth(restbed, lifespan=3600)["X-SLURM-USER-TOKEN"]
    over = {
        "cli": {**env, "HPCDIST_TRANSPORT": "cli"},
        "rest": {
            **env,
            "HPCDIST_TRANSPORT": "rest",
            "HPCDIST_SLURMRESTD": restbed.exports["HPCDIST_SLURMRESTD"],
            "SLURM_JWT": token,
        },
    }
    work = tmp_path / "work"
    work.mkdir()
    # Every job waits for one that never starts: none runs, each stays to be read.
    held = slurm(restbed, "sbatch", "--parsable", "--hold", "--wrap", "true").strip()
    compared = refused = 0
    # All fifty on the newest release (its pass runs beside the 22.05 one, with time to
    # spare); the first twelve of the same sets on the older two.
    release = slurm(restbed, "scontrol", "--version").split()[-1]
    wanted = 50 if release.startswith("26.05") else 12
    try:
        for flags in flag_sets(120):  # until enough are compared (22.05 refuses some)
            if compared == wanted:
                break
            argv = [*flags, "--after", held]
            rendered = subprocess.run(
                [*HPCDIST, "render", *argv], env=over["rest"], cwd=work,
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert rendered.returncode == 0, (flags, rendered.stderr)
            jobs = {}
            for name, transport_env in over.items():
                done = subprocess.run(
                    [*HPCDIST, "submit", "--no-preflight", *argv], env=transport_env, cwd=work,
                    capture_output=True, text=True, timeout=120,
                )  # fmt: skip
                refusal = legacy_refusal(flags) if legacy(restbed) else None
                if name == "rest" and refusal:
                    assert (done.returncode, done.stdout, done.stderr) == (2, "", refusal)
                    break
                if name == "cli" and done.returncode == 2:
                    # SLURM refuses it (24.11 on: RB: "Preemption is required but is
                    # disabled"): so must the daemon, in one line, queueing nothing.
                    again = subprocess.run(
                        [*HPCDIST, "submit", "--no-preflight", *argv], env=over["rest"],
                        cwd=work, capture_output=True, text=True, timeout=120,
                    )  # fmt: skip
                    assert (again.returncode, again.stdout) == (2, ""), again
                    assert again.stderr.count("\n") == 1, again.stderr
                    refused += 1
                    break
                assert done.returncode == 0, (name, flags, done.stderr)
                jobs[name] = submitted_id(done.stdout).partition("_")[0]
            if len(jobs) < 2:
                continue
            for name, job in jobs.items():
                queued = slurm(restbed, "scontrol", "write", "batch_script", job, "-")
                assert queued == rendered.stdout, (name, flags)
            assert shown_fields(restbed, jobs["rest"]) == shown_fields(restbed, jobs["cli"]), (
                " ".join(flags)
            )
            compared += 1
    finally:
        subprocess.run(
            ["scancel", "-u", pwd.getpwuid(os.getuid()).pw_name],
            env=env, capture_output=True, timeout=60, check=False,
        )  # fmt: skip
    assert compared == wanted


def test_controller_rpcs_short_mode_follows_an_array_over_rest(
    restbed: SideBed, tmp_path: Path
) -> None:
    out = tmp_path / "rpcs.json"
    env = slurm_env({"SLURM_CONF": str(restbed.slurm_conf)})
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            "HPCDIST_SLURMRESTD": restbed.exports["HPCDIST_SLURMRESTD"],
            "SLURM_JWT": auth(restbed, lifespan=3600)["X-SLURM-USER-TOKEN"],
        }
    )
    argv = ["--rest-only", "--tasks", "4", "--status-every", "2", "--timeout", "300"]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.controller_rpcs", *argv, "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rest = json.loads(out.read_text())["rest"]
    assert sorted(rest["ends_s"]) == ["waiter", "watchers"]
    assert rest["calls"] == {}  # hpcdist's followers ran no SLURM command
    assert rest["controller_queries"].get("REQUEST_JOB_INFO_SINGLE", 0) >= 1, rest
    assert "| hpcdist over slurmrestd: submit --wait + 10 watchers |" in proc.stdout
