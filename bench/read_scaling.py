"""Reading a series in shares: 1 rank reading every file against N ranks each reading its own.

    python3 -m bench.read_scaling --work /tmp/readscale --grid 1440x1080 --days 30 \\
        --ranks 4 --repeats 3 --out OUT

The daily files of ``make-data --days`` are written first into WORK/days (untimed, kept
for the next run) and read once whole, so the page cache is warm for every case alike.
Each reader is a process of its own, as a rank is (``python -m bench.read_scaling
worker``): it imports netCDF4 and the reader, says it is ready, waits for the start signal
and times ``load_dataset(files, share=(rank, N))`` alone. Cases, each ``--repeats`` times
(the best is kept):

- ``1 rank``: one process reads every file (``share=(0, 1)``);
- ``N together``: N processes started together, one per share: the phase ends with the
  slowest share, which is what a training waits for;
- ``share r alone``: each share read with nothing else running (the reference: N shares
  together should each take about as long as alone).

``--code DIR`` reads with the ``ufsemulator`` of another checkout (DIR on the workers'
PYTHONPATH), to set a version's reader beside another's on the same files. A table goes to
stdout and OUT/read_scaling.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def worker(argv: list[str]) -> int:
    """One reader: ready, wait for a line on stdin, read the share, print its numbers."""
    parser = argparse.ArgumentParser(prog="bench.read_scaling worker")
    parser.add_argument("--data", required=True)
    parser.add_argument("--share", required=True, help="RANK/WORLD")
    args = parser.parse_args(argv)
    rank, world = (int(v) for v in args.share.split("/"))
    import netCDF4  # noqa: F401  (start-up, not reading: a rank imports it while torch starts)

    from ufsemulator.data.read import load_dataset

    print("ready", flush=True)
    sys.stdin.readline()
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    dataset = load_dataset(args.data, share=(rank, world))
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    result = {
        "rank": rank,
        "world": world,
        "seconds": seconds,
        "rows": len(dataset),
        "mb": dataset.bytes_read / 1e6,
        "cpu_s": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
        "page_faults": after.ru_minflt - before.ru_minflt,
        "code": str(Path(sys.modules["ufsemulator"].__file__ or "").parent.parent),
    }
    print(json.dumps(result), flush=True)
    return 0


def read_together(data: str, shares: list[tuple[int, int]], env: dict[str, str]) -> list[dict]:
    """Start one worker per share, wait until all are ready, start them at once; their
    results in share order."""
    # A script, not -m: the working folder must not come before --code on sys.path.
    command = [sys.executable, str(Path(__file__).resolve()), "worker", "--data", data]
    procs = [
        subprocess.Popen(
            [*command, "--share", f"{rank}/{world}"],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank, world in shares
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"a reader did not start: {line!r} (exit {proc.wait()})")
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = []
        for proc in procs:
            out, _ = proc.communicate(timeout=600)
            if proc.returncode != 0:
                raise RuntimeError(f"a reader failed (exit {proc.returncode}): {out[-500:]}")
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()


def _files(args: argparse.Namespace) -> str:
    """The files' glob; written first where missing (untimed), then read once (warm)."""
    from ufsemulator.data.makedays import day_paths, parse_grid, write_days

    folder = args.work / "days"
    ni, nj = parse_grid(args.grid)
    paths = day_paths(folder, args.days)
    stamp = folder / "grid.txt"
    if not (stamp.is_file() and stamp.read_text() == args.grid) or not all(
        p.is_file() for p in paths
    ):
        for old in folder.glob("iceh.*.nc"):
            old.unlink()
        written = write_days(folder, ni, nj, args.days)
        stamp.write_text(args.grid)
        print(
            f"make-data: {len(written.paths)} files, {written.bytes / 1e6:.0f} MB in "
            f"{written.seconds:.1f} s (untimed)",
            flush=True,
        )
    for path in paths:  # the page cache, warm for every case alike
        with open(path, "rb") as handle:
            while handle.read(1 << 24):
                pass
    return str(folder / "iceh.*.nc")


def _best(runs: list[list[dict]]) -> list[dict]:
    """Of repeated runs of the same shares, the one whose slowest share was fastest."""
    return min(runs, key=lambda results: max(r["seconds"] for r in results))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        return worker(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/readscale"))
    parser.add_argument("--grid", default="1440x1080")
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--code", type=Path, default=None, help="another checkout's reader")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.ranks < 1 or args.repeats < 1:
        parser.error(f"--ranks and --repeats must be >= 1, got {args.ranks}, {args.repeats}")
    data = _files(args)
    env = dict(os.environ)
    code = str(args.code.resolve()) if args.code is not None else str(REPO)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (code, env.get("PYTHONPATH")) if p)
    n = args.ranks
    whole = _best([read_together(data, [(0, 1)], env) for _ in range(args.repeats)])[0]
    together = _best(
        [read_together(data, [(r, n) for r in range(n)], env) for _ in range(args.repeats)]
    )
    alone = [
        _best([read_together(data, [(r, n)], env) for _ in range(args.repeats)])[0]
        for r in range(n)
    ]
    slowest = max(r["seconds"] for r in together)
    ratio = whole["seconds"] / slowest
    print(
        f"\nreading {args.days} daily {args.grid} files, {n} ranks, best of {args.repeats}, "
        f"reader of {whole['code']}"
    )
    print(f"{'case':18s} {'seconds':>8s} {'CPU s':>7s} {'MB':>7s} {'rows':>9s} {'faults':>8s}")

    def row(name: str, r: dict) -> None:
        print(
            f"{name:18s} {r['seconds']:8.3f} {r['cpu_s']:7.3f} {r['mb']:7.0f} {r['rows']:9d} "
            f"{r['page_faults']:8d}"
        )

    row("1 rank, all", whole)
    for r in together:
        row(f"share {r['rank']}, together", r)
    for r in alone:
        row(f"share {r['rank']}, alone", r)
    alone_max = max(r["seconds"] for r in alone)
    print(
        f"{n} together vs 1 rank: {ratio:.2f}x faster (slowest share {slowest:.3f} s; "
        f"alone the slowest takes {alone_max:.3f} s, ideal {whole['seconds'] / n:.3f} s)"
    )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        report: dict[str, Any] = {
            "args": {k: str(v) for k, v in vars(args).items()},
            "whole": whole,
            "together": together,
            "alone": alone,
            "speedup": ratio,
        }
        (args.out / "read_scaling.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
