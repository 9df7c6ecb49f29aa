"""End to end: the whole training job, process start to ``model.pt``, beside its floor.

    python3 -m bench.e2e --out OUT --work /tmp/e2e --days 30 --grid 1440x1080 \\
        --gpus 1,2,4 --cpu-ranks 1,2,4 --threads 16 --target-days 0.01 ...

Every case is launched as a user launches it, ``torchrun --standalone --nproc-per-node N``,
and timed from just before the launcher starts to its exit and to ``model.pt``'s
modification time. In the same run, beside it:

- ``floor``: ``bench.floor`` launched the same way (import torch, CUDA, NCCL group, one
  all-reduce): what any job pays;
- ``default``: ``python -m ufsemulator train`` with the default configuration (data cached
  by an untimed first run), and the same to ``--target-default``;
- ``days``: the daily files of ``make-data --days`` (written first, timed), to
  ``--target-days``, on 1/2/4 GPUs (with the ``--days-set`` settings), and on CPU ranks
  (``CUDA_VISIBLE_DEVICES=""``, ``--threads`` each) to ``--target-cpu``; no array cache,
  every run reads the netCDF files (the page cache is warm for all of them alike);
- ``user``: ``bench.userloop`` (xarray + DataLoader + DistributedSampler + DDP) to the
  same target on the same files.

Stages: ``--stages data,floor,default,days,cpu,user``; without ``data`` the daily files
already in WORK/days are used. Results go to OUT/e2e.json (updated
after every case) and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.launch import NO_MULTICAST, REPO, without_launcher
from hpcdist.facts.cpulayout import cpu_layout


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def launch(
    module_args: list[str],
    ranks: int,
    env: dict[str, str],
    run_dir: Path | None,
    timeout_s: float,
    log: Path,
) -> dict[str, Any]:
    """``torchrun --standalone --nproc-per-node ranks -m ...``; wall time, time to model.pt."""
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={ranks}",
        "-m",
        *module_args,
    ]
    started = time.time()
    try:
        done = subprocess.run(
            argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout_s
        )
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        code = 124
        output = (
            (exc.stdout or b"").decode(errors="replace")
            if isinstance(exc.stdout, bytes)
            else str(exc.stdout or "")
        )
    wall = time.time() - started
    with log.open("a") as handle:
        handle.write(f"=== {' '.join(module_args)} ({ranks} ranks): exit {code}, {wall:.2f} s\n")
        handle.write(output)
    result: dict[str, Any] = {"ranks": ranks, "exit": code, "wall_s": wall}
    if run_dir is not None:
        model = run_dir / "model.pt"
        if model.is_file():
            result["to_model_s"] = model.stat().st_mtime - started
        results = run_dir / "training_results.json"
        if results.is_file():
            data = json.loads(results.read_text())
            result.update(
                status=data["status"],
                epochs=data["epochs_run"],
                best_val_loss=data["best_val_loss"],
                n_train=data["n_train"],
                timings=data.get("timings"),
                val_history=data["history"]["val_loss"],
                # How the steps ran: a graph captured or not (and why), the all-reduce used.
                cuda_graph=data.get("cuda_graph"),
                grad_allreduce=data.get("grad_allreduce"),
            )
        user = run_dir / "result.json"
        if user.is_file():
            result["user"] = json.loads(user.read_text())
    if code != 0:
        result["tail"] = output[-1500:]
    return result


def _env(
    base: dict[str, str], data_dir: Path, cpu_threads: int | None, ranks: int = 1
) -> dict[str, str]:
    """The case's environment; CPU ranks (``cpu_threads``: each rank's CPUs) get the CPU
    layout a rendered script exports for ``ranks`` ranks of that many CPUs."""
    env = without_launcher(base)
    env.update(NO_MULTICAST)
    path = env.get("PYTHONPATH")
    env.update(
        PYTHONPATH=f"{REPO}{os.pathsep}{path}" if path else str(REPO),
        PYTHONUNBUFFERED="1",
        HPCDIST_DATA_DIR=str(data_dir),
    )
    if cpu_threads is not None:
        env.update(CUDA_VISIBLE_DEVICES="", **cpu_layout(cpu_threads, ranks).env())
    return env


def _config(path: Path, target: float | None, epochs: int) -> Path:
    lines = ["training:", f"  epochs: {epochs}", "  early_stopping_patience: 0"]
    if target is not None:
        lines.append(f"  target_val_loss: {target}")
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/e2e"))
    parser.add_argument("--stages", default="data,floor,default,days,cpu,user")
    parser.add_argument("--grid", default="1440x1080")
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--gpus", type=_ints, default=[1, 2, 4])
    parser.add_argument("--cpu-ranks", type=_ints, default=[1, 2, 4])
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--user-ranks", type=_ints, default=[4])
    parser.add_argument("--target-default", type=float, default=0.01)
    parser.add_argument(
        "--target-days",
        action="append",
        default=[],
        metavar="LOSS:GPUS",
        help="a target for the daily files and the GPU counts to run it on, e.g. 0.0015:1,2,4",
    )
    parser.add_argument("--target-cpu", type=float, default=0.05)
    parser.add_argument("--target-user", type=float, default=0.01)
    parser.add_argument("--default-target-gpus", type=_ints, default=[1, 2, 4])
    parser.add_argument("--max-epochs", type=int, default=60)
    parser.add_argument("--max-epochs-default", type=int, default=150)
    parser.add_argument("--user-max-s", type=float, default=150.0)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs of the floor and the default job, in turns"
    )
    parser.add_argument(
        "--default-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="the default job also with `--set KEY=VALUE`, at every --gpus, e.g. "
        "training.grad_allreduce=backend",
    )
    parser.add_argument(
        "--days-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="the days runs with `--set KEY=VALUE` (all of them), e.g. "
        "training.lr_warmup_epochs=0.5 or data.read_early=false",
    )
    args = parser.parse_args(argv)
    stages = set(args.stages.split(","))
    args.out.mkdir(parents=True, exist_ok=True)
    # A fresh work folder; without the data stage the daily files of an earlier run stay.
    args.work.mkdir(parents=True, exist_ok=True)
    for entry in args.work.iterdir():
        if entry.name != "days" or "data" in stages:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    log = args.out / "e2e.log"
    report: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "cases": []}
    cache = args.work / "cache"
    days_dir = args.work / "days"
    days_glob = str(days_dir / "iceh.*.nc")

    def record(name: str, result: dict[str, Any]) -> None:
        result["case"] = name
        report["cases"].append(result)
        (args.out / "e2e.json").write_text(json.dumps(report, indent=1))
        t = result.get("timings") or {}
        print(
            f"{name:28s} ranks {result['ranks']} exit {result['exit']} wall "
            f"{result['wall_s']:.2f} s, to model.pt {result.get('to_model_s', float('nan')):.2f}"
            f" s, epochs {result.get('epochs', '-')}, best val {result.get('best_val_loss', '-')}"
            f", status {result.get('status', '-')}, in-job total {t.get('total_s', 0):.2f} "
            f"(start-up {t.get('startup_s', 0):.2f}, data {t.get('data_s', 0):.2f}, steps "
            f"{t.get('steps_s', 0):.2f}, outside {t.get('outside_steps_s', 0):.2f}, export "
            f"{t.get('export_s', 0):.2f})"
            + (f" user {result['user']}" if "user" in result else ""),
            flush=True,
        )
        if result["exit"] != 0:
            print(result.get("tail", ""), flush=True)

    gpu_env = _env(dict(os.environ), cache, None)
    if "data" in stages:
        started = time.time()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "ufsemulator",
                "make-data",
                "--grid",
                args.grid,
                "--days",
                str(args.days),
                "--out",
                str(days_dir),
            ],
            env=gpu_env,
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        report["make_data"] = {"wall_s": time.time() - started, "output": done.stdout + done.stderr}
        print(
            f"make-data: {time.time() - started:.1f} s: {done.stdout.strip()} {done.stderr[-500:]}"
        )
    if "default" in stages:
        run = args.work / "warm"
        launch(
            ["ufsemulator", "train", "--run-dir", str(run), "--epochs", "1"],
            1,
            gpu_env,
            run,
            args.timeout,
            log,
        )  # untimed: writes the synthetic file and its cache
    # The floor and the default job (and its variants) take turns, --repeats times.
    variants = [("", [])] + [(f" ({item})", ["--set", item]) for item in args.default_set]
    for repeat in range(args.repeats):
        if "floor" in stages:
            for n in args.gpus:
                result = launch(["bench.floor"], n, gpu_env, None, args.timeout, log)
                record("floor gpu", {**result, "repeat": repeat})
        if "default" not in stages:
            continue
        for label, extra in variants:
            for n in args.gpus:
                run = args.work / f"default{n}-{repeat}{label.strip(' ()').replace('=', '-')}"
                argv = ["ufsemulator", "train", "--run-dir", str(run), *extra]
                result = launch(argv, n, gpu_env, run, args.timeout, log)
                record(f"default job{label}", {**result, "repeat": repeat})
    if "default" in stages:
        target = _config(
            args.work / "default_target.yaml", args.target_default, args.max_epochs_default
        )
        for n in args.default_target_gpus:
            run = args.work / f"default-target{n}"
            record(
                "default set to target",
                launch(
                    ["ufsemulator", "train", "--config", str(target), "--run-dir", str(run)],
                    n,
                    gpu_env,
                    run,
                    args.timeout,
                    log,
                ),
            )
    if "days" in stages:
        for item in args.target_days:
            loss, _, gpus = item.partition(":")
            target = _config(args.work / f"days_{loss}.yaml", float(loss), args.max_epochs)
            for n in _ints(gpus) if gpus else args.gpus:
                run = args.work / f"days{n}-{loss}"
                env = _env(dict(os.environ), args.work / f"nocache-days{n}-{loss}", None)
                argv = ["ufsemulator", "train", "--config", str(target), "--data", days_glob]
                argv += ["--run-dir", str(run)]
                argv += [arg for item in args.days_set for arg in ("--set", item)]
                record(f"days to {loss}", launch(argv, n, env, run, args.timeout, log))
    if "cpu" in stages:
        for n in args.cpu_ranks:
            cpu_env = _env(dict(os.environ), args.work / "cpu-cache", args.threads, n)
            record("floor cpu", launch(["bench.floor"], n, cpu_env, None, args.timeout, log))
        target = _config(args.work / "cpu_target.yaml", args.target_cpu, args.max_epochs)
        for n in args.cpu_ranks:
            run = args.work / f"cpu{n}"
            env = _env(dict(os.environ), args.work / f"nocache-cpu{n}", args.threads, n)
            record(
                "30-day set to target, CPU",
                launch(
                    [
                        "ufsemulator",
                        "train",
                        "--config",
                        str(target),
                        "--data",
                        days_glob,
                        "--run-dir",
                        str(run),
                    ],
                    n,
                    env,
                    run,
                    args.timeout,
                    log,
                ),
            )
    if "user" in stages:
        for n in args.user_ranks:
            run = args.work / f"user{n}"
            record(
                "user loop to target",
                launch(
                    [
                        "bench.userloop",
                        "--data",
                        days_glob,
                        "--target",
                        str(args.target_user),
                        "--max-epochs",
                        str(args.max_epochs),
                        "--max-seconds",
                        str(args.user_max_s),
                        "--run-dir",
                        str(run),
                    ],
                    n,
                    gpu_env,
                    run,
                    args.user_max_s + 120,
                    log,
                ),
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
