"""Sweeps of thousands: render, submit (held), status and report of an N-point sweep, beside
the same steps at N/10 points in the same run (their ratio per point says whether a step
grows faster than the sweep).

    python3 -m bench.sweep_scale                     # 10,000 points on this machine's SLURM
    python3 -m bench.sweep_scale --points 40 --fake-slurm --json out.json   # CI's short mode

Each step is the command a user types, timed from its start to its exit (the interpreter's
start-up included): ``hpcdist render --sweep training.seed=0,...,N-1``; ``hpcdist submit``
of the same sweep with ``--sbatch hold`` (so nothing runs: the arrays are cancelled after;
its preflight ``sbatch --test-only`` included), split into as many arrays as the site's
MaxArraySize requires; ``hpcdist status`` of the sweep (the count of tasks in each state);
``hpcdist report`` once every point has a ``training_results.json`` (written here, with
its digest, as the training writes it). ``--fake-slurm`` puts stand-in sbatch, squeue,
scontrol (``MaxArraySize = --max-array-size``; the jobs of ``show job``), sacct and scancel
on PATH: no cluster needed, nothing timed of SLURM's own.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

TARGETS_S = {"render + submit": 10.0, "report": 2.0, "status": 1.0}
HPCDIST = [sys.executable, "-m", "hpcdist.cli.main"]

# The stand-in tools: each sbatch notes its array as one record of pending tasks, as the
# controller keeps them; ``scontrol show job [N]`` prints them (hpcdist.slurm.userjobs reads them).
_FAKE_SBATCH = r"""#!/bin/bash
state="$(dirname "$0")/state"
for arg in "$@"; do [ "$arg" = --test-only ] && { echo "sbatch: would run" >&2; exit 0; }; done
script="${@: -1}"
range="$(printf '%s\n' "$@" | sed -n 's/^--array=0-\([0-9]*\).*/\1/p')"
[ -n "$range" ] || range="$(sed -n 's/^#SBATCH --array="\{0,1\}0-\([0-9]*\).*/\1/p' "$script")"
id=$(( $(cat "$state/next" 2>/dev/null || echo 700000) ))
echo $((id + 1)) > "$state/next"
now="$(date +%Y-%m-%dT%H:%M:%S)"
printf 'JobId=%s ArrayJobId=%s ArrayTaskId=0-%s JobName=sweep UserId=me(%s) JobState=PENDING ' \
  "$id" "$id" "${range:-0}" "$(id -u)" >> "$state/jobs"
printf 'Reason=JobHeldUser Dependency=(null) Restarts=0 ExitCode=0:0 RunTime=00:00:00 ' \
  >> "$state/jobs"
printf 'TimeLimit=UNLIMITED SubmitTime=%s StartTime=Unknown EndTime=Unknown NodeList= ' \
  "$now" >> "$state/jobs"
printf 'NumNodes=1 WorkDir=%s StdErr=/dev/null StdOut=/dev/null\n' "$PWD" >> "$state/jobs"
echo "Submitted batch job $id"
"""
_FAKE_SCONTROL = """#!/bin/sh
for last; do :; done
case "$*" in
  *"show job "*) grep "^JobId=$last " "$(dirname "$0")/state/jobs" ;;
  *"show job"*) cat "$(dirname "$0")/state/jobs" 2>/dev/null ;;
  *) echo 'MaxArraySize = {max_array_size}'; echo 'MaxJobCount = 99999' ;;
esac
exit 0
"""


def fake_slurm(folder: Path, max_array_size: int) -> Path:
    """A folder of stand-in SLURM tools (put it first on PATH)."""
    (folder / "state").mkdir(parents=True)
    tools = {
        "sbatch": _FAKE_SBATCH,
        "squeue": "#!/bin/sh\nexit 0\n",
        "scontrol": _FAKE_SCONTROL.replace("{max_array_size}", str(max_array_size)),
        "sacct": "#!/bin/sh\nexit 0\n",
        "scancel": "#!/bin/sh\nexit 0\n",
        "srun": "#!/bin/sh\nexit 0\n",
        "sinfo": "#!/bin/sh\necho debug\n",
    }
    for name, text in tools.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


def timed(argv: Sequence[str], cwd: Path, env: dict[str, str]) -> tuple[float, str]:
    """Seconds an hpcdist command took, and what it printed; a failure stops the bench."""
    start = time.perf_counter()
    proc = subprocess.run([*HPCDIST, *argv], cwd=cwd, env=env, capture_output=True, text=True)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"hpcdist {' '.join(argv[:2])} failed:\n{proc.stdout}\n{proc.stderr}")
    return took, proc.stdout


def write_results(project: Path, sweep_id: str) -> int:
    """A training_results.json in every point's run folder, with its digest (as the
    training records it): what report reads."""
    from hpcdist.jobs.records import load_record
    from hpcdist.jobs.report import task_ids
    from hpcdist.state.outputs import book_for, write_output

    record = load_record(sweep_id, project)
    book = book_for(project)
    tasks = task_ids(record)
    for number, (task, _) in enumerate(tasks):
        curve = [1.0 / (1 + epoch + number % 7) for epoch in range(5)]
        data = {
            "best_val_loss": min(curve),
            "best_val_r2": 0.9,
            "epochs_run": 5,
            "wall_time_s": 3.0,
            "history": {"val_loss": curve},
        }
        path = project / "runs" / task / "training_results.json"
        path.parent.mkdir(parents=True)
        write_output(path, json.dumps(data).encode(), book)
    return len(tasks)


def one_size(points: int, env: dict[str, str], work: Path) -> dict[str, Any]:
    """Every step at one sweep size, in a fresh project folder."""
    project = work / f"sweep-{points}"
    project.mkdir()
    sweep = ["--sweep", "training.seed=" + ",".join(str(i) for i in range(points))]
    shape = ["--mode", "threads", "--sbatch", "hold", *sweep]
    render_s, script = timed(["render", *shape], project, env)
    submit_s, said = timed(["submit", *shape], project, env)
    sweep_id = re.findall(r"Submitted job (\d+)", said)[0]
    arrays = len(re.findall(r"^    \d+: points", said, re.MULTILINE)) or 1
    status_s, status = timed(["status", sweep_id], project, env)
    written = write_results(project, sweep_id)
    report_s, report = timed(["report", sweep_id], project, env)
    timed(["cancel", sweep_id], project, env)
    return {
        "points": points,
        "arrays": arrays,
        "script_bytes": len(script.encode()),
        "render_s": render_s,
        "submit_s": submit_s,
        "status_s": status_s,
        "report_s": report_s,
        "results": written,
        "status_head": status.splitlines()[0] if status else "",
        "report_rows": len(re.findall(r"^[* ]\s*\d+_\d+ ", report, re.MULTILINE)),
    }


def table(small: dict[str, Any], big: dict[str, Any]) -> str:
    ratio = big["points"] / small["points"]
    rows = [
        ("render", "render_s", None),
        ("submit (held)", "submit_s", None),
        ("render + submit", None, "render + submit"),
        ("status", "status_s", "status"),
        ("report", "report_s", "report"),
    ]
    lines = [
        f"| step | {small['points']} points s | {big['points']} points s | "
        f"x per point ({ratio:.0f}x points) | target s |",
        "|---|---|---|---|---|",
    ]
    for label, key, target in rows:
        a = small[key] if key else small["render_s"] + small["submit_s"]
        b = big[key] if key else big["render_s"] + big["submit_s"]
        goal = f"<= {TARGETS_S[target]:.0f}" if target else ""
        lines.append(f"| {label} | {a:.2f} | {b:.2f} | {b / a / ratio:.2f} | {goal} |")
    lines.append(
        f"\n{big['points']} points: {big['arrays']} arrays, script {big['script_bytes']} bytes; "
        f"status: {big['status_head']}; report: {big['report_rows']} rows"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=10_000)
    parser.add_argument("--fake-slurm", action="store_true", help="stand-in SLURM tools")
    parser.add_argument("--max-array-size", type=int, default=1001, help="with --fake-slurm")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hpcdist-sweep-") as tmp:
        work = Path(tmp)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1])])
        if args.fake_slurm:
            env["PATH"] = f"{fake_slurm(work / 'bin', args.max_array_size)}:{env['PATH']}"
            env["SLURM_CONF"] = str(work / "bin" / "slurm.conf")  # a view of its own
        small = one_size(max(2, args.points // 10), env, work)
        big = one_size(args.points, env, work)
    print(table(small, big))
    if args.json is not None:
        args.json.write_text(json.dumps({"small": small, "big": big}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
