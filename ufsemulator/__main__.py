"""``python -m ufsemulator make-data | train | export``.

User mistakes (a bad config, a missing or broken file) end with one line on stderr and
exit code 2; a training stopped by the preemption signal exits with 85
(hpcdist.facts.protocol.REQUEUE_EXIT_CODE) after its checkpoint is written, so a job script
can requeue it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from pathlib import Path

from hpcdist.distributed import MARKER_VAR, REQUEUE_EXIT_CODE, DistEnvError, DistributedInitError
from hpcdist.errors import UserError
from hpcdist.state import create_exclusive, private_dir
from ufsemulator.config import ConfigError
from ufsemulator.data.makedays import parse_grid
from ufsemulator.errors import CheckpointError, DataError
from ufsemulator.training import earlysignal

EXIT_USAGE = 2
EXIT_PREEMPTED = REQUEUE_EXIT_CODE
# How gloo (and a socket under it) says that the rank at the other end is gone.
_PEER_GONE = re.compile(r"Connection (?:closed|reset) by peer(?: \[[^\]]*\](?::\d+)?)?")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ufsemulator", description="Sea-ice concentration emulator."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_make_data(sub)
    _add_train(sub)
    _add_export(sub)
    return parser


def _add_make_data(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    data = sub.add_parser("make-data", help="write synthetic CICE-style data in any layout")
    data.add_argument(
        "--out", type=Path, required=True, help="netCDF file to write (with --days: a folder)"
    )
    data.add_argument(
        "--grid", metavar="NIxNJ", help="grid, e.g. 1440x1080 (instead of --ni and --nj)"
    )
    data.add_argument(
        "--days",
        type=int,
        help="a season of daily files OUT/iceh.2000-01-01.nc, ... (daily stream, one "
        "record each, seasonal cycle from 1 January), written in parallel",
    )
    data.add_argument("--jobs", type=int, help="processes writing --days files (default: all CPUs)")
    data.add_argument("--ni", type=int, default=384, help="grid points along x (384)")
    data.add_argument("--nj", type=int, default=320, help="grid points along y (320)")
    data.add_argument("--seed", type=int, default=0)
    data.add_argument(
        "--layout",
        choices=["hourly", "daily", "monthly", "cf"],
        default="hourly",
        help="CICE stream (fields aice_h, aice_d, aice) or the CF-named ocean/ice + "
        "atmosphere pair (OUT and OUT_atm); default hourly",
    )
    data.add_argument("--records", type=int, default=1, help="records per file (1)")
    data.add_argument(
        "--files",
        type=int,
        default=1,
        help="files of a time series, OUT.0001.nc, ... (1: just OUT)",
    )


def _add_train(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    train = sub.add_parser("train", help="train (under torchrun, srun or alone)")
    train.add_argument("--config", type=Path, help="YAML merged over the default config")
    train.add_argument(
        "--data",
        nargs="+",
        metavar="FILE",
        help="CICE history or ocean/ice files, or a quoted glob, in time "
        "order (default: data.path, else synthetic)",
    )
    train.add_argument(
        "--atmosphere",
        nargs="+",
        metavar="FILE",
        help="the atmosphere file paired with each --data file (CF pair)",
    )
    train.add_argument("--resume", type=Path, metavar="CKPT", help="checkpoint to resume")
    train.add_argument("--run-dir", type=Path, help="output folder (default runs/<job id>)")
    train.add_argument("--epochs", type=int, help="override training.epochs")
    train.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config value, e.g. training.lr=3e-4 or model.hidden_sizes=[32,32] "
        "(a YAML value); repeatable, applied after --config and --epochs",
    )


def _add_export(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    export = sub.add_parser(
        "export", help="TorchScript (and AOTInductor) export of a checkpoint, or --describe one"
    )
    export.add_argument("--checkpoint", type=Path)
    export.add_argument("--out", type=Path)
    export.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help="export a checkpoint that this user's training did not write (by default one "
        "that another user owns or changed, or whose digest was not recorded, is refused)",
    )
    export.add_argument(
        "--describe",
        type=Path,
        metavar="MODEL",
        help="print an export's (model.pt or model.pt2) names, units, levels, ranges and "
        "provenance, and stop",
    )
    export.add_argument(
        "--aoti",
        type=Path,
        metavar="PT2",
        help="also write an AOTInductor package (predict, jac_physical, tlm, adjoint; "
        "float32) for LibTorch's AOTIModelPackageLoader; compiling takes 2-4 min",
    )
    export.add_argument(
        "--aoti-cpu",
        choices=["portable", "host"],
        default="portable",
        help="CPUs the package runs on: portable (default; x86-64-v3: AVX2 and FMA, Haswell "
        "and later) or host (this machine's every extension, e.g. AVX-512)",
    )
    export.add_argument(
        "--names",
        choices=["short", "jedi", "soca"],
        help="input/output names (default: the checkpoint's export.names); soca: a SOCA "
        "background's names and units",
    )
    export.add_argument(
        "--units",
        choices=["native", "jedi"],
        help="units to check the names' units against (default: the checkpoint's "
        "export.units; names carry their units)",
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "make-data":
            return _make_data(args)
        if args.command == "train":
            return _train(args)
        return _export(args)
    except (
        ConfigError,
        DataError,
        CheckpointError,
        DistEnvError,
        FileNotFoundError,
        UserError,  # a folder or file of the run that another user could have replaced
    ) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except DistributedInitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except RuntimeError as exc:
        # A rank that ended (its own line says why) closes its connections: the ranks left
        # say so in one line, not with a traceback of their next collective. The peer's
        # address stays in the line: the job's runner reads it to name the node.
        gone = _PEER_GONE.search(str(exc))
        if gone is None:
            raise
        print(
            f"error: another rank of this job ended first ({gone.group()}); its own line says why",
            file=sys.stderr,
        )
        return 1


def _make_data(args: argparse.Namespace) -> int:
    # Imported here: `--help` and argument errors should not wait for torch or netCDF.
    from ufsemulator.data.synthfiles import write_layout

    if args.grid is not None:
        try:
            args.ni, args.nj = parse_grid(args.grid)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if args.days is not None:
        return _make_days(args)
    if args.ni < 4 or args.nj < 4:
        raise ConfigError(f"--ni and --nj must be >= 4, got {args.ni} and {args.nj}")
    if args.records < 1 or args.files < 1:
        raise ConfigError(
            f"--records and --files must be >= 1, got {args.records} and {args.files}"
        )
    paths = write_layout(
        args.out, args.layout, args.ni, args.nj, args.seed, args.records, args.files
    )
    print(
        f"Wrote synthetic {args.layout} data {args.ni}x{args.nj} (seed {args.seed}, "
        f"{args.records} record(s) per file) to {', '.join(map(str, paths))}"
    )
    return 0


def _make_days(args: argparse.Namespace) -> int:
    from ufsemulator.data.makedays import write_days

    if args.days < 1:
        raise ConfigError(f"--days must be >= 1, got {args.days}")
    if args.jobs is not None and args.jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {args.jobs}")
    if args.ni < 4 or args.nj < 4:
        raise ConfigError(f"--ni and --nj must be >= 4, got {args.ni} and {args.nj}")
    done = write_days(args.out, args.ni, args.nj, args.days, args.seed, args.jobs)
    print(
        f"Wrote {len(done.paths)} daily files {args.ni}x{args.nj} (seed {args.seed}) to "
        f"{args.out}: {done.paths[0].name} .. {done.paths[-1].name}, "
        f"{done.bytes / 1e6:.0f} MB in {done.seconds:.1f} s ({done.mb_per_second:.0f} MB/s, "
        f"{len(done.paths) / done.seconds:.2f} files/s, {done.jobs} processes)"
    )
    return 0


def _train(args: argparse.Namespace) -> int:
    from ufsemulator.config import load_config

    if args.resume is not None and args.config is None:
        # Resuming without --config continues the run exactly as it was configured (a
        # checkpoint is read with torch; a run that does not resume imports it later,
        # while its data is read).
        from ufsemulator.checkpoints.state import read_state

        config = read_state(args.resume).config
    else:
        config = load_config(args.config)
    if args.epochs is not None:
        if args.epochs < 1:
            raise ConfigError(f"--epochs must be >= 1, got {args.epochs}")
        config = config.with_epochs(args.epochs)
    if args.overrides:
        from ufsemulator.overrides import apply_to

        config = apply_to(config, args.overrides)
    if args.data is not None or args.atmosphere is not None:
        # Through the config: the checkpoint then records what the model was trained on.
        data = dataclasses.replace(
            config.data,
            path=tuple(args.data) if args.data is not None else config.data.path,
            atmosphere=tuple(args.atmosphere) if args.atmosphere else config.data.atmosphere,
        )
        config = dataclasses.replace(config, data=data)
    # This rank's files are read while torch, CUDA and NCCL start.
    from ufsemulator.training import earlyread

    early = earlyread.start(config, os.environ)
    # Imported once the config is checked: a bad --set fails without waiting for torch.
    from ufsemulator.training.train import train

    result = train(
        config,
        resume=args.resume,
        run_dir=args.run_dir,
        overrides=args.overrides,
        early_read=early,
    )
    if result.status != "preempted" or not result.is_main:
        return 0
    # Rank 0 alone reports the preemption, by exit code and, for the rendered job scripts,
    # by a marker file: srun reports the status of whichever rank it killed last.
    marker = os.environ.get(MARKER_VAR)
    if marker:
        # A new 0600 file in a private folder, never through a link another user planted.
        path = Path(marker)
        private_dir(path.parent, "requeue marker folder", root=path.parent.parent)
        create_exclusive(path, f"{result.run_dir}\n")
    return EXIT_PREEMPTED


def _export(args: argparse.Namespace) -> int:
    from hpcdist.state import book_for, read_once, read_output
    from ufsemulator.export.torchscript import checkpoint_export_config, export_checkpoint

    if args.describe is not None:
        return _describe(args.describe)
    if args.checkpoint is None or args.out is None:
        raise ConfigError("export needs --checkpoint and --out (or --describe MODEL)")
    book = book_for()
    # The checkpoint's bytes, read once: this user's, unchanged since the training wrote it
    # (its digest in the private state), unless --trust-checkpoint vouches for a file.
    if args.trust_checkpoint:
        data = read_once(args.checkpoint).data
    else:
        data = read_output(args.checkpoint, book, "checkpoint").data
    options = checkpoint_export_config(args.checkpoint, data)
    overrides = {
        key: value for key in ("names", "units") if (value := getattr(args, key)) is not None
    }
    options = dataclasses.replace(options, **overrides)
    path = export_checkpoint(args.checkpoint, args.out, options, data=data, book=book)
    units = options.units or "those of the names"
    print(
        f"Exported {args.checkpoint} to {path} (TorchScript: predict, row_flags, "
        f"jac_physical, tlm, adjoint in physical units; forward normalised, not the "
        f"prediction; names {options.names}, units {units}); model card "
        f"{path.with_suffix('.md')}"
    )
    if args.aoti is not None:
        from ufsemulator.export.aoti import package_export

        package = package_export(path, args.aoti, args.aoti_cpu)
        print(
            f"Packaged {path} for AOTInductor at {package} (predict, jac_physical, tlm, "
            f"adjoint; float32, inputs checked; CPUs: {args.aoti_cpu})"
        )
    return 0


def _describe(path: Path) -> int:
    from ufsemulator.export.signature import describe
    from ufsemulator.export.torchscript import read_extra_files

    if not path.is_file():
        raise ConfigError(f"--describe: '{path}' does not exist or is not a file")
    try:
        if path.suffix == ".pt2":  # an AOTInductor package: the same records as metadata
            from ufsemulator.export.aoti import load

            extra = dict(load(path).loader.get_metadata())
        else:
            extra = read_extra_files(path)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "not TorchScript"
        raise ConfigError(f"--describe: cannot load '{path}' as an export: {first}") from None
    print(describe(extra, str(path)))
    return 0


if __name__ == "__main__":
    # Before torch is imported (lazily, in main): an early warning signal must not kill us.
    earlysignal.install()
    code = main()
    earlysignal.ignore_late_warnings()
    # Everything is written and the process group destroyed: leave without the
    # interpreter's teardown, in which torch's communication threads were seen to abort
    # one rank of a completed 4-node training ("terminate called without an active
    # exception", SIGABRT), turning the whole job FAILED.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
