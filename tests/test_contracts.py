"""The import contracts of pyproject.toml mean what they say: the workload's contract names
every module of hpcdist but the public ones, and breaks when the workload imports one."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]
PUBLIC = {"hpcdist", "hpcdist.distributed", "hpcdist.state", "hpcdist.errors"}
WORKLOAD_CONTRACT = "ufsemulator imports only hpcdist's public API"


def _contracts() -> list[dict[str, object]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    contracts: list[dict[str, object]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def _workload_contract() -> dict[str, object]:
    return next(c for c in _contracts() if str(c["name"]).startswith(WORKLOAD_CONTRACT))


def _modules() -> list[str]:
    names = []
    for path in sorted((REPO / "hpcdist").rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_every_module_but_the_public_ones_is_forbidden_to_the_workload() -> None:
    forbidden = [str(name) for name in _workload_contract()["forbidden_modules"]]  # type: ignore[attr-defined]
    uncovered = [
        module
        for module in _modules()
        if module not in PUBLIC
        and not any(module == f or module.startswith(f + ".") for f in forbidden)
    ]
    assert uncovered == []
    assert not PUBLIC & set(forbidden)


def _lint_workload(tmp_path: Path, line: str) -> subprocess.CompletedProcess[str]:
    """lint-imports with the workload's contract over hpcdist and a one-line workload."""
    shutil.copytree(REPO / "hpcdist", tmp_path / "hpcdist")
    workload = tmp_path / "ufsemulator"
    workload.mkdir()
    (workload / "__init__.py").write_text("")
    (workload / "job.py").write_text(line + "\n")
    contract = _workload_contract()
    lines = [
        "[importlinter]",
        "root_packages =\n    hpcdist\n    ufsemulator",
        "[importlinter:contract:workload]",
        f"name = {contract['name']}",
        "type = forbidden",
        "source_modules =\n    ufsemulator",
        "forbidden_modules =\n" + "\n".join(f"    {m}" for m in contract["forbidden_modules"]),  # type: ignore[attr-defined]
        "allow_indirect_imports = true",
    ]
    (tmp_path / ".importlinter").write_text("\n".join(lines) + "\n")
    lint = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    return subprocess.run(
        [lint, "--config", ".importlinter", "--no-cache"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("line", "kept"),
    [
        ("from hpcdist.state import DigestBook", True),
        ("from hpcdist.distributed import SIGNAL_VAR, setup_distributed", True),
        ("from hpcdist.errors import UserError", True),
        ("from hpcdist.state.digests import DigestBook", False),
        ("from hpcdist.facts.protocol import SIGNAL_VAR", False),
        ("from hpcdist.jobs.localjob import identify", False),
    ],
)
def test_the_workload_contract_breaks_on_a_private_import(
    line: str, kept: bool, tmp_path: Path
) -> None:
    proc = _lint_workload(tmp_path, line)
    assert (proc.returncode == 0) is kept, proc.stdout + proc.stderr
    assert ("BROKEN" in proc.stdout) is not kept
