"""The slurmrestd client against a real local HTTP server (TCP and a unix socket) that replays
the answers recorded from SLURM 22.05, 24.11 and 26.05 (tests/fixtures/slurmrestd): the
version it negotiates, its operations, every refusal as one line that never holds the token;
the token's sources, the daemon's address, the job's environment and the CLI's --transport."""

from __future__ import annotations

import json
import os
import shutil
import socket
import socketserver
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from hpcdist.cli.main import cli
from hpcdist.errors import UserError
from hpcdist.slurm import rest
from hpcdist.slurm.probe import Partition, SlurmVersion, rest_probe
from hpcdist.slurm.rest import (
    SPOKEN,
    Endpoint,
    RestClient,
    RestError,
    endpoint,
    job_environment,
    negotiate,
    parse_endpoint,
    served_versions,
    token,
    transport_name,
)
from hpcdist.slurm.restjob import description

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurmrestd"
TOKEN = "eyJhbGciOiJIUzI1NiJ9.test-token.S3CR3T"
USER = "alice"
# Every folder of a version hpcdist speaks: (version, release).
SPOKEN_FOLDERS = sorted(
    (path.parent.name, path.name)
    for path in FIXTURES.glob("v*/*")
    if path.is_dir() and path.parent.name in SPOKEN
)
LEGACY = [f for f in SPOKEN_FOLDERS if f[0] == "v0.0.38"]
CURRENT = [f for f in SPOKEN_FOLDERS if f[0] != "v0.0.38"]
HANG = object()  # a route that never answers


def _recorded(version: str, release: str, name: str) -> tuple[int, Any]:
    answer = json.loads((FIXTURES / version / release / f"{name}.json").read_text())
    return answer["status"], answer["body"]


def _served(release: str, newest: str) -> dict[str, Any]:
    """``release``'s OpenAPI document without the versions after ``newest``, as a daemon
    that serves up to ``newest`` answers it."""
    document = json.loads((FIXTURES / f"served-{release}.json").read_text())
    paths = {
        path: methods
        for path, methods in document["paths"].items()
        if not path.startswith(("/slurm/v", "/slurmdb/v")) or path.split("/")[2] <= newest
    }
    return {**document, "paths": paths}


def _openapi(version: str, release: str) -> dict[tuple[str, str], Any]:
    return {("GET", "/openapi/v3"): (200, _served(release, version))}


# ---- a daemon that replays ------------------------------------------------------------------


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Daemon:
    address: str
    routes: dict[tuple[str, str], Any]
    seen: list[Request] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)

    def client(self, user: str = USER, timeout: float = 10.0) -> RestClient:
        return RestClient(parse_endpoint(self.address), TOKEN, user, timeout=timeout)


def _handler(daemon: Daemon) -> type[BaseHTTPRequestHandler]:
    class Replay(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            daemon.seen.append(Request(self.command, self.path, dict(self.headers), body))
            route = daemon.routes.get((self.command, self.path))
            if route is HANG:
                daemon.release.wait()  # set when the test ends; the client gave up before
                return
            status, answer = route or (599, f"no route for {self.command} {self.path}")
            text = isinstance(answer, str)
            data = answer.encode() if text else json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if text else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Replay


class _TcpServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up on a hanging route


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@contextmanager
def _daemon(routes: dict[tuple[str, str], Any], unix: bool) -> Iterator[Daemon]:
    folder = tempfile.mkdtemp(prefix="hpcrest-")  # short: a socket path has ~100 bytes
    server: socketserver.BaseServer
    if unix:
        path = f"{folder}/slurmrestd.socket"
        daemon = Daemon(f"unix:{path}", routes)
        server = _UnixServer(path, _handler(daemon))
    else:
        server = _TcpServer(("127.0.0.1", 0), _handler(daemon := Daemon("", routes)))
        daemon.address = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield daemon
    finally:
        daemon.release.set()
        server.shutdown()
        server.server_close()
        thread.join()
        shutil.rmtree(folder)


@pytest.fixture
def serve() -> Iterator[Callable[..., Daemon]]:
    with ExitStack() as stack:

        def start(routes: dict[tuple[str, str], Any], unix: bool = False) -> Daemon:
            return stack.enter_context(_daemon(routes, unix))

        yield start


def _refused(call: Callable[[], object]) -> str:
    """The whole message of the RestError ``call`` raises."""
    with pytest.raises(RestError) as refused:
        call()
    message = str(refused.value)
    assert "\n" not in message
    assert TOKEN not in message and TOKEN not in repr(refused.value)
    return message


# ---- the token travels in the header alone ---------------------------------------------------


@pytest.mark.parametrize("unix", [False, True], ids=["tcp", "unix"])
def test_the_token_travels_in_the_header_alone(serve: Callable[..., Daemon], unix: bool) -> None:
    status, body = _recorded("v0.0.42", "24.11.5", "job_running")
    daemon = serve(
        {**_openapi("v0.0.42", "24.11.5"), ("GET", "/slurm/v0.0.42/job/38166323"): (status, body)},
        unix=unix,
    )
    client = daemon.client()
    (record,) = client.job_records("38166323")
    assert (record["JobId"], record["JobState"], record["NodeList"]) == (
        "38166323",
        "RUNNING",
        "node1",
    )
    assert [(r.method, r.path) for r in daemon.seen] == [
        ("GET", "/openapi/v3"),
        ("GET", "/slurm/v0.0.42/job/38166323"),
    ]
    for request in daemon.seen:
        assert request.headers["X-SLURM-USER-TOKEN"] == TOKEN
        assert request.headers["X-SLURM-USER-NAME"] == USER
        assert TOKEN not in request.path
    assert repr(client) == f"RestClient({daemon.address!r}, user='alice')"


def test_a_prefix_of_the_address_goes_before_every_path(serve: Callable[..., Daemon]) -> None:
    daemon = serve({("GET", "/api/openapi/v3"): (200, _served("26.05.5", "v0.0.45"))})
    client = RestClient(parse_endpoint(daemon.address + "/api/"), TOKEN, USER, timeout=10)
    assert client.version == "v0.0.45"
    assert [r.path for r in daemon.seen] == ["/api/openapi/v3"]


# ---- the version -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("release", "served", "chosen"),
    [
        ("22.05.8", ["v0.0.38", "v0.0.37", "v0.0.36"], "v0.0.38"),
        ("24.11.5", ["v0.0.42", "v0.0.41", "v0.0.40"], "v0.0.42"),
        ("26.05.5", ["v0.0.45", "v0.0.44", "v0.0.43", "v0.0.42"], "v0.0.45"),
    ],
)
def test_the_newest_version_both_speak_is_chosen(
    release: str, served: list[str], chosen: str
) -> None:
    document = json.loads((FIXTURES / f"served-{release}.json").read_text())
    assert served_versions(document["paths"]) == served
    assert negotiate(served, "http://h:6820") == chosen


@pytest.mark.parametrize(("version", "release"), SPOKEN_FOLDERS)
def test_the_daemon_is_asked_its_versions_once(
    serve: Callable[..., Daemon], version: str, release: str
) -> None:
    daemon = serve(_openapi(version, release))
    client = daemon.client()
    assert (client.version, client.version) == (version, version)
    assert client.path("job/1") == f"/slurm/{version}/job/1"
    assert client.path("job/1", api="slurmdb") == f"/slurmdb/{version}/job/1"
    assert [r.path for r in daemon.seen] == ["/openapi/v3"]


@pytest.mark.parametrize(
    ("served", "shown"),
    [
        (["v0.0.37", "v0.0.36"], "v0.0.37, v0.0.36"),
        (["v0.0.39"], "v0.0.39"),
        ([], "no SLURM version"),
    ],
)
def test_a_daemon_serving_no_version_hpcdist_speaks_is_named_with_both_lists(
    served: list[str], shown: str
) -> None:
    assert _refused(lambda: negotiate(served, "http://login1:6820")) == (
        f"slurmrestd at http://login1:6820 serves {shown}; hpcdist speaks v0.0.45, v0.0.44, "
        "v0.0.43, v0.0.42, v0.0.41, v0.0.40, v0.0.38"
    )


def test_an_old_daemon_is_refused_when_the_version_is_first_needed(
    serve: Callable[..., Daemon],
) -> None:
    daemon = serve(_openapi("v0.0.37", "22.05.8"))
    assert _refused(lambda: daemon.client().job_records("1")) == (
        f"slurmrestd at {daemon.address} serves v0.0.37, v0.0.36; hpcdist speaks v0.0.45, "
        "v0.0.44, v0.0.43, v0.0.42, v0.0.41, v0.0.40, v0.0.38"
    )


# ---- refusals --------------------------------------------------------------------------------

JOBS_PATH = "/slurm/{}/jobs"


@pytest.mark.parametrize(("version", "release"), SPOKEN_FOLDERS)
def test_no_token_is_refused_in_one_line(
    serve: Callable[..., Daemon], version: str, release: str
) -> None:
    answer = _recorded(version, release, "error_no_token")
    assert answer == (401, "Authentication failure")
    daemon = serve({**_openapi(version, release), ("GET", JOBS_PATH.format(version)): answer})
    assert _refused(daemon.client().user_records) == (
        f"slurmrestd at {daemon.address} refused the token (HTTP 401); expected a token of "
        "'alice': export $(scontrol token)"
    )


def test_a_401_for_the_openapi_document_is_the_same_refusal(serve: Callable[..., Daemon]) -> None:
    daemon = serve({("GET", "/openapi/v3"): (401, "Authentication failure")}, unix=True)
    assert _refused(lambda: daemon.client().version) == (
        f"slurmrestd at {daemon.address} refused the token (HTTP 401); expected a token of "
        "'alice': export $(scontrol token)"
    )


@pytest.mark.parametrize(
    "name", ["error_expired_token", "error_garbage_token", "error_token_of_other_user"]
)
@pytest.mark.parametrize(("version", "release"), LEGACY)
def test_slurm_22_05s_unspecified_error_says_what_it_means(
    serve: Callable[..., Daemon], version: str, release: str, name: str
) -> None:
    answer = _recorded(version, release, name)
    assert answer[0] == 500
    daemon = serve({**_openapi(version, release), ("GET", JOBS_PATH.format(version)): answer})
    assert _refused(daemon.client().user_records) == (
        "slurmrestd refused GET /slurm/v0.0.38/jobs: Unspecified error (-1); SLURM 22.05 "
        "answers so for an expired token or one not yours"
    )


@pytest.mark.parametrize(
    "name", ["error_expired_token", "error_garbage_token", "error_token_of_other_user"]
)
@pytest.mark.parametrize(("version", "release"), CURRENT)
def test_a_refused_token_of_24_11_on_is_one_line(
    serve: Callable[..., Daemon], version: str, release: str, name: str
) -> None:
    answer = _recorded(version, release, name)
    assert answer[0] == 511
    daemon = serve({**_openapi(version, release), ("GET", JOBS_PATH.format(version)): answer})
    assert _refused(daemon.client().user_records) == (
        f"slurmrestd at {daemon.address} refused the token (HTTP 511: Protocol authentication "
        "error (1007)): expired, or not a token of 'alice'; get one with export $(scontrol token)"
    )


def test_slurm_22_05s_unspecified_error_for_one_job_says_what_it_means(
    serve: Callable[..., Daemon],
) -> None:
    answer = _recorded("v0.0.38", "22.05.8", "error_expired_token")
    daemon = serve({**_openapi("v0.0.38", "22.05.8"), ("GET", "/slurm/v0.0.38/job/5"): answer})
    message = _refused(lambda: daemon.client().job_records("5"))
    assert "SLURM 22.05 answers so for an expired token or one not yours" in message


@pytest.mark.parametrize(
    ("status", "body", "shown"),
    [
        (502, "<html>Bad Gateway</html>", "'<html>Bad Gateway</html>'"),
        (200, "a" * 80, repr("a" * 80)),
        (200, "a" * 81, repr("a" * 80)),
    ],
)
def test_an_answer_that_is_not_json_is_one_line(
    serve: Callable[..., Daemon], status: int, body: str, shown: str
) -> None:
    daemon = serve({("GET", "/openapi/v3"): (status, body)})
    assert _refused(lambda: daemon.client().version) == (
        f"slurmrestd at {daemon.address} answered GET /openapi/v3 with HTTP {status} and no "
        f"JSON: {shown}"
    )


@pytest.mark.parametrize(("status", "body"), [(200, {"openapi": "3.0.2"}), (404, {"errors": []})])
def test_json_that_is_no_openapi_document_is_one_line(
    serve: Callable[..., Daemon], status: int, body: object
) -> None:
    daemon = serve({("GET", "/openapi/v3"): (status, body)})
    assert _refused(lambda: daemon.client().version) == (
        f"slurmrestd at {daemon.address} gave no OpenAPI document at /openapi/v3 "
        f"(HTTP {status}); is it slurmrestd?"
    )


def test_nothing_listening_is_one_line() -> None:
    with socket.socket() as bound:  # bound, never listening: every connection is refused
        bound.bind(("127.0.0.1", 0))
        address = f"http://127.0.0.1:{bound.getsockname()[1]}"
        client = RestClient(parse_endpoint(address), TOKEN, USER, timeout=10)
        assert _refused(lambda: client.version) == (
            f"slurmrestd at {address} could not be reached: Connection refused"
        )


def test_no_socket_at_the_path_is_one_line(tmp_path: Path) -> None:
    address = f"unix:{tmp_path}/absent.socket"
    client = RestClient(parse_endpoint(address), TOKEN, USER, timeout=10)
    assert _refused(lambda: client.version) == (
        f"slurmrestd at {address} could not be reached: No such file or directory"
    )


@contextmanager
def _silent() -> Iterator[str]:
    """A daemon that takes the connection and never answers."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        yield f"http://127.0.0.1:{listening.getsockname()[1]}"


def test_a_daemon_that_never_answers_is_given_up_on() -> None:
    with _silent() as address:
        client = RestClient(parse_endpoint(address), TOKEN, USER, timeout=1.0)
        assert _refused(lambda: client.version) == (
            f"slurmrestd at {address} did not answer GET /openapi/v3 within 1 s"
        )


def test_a_short_timeout_is_shown_as_it_was_given() -> None:
    with _silent() as address:
        client = RestClient(parse_endpoint(address), TOKEN, USER, timeout=0.5)
        assert _refused(lambda: client.version) == (
            f"slurmrestd at {address} did not answer GET /openapi/v3 within 0.5 s"
        )


# ---- operations on every version -------------------------------------------------------------


@pytest.mark.parametrize(("version", "release"), SPOKEN_FOLDERS)
def test_an_unknown_job_is_no_record(
    serve: Callable[..., Daemon], version: str, release: str
) -> None:
    answer = _recorded(version, release, "error_unknown_job")
    assert answer[0] == (500 if version == "v0.0.38" else 404)
    daemon = serve({**_openapi(version, release), ("GET", f"/slurm/{version}/job/1"): answer})
    assert daemon.client().job_records("1") == []


def test_a_404_that_is_not_an_unknown_job_is_refused(serve: Callable[..., Daemon]) -> None:
    daemon = serve(
        {**_openapi("v0.0.45", "26.05.5"), ("GET", "/slurm/v0.0.45/job/1"): (404, {"errors": []})}
    )
    assert _refused(lambda: daemon.client().job_records("1")) == (
        "slurmrestd refused GET /slurm/v0.0.45/job/1: HTTP 404"
    )


@pytest.mark.parametrize(("version", "release"), SPOKEN_FOLDERS)
def test_submit_posts_the_description_and_answers_the_job_id(
    serve: Callable[..., Daemon], version: str, release: str
) -> None:
    status, answer = _recorded(version, release, "job_submit")
    daemon = serve(
        {**_openapi(version, release), ("POST", f"/slurm/{version}/job/submit"): (status, answer)}
    )
    script = "#!/bin/bash\n#SBATCH --job-name=rest\n#SBATCH --time=5\nsleep 30\n"
    env = {"PATH": "/usr/bin:/bin", "HPCDIST_REST": "1"}
    assert daemon.client().submit(script, env, "/home/alice/run") == str(answer["job_id"])
    posted = daemon.seen[-1]
    assert (posted.method, posted.headers["Content-Type"]) == ("POST", "application/json")
    assert json.loads(posted.body) == description(script, version, env, "/home/alice/run")
    assert TOKEN.encode() not in posted.body


def _hanging_submit(daemon_jobs: list[dict[str, Any]]) -> dict[tuple[str, str], Any]:
    return {
        **_openapi("v0.0.42", "24.11.5"),
        ("POST", "/slurm/v0.0.42/job/submit"): HANG,
        ("GET", "/slurm/v0.0.42/jobs"): (200, {"jobs": daemon_jobs, "errors": []}),
    }


def _queued(name: str, submitted: float, job_id: int = 38166400) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "name": name,
        "user_name": USER,
        "job_state": ["PENDING"],
        "current_working_directory": "/home/alice/run",
        "submit_time": {"set": True, "infinite": False, "number": int(submitted)},
        "array_job_id": {"set": True, "infinite": False, "number": 0},
    }


def test_a_submit_without_an_answer_finds_the_job_it_queued(serve: Callable[..., Daemon]) -> None:
    script = "#!/bin/bash\n#SBATCH --job-name=rest\nsleep 30\n"
    later = time.time() + 3600  # submitted after the request went out
    daemon = serve(_hanging_submit([_queued("other", later, 1), _queued("rest", later)]))
    client = daemon.client(timeout=1.0)
    assert client.submit(script, {"PATH": "/bin"}, "/home/alice/run") == "38166400"
    assert [(r.method, r.path) for r in daemon.seen] == [
        ("GET", "/openapi/v3"),
        ("POST", "/slurm/v0.0.42/job/submit"),
        ("GET", "/slurm/v0.0.42/jobs"),
    ]


def test_a_submit_without_an_answer_and_no_such_job_is_refused(
    serve: Callable[..., Daemon],
) -> None:
    script = "#!/bin/bash\n#SBATCH --job-name=rest\nsleep 30\n"
    earlier = time.time() - 3600  # a job of that name from before
    daemon = serve(_hanging_submit([_queued("rest", earlier)]))
    client = daemon.client(timeout=1.0)
    assert _refused(lambda: client.submit(script, {"PATH": "/bin"}, "/home/alice/run")) == (
        f"slurmrestd at {daemon.address} did not answer POST /slurm/v0.0.42/job/submit within 1 s"
    )


@pytest.mark.parametrize(("version", "release"), SPOKEN_FOLDERS)
def test_the_users_own_jobs_are_listed(
    serve: Callable[..., Daemon], version: str, release: str
) -> None:
    answer = _recorded(version, release, "jobs")
    daemon = serve({**_openapi(version, release), ("GET", JOBS_PATH.format(version)): answer})
    ids = [str(job["job_id"]) for job in answer[1]["jobs"]]
    assert [r["JobId"] for r in daemon.client(user="root").user_records()] == ids
    assert daemon.client(user="nobody").user_records() == []


@pytest.mark.parametrize(("version", "release"), SPOKEN_FOLDERS)
def test_slurmdbds_record_is_read_as_sacct_rows(
    serve: Callable[..., Daemon], version: str, release: str
) -> None:
    status, answer = _recorded(version, release, "slurmdb_job")
    job_id = str(answer["jobs"][0]["job_id"])
    daemon = serve(
        {
            **_openapi(version, release),
            ("GET", f"/slurmdb/{version}/job/{job_id}"): (status, answer),
        }
    )
    (row,) = daemon.client().db_rows(job_id)
    assert (row["JobIDRaw"], row["State"], row["ExitCode"]) == (job_id, "COMPLETED", "0:0")


def _cancel_routes(version: str, release: str, refused: bool) -> dict[tuple[str, str], Any]:
    name = "error_cancel_by_other_user" if refused else "job_cancel"
    status = json.loads((FIXTURES / version / release / f"{name}.json").read_text())
    path = status["request"]["path"]
    after = "job_running" if refused else "job_cancelled"
    return {
        **_openapi(version, release),
        ("DELETE", path): (status["status"], status["body"]),
        ("GET", path): _recorded(version, release, after),
    }


@pytest.mark.parametrize(("version", "release"), SPOKEN_FOLDERS)
def test_cancel_of_ones_own_job(serve: Callable[..., Daemon], version: str, release: str) -> None:
    daemon = serve(_cancel_routes(version, release, refused=False))
    (job_id,) = {path.rsplit("/", 1)[1] for method, path in daemon.routes if method == "DELETE"}
    daemon.client(user="root").cancel(job_id)  # no RestError
    # v0.0.40-41 answer 200 to a refused cancel too: the job's state after it tells.
    looked = version in ("v0.0.40", "v0.0.41")
    assert [(r.method, r.path) for r in daemon.seen[1:]] == [
        ("DELETE", f"/slurm/{version}/job/{job_id}"),
        *([("GET", f"/slurm/{version}/job/{job_id}")] if looked else []),
    ]


@pytest.mark.parametrize(("version", "release"), SPOKEN_FOLDERS)
def test_cancel_of_another_users_job_is_refused_in_one_line(
    serve: Callable[..., Daemon], version: str, release: str
) -> None:
    daemon = serve(_cancel_routes(version, release, refused=True))
    (job_id,) = {path.rsplit("/", 1)[1] for method, path in daemon.routes if method == "DELETE"}
    message = _refused(lambda: daemon.client(user="nobody").cancel(job_id))
    if version in ("v0.0.40", "v0.0.41"):  # 200 and no error: the job runs on
        assert (
            message == f"slurmrestd did not cancel job {job_id}: it belongs to 'root', not 'nobody'"
        )
    else:
        assert message == (
            f"slurmrestd refused DELETE /slurm/{version}/job/{job_id}: Access/permission denied "
            "(2002)"
        )


def test_a_signal_is_sent_as_the_query(serve: Callable[..., Daemon]) -> None:
    routes = _cancel_routes("v0.0.45", "26.05.5", refused=False)
    (path,) = [path for method, path in routes if method == "DELETE"]
    routes[("DELETE", path + "?signal=USR1")] = routes.pop(("DELETE", path))
    daemon = serve(routes)
    daemon.client().cancel(path.rsplit("/", 1)[1], signal="USR1")
    assert [(r.method, r.path) for r in daemon.seen[1:]] == [("DELETE", path + "?signal=USR1")]


@pytest.mark.parametrize(
    ("version", "release", "slurm", "cluster_name", "default"),
    [
        ("v0.0.38", "22.05.8", SlurmVersion(22, 5, 8), None, True),
        ("v0.0.42", "24.11.5", SlurmVersion(24, 11, 5), "hpcdist", None),
        ("v0.0.45", "26.05.5", SlurmVersion(26, 5, 5), "hpcdist", True),
    ],
)
def test_the_cluster_probe_asks_the_daemon(
    serve: Callable[..., Daemon],
    monkeypatch: pytest.MonkeyPatch,
    version: str,
    release: str,
    slurm: SlurmVersion,
    cluster_name: str | None,
    default: bool | None,
) -> None:
    daemon = serve(
        {
            **_openapi(version, release),
            ("GET", f"/slurm/{version}/nodes"): _recorded(version, release, "nodes"),
            ("GET", f"/slurm/{version}/partitions"): _recorded(version, release, "partitions"),
        }
    )
    monkeypatch.setattr(rest, "_CLIENTS", {})
    monkeypatch.setenv("HPCDIST_TRANSPORT", "rest")
    monkeypatch.setenv("HPCDIST_SLURMRESTD", daemon.address)
    monkeypatch.setenv("SLURM_JWT", TOKEN)
    found = rest_probe()
    assert (found.version, found.controller, found.cluster_name) == (slurm, True, cluster_name)
    assert found.partitions == (
        Partition("debug", "node[1-4]", 4, None, None, None, default, "UP"),
    )
    assert [node.name for node in found.nodes] == ["node1", "node2", "node3", "node4"]
    assert all(r.headers["X-SLURM-USER-TOKEN"] == TOKEN for r in daemon.seen)


# ---- the token -------------------------------------------------------------------------------


def _token_file(folder: Path, text: str, mode: int = 0o600) -> Path:
    path = folder / "jwt"
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize(
    ("value", "expected"),
    [("abc", "abc"), ("SLURM_JWT=abc", "abc"), ("  abc\n", "abc"), ("SLURM_JWT=a=b", "a=b")],
)
def test_slurm_jwt_is_the_token(value: str, expected: str) -> None:
    assert token({"SLURM_JWT": value}) == expected


def test_slurm_jwt_wins_over_the_file(tmp_path: Path) -> None:
    path = _token_file(tmp_path, "from-file\n")
    env = {"SLURM_JWT": "from-env", "HPCDIST_SLURM_JWT_FILE": str(path)}
    assert token(env) == "from-env"
    assert token({**env, "SLURM_JWT": " "}) == "from-file"


def test_an_empty_slurm_jwt_after_its_prefix_is_no_token() -> None:
    with pytest.raises(UserError):
        token({"SLURM_JWT": "SLURM_JWT="})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("abc\n", "abc"),
        ("SLURM_JWT=abc\n", "abc"),
        ("  abc  \nsecond line\n", "abc"),
        ("\n\nabc\n", "abc"),
    ],
)
@pytest.mark.parametrize("mode", [0o600, 0o400, 0o700])
def test_a_token_file_of_ones_own_is_read(
    tmp_path: Path, text: str, expected: str, mode: int
) -> None:
    path = _token_file(tmp_path, text, mode)
    assert token({"HPCDIST_SLURM_JWT_FILE": str(path)}) == expected


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o602, 0o660, 0o644])
def test_a_token_file_others_can_read_or_write_is_refused(tmp_path: Path, mode: int) -> None:
    path = _token_file(tmp_path, "abc\n", mode)
    with pytest.raises(UserError) as refused:
        token({"HPCDIST_SLURM_JWT_FILE": str(path)})
    assert str(refused.value) == (
        f"HPCDIST_SLURM_JWT_FILE='{path}' is not yours alone (mode {mode:04o}, owner uid "
        f"{os.getuid()}): others could read or replace your token; expected chmod 600 on a file "
        "of your own"
    )


@pytest.mark.skipif(os.getuid() != 0, reason="only root can give a file to another user")
def test_a_token_file_of_another_user_is_refused(tmp_path: Path) -> None:
    path = _token_file(tmp_path, "abc\n")
    os.chown(path, 65534, 65534)
    with pytest.raises(UserError) as refused:
        token({"HPCDIST_SLURM_JWT_FILE": str(path)})
    assert str(refused.value) == (
        f"HPCDIST_SLURM_JWT_FILE='{path}' is not yours alone (mode 0600, owner uid 65534): "
        "others could read or replace your token; expected chmod 600 on a file of your own"
    )


def test_a_token_file_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    target = _token_file(tmp_path, "abc\n")
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(UserError) as refused:
        token({"HPCDIST_SLURM_JWT_FILE": str(link)})
    assert str(refused.value) == (
        f"HPCDIST_SLURM_JWT_FILE='{link}' is a symbolic link; expected the token file itself (a "
        "link could be pointed at another user's file)"
    )


@pytest.mark.parametrize("text", ["", "\n", "   \n\n", "SLURM_JWT=\n"])
def test_a_token_file_without_a_token_is_refused(tmp_path: Path, text: str) -> None:
    path = _token_file(tmp_path, text)
    with pytest.raises(UserError) as refused:
        token({"HPCDIST_SLURM_JWT_FILE": str(path)})
    assert str(refused.value) == f"HPCDIST_SLURM_JWT_FILE='{path}' holds no token"


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_token_path_that_is_no_file_is_refused(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "jwt"
    if kind == "folder":
        path.mkdir(mode=0o700)
    else:
        os.mkfifo(path, 0o600)
    with pytest.raises(UserError) as refused:
        token({"HPCDIST_SLURM_JWT_FILE": str(path)})
    assert str(refused.value) == f"HPCDIST_SLURM_JWT_FILE='{path}' is not a regular file"


def test_a_missing_token_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "absent"
    with pytest.raises(UserError) as refused:
        token({"HPCDIST_SLURM_JWT_FILE": str(path)})
    assert str(refused.value) == f"HPCDIST_SLURM_JWT_FILE='{path}': No such file or directory"


@pytest.mark.parametrize(
    "env", [{}, {"SLURM_JWT": ""}, {"SLURM_JWT": "  ", "HPCDIST_SLURM_JWT_FILE": " "}]
)
def test_no_token_names_both_sources(env: dict[str, str]) -> None:
    with pytest.raises(UserError) as refused:
        token(env)
    assert str(refused.value) == (
        "--transport rest: no token; expected SLURM_JWT (export $(scontrol token)) or "
        "HPCDIST_SLURM_JWT_FILE naming a file only you can read"
    )


# ---- the daemon's address and the transport --------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("http://h:65535", Endpoint("http://h:65535", host="h", port=65535)),
        ("http://h:1", Endpoint("http://h:1", host="h", port=1)),
        ("http://login1", Endpoint("http://login1", host="login1", port=80)),
        ("  http://h:6820/  ", Endpoint("http://h:6820/", host="h", port=6820)),
        ("http://h:6820/api/", Endpoint("http://h:6820/api/", host="h", port=6820, prefix="/api")),
        ("http://[::1]:6820", Endpoint("http://[::1]:6820", host="::1", port=6820)),
        (
            "unix:/run/slurmrestd.socket",
            Endpoint("unix:/run/slurmrestd.socket", socket_path="/run/slurmrestd.socket"),
        ),
    ],
)
def test_an_address_is_parsed(value: str, expected: Endpoint) -> None:
    assert parse_endpoint(value) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("http://h:65536", "the port is not a number from 1 to 65535"),
        ("http://h:port", "the port is not a number from 1 to 65535"),
        (
            "https://h:6820",
            "expected http://HOST:PORT or unix:/path/to.socket (slurmrestd's listening address)",
        ),
        (
            "h:6820",
            "expected http://HOST:PORT or unix:/path/to.socket (slurmrestd's listening address)",
        ),
        (
            "http://:6820",
            "expected http://HOST:PORT or unix:/path/to.socket (slurmrestd's listening address)",
        ),
        ("unix:relative.socket", "expected unix:/absolute/path/to.socket"),
        ("unix:", "expected unix:/absolute/path/to.socket"),
    ],
)
def test_an_address_that_is_not_slurmrestds_is_refused(value: str, message: str) -> None:
    with pytest.raises(UserError) as refused:
        parse_endpoint(value)
    assert str(refused.value) == f"HPCDIST_SLURMRESTD={value!r}: {message}"


def test_port_0_is_refused() -> None:
    with pytest.raises(UserError):
        parse_endpoint("http://h:0")


@pytest.mark.parametrize("environ", [{}, {"HPCDIST_SLURMRESTD": "  "}])
def test_no_address_is_one_line(environ: dict[str, str]) -> None:
    with pytest.raises(UserError) as refused:
        endpoint(environ)
    assert str(refused.value) == (
        "--transport rest: HPCDIST_SLURMRESTD is not set; expected slurmrestd's address, e.g. "
        "http://login1:6820 or unix:/run/slurmrestd.socket"
    )


@pytest.mark.parametrize(
    ("value", "expected"), [(None, "cli"), ("", "cli"), (" cli ", "cli"), ("rest", "rest")]
)
def test_the_transport_is_cli_unless_rest_is_named(value: str | None, expected: str) -> None:
    environ = {} if value is None else {"HPCDIST_TRANSPORT": value}
    assert transport_name(environ) == expected
    assert rest.chosen(environ) is (expected == "rest")


@pytest.mark.parametrize("value", ["REST", "slurmrestd", "http"])
def test_an_unknown_transport_is_refused(value: str) -> None:
    with pytest.raises(UserError) as refused:
        transport_name({"HPCDIST_TRANSPORT": value})
    assert str(refused.value) == f"HPCDIST_TRANSPORT={value!r}: expected cli or rest"


def test_the_jobs_environment_holds_neither_the_token_nor_the_transport() -> None:
    environ = {
        "SLURM_JWT": TOKEN,
        "HPCDIST_SLURM_JWT_FILE": "/home/alice/.jwt",
        "HPCDIST_TRANSPORT": "rest",
        "HPCDIST_SLURMRESTD": "http://login1:6820",
        "PATH": "/usr/bin",
        "HOME": "/home/alice",
        "SLURM_JWT_X": "kept: another name",
        "HPCDIST_PROFILE": "local",
    }
    assert job_environment(environ) == {
        "PATH": "/usr/bin",
        "HOME": "/home/alice",
        "SLURM_JWT_X": "kept: another name",
        "HPCDIST_PROFILE": "local",
    }


def test_the_jobs_environment_is_this_process_s_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JWT", TOKEN)
    monkeypatch.setenv("HPCDIST_TRANSPORT", "rest")
    monkeypatch.setenv("HPCDIST_TEST_MARK", "1")
    env = job_environment()
    assert env["HPCDIST_TEST_MARK"] == "1"
    assert "SLURM_JWT" not in env and "HPCDIST_TRANSPORT" not in env
    assert TOKEN not in env.values()


# ---- the CLI ---------------------------------------------------------------------------------


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No daemon named, state under tmp_path; HPCDIST_TRANSPORT restored after the test
    (--transport writes it into this process's environment)."""
    monkeypatch.delenv("HPCDIST_SLURMRESTD", raising=False)
    monkeypatch.delenv("HPCDIST_TRANSPORT", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    return monkeypatch


def test_an_unknown_transport_option_is_clicks_one_line(cli_env: pytest.MonkeyPatch) -> None:
    result = CliRunner().invoke(cli, ["submit", "--transport", "bogus"])
    assert result.exit_code == 2
    assert result.stderr == (
        "hpcdist: error: Invalid value for '--transport': 'bogus' is not one of 'cli', 'rest'.\n"
    )
    assert "HPCDIST_TRANSPORT" not in os.environ


NO_ADDRESS = (
    "hpcdist: error: --transport rest: HPCDIST_SLURMRESTD is not set; expected slurmrestd's "
    "address, e.g. http://login1:6820 or unix:/run/slurmrestd.socket\n"
)


@pytest.mark.parametrize(
    "args", [["status", "1"], ["cancel", "1"], ["logs", "1"], ["list"], ["doctor"]]
)
def test_rest_without_an_address_is_one_line(cli_env: pytest.MonkeyPatch, args: list[str]) -> None:
    cli_env.setenv("HPCDIST_TRANSPORT", "rest")
    result = CliRunner().invoke(cli, args)
    assert (result.exit_code, result.stderr) == (2, NO_ADDRESS)


def test_the_transport_option_chooses_rest(cli_env: pytest.MonkeyPatch) -> None:
    cli_env.setenv("HPCDIST_TRANSPORT", "cli")
    result = CliRunner().invoke(cli, ["status", "--transport", "rest", "1"])
    assert (result.exit_code, result.stderr) == (2, NO_ADDRESS)


def test_an_unknown_transport_variable_is_one_line(cli_env: pytest.MonkeyPatch) -> None:
    cli_env.setenv("HPCDIST_TRANSPORT", "bogus")
    result = CliRunner().invoke(cli, ["status", "1"])
    assert (result.exit_code, result.stderr) == (
        2,
        "hpcdist: error: HPCDIST_TRANSPORT='bogus': expected cli or rest\n",
    )
