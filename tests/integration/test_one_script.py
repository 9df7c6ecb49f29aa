"""One artefact, on the testbed: the batch script SLURM holds for a job ``hpcdist submit``
queued is, byte for byte, the script ``hpcdist render`` prints for the same flags.

Flag sets are drawn by Hypothesis across modes, launchers, arrays, containers and site
options. Each job is queued held (``--sbatch hold``, in render and submit alike), its
script is read back with ``scontrol write batch_script``, and it is cancelled.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hpcdist.errors import UserError
from hpcdist.jobs.submit import submit
from hpcdist.render.script import render
from hpcdist.spec.options import spec_from_options
from tests.integration.conftest import SlurmCluster, run_slurm

# Every flag takes a value the testbed accepts (partition debug, 4 nodes of 2 CPUs and
# 2000 MB, feature `testbed`, no GPUs: an nccl job counts them at run time).
SITE: dict[str, Any] = {
    "constraint": st.just("testbed"),
    "mail_type": st.sampled_from(["END", "END,FAIL"]),
    "mail_user": st.just("me@site.org"),
    "exclusive": st.booleans(),
    "memory": st.sampled_from(["500M", "1G"]),
    "nodelist": st.just("node1"),  # widened to the job's node count below
    "exclude": st.just("node4"),
    "cpu_bind": st.sampled_from(["cores", "none"]),
    "sbatch_options": st.sampled_from([('comment=it\'s a "test"',), ("comment=a b\\c",)]),
    "srun_args": st.sampled_from([("--export=ALL,X=a b",), ("--distribution=block",)]),
    "rank_logs": st.sampled_from(["label", "split", "none"]),
    "container": st.just("/images/torch 2.13.sif"),
    "job_name": st.sampled_from(["emu", "emu run #1", 'a\'b "c" $(id)']),
    "env": st.sampled_from([("A=1",), ("B_1=a b", "C=$HOME")]),
    "signal": st.sampled_from(["USR2@90", "USR1@120", "B:USR2@90"]),
    "requeue": st.booleans(),
    "sweep": st.sampled_from([("training.lr=1e-3,2e-3",), ("training.epochs=1,2,3",)]),
    "max_parallel": st.integers(1, 2),
    "launcher": st.sampled_from(["srun", "torchrun"]),
}


@st.composite
def flag_sets(draw: st.DrawFn) -> dict[str, Any]:
    mode = draw(st.sampled_from(["threads", "gloo", "test", "nccl"]))
    flags: dict[str, Any] = {"profile": None, "mode": mode, "sbatch_options": ("hold",)}
    if mode in ("gloo", "test"):
        flags["nodes"] = draw(st.integers(1, 2))
        flags["tasks_per_node"] = draw(st.integers(1, 2))
        flags["cpus_per_task"] = 1
    chosen = draw(st.sets(st.sampled_from(sorted(SITE)), max_size=6))
    for name in chosen:
        value = draw(SITE[name])
        if name == "sbatch_options":
            value = ("hold", *value)
        flags[name] = value
    if "max_parallel" in flags and "sweep" not in flags:
        del flags["max_parallel"]
    if flags.get("nodes", 1) == 2 and "nodelist" in flags:
        flags["nodelist"] = "node[1-2]"  # SLURM wants every listed node in the job
    return flags


@pytest.mark.slurm
@settings(
    max_examples=200,
    derandomize=True,  # the same 200 flag sets on every run
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(flags=flag_sets())
def test_the_script_slurm_holds_is_the_rendered_script(
    flags: dict[str, Any],
    slurm_cluster: SlurmCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    try:
        spec = spec_from_options(flags)
    except (UserError, ValueError):
        assume(False)  # refused alike by render and submit (tests/spec/test_properties.py)
        return
    rendered = render(spec)
    record = submit(spec, "slurm", project_dir=tmp_path).record
    job = record.job_id.partition("_")[0]
    try:
        held = run_slurm("scontrol", "write", "batch_script", job, "-").stdout
    finally:
        run_slurm("scancel", job, check=False)
    assert held == rendered, flags


@pytest.mark.slurm
def test_the_held_script_check_can_fail(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """The comparison above would see a script that is not render's: one queued by hand."""
    script = tmp_path / "other.sh"
    script.write_text("#!/bin/bash\n#SBATCH --hold\ntrue\n")
    queued = subprocess.run(
        ["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        held = run_slurm("scontrol", "write", "batch_script", queued, "-").stdout
    finally:
        run_slurm("scancel", queued, check=False)
    spec = spec_from_options({"profile": None, "mode": "gloo", "sbatch_options": ("hold",)})
    assert held == script.read_text()
    assert held != render(spec)
