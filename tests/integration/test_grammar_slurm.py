"""hpcdist takes exactly the values sbatch takes: a sample drawn from SLURM's grammar of each
option (sizes, time limits, signals, mail types, node counts, dependencies, --exclusive,
partition lists, job names by bytes, node lists, constraints, arrays) goes both to the
testbed's ``sbatch --test-only`` and through hpcdist's own checks (the JobSpec every render
and submit builds), and the two must agree on accept and refuse. Where hpcdist refuses on
purpose what SLURM takes (a time limit without an end, a warning the job cannot catch, a
node range), the message must say so, never that the value is not SLURM's.

Runs on every SLURM version the testbed runs (marker slurm_versions); about 230 sbatch calls.
"""

from __future__ import annotations

import itertools
import random
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hpcdist.errors import UserError
from hpcdist.spec.options import spec_from_options
from tests.integration.conftest import SlurmCluster, run_slurm, slurm_env

# On one xdist worker: one held job every value is tried on, made once for the module.
pytestmark = [pytest.mark.slurm_versions, pytest.mark.xdist_group("test_grammar_slurm")]

# sbatch's answers that are about this cluster's resources, not the value's form: the value
# was understood (16T of memory, more nodes than the partition has).
_RESOURCE_ANSWERS = (
    "Requested node configuration is not available",
    # SLURM >= 24.11 for R: (the warning also on preemption) on a cluster without preemption
    "Preemption is required but is disabled",
)


@dataclass(frozen=True)
class Case:
    """One value: the sbatch option it is, and hpcdist's flags for it."""

    option: str  # sbatch's --OPTION
    value: str
    flags: tuple[tuple[str, Any], ...]  # hpcdist's JobSpec flags
    sbatch_extra: tuple[str, ...] = ()
    # hpcdist refuses this on purpose (SLURM takes it): what its message must say instead
    deliberate: str | None = None


def _case(option: str, value: str, field: str, **extra: Any) -> Case:
    deliberate = extra.pop("deliberate", None)
    sbatch_extra = tuple(extra.pop("sbatch_extra", ()))
    flags = {"mode": "test", field: value, **extra}
    return Case(option, value, tuple(flags.items()), sbatch_extra, deliberate)


def _pick(values: list[str], count: int, seed: str) -> list[str]:
    """A fixed sample (the same on every run and machine)."""
    return sorted(random.Random(seed).sample(values, min(count, len(values))))


def _memory() -> Iterator[Case]:
    numbers, units, bytes_ = ["0", "1", "16", "4000", "+16"], "kKmMgGtT", ["", "b", "B"]
    forms = [n + u + b for n in numbers for u in ["", *units] for b in bytes_ if u or not b]
    odd = ["16b", "16B", "16.5G", "16P", "G", "-1", "16GiB", "0x10", "16e3", "16GBB"]
    for value in [*_pick(forms, 36, "mem"), *odd, "99999999999999999999T", "9999999999T"]:
        yield _case("mem", value, "memory")


def _time() -> Iterator[Case]:
    fields = ["0", "1", "05", "24", "59", "60", "90"]
    shapes = ["{0}", "{0}:{1}", "{0}:{1}:{2}", "{0}-{1}", "{0}-{1}:{2}", "{0}-{1}:{2}:{3}"]
    rng = random.Random("time")
    forms = sorted({shape.format(*rng.choices(fields, k=4)) for shape in shapes for _ in range(6)})
    odd = ["1:2:3:4", "1::2", ":1", "1:", "abc", "1d", "+5", "1-2-3", "1:2-3", "-", "1-"]
    for value in [*forms, *odd]:
        yield _case("time", value, "time")
    for value in ["UNLIMITED", "unlimited", "INFINITE", "Infinite", "-1", "0", "0-0", "00:00:00"]:
        yield _case("time", value, "time", deliberate="hpcdist needs a finite time limit")


def _signal() -> Iterator[Case]:
    names = ["USR2", "SIGUSR2", "usr2", "12", "USR1", "Usr1", "10", "TERM", "SIGterm", "HUP"]
    forms = [
        f"{flags}{name}{at}"
        for flags in ["", "B:", "R:", "RB:", "b:"]
        for name in names
        for at in ["", "@90", "@0", "@65535", "@65536"]
    ]
    odd = ["0@90", "USR2@-1", "@90", "USR2@90x", "B:R:USR2", "SIG12@5", "USR2@0x10"]
    time = {"mode": "gloo", "time": "1-00:00:00"}
    for value in [*_pick(forms, 40, "signal"), *odd]:
        yield _case("signal", value, "signal", **time)
    # (PIPE, SEGV: SLURM 22.05 refuses them, 24.11 takes them)
    for value in ["KILL@90", "9@90", "STOP", "sigquit@5", "XCPU@60", "PIPE@5", "segv"]:
        yield _case("signal", value, "signal", **time, deliberate="which the job cannot catch")


def _mail_type() -> Iterator[Case]:
    kinds = ["end", "End", "FAIL", "fail", "BEGIN", "all", "None", "time_limit_80", "REQUEUE"]
    forms = [",".join(pair) for pair in itertools.permutations(kinds, 2)]
    odd = ["foo", "TIME_LIMIT_70", "END:FAIL", "END,,FAIL", ",END", "END,"]
    for value in [*_pick(kinds, 9, "mail"), *_pick(forms, 8, "mail2"), *odd]:
        yield _case("mail-type", value, "mail_type")


def _nodes() -> Iterator[Case]:
    for value in ["1", "2", "4", "1-1", "2-2", "4-2", "2-", "two", "2-4:0"]:
        yield _case("nodes", value, "nodes")
    # (a list of counts and a step: SLURM 22.05 refuses them, 24.11 takes them)
    for value in ["2-4", "1-3", "1,2", "2-4:2"]:
        yield _case("nodes", value, "nodes", deliberate="needs one count")


def _dependency(job: int) -> Iterator[Case]:
    j = str(job)
    good = [
        "singleton",
        "SINGLETON",
        f"afterok:{j}",
        f"Afterok:{j}",
        f"aftercorr:{j}",
        f"afterok:{j}+10",
        f"after:{j}+5",
        f"afterany:{j}:{j}",
        f"afternotok:{j}",
        f"afterburstbuffer:{j}",
        f"afterok:{j}?afterany:{j}",
        f"afterok:{j},afterany:{j}",
        f"afterok:{j},singleton",
        f"afterok:{j}?singleton",
    ]
    bad = [
        "afterok:abc",
        "afterok",
        "afterok:",
        f"afterok:{j}+x",
        f"afterok:{j}+0",
        f"afterok:{j}+-1",
        f"foo:{j}",
        f"afterok:{j}?",
        f",afterok:{j}",
        f"afterok:{j},,afterany:{j}",
    ]
    for value in [*good, *bad]:
        yield Case("dependency", value, (("mode", "test"), ("after", (value,))))
    # the controller takes both separators, which sbatch(1) says is one too many
    for value in [f"afterok:{j},afterany:{j}?afternotok:{j}", f"afterok:{j}?after:{j},singleton"]:
        flags = (("mode", "test"), ("after", (value,)))
        yield Case("dependency", value, flags, deliberate="allows one separator per job")
    # hpcdist's own short spelling is the sbatch value it renders
    for short, value in [(j, f"afterok:{j}"), (f"{j}:any", f"afterany:{j}")]:
        yield Case("dependency", value, (("mode", "test"), ("after", (short,))))


def _exclusive() -> Iterator[Case]:
    for value in ["user", "mcs", "USER", "Mcs", "foo", "node"]:
        yield _case("exclusive", value, "exclusive")


def _partition() -> Iterator[Case]:
    for value in ["debug", "debug,debug", "debug,", ",debug", "debug,,debug"]:
        yield _case("partition", value, "partition")


def _job_name() -> Iterator[Case]:
    for value in ["a" * 1024, "a" * 1025, "\u00e9" * 512, "\u00e9" * 513, "a" * 1023 + "\u00e9"]:
        yield _case("job-name", value, "job_name", output="job-%j.out")


def _node_list() -> Iterator[Case]:
    for value in ["node[1-2]", "node1,node2", "node[3-4]", "node2"]:
        yield _case("nodelist", value, "nodelist", nodes=2, sbatch_extra=["--nodes=2"])
    # more nodes than --nodes: SLURM 22.05 refuses the job, 24.11 runs it on 2 of them
    for value in ["node[1-2,4]", "node[1-3]"]:
        extra = {"nodes": 2, "sbatch_extra": ["--nodes=2"], "deliberate": "names 3 nodes"}
        yield _case("nodelist", value, "nodelist", **extra)
    for value in ["$(touch pwned)", "a'b", "node[1-2", "node;1"]:
        yield _case("nodelist", value, "nodelist", nodes=2, sbatch_extra=["--nodes=2"])


def _constraint() -> Iterator[Case]:
    good = ["testbed", "testbed&testbed", "testbed|testbed", "[testbed|testbed]", "(testbed)"]
    good += ["testbed,testbed", "testbed*2", "testbed&"]
    bad = ["&&", "!testbed", "&testbed", "testbed||testbed", "testbed&&testbed", "testbed'"]
    for value in [*good, *bad]:
        yield _case("constraint", value, "constraint")


def _array() -> Iterator[Case]:
    good = ["0-15:2%4", "0-15", "1,3,5-7", "0-15%4", "7", "0-15:2", "0-1000", "0-3,5%2"]
    bad = ["0-1001", "1-0", "0-15:0", "a-b", "0-3:"]
    for value in [*good, *bad]:
        yield _case("array", value, "array")
    # sbatch reads a limit that is no number as 0
    yield _case("array", "0-3%x", "array", deliberate="the limit after % must be a number")


def _sbatch_accepts(case: Case, cwd: Path) -> tuple[bool, str]:
    proc = subprocess.run(
        [
            "sbatch",
            "--test-only",
            f"--{case.option}={case.value}",
            *case.sbatch_extra,
            "--wrap",
            "true",
        ],
        cwd=cwd,
        env=slurm_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    answer = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
    return proc.returncode == 0 or any(a in answer for a in _RESOURCE_ANSWERS), answer


def _hpcdist_accepts(case: Case, profile: Path) -> tuple[bool, str]:
    try:
        spec_from_options({"profile": str(profile), **dict(case.flags)})
    except UserError as exc:
        return False, str(exc)
    return True, ""


@pytest.fixture(scope="module")
def held_job(slurm_cluster: SlurmCluster) -> Iterator[int]:
    """A job that stays queued, for the dependencies to name."""
    job = run_slurm("sbatch", "--parsable", "--hold", "--wrap", "true").stdout.strip()
    yield int(job.split(";")[0])
    run_slurm("scancel", job.split(";")[0], check=False)


def test_hpcdist_accepts_exactly_what_sbatch_accepts(
    held_job: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profile = tmp_path / "testbed.yaml"
    profile.write_text("partition: debug\npartitions: [debug]\nmax_nodes: 4\ncores_per_node: 2\n")
    profile.chmod(0o600)
    monkeypatch.chdir(tmp_path)
    cases = [
        *_memory(),
        *_time(),
        *_signal(),
        *_mail_type(),
        *_nodes(),
        *_dependency(held_job),
        *_exclusive(),
        *_partition(),
        *_job_name(),
        *_node_list(),
        *_constraint(),
        *_array(),
    ]
    assert len(cases) < 300
    disagree = []
    for case in cases:
        slurm, answer = _sbatch_accepts(case, tmp_path)
        ours, message = _hpcdist_accepts(case, profile)
        if case.deliberate is not None:
            # SLURM takes it (some releases); hpcdist says why it does not, in its own terms.
            if ours or case.deliberate not in message:
                disagree.append(f"{case.option}={case.value!r}: sbatch {slurm}, {message!r}")
            continue
        if slurm != ours:
            disagree.append(
                f"{case.option}={case.value!r}: sbatch {'takes' if slurm else 'refuses'} it "
                f"({answer!r}), hpcdist {'takes' if ours else 'refuses'} it ({message!r})"
            )
        elif not ours and "SLURM" not in message and "sbatch" not in message:
            disagree.append(
                f"{case.option}={case.value!r}: refused without SLURM's terms: {message}"
            )
    assert not disagree, "\n".join(disagree)
