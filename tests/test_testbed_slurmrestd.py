"""The testbed's REST daemon (HPCDIST_TESTBED_SLURMRESTD=1) as configuration text, and the
recorded answers of tests/fixtures/slurmrestd: pure functions and files, no cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.test_testbed_shapes import tb

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "slurmrestd"
RECORDED = sorted(p for p in FIXTURES.glob("v0.0.*/*") if p.is_dir())


def make_testbed(base: Path, **env: str) -> Any:
    settings = tb.Settings.from_environ({f"HPCDIST_TESTBED_{k}": v for k, v in env.items()})
    return tb.Testbed(tb.Paths.under(base), settings)


def test_jwt_lines_only_with_slurmrestd_in_both_configs() -> None:
    plain, rest = make_testbed(Path("/tmp/tb")), make_testbed(Path("/tmp/tb"), SLURMRESTD="1")
    key = "AuthAltParameters=jwt_key=/tmp/tb/etc/jwt_hs256.key"
    for text in (tb.slurm_conf_text(rest, 1000), tb.dbd_conf_text(rest)):
        assert "AuthAltTypes=auth/jwt" in text.splitlines() and key in text.splitlines()
    for text in (tb.slurm_conf_text(plain, 1000), tb.dbd_conf_text(plain)):
        assert "AuthAlt" not in text and "jwt" not in text


@pytest.mark.parametrize(("offset", "port"), [("0", 6820), ("2750", 9570), ("95", 6915)])
def test_slurmrestd_port_follows_the_offset(offset: str, port: int) -> None:
    cfg = make_testbed(Path("/tmp/tb"), SLURMRESTD="1", PORT_OFFSET=offset).cfg
    assert cfg.slurmrestd_url == f"http://127.0.0.1:{port}"
    assert "slurmrestd" in cfg.daemons and "slurm-wlm-jwt-plugin" in cfg.packages


def test_recorded_settings_without_slurmrestd_keep_their_old_text() -> None:
    plain, rest = (
        make_testbed(Path("/tmp/tb")).cfg,
        make_testbed(Path("/tmp/tb"), SLURMRESTD="1").cfg,
    )
    assert "slurmrestd" not in json.loads(plain.record())
    assert json.loads(rest.record())["slurmrestd"] is True
    assert tb.Settings(**json.loads(rest.record())) == rest


def test_without_accounting_slurmrestd_loads_no_slurmdbd_plugin(tmp_path: Path) -> None:
    plugins = tmp_path / "usr/lib/x86_64-linux-gnu/slurm-wlm"
    plugins.mkdir(parents=True)
    names = ("auth_munge", "openapi_v0_0_38", "openapi_dbv0_0_38", "openapi_slurmctld")
    for name in (*names, "openapi_slurmdbd", "openapi_util"):
        (plugins / f"{name}.so").touch()
    bed = make_testbed(tmp_path / "base", SLURMRESTD="1", ACCOUNTING="0", PREFIX=str(tmp_path))
    assert tb.controller_openapi_plugins(bed) == [
        "openapi/slurmctld",
        "openapi/util",
        "openapi/v0.0.38",
    ]


def test_every_recording_has_the_same_answers_and_no_token() -> None:
    assert len(RECORDED) >= 10, RECORDED
    names = {p: sorted(f.name for f in p.glob("*.json")) for p in RECORDED}
    assert len(set(map(tuple, names.values()))) == 1, names
    for folder in RECORDED:
        for path in folder.glob("*.json"):
            text = path.read_text()
            assert "eyJ" not in text, f"{path} holds a token"  # a JWT's header, base64
            answer = json.loads(text)
            assert set(answer) == {"request", "status", "body"}


@pytest.mark.parametrize("folder", RECORDED, ids=lambda p: f"{p.parent.name}-{p.name}")
def test_job_state_is_a_string_until_v0_0_38_and_a_list_after(folder: Path) -> None:
    job = json.loads((folder / "job_running.json").read_text())["body"]["jobs"][0]
    newer = folder.parent.name >= "v0.0.40"
    assert job["job_state"] == (["RUNNING"] if newer else "RUNNING")
    limit = job["time_limit"]
    assert limit == ({"set": True, "infinite": False, "number": 5} if newer else 5)
    submitted = json.loads((folder / "job_submit.json").read_text())
    assert submitted["status"] == 200 and submitted["body"]["job_id"] == job["job_id"]
    assert json.loads((folder / "error_no_token.json").read_text())["status"] == 401
