"""The requeue protocol is defined once (hpcdist/facts/protocol.py): nothing else
spells its names or numbers, and the rendered scripts carry the same values the training reads."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from hpcdist.facts import protocol
from hpcdist.render.script import render
from hpcdist.spec.options import spec_from_options

REPO = Path(__file__).resolve().parents[2]
SOURCES = [
    p
    for d in ("hpcdist", "ufsemulator", "templates", "bench")
    for p in (REPO / d).rglob("*")
    if p.suffix in (".py", ".j2", ".sh")
]


@pytest.mark.parametrize(
    "literal",
    [
        protocol.SIGNAL_VAR,
        protocol.MARKER_VAR,
        protocol.RUN_DIR_VAR,
        protocol.RESTARTS_VAR,
        protocol.MARKER_DIR,
        protocol.SECRET_VAR,
        protocol.SECRET_DIR,
        f"= {protocol.REQUEUE_EXIT_CODE}",
        f"{protocol.PORT_LOW}",
        f"{protocol.PORT_HIGH}",
    ],
)
def test_each_protocol_constant_is_spelled_in_one_place(literal: str) -> None:
    spelled = [
        p.relative_to(REPO).as_posix()
        for p in SOURCES
        if re.search(rf"(?<![\w$]){re.escape(literal)}(?!\w)", _code(p))
    ]
    assert spelled == ["hpcdist/facts/protocol.py"]


def _code(path: Path) -> str:
    """The file without comments and docstrings: prose may mention the names."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    prose: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            prose.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    lines = text.splitlines()
    return "\n".join(
        line.split("  #")[0]
        for n, line in enumerate(lines, 1)
        if n not in prose and not line.lstrip().startswith("#")
    )


def test_rendered_script_uses_the_protocol_values(tmp_path: Path) -> None:
    script = render(
        spec_from_options(
            {
                "profile": "local",
                "mode": "gloo",
                "nodes": 2,
                "signal": "USR1@60",
                "launcher": "torchrun",
            }
        )
    )
    assert f"export {protocol.SIGNAL_VAR}=USR1\n" in script
    # The state, the secret, the marker and the port come from the protocol's own code.
    assert "hpcdist.distributed.jobstep prepare " in script
    assert " --marker --torchrun-port)" in script
    assert "jobstep run --warning=USR1@60 --requeue " in script
    assert "SLURM_JOB_ID} * " not in script  # never the public job id


@pytest.mark.parametrize("job", ["7", "123456789"])
def test_a_scripts_secret_marker_and_port_follow_the_protocol(
    job: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpcdist.distributed.jobstep import prepare

    monkeypatch.delenv("HPCDIST_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    env = {"SLURM_JOB_ID": job, "SLURM_SUBMIT_DIR": str(tmp_path)}
    lines = dict(line.split("=", 1) for line in prepare(env, "{}", True, True))
    secret_file = tmp_path / protocol.SECRET_DIR / job
    assert lines[f"export {protocol.SECRET_VAR}"] == str(secret_file)
    assert lines[f"export {protocol.MARKER_VAR}"] == str(tmp_path / protocol.MARKER_DIR / job)
    secret = secret_file.read_text().strip()
    assert len(secret) == protocol.SECRET_HEX_DIGITS
    port = int(lines["MASTER_PORT"])
    assert port == protocol.derive_port(protocol.port_seed(secret), 0)
    assert protocol.PORT_LOW <= port <= protocol.PORT_HIGH


def test_the_port_follows_the_secret_not_the_job_id() -> None:
    a, b = "00000000" + "1" * 56, "00000001" + "1" * 56
    assert protocol.port_seed(a) == 0 and protocol.port_seed(b) == 1
    second = protocol.derive_port(protocol.port_seed(b), 0)
    assert second == protocol.PORT_LOW + protocol.PORT_STRIDE


@pytest.mark.parametrize(
    ("name", "inherited"),
    [
        ("SLURM_JOB_ID", True),
        ("SBATCH_PARTITION", True),
        ("SRUN_CPUS_PER_TASK", True),
        ("SALLOC_ACCOUNT", True),
        ("SLURM_CONF", False),
        ("SLURMD_NODENAME", False),
        ("MY_SLURM_JOB_ID", False),
        ("PATH", False),
    ],
)
def test_inherited_variables(name: str, inherited: bool) -> None:
    assert protocol.is_inherited(name) is inherited


@pytest.mark.parametrize(
    ("job_id", "step_id", "port"),
    [
        (0, 0, protocol.PORT_LOW),
        (0, 5, protocol.PORT_LOW + 5),
        (1, 1, protocol.PORT_LOW + protocol.PORT_STRIDE + 1),
        (0, protocol.PORT_HIGH - protocol.PORT_LOW, protocol.PORT_HIGH),
        (0, protocol.PORT_HIGH - protocol.PORT_LOW + 1, protocol.PORT_LOW),  # wraps round
    ],
)
def test_derive_port_values(job_id: int, step_id: int, port: int) -> None:
    assert protocol.derive_port(job_id, step_id) == port


@pytest.mark.parametrize(("job_id", "step_id"), [(-1, 0), (0, -1), (-1, -1)])
def test_derive_port_refuses_a_negative_seed_or_step(job_id: int, step_id: int) -> None:
    with pytest.raises(ValueError) as info:
        protocol.derive_port(job_id, step_id)
    assert str(info.value) == f"port seed and step id must be >= 0, got {job_id} and {step_id}"
