"""--set and --sweep reach the workload's config schema through its entry point, never by
hpcdist importing the workload (import-linter forbids that import; these check the plug)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hpcdist.errors import SpecError
from hpcdist.spec.workload import GROUP, WORKLOAD, config_checker


def test_the_installed_workload_declares_its_checker() -> None:
    checker = config_checker()
    assert WORKLOAD == "ufsemulator"
    assert checker.valid_key("training.lr") and not checker.valid_key("training..lr")
    assert checker.parse_override("training.lr=0.001") == ("training.lr", 0.001)
    with pytest.raises(ValueError, match="unknown key"):
        checker.check_overrides(["training.no_such_key=1"])


def test_a_workload_without_a_checker_is_one_line() -> None:
    with pytest.raises(SpecError, match=f"no installed package declares its checker.*{GROUP}"):
        config_checker("no-such-workload")


@pytest.mark.parametrize(
    ("argv", "loaded"),
    [
        (["render", "--nodes", "2"], False),
        (["render", "--nodes", "2", "--set", "training.lr=3e-4"], True),
    ],
)
def test_the_workload_loads_only_for_set_or_sweep(argv: list[str], loaded: bool) -> None:
    code = (
        f"import sys; from hpcdist.cli.main import main; rc = main({argv!r});"
        "print('ufsemulator' in sys.modules); sys.exit(rc)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == str(loaded)
