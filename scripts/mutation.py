#!/usr/bin/env python3
"""Mutation score of the core modules: how many small code changes their own tests catch.

Usage:
    scripts/mutation                      # every core module, then the table
    scripts/mutation spec nodelist        # some of them
    scripts/mutation --survivors spec     # also print each surviving mutant's diff

Each module is mutated by mutmut in a throw-away copy of the working tree (tracked files as they
are on disk, so uncommitted tests count), and each mutant runs against the module's own test
files only (integration tests never). A mutant is killed when a test fails or times out.
Surviving mutants that change nothing observable are listed, each with its mutated line and a
one-line reason, in scripts/mutation-equivalent.yaml; they are left out of the score. An entry
whose mutated line no longer matches (the code moved on) is reported as stale and not excluded.

Needs `pip install mutmut==3.8.1` (the test extra does not install it: this is not part of CI).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
EQUIVALENT_FILE = REPO / "scripts" / "mutation-equivalent.yaml"
MUTMUT_VERSION = "3.8.1"
TARGET_SCORE = 95.0

JOB_EXTRAS = (
    "tests/spec/test_siteopts.py",
    "tests/spec/test_sweep.py",
    "tests/render/test_container.py",
    "tests/render/test_rank_logs.py",
)
# module -> the test files that are its own (mutants run against these only).
CORE_MODULES: dict[str, tuple[str, ...]] = {
    # The site options and sweeps of the job description are tested in files of their own.
    "spec": ("tests/spec/test_spec.py", "tests/cli/test_cli.py", *JOB_EXTRAS),
    "validate": ("tests/spec/test_spec.py", "tests/cli/test_cli.py", *JOB_EXTRAS),
    "directives": ("tests/render/test_render.py", "tests/jobs/test_submit.py", *JOB_EXTRAS),
    "render": ("tests/render/test_render.py", "tests/spec/test_sweep.py"),
    "distenv": (
        "tests/distributed/test_distenv.py",
        "tests/slurm/test_nodelist.py",
    ),  # + tasks per node
    "nodelist": ("tests/slurm/test_nodelist.py",),
    "slurmtime": ("tests/spec/test_spec.py",),
    "protocol": ("tests/distributed/test_protocol.py",),
}
KILLED = {"killed", "timeout"}
# What the tests read besides the package (mutmut copies only the package and tests/).
ALSO_COPY = "\n    ".join(["templates", "hpc", "ufsemulator", "bench", "scripts", "README.md"])


@dataclass(frozen=True)
class Equivalent:
    name: str
    line: str  # the mutated line, as mutmut's diff shows it after "+"
    reason: str


@dataclass(frozen=True)
class Score:
    module: str
    mutants: int
    killed: int
    equivalent: int
    survivors: tuple[str, ...]
    stale: tuple[str, ...]

    @property
    def percent(self) -> float:
        counted = self.mutants - self.equivalent
        return 100.0 * self.killed / counted if counted else 100.0


def load_equivalents() -> dict[str, Equivalent]:
    if not EQUIVALENT_FILE.exists():
        return {}
    entries = yaml.safe_load(EQUIVALENT_FILE.read_text()) or []
    found = {}
    for entry in entries:
        eq = Equivalent(str(entry["name"]), str(entry["line"]).strip(), str(entry["reason"]))
        found[eq.name] = eq
    return found


def copy_tree(dest: Path) -> None:
    """The tracked files as they are on disk (deleted ones skipped)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    for raw in listed:
        rel = raw.decode()
        src = REPO / rel
        if rel and src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def mutmut(workdir: Path, *args: str) -> str:
    # mutmut's copy must be the hpcdist imported (a subprocess imports the installed one).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HPCDIST_PROPERTY_EXAMPLES"] = env.get("HPCDIST_PROPERTY_EXAMPLES", "20")
    proc = subprocess.run(
        [sys.executable, "-m", "mutmut", *args],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise SystemExit(f"mutmut {' '.join(args)} failed in {workdir}:\n{tail}")
    return proc.stdout


def added_line(diff: str) -> str:
    """The mutated line(s) of a mutmut diff, joined."""
    lines = [
        ln[1:].strip()
        for ln in diff.splitlines()
        if ln.startswith("+") and not ln.startswith("+++")
    ]
    return " / ".join(lines)


def score_module(
    module: str, equivalents: dict[str, Equivalent], workroot: Path, show: bool, jobs: int
) -> Score:
    workdir = workroot / module
    copy_tree(workdir)
    tests = "\n    ".join(CORE_MODULES[module])
    (workdir / "setup.cfg").write_text(
        "[mutmut]\n"
        "source_paths = hpcdist\n"
        f"only_mutate = hpcdist/{module}.py\n"
        f"pytest_add_cli_args_test_selection =\n    {tests}\n"
        "pytest_add_cli_args = -p no:cacheprovider\n"
        f"also_copy =\n    {ALSO_COPY}\n"
    )
    print(f"mutation: {module} against {', '.join(CORE_MODULES[module])}", file=sys.stderr)
    mutmut(workdir, "run", "--max-children", str(jobs))
    statuses: dict[str, str] = {}
    for line in mutmut(workdir, "results", "--all", "true").splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and name.startswith(f"hpcdist.{module}."):
            statuses[name] = status.strip()
    killed = sum(1 for s in statuses.values() if s in KILLED)
    survivors, stale, equivalent = [], [], 0
    for name, status in sorted(statuses.items()):
        if status in KILLED:
            continue
        diff = mutmut(workdir, "show", name)
        known = equivalents.get(name)
        if known is not None and known.line == added_line(diff):
            equivalent += 1
            continue
        if known is not None:
            stale.append(name)
        survivors.append(name)
        if show:
            print(f"--- {name} ({status})\n{diff}", file=sys.stderr)
    return Score(module, len(statuses), killed, equivalent, tuple(survivors), tuple(stale))


def table(scores: list[Score]) -> str:
    rows = [
        "| module | mutants | killed | equivalent | score |",
        "|---|---|---|---|---|",
    ]
    for s in scores:
        rows.append(
            f"| hpcdist/{s.module}.py | {s.mutants} | {s.killed} | {s.equivalent} "
            f"| {s.percent:.1f}% |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", metavar="MODULE", help=", ".join(CORE_MODULES))
    parser.add_argument("--survivors", action="store_true", help="print each survivor's diff")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="mutmut children")
    parser.add_argument("--keep", action="store_true", help="keep the mutmut work folders")
    args = parser.parse_args(argv)
    unknown = [m for m in args.modules if m not in CORE_MODULES]
    if unknown:
        parser.error(f"unknown module {unknown[0]!r}; expected one of {', '.join(CORE_MODULES)}")
    modules = args.modules or list(CORE_MODULES)
    equivalents = load_equivalents()
    workroot = Path(tempfile.mkdtemp(prefix="hpcdist-mutation-"))
    try:
        scores = [
            score_module(m, equivalents, workroot, args.survivors, args.jobs) for m in modules
        ]
    finally:
        if args.keep:
            print(f"mutation: work folders kept in {workroot}", file=sys.stderr)
        else:
            shutil.rmtree(workroot, ignore_errors=True)
    print(table(scores))
    for s in scores:
        for name in s.stale:
            print(f"stale equivalent entry (mutated line changed): {name}", file=sys.stderr)
        if s.survivors:
            print(f"{s.module}: {len(s.survivors)} surviving: {' '.join(s.survivors)}")
    below = [s.module for s in scores if s.percent < TARGET_SCORE]
    if below:
        print(f"below {TARGET_SCORE}%: {', '.join(below)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
