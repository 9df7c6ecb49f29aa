"""SLURM through its REST daemon (slurmrestd, JWT tokens): submit, a job's record, this
user's jobs, cancel, the database's record, the controller's RPC counts.

Chosen with ``--transport rest`` or ``HPCDIST_TRANSPORT=rest`` (``transport_name``). The
daemon's address is ``HPCDIST_SLURMRESTD``: ``http://host:port`` or ``unix:/path/to.socket``.
The token is ``SLURM_JWT`` (what ``scontrol token`` prints) or the first line of
``HPCDIST_SLURM_JWT_FILE``, a file only its owner can read. The token travels only in the
request's header: never in argv, a job's environment, a script or a file of hpcdist's.

The version is chosen once per process from what the daemon serves (``GET /openapi/v3``),
newest first of ``SPOKEN``; a daemon serving none of them is one line naming both lists.
Every failure (no daemon, a refused token, an answer that is not SLURM's) is a UserError of
one line: exit 2, nothing queued twice (a submit that timed out is looked up by its name and
script before anything else is tried: ``submit``).
"""

from __future__ import annotations

import errno
import http.client
import json
import os
import socket
import stat
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcdist.errors import UserError
from hpcdist.slurm import restjob
from hpcdist.slurm.accounts import current_user
from hpcdist.slurm.parse import parse_timestamp

# The OpenAPI versions hpcdist speaks, newest first: v0.0.38 (SLURM 22.05), v0.0.40-42
# (24.11), v0.0.42-45 (26.05); tests/fixtures/slurmrestd holds each one's real answers.
SPOKEN = ("v0.0.45", "v0.0.44", "v0.0.43", "v0.0.42", "v0.0.41", "v0.0.40", "v0.0.38")
TRANSPORTS = ("cli", "rest")
TIMEOUT_S = 30.0
ADDRESS_VAR = "HPCDIST_SLURMRESTD"
TRANSPORT_VAR = "HPCDIST_TRANSPORT"
TOKEN_VAR = "SLURM_JWT"
TOKEN_FILE_VAR = "HPCDIST_SLURM_JWT_FILE"
# What a job's environment never carries from the submitting process.
PRIVATE_VARS = (TOKEN_VAR, TOKEN_FILE_VAR)


class RestError(UserError):
    """slurmrestd could not be reached, refused the request, or answered something else."""


def transport_name(environ: Mapping[str, str] | None = None) -> str:
    """``cli`` (SLURM's commands, the default) or ``rest``."""
    value = (os.environ if environ is None else environ).get(TRANSPORT_VAR, "").strip()
    if value in ("", "cli"):
        return "cli"
    if value == "rest":
        return "rest"
    raise UserError(f"{TRANSPORT_VAR}={value!r}: expected cli or rest")


def chosen(environ: Mapping[str, str] | None = None) -> bool:
    """Whether SLURM is reached through slurmrestd."""
    return transport_name(environ) == "rest"


@dataclass(frozen=True)
class Endpoint:
    """Where the daemon listens: ``http://host:port[/prefix]`` or a unix socket."""

    text: str
    host: str = ""
    port: int = 0
    socket_path: str = ""
    prefix: str = ""

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.socket_path:
            return _UnixConnection(self.socket_path, timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def parse_endpoint(value: str, where: str = ADDRESS_VAR) -> Endpoint:
    """``http://host:port`` or ``unix:/path``; one line naming ``where`` when neither."""
    text = value.strip()
    if text.startswith("unix:"):
        path = text[len("unix:") :]
        if not path.startswith("/"):
            raise UserError(f"{where}={value!r}: expected unix:/absolute/path/to.socket")
        return Endpoint(text, socket_path=path)
    parsed = urllib.parse.urlsplit(text)
    if parsed.scheme != "http" or not parsed.hostname:
        raise UserError(
            f"{where}={value!r}: expected http://HOST:PORT or unix:/path/to.socket "
            "(slurmrestd's listening address)"
        )
    try:
        port = 80 if parsed.port is None else parsed.port
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise UserError(f"{where}={value!r}: the port is not a number from 1 to 65535")
    return Endpoint(text, host=parsed.hostname, port=port, prefix=parsed.path.rstrip("/"))


def endpoint(environ: Mapping[str, str] | None = None) -> Endpoint:
    value = (os.environ if environ is None else environ).get(ADDRESS_VAR, "")
    if not value.strip():
        raise UserError(
            f"--transport rest: {ADDRESS_VAR} is not set; expected slurmrestd's address, "
            "e.g. http://login1:6820 or unix:/run/slurmrestd.socket"
        )
    return parse_endpoint(value)


def token(environ: Mapping[str, str] | None = None) -> str:
    """The user's JWT: ``SLURM_JWT``, else the token file (the user's own, mode 0600 or
    stricter, opened once and checked on its descriptor)."""
    env = os.environ if environ is None else environ
    value = env.get(TOKEN_VAR, "").strip().removeprefix(f"{TOKEN_VAR}=").strip()
    if value:
        return value
    path = env.get(TOKEN_FILE_VAR, "").strip()
    if not path:
        raise UserError(
            f"--transport rest: no token; expected {TOKEN_VAR} (export $(scontrol token)) or "
            f"{TOKEN_FILE_VAR} naming a file only you can read"
        )
    return _token_file(Path(path))


def _token_file(path: Path) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UserError(
                f"{TOKEN_FILE_VAR}={str(path)!r} is a symbolic link; expected the token file "
                "itself (a link could be pointed at another user's file)"
            ) from exc
        raise UserError(f"{TOKEN_FILE_VAR}={str(path)!r}: {exc.strerror}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UserError(f"{TOKEN_FILE_VAR}={str(path)!r} is not a regular file")
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise UserError(
                f"{TOKEN_FILE_VAR}={str(path)!r} is not yours alone (mode "
                f"{stat.S_IMODE(info.st_mode):04o}, owner uid {info.st_uid}): others could "
                "read or replace your token; expected chmod 600 on a file of your own"
            )
        data = os.read(fd, 1 << 16).decode("utf-8", "replace")
    finally:
        os.close(fd)
    line = (data.strip().splitlines() or [""])[0].strip().removeprefix(f"{TOKEN_VAR}=")
    if not line:
        raise UserError(f"{TOKEN_FILE_VAR}={str(path)!r} holds no token")
    return line


def _reason(body: object) -> str:
    """SLURM's own words of an answer's first error (v0.0.42 on: also per-job ``status``)."""
    if not isinstance(body, dict):
        return ""
    for error in body.get("errors") or []:
        if isinstance(error, dict):
            number = error.get("error_number", error.get("error_code"))
            text = error.get("error") or error.get("description") or ""
            return f"{text} ({number})" if number not in (None, 0) else str(text)
    for status in body.get("status") or []:
        error = status.get("error") if isinstance(status, dict) else None
        if isinstance(error, dict) and error.get("code"):
            return f"{error.get('string') or error.get('message')} ({error['code']})"
    return ""


class RestClient:
    """One daemon, one user's token; the version chosen on first use."""

    def __init__(self, where: Endpoint, jwt: str, user: str, timeout: float = TIMEOUT_S) -> None:
        self.where = where
        self._token = jwt
        self.user = user
        self.timeout = timeout
        self._version: str | None = None
        self._database = False  # whether the daemon serves slurmdbd's paths

    def __repr__(self) -> str:  # never the token
        return f"RestClient({self.where.text!r}, user={self.user!r})"

    # -- the wire ------------------------------------------------------------------------

    def call(self, method: str, path: str, body: object = None) -> tuple[int, Any]:
        """(HTTP status, parsed JSON); RestError when there is no answer or no JSON."""
        headers = {
            "X-SLURM-USER-NAME": self.user,
            "X-SLURM-USER-TOKEN": self._token,
            "Accept": "application/json",
        }
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn = self.where.connection(self.timeout)
        try:
            conn.request(method, self.where.prefix + path, body=data, headers=headers)
            answer = conn.getresponse()
            raw = answer.read()
        except TimeoutError as exc:
            raise RestError(
                f"slurmrestd at {self.where.text} did not answer {method} {path} within "
                f"{self.timeout:g} s"
            ) from exc
        except (OSError, http.client.HTTPException) as exc:
            raise RestError(
                f"slurmrestd at {self.where.text} could not be reached: "
                f"{getattr(exc, 'strerror', None) or exc or type(exc).__name__}"
            ) from exc
        finally:
            conn.close()
        if answer.status == 401:
            raise RestError(
                f"slurmrestd at {self.where.text} refused the token (HTTP 401); expected a "
                f"token of {self.user!r}: export $(scontrol token)"
            )
        try:
            parsed = json.loads(raw)
        except ValueError as exc:
            shown = raw[:80].decode("utf-8", "replace").strip()
            raise RestError(
                f"slurmrestd at {self.where.text} answered {method} {path} with HTTP "
                f"{answer.status} and no JSON: {repr(shown) if shown else 'an empty body'}"
            ) from exc
        if answer.status in (500, 511) and "authentication" in _reason(parsed).lower():
            raise RestError(
                f"slurmrestd at {self.where.text} refused the token (HTTP {answer.status}: "
                f"{_reason(parsed)}): expired, or not a token of {self.user!r}; get one "
                "with export $(scontrol token)"
            )
        return answer.status, parsed

    def ok(self, method: str, path: str, body: object = None) -> dict[str, Any]:
        """The answer of a request that must succeed; its error in one line otherwise."""
        status, parsed = self.call(method, path, body)
        if status >= 400 or _reason(parsed):
            raise self.refusal(method, path, status, parsed)
        if not isinstance(parsed, dict):
            raise RestError(f"slurmrestd answered {method} {path} with something not an object")
        return parsed

    def refusal(self, method: str, path: str, status: int, parsed: object) -> RestError:
        """SLURM's refusal of a request in one line (with what 22.05's vague answer means)."""
        reason = _reason(parsed)
        if status == 500 and "Unspecified error" in reason and self._is_legacy():
            reason += "; SLURM 22.05 answers so for an expired token or one not yours"
        return RestError(f"slurmrestd refused {method} {path}: {reason or f'HTTP {status}'}")

    # -- the version ---------------------------------------------------------------------

    @property
    def version(self) -> str:
        if self._version is None:
            paths = self.served()
            self._version = negotiate(served_versions(paths), self.where.text)
            self._database = any(p.startswith(f"/slurmdb/{self._version}/") for p in paths)
        return self._version

    @property
    def database(self) -> bool:
        """Whether the daemon serves slurmdbd's paths (accounting) in the version spoken."""
        return bool(self.version) and self._database

    def _is_legacy(self) -> bool:
        return self._version is not None and restjob.is_legacy(self._version)

    def served(self) -> list[str]:
        """The paths of the daemon's OpenAPI document."""
        status, spec = self.call("GET", "/openapi/v3")
        paths = spec.get("paths") if isinstance(spec, dict) else None
        if status != 200 or not isinstance(paths, dict):
            raise RestError(
                f"slurmrestd at {self.where.text} gave no OpenAPI document at /openapi/v3 "
                f"(HTTP {status}); is it slurmrestd?"
            )
        return list(paths)

    def path(self, tail: str, api: str = "slurm") -> str:
        return f"/{api}/{self.version}/{tail}"

    # -- operations ----------------------------------------------------------------------

    def submit(
        self,
        script: str,
        environment: Mapping[str, str],
        workdir: str,
        overrides: Mapping[str, str] | None = None,
    ) -> str:
        """Queue ``script`` (its bytes, its directives as the description); the job id.
        A request that got no answer may still have queued the job: it is looked up (this
        user's newest job of that name and folder, submitted since) before the error."""
        body = restjob.description(script, self.version, environment, workdir, overrides)
        began = time.time()
        try:
            answer = self.ok("POST", self.path("job/submit"), body)
        except RestError as exc:
            if "did not answer" not in str(exc):
                raise
            job = body["job"]
            found = self._queued_since(began, job.get("name", ""), job["current_working_directory"])
            if found is None:
                raise
            return found
        job_id = answer.get("job_id") or (answer.get("result") or {}).get("job_id")
        if not job_id:
            raise RestError(f"slurmrestd queued nothing it named: {_reason(answer) or answer}")
        return str(job_id)

    def _queued_since(self, began: float, name: str, workdir: str) -> str | None:
        for record in self.user_records():
            stamp = parse_timestamp(record["SubmitTime"])
            if (
                record["JobName"] == name
                and record["WorkDir"] == workdir
                and stamp is not None
                and stamp >= began - 1
            ):
                return record["ArrayJobId"] or record["JobId"]
        return None

    def job_records(self, job_id: str) -> list[dict[str, str]]:
        """``scontrol show job`` records of ``job_id`` (one per array task); [] when the
        controller does not know it (never was, or forgot it)."""
        path = self.path(f"job/{urllib.parse.quote(job_id)}")
        status, answer = self.call("GET", path)
        if status in (404, 500) and "Invalid job id" in _reason(answer):
            return []
        if status >= 400:
            raise self.refusal("GET", path, status, answer)
        now = time.time()
        return [restjob.job_record(job, now) for job in answer.get("jobs") or []]

    def user_records(self) -> list[dict[str, str]]:
        """This user's jobs the controller holds (``GET jobs`` lists everyone's)."""
        answer = self.ok("GET", self.path("jobs"))
        now = time.time()
        return [
            restjob.job_record(job, now)
            for job in answer.get("jobs") or []
            if job.get("user_name") == self.user
        ]

    def db_rows(self, job_id: str) -> list[dict[str, str]]:
        """slurmdbd's record of ``job_id`` as sacct rows; [] when unknown or the daemon
        serves no database paths (a cluster without slurmdbd)."""
        if not self.version or not self._database:
            return []
        status, answer = self.call("GET", self.path(f"job/{job_id}", api="slurmdb"))
        if status >= 400 or not isinstance(answer, dict):
            return []
        return restjob.db_rows(answer.get("jobs") or [])

    def cancel(self, job_id: str, signal: str | None = None) -> None:
        """Cancel (or signal) ``job_id``; SLURM's refusal in one line. Versions that answer
        200 to a refused cancel (v0.0.40-41) are checked by the job's state after it."""
        query = f"?signal={urllib.parse.quote(signal)}" if signal else ""
        self.ok("DELETE", self.path(f"job/{urllib.parse.quote(job_id)}") + query)
        if signal is None and self.version in ("v0.0.40", "v0.0.41"):
            records = self.job_records(job_id)
            live = [r for r in records if r["JobState"] in ("PENDING", "RUNNING", "SUSPENDED")]
            if live and records[0].get("UserName") != self.user:
                raise RestError(
                    f"slurmrestd did not cancel job {job_id}: it belongs to "
                    f"{records[0].get('UserName')!r}, not {self.user!r}"
                )

    def diag(self) -> dict[str, Any]:
        return self.ok("GET", self.path("diag"))

    def ping(self) -> None:
        self.ok("GET", self.path("ping"))


def served_versions(paths: Iterable[str]) -> list[str]:
    """The versions of ``/slurm/vX/...`` paths an OpenAPI document lists."""
    found = {p.split("/")[2] for p in paths if p.startswith("/slurm/v") and p.count("/") >= 3}
    return sorted(found, reverse=True)


def negotiate(served: list[str], where: str) -> str:
    """The newest version both sides speak; one line naming both lists when none."""
    for version in SPOKEN:
        if version in served:
            return version
    raise RestError(
        f"slurmrestd at {where} serves {', '.join(served) or 'no SLURM version'}; hpcdist "
        f"speaks {', '.join(SPOKEN)}"
    )


_CLIENTS: dict[str, RestClient] = {}


def client(environ: Mapping[str, str] | None = None) -> RestClient:
    """The client of this process's daemon (one per process: the version is asked once,
    the token read once; a submission hides SLURM_* variables while it queues)."""
    env = os.environ if environ is None else environ
    where = endpoint(env)
    if where.text not in _CLIENTS:
        _CLIENTS[where.text] = RestClient(where, token(env), current_user())
    return _CLIENTS[where.text]


def job_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a job queued over REST starts with: this process's (sbatch's
    ``--export=ALL``), without the token or the transport's own settings."""
    env = os.environ if environ is None else environ
    dropped = {*PRIVATE_VARS, TRANSPORT_VAR, ADDRESS_VAR}
    return {key: value for key, value in env.items() if key not in dropped}
