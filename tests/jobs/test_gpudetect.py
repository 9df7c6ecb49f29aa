"""submit with no GPU count: the partition's GPUs per node, from sinfo."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcdist.cli.main import cli
from hpcdist.errors import SpecError
from hpcdist.jobs.gpudetect import gres_gpus, parse_sinfo


@pytest.mark.parametrize(
    ("gres", "gpu_type", "count"),
    [
        ("gpu:4", None, 4),
        ("gpu:a100:4(S:0-1)", None, 4),
        ("gpu:a100:4(S:0-1)", "a100", 4),
        ("gpu:a100:4(S:0-1)", "h100", 0),
        ("gpu:a100:2(S:0,1),gpu:v100:2(S:1)", None, 4),
        ("gpu:a100:2(S:0,1),gpu:v100:2(S:1)", "v100", 2),
        ("nvme:1,gpu:8", None, 8),
        ("(null)", None, 0),
        ("gpu", None, 0),
    ],
)
def test_gres_gpus(gres: str, gpu_type: str | None, count: int) -> None:
    assert gres_gpus(gres, gpu_type) == count


SINFO = "debug*|(null)|2\ngpu|gpu:a100:4(S:0-1)|64\ngpu|gpu:a100:2(S:0)|32\nsmall|gpu:1|8\n"


@pytest.mark.parametrize(
    ("partition", "gpus", "cpus"),
    [("gpu", 2, 32), ("small", 1, 8)],
)
def test_parse_sinfo_takes_the_fewest_gpus_of_the_partition(
    partition: str, gpus: int, cpus: int
) -> None:
    found = parse_sinfo(SINFO, partition, None)
    assert (found.partition, found.gpus_per_node, found.cpus_per_node) == (partition, gpus, cpus)


@pytest.mark.parametrize(
    ("text", "partition", "gpu_type", "message"),
    [
        (SINFO, None, None, "partition debug has no GPUs (sinfo %G: (null))"),
        (SINFO, "gpu", "h100", "partition gpu has no GPUs of type 'h100'"),
        (SINFO, "nosuch", None, "sinfo knows no partition 'nosuch'"),
        ("gpu|gpu:4|8\n", None, None, "no partition given and the cluster has no default one"),
    ],
)
def test_parse_sinfo_refusals(
    text: str, partition: str | None, gpu_type: str | None, message: str
) -> None:
    with pytest.raises(SpecError, match="--mode nccl with no GPU count") as info:
        parse_sinfo(text, partition, gpu_type)
    assert message in str(info.value)


def test_submit_fills_the_gpu_count_from_the_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool, text in {"sinfo": "debug*|gpu:tesla:2(S:0)|4", "sbatch": ""}.items():
        (bindir / tool).write_text(f"#!/bin/sh\nprintf '%s\\n' '{text}'\n")
        (bindir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        cli, ["submit", "--mode", "nccl", "--nodes", "2", "--executor", "slurm", "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    assert result.stderr.strip() == (
        "hpcdist: no GPU count given; partition debug has 2 GPUs per node "
        "(sinfo %G: gpu:tesla:2(S:0)): submitting 2 tasks per node, 1 CPU each"
    )
    params = json.loads(result.stdout)["parameters"]
    assert params["ntasks_per_node"] == 2
    assert params["additional_parameters"]["gpus_per_node"] == 2
    # The local profile's 2 cores per node, shared by the 2 GPUs (sinfo said 4 CPUs).
    assert params["additional_parameters"]["cpus_per_task"] == 1
