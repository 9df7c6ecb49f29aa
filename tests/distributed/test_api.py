"""``hpcdist.distributed``'s public API: listed once (its ``__all__``), loaded on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

import hpcdist.distributed as api
from hpcdist.distributed import group


@pytest.mark.parametrize("name", api.__all__)
def test_every_public_name_is_the_group_modules(name: str) -> None:
    assert getattr(api, name) is getattr(group, name)


def test_an_unknown_name_says_so() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        api.nope  # noqa: B018


def test_the_protocol_and_the_job_step_do_not_load_the_group_module() -> None:
    code = (
        "import sys\n"
        "from hpcdist.facts import protocol\n"
        "import hpcdist.distributed.jobstep\n"
        "print('hpcdist.distributed.group' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
