"""C++ call costs of the two export paths: TorchScript (model.pt) and AOTInductor (model.pt2).

Builds examples/cxx, exports a model of the default size (14-64-64-64-1, GELU, JEDI names)
both ways, and runs the C++ example ``--runs`` times (each a fresh process, so each has a
first call) on ``--rows`` rows at each of ``--threads`` (default 1 and 2 intra-op threads).
Per path and thread count it prints the load time, the first call and the median of later
calls of ``jac_physical`` and ``predict``, the AOTI Jacobian against TorchScript's, and
each path's Jacobian at more threads against one (above 1: slower with more threads).

    python -m bench.export_paths                      # 10,000 rows, 1 and 2 threads, 5 runs
    python -m bench.export_paths --short              # CI: small model, 1,000 rows, 1 process
    python -m bench.export_paths --binary B --model M.pt --aoti M.pt2   # reuse artifacts
    python -m bench.export_paths --work DIR --rows 100000   # build and export into DIR once
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "cxx"
KEYS = ("first_jacobian_ms", "jacobian_ms", "first_predict_ms", "predict_ms")


def build_example(build: Path) -> Path:
    """cmake configure and build of examples/cxx in ``build``; the binary's path."""
    import torch.utils

    cmake = shutil.which("cmake")
    if cmake is None:
        raise SystemExit("error: the benchmark needs cmake and a C++17 compiler")
    configure = [cmake, "-S", str(EXAMPLE), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release"]
    configure.append(f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}")
    subprocess.run(configure, check=True, capture_output=True, text=True)
    subprocess.run([cmake, "--build", str(build), "-j", "2"], check=True, capture_output=True)
    return build / "emulator_jacobian"


def seeded_model(hidden: tuple[int, ...]) -> Any:
    """A seeded model of ``hidden`` widths with realistic normalisation and ranges."""
    import torch

    from ufsemulator.model.emulator import EmulatorMLP, ModelConfig
    from ufsemulator.model.normalization import Stats

    torch.manual_seed(0)
    model = EmulatorMLP(ModelConfig(hidden=hidden))
    mean = [-1.0, 33.0, -15.0, -12.0, 1.5, 0.2, 4.0, 0.0, 0.0, 2.0, 0.0, 1.5, 250.0, 30.0]
    std = [1.0, 1.0, 8.0, 7.0, 1.0, 0.1, 2.0, 0.1, 0.1, 5.0, 4.0, 0.8, 40.0, 50.0]
    model.set_normalization(
        Stats(*(np.asarray(v, dtype=np.float64) for v in (mean, std, [0.6], [0.3])))
    )
    low = [m - 4 * s for m, s in zip(mean, std, strict=True)]
    model.set_input_range(low, [m + 4 * s for m, s in zip(mean, std, strict=True)])
    return model.eval()


def make_models(folder: Path, hidden: tuple[int, ...]) -> tuple[Path, Path]:
    """A seeded model of ``hidden`` widths with realistic normalisation, both exports."""
    from ufsemulator.config import ExportConfig
    from ufsemulator.export.aoti import package_export
    from ufsemulator.export.torchscript import export_model

    pt = export_model(seeded_model(hidden), folder / "model.pt", ExportConfig(names="jedi"))
    return pt, package_export(pt, folder / "model.pt2")


def run_once(
    binary: Path, pt: Path, pt2: Path, rows: int, threads: int, repeat: int
) -> dict[str, Any]:
    command = [str(binary), str(pt), "--aoti", str(pt2), "--rows", str(rows)]
    command += ["--threads", str(threads), "--repeat", str(repeat)]
    out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=600)
    report: dict[str, Any] = json.loads(out.stdout)
    return report


def summarise(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the processes, per path, and the ratios of the targets."""
    paths: dict[str, dict[str, float]] = {}
    for path, pick in (("torchscript", lambda r: r), ("aoti", lambda r: r["aoti"])):
        values = {key: statistics.median(pick(r)[key] for r in reports) for key in KEYS}
        load = "torchscript_load_ms" if path == "torchscript" else "load_ms"
        values["load_ms"] = statistics.median(pick(r)[load] for r in reports)
        values["first_over_later"] = values["first_jacobian_ms"] / values["jacobian_ms"]
        paths[path] = values
    return {
        "paths": paths,
        "aoti_jacobian_speedup": paths["torchscript"]["jacobian_ms"] / paths["aoti"]["jacobian_ms"],
        "aoti_max_diff": max(r["aoti"]["jacobian_max_diff"] for r in reports),
        "processes": len(reports),
    }


def table(summary: dict[str, Any], rows: int, threads: int) -> str:
    lines = [
        f"C++ at {threads} thread(s), {rows} rows, median of {summary['processes']} processes",
        "| path | load ms | jac first ms | jac later ms | first/later | predict first ms "
        "| predict later ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for path, v in summary["paths"].items():
        lines.append(
            f"| {path} | {v['load_ms']:.1f} | {v['first_jacobian_ms']:.2f} | "
            f"{v['jacobian_ms']:.2f} | {v['first_over_later']:.1f}x | "
            f"{v['first_predict_ms']:.2f} | {v['predict_ms']:.2f} |"
        )
    lines.append(
        f"AOTI Jacobian {summary['aoti_jacobian_speedup']:.2f}x faster per call than "
        f"TorchScript's; largest |difference| {summary['aoti_max_diff']:.2g}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.export_paths", description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument(
        "--threads", default="1,2", help="intra-op thread counts, comma-separated (1,2)"
    )
    parser.add_argument("--repeat", type=int, default=20, help="timed calls per process")
    parser.add_argument("--runs", type=int, default=5, help="processes (first calls) per path")
    parser.add_argument("--hidden", default="64,64,64", help="hidden widths (default size)")
    parser.add_argument("--short", action="store_true", help="CI: 1,000 rows, 3 calls, 1 run")
    parser.add_argument("--binary", type=Path, help="a built examples/cxx (else built here)")
    parser.add_argument("--model", type=Path, help="model.pt to time (with --aoti)")
    parser.add_argument("--aoti", type=Path, help="model.pt2 to time (with --model)")
    parser.add_argument("--json", type=Path, help="write the summary and the runs here")
    parser.add_argument(
        "--work", type=Path, help="keep the build and exports here, reusing what is there"
    )
    args = parser.parse_args(argv)
    if args.short:
        args.rows, args.repeat, args.runs, args.hidden = 1000, 3, 1, "8"
    if (args.model is None) != (args.aoti is None):
        parser.error("--model and --aoti go together")
    with tempfile.TemporaryDirectory(prefix="bench-export-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        built = work / "build" / "emulator_jacobian"
        binary = args.binary or (built if built.is_file() else build_example(work / "build"))
        if args.model is None and (work / "model.pt2").is_file():
            args.model, args.aoti = work / "model.pt", work / "model.pt2"
        elif args.model is None:
            hidden = tuple(int(h) for h in args.hidden.split(","))
            args.model, args.aoti = make_models(work, hidden)
        prepared = time.perf_counter() - started
        counts = [int(t) for t in str(args.threads).split(",")]
        by_threads = {
            t: [
                run_once(binary, args.model, args.aoti, args.rows, t, args.repeat)
                for _ in range(args.runs)
            ]
            for t in counts
        }
    summaries = {t: summarise(reports) for t, reports in by_threads.items()}
    for t, summary in summaries.items():
        print(table(summary, args.rows, t))
    scaling = thread_scaling(summaries)
    print(scaling_line(scaling))
    print(f"(build and export {prepared:.0f} s)", file=sys.stderr)
    if args.json is not None:
        first = counts[0]
        record = {"rows": args.rows, "threads": first, **summaries[first]}
        record["by_threads"] = {str(t): summary for t, summary in summaries.items()}
        record["jacobian_vs_one_thread"] = scaling
        record["runs"] = by_threads[first]
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    return 0


def thread_scaling(summaries: dict[int, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per path, the Jacobian's later-call time at each thread count over its time at the
    first count (1: above 1 means more threads made it slower)."""
    first = next(iter(summaries.values()))["paths"]
    return {
        path: {
            str(t): s["paths"][path]["jacobian_ms"] / first[path]["jacobian_ms"]
            for t, s in summaries.items()
        }
        for path in first
    }


def scaling_line(scaling: dict[str, dict[str, float]]) -> str:
    parts = [
        f"{path} " + ", ".join(f"{t} threads {ratio:.2f}x" for t, ratio in ratios.items())
        for path, ratios in scaling.items()
    ]
    return "Jacobian time against the first thread count: " + "; ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
