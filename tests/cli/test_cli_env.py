"""`hpcdist env`: this rank's contract inside a job, every rank's with --simulate."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from hpcdist.cli.env import PORT_NOTE, env_command
from hpcdist.distributed import derive_port

SIMULATE = ["--simulate", "--job-id", "1234"]


_LAUNCHER_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMP_NUM_THREADS",
)


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    # Whatever job runs the tests, the command sees only the environment given here.
    clean: dict[str, str | None] = {
        k: None for k in os.environ if k.startswith(("SLURM_", "SUBMITIT_")) or k in _LAUNCHER_VARS
    }
    clean.update(env or {})
    result = CliRunner().invoke(env_command, list(args), env=clean)
    return result.exit_code, result.output


def table(output: str) -> list[list[str]]:
    *lines, note = output.splitlines()
    assert note == PORT_NOTE  # after the table, on stderr
    header, *rows = lines
    assert header.split() == ["rank", "local", "node", "master", "threads", "device"]
    return [row.split() for row in rows]


def test_simulate_prints_every_rank_of_the_allocation() -> None:
    code, out = invoke(*SIMULATE, "--nodelist", "gpu-[01-03,07]", "--tasks-per-node", "4")
    assert code == 0, out
    rows = table(out)
    port = derive_port(1234, 0)
    assert len(rows) == 16
    assert rows[0] == ["0", "0", "gpu-01", f"gpu-01:{port}", "-", "cpu"]
    assert rows[13] == ["13", "1", "gpu-07", f"gpu-01:{port}", "-", "cpu"]
    assert [r[2] for r in rows[::4]] == ["gpu-01", "gpu-02", "gpu-03", "gpu-07"]


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [("gpu-[01-02]", ("gpu-01", "gpu-02")), ("gpu-[07-08]", ("gpu-07", "gpu-08"))],
)
def test_simulate_eight_gpus_on_two_nodes(nodelist: str, hosts: tuple[str, str]) -> None:
    args = [
        *SIMULATE,
        "--nodelist",
        nodelist,
        "--tasks-per-node",
        "8",
        "--gpus-per-node",
        "8",
        "--cpus-per-task",
        "6",
    ]
    code, out = invoke(*args)
    assert code == 0, out
    rows = table(out)
    assert len(rows) == 16
    assert [r[0] for r in rows] == [str(i) for i in range(16)]
    assert [r[5] for r in rows] == [f"cuda:{i}" for i in range(8)] * 2
    assert [r[1] for r in rows] == [str(i) for i in range(8)] * 2
    assert [r[2] for r in rows] == [hosts[0]] * 8 + [hosts[1]] * 8
    assert {r[4] for r in rows} == {"6"}
    assert {r[3] for r in rows} == {f"{hosts[0]}:{derive_port(1234, 0)}"}
    code, out = invoke(*args, "--json")
    assert code == 0, out
    ranks = json.loads(out)
    assert {(r["world_size"], r["local_world_size"], r["master_addr"]) for r in ranks} == {
        (16, 8, hosts[0])
    }
    assert [r["node_rank"] for r in ranks] == [0] * 8 + [1] * 8


def test_simulate_accepts_the_compressed_layout() -> None:
    code, out = invoke(*SIMULATE, "--nodelist", "n[1-4]", "--tasks-per-node", "2(x3),1")
    assert code == 0, out
    rows = table(out)
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("0", "0", "n1"),
        ("1", "1", "n1"),
        ("2", "0", "n2"),
        ("3", "1", "n2"),
        ("4", "0", "n3"),
        ("5", "1", "n3"),
        ("6", "0", "n4"),
    ]


def test_the_port_note_goes_to_stderr_and_never_into_json() -> None:
    result = CliRunner().invoke(env_command, [*SIMULATE, "--nodelist", "n1"])
    assert result.exit_code == 0 and PORT_NOTE not in result.stdout
    assert result.stderr.strip() == PORT_NOTE
    result = CliRunner().invoke(env_command, [*SIMULATE, "--nodelist", "n1", "--json"])
    assert result.stderr == "" and json.loads(result.stdout)[0]["rank"] == 0


def test_simulate_step_id_changes_the_port() -> None:
    _, step0 = invoke(*SIMULATE, "--nodelist", "n1", "--step-id", "0", "--json")
    _, step1 = invoke(*SIMULATE, "--nodelist", "n1", "--step-id", "1", "--json")
    assert json.loads(step0)[0]["master_port"] == derive_port(1234, 0)
    assert json.loads(step1)[0]["master_port"] == derive_port(1234, 1)


def test_simulate_json_has_every_field() -> None:
    code, out = invoke(
        *SIMULATE,
        "--nodelist",
        "node[1-2]",
        "--tasks-per-node",
        "2",
        "--gpus-per-node",
        "2",
        "--json",
    )
    assert code == 0, out
    rows = json.loads(out)
    assert len(rows) == 4
    assert rows[3] == {
        "rank": 3,
        "local_rank": 1,
        "world_size": 4,
        "local_world_size": 2,
        "node_rank": 1,
        "master_addr": "node1",
        "master_port": derive_port(1234, 0),
        "num_threads": None,
        "source": "slurm",
        "hostname": "node2",
        "device": "cuda:1",
    }


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--nodelist", "gpu-[01-03"], ("--nodelist", "'gpu-[01-03'", "unbalanced")),
        (["--nodelist", "node[5-3]"], ("'node[5-3]'", "backwards")),
        (["--nodelist", "n[1-3]", "--tasks-per-node", "2(x2)"], ("'2(x2)'", "3")),
        (["--nodelist", "n[1-3]", "--tasks-per-node", "two"], ("--tasks-per-node", "'two'")),
        (["--nodelist", "n[1-2]", "--tasks-per-node", "0,2"], ("--tasks-per-node", "'0,2'")),
        (["--nodelist", "n1", "--tasks-per-node", "8", "--gpus-per-node", "4"], ("4 GPUs", "8")),
        (["--nodelist", "n1", "--cpus-per-task", "0"], ("--cpus-per-task", "0")),
        (["--nodelist", "n1", "--job-id", "-5"], ("--job-id", "-5")),
    ],
)
def test_simulate_bad_input_is_a_usage_error_naming_the_value(
    args: list[str], words: tuple[str, ...]
) -> None:
    code, out = invoke("--simulate", "--job-id", "7", *args)
    assert code == 2, out
    assert "Traceback" not in out
    for word in words:
        assert word in out


def test_simulate_needs_a_nodelist_and_a_job_id() -> None:
    code, out = invoke("--simulate", "--nodelist", "n1")
    assert code == 2
    assert "--job-id" in out


def test_allocation_options_without_simulate_are_refused() -> None:
    code, out = invoke("--nodelist", "n1", "--job-id", "3")
    assert code == 2
    assert "--nodelist, --job-id" in out and "--simulate" in out


def test_inside_a_job_prints_this_ranks_contract() -> None:
    env = {
        "SLURM_JOB_ID": "42",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_NODELIST": "node[1-2]",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_CPUS_PER_TASK": "2",
        "SLURMD_NODENAME": "node2",
    }
    code, out = invoke(env=env)
    assert code == 0, out
    fields = dict(line.split(":", 1) for line in out.splitlines())
    assert {k: v.strip() for k, v in fields.items()} == {
        "rank": "3",
        "local_rank": "1",
        "world_size": "4",
        "local_world_size": "2",
        "node_rank": "1",
        "master_addr": "node1",
        "master_port": str(derive_port(42, 0)),
        "num_threads": "2",
        "source": "slurm",
        "hostname": "node2",
    }
    code, out = invoke("--json", env=env)
    assert json.loads(out)["rank"] == 3


def test_inside_a_job_with_stale_variables_is_a_one_line_error() -> None:
    stale = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0"}
    code, out = invoke(env=stale)
    assert code == 2
    assert "SLURM_STEP_NODELIST" in out
    assert "Traceback" not in out


def test_registered_on_the_hpcdist_group_errors_are_one_line() -> None:
    from hpcdist.cli.main import cli

    result = CliRunner().invoke(cli, ["env", "--simulate", "--job-id", "1", "--nodelist", "n[1-"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "'n[1-'" in lines[0]


def test_cli_env_imports_without_torch() -> None:
    code = "import sys, hpcdist.cli.env; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
