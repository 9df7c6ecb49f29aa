"""slurmrestd on the testbed (HPCDIST_TESTBED_SLURMRESTD=1): it answers a token from
`scontrol token` in every OpenAPI version it serves and refuses a request without one. The
answers' shapes per version are recorded in tests/fixtures/slurmrestd (scripts/slurmrestd-record).
"""

from __future__ import annotations

import http.client
import json
import os
import pwd
import subprocess
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.integration.conftest import slurm_env
from tests.integration.sidebed import SideBed, side_testbed

pytestmark = [pytest.mark.slurm, pytest.mark.slurm_versions, pytest.mark.xdist_group("rest")]


@pytest.fixture(scope="module")
def restbed() -> Iterator[SideBed]:
    with side_testbed("rest", 70, slurmrestd="1") as bed:
        yield bed


def get(bed: SideBed, path: str, headers: dict[str, str]) -> tuple[int, Any]:
    url = urlsplit(bed.exports["HPCDIST_SLURMRESTD"])
    assert url.hostname == "127.0.0.1" and url.port
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        conn.request("GET", path, headers=headers)
        answer = conn.getresponse()
        raw = answer.read().decode(errors="replace")
    finally:
        conn.close()
    try:
        return answer.status, json.loads(raw)
    except ValueError:
        return answer.status, raw


def slurm(bed: SideBed, *argv: str) -> str:
    env = slurm_env({"SLURM_CONF": str(bed.slurm_conf)})
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout


def auth(bed: SideBed, lifespan: int = 300) -> dict[str, str]:
    me = pwd.getpwuid(os.getuid()).pw_name
    printed = slurm(bed, "scontrol", "token", f"username={me}", f"lifespan={lifespan}").strip()
    assert printed.startswith("SLURM_JWT=")
    return {"X-SLURM-USER-NAME": me, "X-SLURM-USER-TOKEN": printed.split("=", 1)[1]}


def test_every_served_version_pings_with_a_token_of_scontrol(restbed: SideBed) -> None:
    headers = auth(restbed)
    status, spec = get(restbed, "/openapi/v3", headers)
    assert status == 200
    versions = sorted({p.split("/")[2] for p in spec["paths"] if p.startswith("/slurm/v0.0.")})
    assert versions, spec["paths"]
    release = slurm(restbed, "scontrol", "--version").split()[-1]
    for version in versions:
        ping = next(p for p in spec["paths"] if p.rstrip("/") == f"/slurm/{version}/ping")
        status, body = get(restbed, ping, headers)
        assert status == 200, (version, body)
        meta = body["meta"]
        assert (meta.get("slurm") or meta.get("Slurm"))["release"] == release


def test_a_request_without_a_token_or_with_garbage_is_refused(restbed: SideBed) -> None:
    status, spec = get(restbed, "/openapi/v3", auth(restbed))
    jobs = max(p for p in spec["paths"] if p.rstrip("/").endswith("/jobs") and "/slurm/" in p)
    assert get(restbed, jobs, {}) == (401, "Authentication failure")
    me = pwd.getpwuid(os.getuid()).pw_name
    status, body = get(restbed, jobs, {"X-SLURM-USER-NAME": me, "X-SLURM-USER-TOKEN": "x"})
    # 22.05 answers 500, 24.11 on 511; both say so in the errors of the version's body.
    assert status in (500, 511) and body["jobs"] == [], body
