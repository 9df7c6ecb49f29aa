"""CLI speed: ``hpcdist render`` wall time, its import-time profile, node-list expansion.

    python3 -m bench.bench_cli --runs 20 --json cli.json

- ``hpcdist render --mode gloo --nodes 4`` run ``--runs`` times as a subprocess, through
  the installed console script and through ``python3 -m hpcdist.cli.main`` (one untimed run
  of each first), in turns with ``python3 -c 'import click, jinja2, yaml'`` (render's own
  dependencies); median, min and max wall time. Targets: median <= 0.3 s, and the console
  script's median <= 2x that of importing its three dependencies, in the same run.
- ``import hpcdist.distributed`` alone (what each rank imports before torch), the same way.
- ``python3 -X importtime`` of the same command: the modules that cost the most.
- ``expand_nodelist`` of 10,000-host lists in four shapes; median of ``--repeats``.
  Target: <= 10 ms.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.report import machine, table, write_json
from hpcdist.slurm.nodelist import expand_nodelist

RENDER_ARGS = ("render", "--mode", "gloo", "--nodes", "4")
RENDER_TARGET_S = 0.3
RENDER_TARGET_RATIO = 2.0  # render against importing click, jinja2 and yaml, same run
DEPENDENCIES = "python3 -c 'import click, jinja2, yaml'"
NODELIST_TARGET_MS = 10.0

NODELISTS: dict[str, str] = {
    "one range node[00001-10000]": "node[00001-10000]",
    "10,000 plain names": ",".join(f"n{i:05d}" for i in range(1, 10001)),
    "10,000 single numbers in one bracket": "n[" + ",".join(str(2 * i) for i in range(10000)) + "]",
    "mixed: gpu-[..],cpu[..],rack[1-20]-node[001-250]": (
        "gpu-[0001-2500],cpu[1-2500],rack[1-20]-node[001-250]"
    ),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python3 -m bench.bench_cli",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--runs", type=int, default=20, help="render runs per way (20)")
    p.add_argument("--repeats", type=int, default=50, help="expand_nodelist repeats (50)")
    p.add_argument("--top", type=int, default=12, help="import-time entries shown (12)")
    p.add_argument("--json", type=Path, help="write the results here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    report: dict[str, Any] = {"machine": machine()}
    host = report["machine"]
    print(
        f"Machine: {host['cpu']}, {host['cpus']} CPUs, load {host.get('loadavg', '?')}, "
        f"{host['date']}\n"
    )

    report["render"] = _render(args.runs)
    print(
        table(
            ["command", "runs", "median s", "min s", "max s", f"<= {RENDER_TARGET_S} s"],
            [
                [
                    r["command"],
                    str(r["runs"]),
                    f"{r['median_s']:.3f}",
                    f"{r['min_s']:.3f}",
                    f"{r['max_s']:.3f}",
                    "yes" if r["median_s"] <= RENDER_TARGET_S else "no",
                ]
                for r in report["render"]
            ],
        )
    )

    medians = {r["command"]: r["median_s"] for r in report["render"]}
    render_label = next(label for label in medians if label.endswith(" ".join(RENDER_ARGS)))
    ratio = medians[render_label] / medians[DEPENDENCIES]
    report["render_ratio"] = {"command": render_label, "against": DEPENDENCIES, "ratio": ratio}
    verdict = "met" if ratio <= RENDER_TARGET_RATIO else "missed"
    print(
        f"\n`{render_label}` / `{DEPENDENCIES}`: {ratio:.2f}x "
        f"(target <= {RENDER_TARGET_RATIO:g}x: {verdict})"
    )

    report["importtime"] = _importtime(args.top)
    imp = report["importtime"]
    print(
        f"\nImport time of `python3 -X importtime -m hpcdist.cli.main {' '.join(RENDER_ARGS)}`: "
        f"{imp['total_ms']:.0f} ms in all top-level imports; largest cumulative:\n"
    )
    print(
        table(
            ["module", "cumulative ms", "self ms"],
            [[e["module"], f"{e['cumulative_ms']:.1f}", f"{e['self_ms']:.1f}"] for e in imp["top"]],
        )
    )

    report["nodelist"] = _nodelists(args.repeats)
    print(f"\nexpand_nodelist, median of {args.repeats}:\n")
    print(
        table(
            ["node list", "hosts", "median ms", "max ms", f"<= {NODELIST_TARGET_MS:g} ms"],
            [
                [
                    r["shape"],
                    str(r["hosts"]),
                    f"{r['median_ms']:.2f}",
                    f"{r['max_ms']:.2f}",
                    "yes" if r["median_ms"] <= NODELIST_TARGET_MS else "no",
                ]
                for r in report["nodelist"]
            ],
        )
    )
    if args.json is not None:
        write_json(args.json, report)
    return 0


def _render(runs: int) -> list[dict[str, Any]]:
    ways: list[tuple[str, list[str]]] = [
        (
            "python3 -m hpcdist.cli.main " + " ".join(RENDER_ARGS),
            [sys.executable, "-m", "hpcdist.cli.main", *RENDER_ARGS],
        ),
        # What every rank imports before torch: the contract without torch.
        (
            "python3 -c 'import hpcdist.distributed'",
            [sys.executable, "-c", "from hpcdist.distributed import setup_distributed"],
        ),
        # render's own dependencies: the floor its import time is measured against.
        (DEPENDENCIES, [sys.executable, "-c", "import click, jinja2, yaml"]),
    ]
    script = shutil.which("hpcdist")
    if script is not None:
        ways.insert(0, ("hpcdist " + " ".join(RENDER_ARGS), [script, *RENDER_ARGS]))
    else:
        print("note: no hpcdist console script on PATH (pip install -e .); module only")
    for _, argv in ways:
        _wall(argv)  # untimed: fills the page cache
    # In turns, so that a busy moment of the machine falls on every way alike.
    timed: dict[str, list[float]] = {label: [] for label, _ in ways}
    for _ in range(runs):
        for label, argv in ways:
            timed[label].append(_wall(argv))
    results = []
    for label, argv in ways:
        times = timed[label]
        results.append(
            {
                "command": label,
                "argv": argv,
                "runs": runs,
                "median_s": statistics.median(times),
                "min_s": min(times),
                "max_s": max(times),
                "times_s": times,
            }
        )
    return results


def _wall(argv: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(argv)} exited {proc.returncode}: {proc.stderr[-500:]}")
    return elapsed


def _importtime(top: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "hpcdist.cli.main", *RENDER_ARGS],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    entries: list[dict[str, Any]] = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "imported package" in line:
            continue
        self_us, cumulative_us, name = line.removeprefix("import time:").split("|", 2)
        name = name.rstrip().removeprefix(" ")  # then two spaces per level of nesting
        entries.append(
            {
                "module": name,
                "self_ms": int(self_us) / 1e3,
                "cumulative_ms": int(cumulative_us) / 1e3,
            }
        )
    # Top-level imports are the names without indentation; nested ones are counted in them.
    total = sum(e["cumulative_ms"] for e in entries if not e["module"].startswith("  "))
    ranked = sorted(entries, key=lambda e: -e["cumulative_ms"])[:top]
    return {"total_ms": total, "top": ranked, "modules": len(entries)}


def _nodelists(repeats: int) -> list[dict[str, Any]]:
    results = []
    for shape, nodelist in NODELISTS.items():
        hosts = expand_nodelist(nodelist)  # also the warm-up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            expand_nodelist(nodelist)
            times.append(1e3 * (time.perf_counter() - start))
        results.append(
            {
                "shape": shape,
                "hosts": len(hosts),
                "chars": len(nodelist),
                "median_ms": statistics.median(times),
                "max_ms": max(times),
            }
        )
    return results


if __name__ == "__main__":
    sys.exit(main())
