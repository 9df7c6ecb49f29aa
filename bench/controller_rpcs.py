"""How hard following a job array leans on SLURM: query RPCs a minute for hpcdist's followers
(one waiter as ``hpcdist submit --wait`` follows an array, and ten watchers beside it) against
submitit's own watcher following the same array, in one run.

    python3 -m bench.controller_rpcs                          # 1,000 tasks of `true`
    python3 -m bench.controller_rpcs --tasks 1000 --at-once 4 # a gentler rate for a small host
    python3 -m bench.controller_rpcs --tasks 6 --json out.json   # CI's short mode
    python3 -m bench.controller_rpcs --rest    # then the same followers over slurmrestd
    python3 -m bench.controller_rpcs --rest-only --tasks 4 # over slurmrestd alone (no sacct)

Needs a SLURM cluster this user may reset the statistics of (root on the testbed:
``sdiag --reset``, ``sacctmgr clear stats``). One ``sbatch --array=0-N-1 --wrap true``, then,
all at once until every task has ended:

- ``submit --wait``: a process running what ``hpcdist submit --wait`` runs for an array
  (``hpcdist.jobs.arrays.wait_for_tasks``);
- 10 watchers: 5 ``hpcdist logs <task> --follow`` (tasks spread over the array) and 5 loops
  of ``hpcdist status <array>`` every ``--status-every`` seconds (``watch hpcdist status``);
- submitit's watcher: a handle per task (``submitit.SlurmJob``), polled as ``job.done()``
  is, every second, until all are done (its watcher asks ``sacct`` for the array).

With ``--rest`` (slurmrestd at ``$HPCDIST_SLURMRESTD``; a token of ``scontrol token`` unless
``SLURM_JWT`` is set), a second array of the same size is then followed by the same waiter
and watchers with ``HPCDIST_TRANSPORT=rest``: the daemon asks the controller for them, and
its RPCs are counted the same way (statistics reset between the two).

Counted: the controller's query RPCs from ``sdiag`` (messages of the query types: job,
partition, node, federation and configuration information; not the submission, not the
daemons' own traffic); slurmdbd's from ``sacctmgr show stats`` (``DBD_GET_JOBS_COND``, one
per sacct call, each with its connection's init and fini messages). hpcdist's processes
and submitit's run the SLURM clients through a counting wrapper on PATH, so each
``sacct`` call is told to one or the other (the controller is asked only by hpcdist's).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

# The controller's RPCs that only read (sdiag's message types).
QUERY_TYPES = (
    "REQUEST_JOB_INFO",
    "REQUEST_JOB_INFO_SINGLE",
    "REQUEST_JOB_USER_INFO",
    "REQUEST_JOB_STEP_INFO",
    "REQUEST_PARTITION_INFO",
    "REQUEST_NODE_INFO",
    "REQUEST_FED_INFO",
    "REQUEST_BUILD_INFO",
    "REQUEST_JOB_ARRAY_INFO",
)
DBD_QUERY = "DBD_GET_JOBS_COND"
DBD_CONNECTION = ("SLURM_PERSIST_INIT", "DBD_FINI")
TOOLS = ("squeue", "sacct", "scontrol", "sinfo")
TARGET_PER_MIN = 12.0

_WAITER = """
import sys
from hpcdist.jobs.arrays import wait_for_tasks
wait_for_tasks(sys.argv[1], int(sys.argv[2]), lambda task, state: None)
"""
_STATUS_LOOP = """
import re, subprocess, sys, time
array, every = sys.argv[1], float(sys.argv[2])
waiting = re.compile(r"\\b(PENDING|RUNNING|REQUEUED|CONFIGURING|COMPLETING|SUSPENDED)\\b")
while True:
    shown = subprocess.run([sys.executable, "-m", "hpcdist.cli.main", "status", array],
                           capture_output=True, text=True).stdout
    if shown and not waiting.search(shown):
        break
    time.sleep(every)
"""
_SUBMITIT = """
import sys, time
import submitit
folder, array, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
jobs = [submitit.SlurmJob(folder=folder, job_id=f"{array}_{i}") for i in range(count)]
while not all(job.done() for job in jobs):
    time.sleep(1)
"""


def stat_counts(text: str) -> Counter[str]:
    """``NAME (code) count:N`` lines of sdiag or sacctmgr show stats, by message type."""
    section = text.split("by user")[0]
    return Counter(
        {
            m[1]: int(m[2])
            for m in re.finditer(r"^\s*(\w+)\s+\(\s*\d+\)\s+count:(\d+)", section, re.M)
        }
    )


def read_stats() -> tuple[Counter[str], Counter[str]]:
    ctld = subprocess.run(["sdiag"], capture_output=True, text=True, check=True).stdout
    dbd = subprocess.run(["sacctmgr", "show", "stats"], capture_output=True, text=True).stdout
    return stat_counts(ctld), stat_counts(dbd)


def reset_stats() -> None:
    subprocess.run(["sdiag", "--reset"], capture_output=True, check=True)
    subprocess.run(["sacctmgr", "-i", "clear", "stats"], capture_output=True, check=False)


def wrappers(folder: Path) -> Path:
    """SLURM's clients behind a wrapper that notes who called them ($BENCH_WHO)."""
    folder.mkdir(parents=True)
    for tool in TOOLS:
        real = shutil.which(tool)
        if real is None:
            continue
        (folder / tool).write_text(
            f'#!/bin/sh\necho "${{BENCH_WHO:-other}} {tool}" >> {folder}/calls\nexec {real} "$@"\n'
        )
        (folder / tool).chmod(0o755)
    return folder


def submit_array(tasks: int, at_once: int | None, folder: Path) -> str:
    limit = f"%{at_once}" if at_once else ""
    proc = subprocess.run(
        [
            "sbatch",
            "--parsable",
            f"--array=0-{tasks - 1}{limit}",
            "-J",
            "bench-true",
            "-o",
            str(folder / "true-%A_%a.out"),
            "--wrap",
            "true",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=folder,
    )
    return proc.stdout.strip().split(";")[0]


def start_followers(
    array: str, tasks: int, env: dict[str, str], folder: Path, status_every: float
) -> dict[str, list[subprocess.Popen[bytes]]]:
    py, cli = sys.executable, [sys.executable, "-m", "hpcdist.cli.main"]
    hp = {**env, "BENCH_WHO": "hpcdist"}
    quiet: dict[str, Any] = {
        "stdout": subprocess.DEVNULL,
        "stderr": subprocess.DEVNULL,
        "cwd": folder,
    }
    picks = sorted({round(i * (tasks - 1) / 4) for i in range(5)})
    watchers = [
        subprocess.Popen([*cli, "logs", f"{array}_{k}", "--follow"], env=hp, **quiet) for k in picks
    ]
    watchers += [
        subprocess.Popen([py, "-c", _STATUS_LOOP, array, str(status_every)], env=hp, **quiet)
        for _ in range(10 - len(watchers))
    ]
    waiter = subprocess.Popen([py, "-c", _WAITER, array, str(tasks)], env=hp, **quiet)
    sub = {**env, "BENCH_WHO": "submitit"}
    submitit_proc = subprocess.Popen(
        [py, "-c", _SUBMITIT, str(folder / "submitit"), array, str(tasks)], env=sub, **quiet
    )
    return {"waiter": [waiter], "watchers": watchers, "submitit": [submitit_proc]}


def rest_env(env: dict[str, str]) -> dict[str, str]:
    """The followers' environment over slurmrestd: the transport, the daemon, a token."""
    if not env.get("HPCDIST_SLURMRESTD"):
        raise SystemExit(
            "--rest: HPCDIST_SLURMRESTD is not set (scripts/slurm-testbed up prints it)"
        )
    token = env.get("SLURM_JWT", "")
    if not token:
        printed = subprocess.run(
            ["scontrol", "token", "lifespan=7200"], capture_output=True, text=True, check=True
        ).stdout.strip()
        token = printed.removeprefix("SLURM_JWT=")
    return {**env, "HPCDIST_TRANSPORT": "rest", "SLURM_JWT": token}


def run(
    tasks: int,
    at_once: int | None,
    status_every: float,
    timeout_s: float,
    transport: str = "cli",
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="hpcdist-rpcs-") as tmp:
        folder = Path(tmp)
        shims = wrappers(folder / "bin")
        env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}"}
        env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
        env["HPCDIST_HOME"] = str(folder / "state")
        if transport == "rest":
            env = rest_env(env)
        reset_stats()
        start = time.monotonic()
        array = submit_array(tasks, at_once, folder)
        procs = start_followers(array, tasks, env, folder, status_every)
        if transport == "rest":  # submitit has no REST client: its watcher is the CLI phase's
            procs["submitit"][0].kill()
            del procs["submitit"]
        ends: dict[str, float] = {}
        while len(ends) < len(procs) and time.monotonic() - start < timeout_s:
            for name, group in procs.items():
                if name not in ends and all(p.poll() is not None for p in group):
                    ends[name] = time.monotonic() - start
            time.sleep(0.5)
        for group in procs.values():
            for proc in group:
                if proc.poll() is None:
                    proc.kill()
        ctld, dbd = read_stats()
        calls = (
            Counter((folder / "bin" / "calls").read_text().split("\n"))
            if (folder / "bin" / "calls").exists()
            else Counter()
        )
        subprocess.run(["scancel", array], capture_output=True)
    result = summarise(tasks, at_once, ends, ctld, dbd, calls, time.monotonic() - start)
    return {**result, "transport": transport}


def summarise(
    tasks: int,
    at_once: int | None,
    ends: dict[str, float],
    ctld: Counter[str],
    dbd: Counter[str],
    calls: Counter[str],
    wall_s: float,
) -> dict[str, Any]:
    minutes = max(ends.values(), default=wall_s) / 60.0
    ctld_queries = sum(ctld[name] for name in QUERY_TYPES)
    hp_sacct, sub_sacct = calls["hpcdist sacct"], calls["submitit sacct"]
    # Each sacct call: one query at slurmdbd, inside a connection's init and fini.
    hpcdist_rpcs = ctld_queries + hp_sacct
    submitit_rpcs = sub_sacct
    return {
        "tasks": tasks,
        "at_once": at_once,
        "minutes": minutes,
        "ends_s": ends,
        "controller_queries": {name: ctld[name] for name in QUERY_TYPES if ctld[name]},
        "dbd_queries": dbd[DBD_QUERY],
        "dbd_connection_messages": sum(dbd[name] for name in DBD_CONNECTION),
        "calls": {key: n for key, n in calls.items() if key},
        "hpcdist_rpcs": hpcdist_rpcs,
        "submitit_rpcs": submitit_rpcs,
        "hpcdist_per_min": hpcdist_rpcs / minutes,
        "submitit_per_min": submitit_rpcs / minutes,
        "dbd_checked": dbd[DBD_QUERY] == hp_sacct + sub_sacct,
    }


def rest_row(rest: dict[str, Any], submitit_per_min: float) -> list[str]:
    """The REST phase's line: the controller's queries (the daemon's on hpcdist's behalf)
    and slurmdbd's (the daemon's database paths), against submitit's watcher of the CLI
    phase."""
    rpcs = sum(rest["controller_queries"].values()) + rest["dbd_queries"]
    per_min = rpcs / rest["minutes"]
    ratio = per_min / submitit_per_min if submitit_per_min else float("inf")
    return [
        f"| hpcdist over slurmrestd: submit --wait + 10 watchers | {rpcs} | {per_min:.1f} | "
        f"{ratio:.2f} | <= {TARGET_PER_MIN:.0f}/min |",
        "",
        f"over slurmrestd, {rest['minutes']:.1f} min to the last end: controller queries "
        f"{rest['controller_queries']}; slurmdbd: {rest['dbd_queries']} queries; client calls "
        f"(none expected): {rest['calls']}",
    ]


def table(result: dict[str, Any] | None, rest: dict[str, Any] | None = None) -> str:
    if result is None:  # --rest-only
        assert rest is not None
        return "\n".join(
            [
                f"array of {rest['tasks']} tasks of `true`",
                "",
                "| who | query RPCs | per minute | x submitit's watcher | target |",
                "|---|---|---|---|---|",
                *rest_row(rest, 0.0),
            ]
        )
    hp, sub = result["hpcdist_per_min"], result["submitit_per_min"]
    lines = [
        f"array of {result['tasks']} tasks of `true`"
        + (f", at most {result['at_once']} at once" if result["at_once"] else "")
        + f": {result['minutes']:.1f} min to the last end",
        "",
        "| who | query RPCs | per minute | x submitit's watcher | target |",
        "|---|---|---|---|---|",
        f"| hpcdist: submit --wait + 10 watchers | {result['hpcdist_rpcs']} | {hp:.1f} | "
        f"{hp / sub if sub else float('inf'):.2f} | <= {TARGET_PER_MIN:.0f}/min, < submitit |",
        f"| submitit's watcher alone | {result['submitit_rpcs']} | {sub:.1f} | 1.00 | |",
        "",
        f"controller queries: {result['controller_queries']}; slurmdbd: {result['dbd_queries']} "
        f"queries (+{result['dbd_connection_messages']} connection messages); "
        f"client calls: {result['calls']}",
    ]
    if rest is not None:
        lines[5:5] = rest_row(rest, sub)[:1]
        lines += rest_row(rest, sub)[1:]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--at-once", type=int, default=None, help="the array's %%K")
    parser.add_argument("--status-every", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--rest", action="store_true", help="also follow over slurmrestd")
    parser.add_argument("--rest-only", action="store_true", help="only over slurmrestd")
    args = parser.parse_args(argv)
    timing = (args.tasks, args.at_once, args.status_every, args.timeout)
    result = None if args.rest_only else run(*timing)
    rest = run(*timing, "rest") if args.rest or args.rest_only else None
    print(table(result, rest))
    if args.json is not None:
        payload = {**(result or {}), **({"rest": rest} if rest else {})}
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
