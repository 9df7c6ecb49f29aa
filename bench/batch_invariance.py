"""What batch invariance costs, and that it holds: the export's methods on R rows at T
threads against the same arithmetic done plainly (one matrix product over all rows).

A row's results must have the same bits whether it comes alone or in a batch of R, at any
number of threads: the export computes rows in fixed blocks of ``block_rows`` (256) rows.
Per method (predict, jac_physical, tlm, adjoint) and thread count this prints the median
time of the export's call and of the plain computation, their ratio (the cost), and how
many of the probed rows (first, second, middle, last, each alone and in threes) differ in
any bit from the batch's answer, and from the answer at the first thread count. With
``--aoti`` the package's programs are timed and probed too (Python loader).

    python -m bench.batch_invariance                        # 100,000 rows, 1 and all threads
    python -m bench.batch_invariance --aoti model.pt2 --model model.pt
    python -m bench.batch_invariance --short                # CI: 2,000 rows, 1 thread
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

METHODS = ("predict", "jac_physical", "tlm", "adjoint")
Call = Callable[[slice], torch.Tensor]


def make_model(folder: Path) -> Path:
    """The default-size model of bench.export_paths, exported with JEDI names."""
    from bench.export_paths import seeded_model
    from ufsemulator.config import ExportConfig
    from ufsemulator.export.torchscript import export_model

    model = seeded_model((64, 64, 64))
    return export_model(model, folder / "model.pt", ExportConfig(names="jedi"))


def plain(model: Any, method: str, x: torch.Tensor, dx: torch.Tensor, dy: torch.Tensor) -> Any:
    """The export's arithmetic without blocks: one product over all rows (not invariant)."""
    z, _ = model._prepare(x)
    pre, h = [], z
    for i, layer in enumerate(model.layers):
        h = F.linear(h, layer.weight, layer.bias)
        if i < len(model.layers) - 1:
            pre.append(h)
            h = model._act(h)
    if method == "predict":
        return h * model.output_std + model.output_mean
    w_out = model.layers[-1].weight
    jac = w_out.unsqueeze(0).expand(x.shape[0], *w_out.shape)
    for i in range(len(pre) - 1, -1, -1):
        jac = torch.matmul(jac * model._act_grad(pre[i]).unsqueeze(1), model.layers[i].weight)
    jac = jac * (model.output_std.unsqueeze(1) / model.input_std.unsqueeze(0))
    if method == "tlm":
        return torch.bmm(jac, dx.unsqueeze(2)).squeeze(2)
    if method == "adjoint":
        return torch.bmm(jac.transpose(1, 2), dy.unsqueeze(2)).squeeze(2)
    return jac


def calls(module: Any, aoti: Path | None, x: Any, dx: Any, dy: Any) -> dict[str, Call]:
    """(path, method) -> a call on a slice of the rows."""
    from ufsemulator.export.aoti import python_model

    model = python_model(module)
    mask = torch.ones(x.shape[0], 1)
    table: dict[str, Call] = {
        "torchscript predict": lambda s: module.predict(x[s]),
        "torchscript jac_physical": lambda s: module.jac_physical(x[s], mask[s]),
        "torchscript tlm": lambda s: module.tlm(x[s], dx[s]),
        "torchscript adjoint": lambda s: module.adjoint(x[s], dy[s]),
    }
    for method in METHODS:
        table[f"plain {method}"] = _plain_call(model, method, x, dx, dy)
    if aoti is not None:
        from ufsemulator.export.aoti import load

        programs = {m: load(aoti, m) for m in METHODS}
        table["aoti predict"] = lambda s: programs["predict"](x[s])[0]
        table["aoti jac_physical"] = lambda s: programs["jac_physical"](x[s], mask[s])
        table["aoti tlm"] = lambda s: programs["tlm"](x[s], dx[s], mask[s])
        table["aoti adjoint"] = lambda s: programs["adjoint"](x[s], dy[s], mask[s])
    return table


def _plain_call(model: Any, method: str, x: Any, dx: Any, dy: Any) -> Call:
    return lambda s: plain(model, method, x[s], dx[s], dy[s])


def differing(call: Call, rows: int, batch: torch.Tensor) -> int:
    """Probed rows whose bits differ alone (or in threes) from the batch's answer."""
    differ = 0
    for row in sorted({0, 1, rows // 2, rows - 1}):
        for size in (1, 3):
            start = row if size == 1 else max(0, min(row - 1, rows - size))
            alone = call(slice(start, start + size))[row - start]
            differ += int(not torch.equal(alone, batch[row]))
    return differ


def measure(call: Call, rows: int, repeat: int) -> tuple[float, torch.Tensor]:
    with torch.inference_mode():
        out = call(slice(0, rows))
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            call(slice(0, rows))
            times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times), out


def run(module: Any, aoti: Path | None, rows: int, threads: list[int], repeat: int) -> list[Any]:
    g = torch.Generator().manual_seed(0)
    x = (module.input_mean + module.input_std * torch.randn(rows, module.n_in, generator=g)).float()
    dx = torch.randn(rows, module.n_in, generator=g)
    dy = torch.randn(rows, module.n_out, generator=g)
    table = calls(module, aoti, x, dx, dy)
    first: dict[str, torch.Tensor] = {}
    results = []
    for count in threads:
        torch.set_num_threads(count)
        for name, call in table.items():
            ms, batch = measure(call, rows, repeat)
            with torch.inference_mode():
                alone = differing(call, rows, batch)
            across = int(not torch.equal(first.setdefault(name, batch), batch))
            path, method = name.split(" ")
            results.append(
                {"path": path, "method": method, "threads": count, "rows": rows, "ms": ms,
                 "differing_rows": alone, "differs_from_first_threads": across}
            )  # fmt: skip
    return results


def table(results: list[dict[str, Any]]) -> str:
    plain_ms = {(r["method"], r["threads"]): r["ms"] for r in results if r["path"] == "plain"}
    lines = [
        "| path | method | threads | rows | ms | plain ms | cost | rows differing alone "
        "| differs across threads |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if r["path"] == "plain":
            continue
        base = plain_ms[(r["method"], r["threads"])]
        lines.append(
            f"| {r['path']} | {r['method']} | {r['threads']} | {r['rows']} | {r['ms']:.2f} | "
            f"{base:.2f} | {r['ms'] / base:.2f}x | {r['differing_rows']} | "
            f"{'yes' if r['differs_from_first_threads'] else 'no'} |"
        )
    lines.append("(plain: one matrix product over all rows, the arithmetic without blocks)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.batch_invariance", description=__doc__)
    parser.add_argument("--model", type=Path, help="a model.pt (default: a seeded one)")
    parser.add_argument("--aoti", type=Path, help="its AOTInductor package, timed too")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--threads", type=int, nargs="+")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--short", action="store_true", help="CI: 2,000 rows, 1 thread, 1 call")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args(argv)
    if args.short:
        args.rows, args.threads, args.repeat = 2000, [1], 1
    threads = args.threads or sorted({1, len(os.sched_getaffinity(0))})
    if args.rows < 4 or min(threads) < 1:
        print(f"error: --rows must be >= 4 and --threads >= 1, got {args.rows}, {threads}",
              file=sys.stderr)  # fmt: skip
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        path = args.model or make_model(Path(tmp))
        module = torch.jit.load(str(path))
        results = run(module, args.aoti, args.rows, threads, args.repeat)
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs")
    print(table(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    broken = [r for r in results if r["path"] != "plain" and r["differing_rows"]]
    broken += [r for r in results if r["path"] != "plain" and r["differs_from_first_threads"]]
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
