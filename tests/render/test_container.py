"""Containers: apptainer/singularity wrap the rank's command, pyxis is srun options."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from hpcdist.facts.launch import RANK_ENV_COMMAND
from hpcdist.render.directives import srun_options
from hpcdist.render.script import render
from hpcdist.spec.options import spec_from_options
from tests.spec.test_siteopts import SITE_PROFILE


@pytest.fixture
def site(tmp_path: Path) -> str:
    """A site profile whose container is /images/torch.sif, apptainer, /scratch mounted."""
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(SITE_PROFILE))
    return str(path)


def test_apptainer_wraps_the_rank_command_with_nv_on_gpus(site: str) -> None:
    spec = spec_from_options({"profile": site, "mode": "nccl", "container_mounts": ("/data:/d",)})
    srun = next(line for line in render(spec).splitlines() if "apptainer exec" in line)
    # torch's env:// variables are set on the host, then passed into the container.
    assert srun.split() == [
        *RANK_ENV_COMMAND,
        "apptainer",
        "exec",
        "--nv",
        "--bind=/scratch",
        "--bind=/data:/d",
        "--writable-tmpfs",
        "/images/torch.sif",
        "python3",
        "-m",
        "ufsemulator",
        "train",
    ]


def test_singularity_on_cpus_has_no_nv() -> None:
    spec = spec_from_options(
        {"profile": None, "mode": "gloo", "container": "c.sif", "container_runtime": "singularity"}
    )
    line = next(ln for ln in render(spec).splitlines() if "singularity exec" in ln)
    assert line.split()[4:7] == ["singularity", "exec", "c.sif"]


def test_pyxis_is_srun_options_not_a_wrapper() -> None:
    spec = spec_from_options(
        {
            "profile": None,
            "mode": "gloo",
            "container": "nvcr.io#nvidia/pytorch:24.01-py3",
            "container_runtime": "pyxis",
            "container_mounts": ("/scratch:/scratch", "/home"),
            "container_options": ("--container-workdir=/work",),
        }
    )
    words = srun_options(spec)
    assert words[-3:] == [
        "--container-image=nvcr.io#nvidia/pytorch:24.01-py3",
        "--container-mounts=/scratch:/scratch,/home",
        "--container-workdir=/work",
    ]
    script = render(spec)
    assert "'--container-image=nvcr.io#nvidia/pytorch:24.01-py3'" in script
    assert "apptainer" not in script
    # The image need not hold hpcdist: the command starts there as it is.
    assert "hpcdist.distributed.rankenv" not in script


def test_container_with_torchrun_wraps_torchrun() -> None:
    spec = spec_from_options(
        {"profile": None, "mode": "gloo", "launcher": "torchrun", "container": "c.sif"}
    )
    line = next(ln for ln in render(spec).splitlines() if "c.sif" in ln)
    words = line.split()
    assert words[:3] == ["apptainer", "exec", "c.sif"]
    # Inside the container: the shell that keeps torchrun's agent from the warning, then the
    # agent (torch.distributed.run behind its handler), which adds the node's rank itself.
    assert words[3:5] == ["bash", "-c"]
    assert """'trap "" USR2 && exec "$@"' python3 python3 -c "${torchrun_agent}" --nnodes""" in line
    # Without a warning: torchrun itself, the node's rank expanded by the shell on each node.
    plain = render(dataclasses.replace(spec, signal=None))
    line = next(ln for ln in plain.splitlines() if "c.sif" in ln)
    assert """--node-rank="$SLURM_NODEID" "$@"' torchrun --nnodes=""" in line
    assert "torchrun_agent" not in plain
