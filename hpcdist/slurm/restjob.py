"""A batch script's ``#SBATCH`` lines as slurmrestd's job description, and its answers as
the records the command-line tools give (pure functions; ``hpcdist.slurm.rest`` talks).

slurmrestd does not read ``#SBATCH`` lines: every directive must become a field of the job
description. The script is parsed as sbatch parses it (``#SBATCH`` lines before the first
command; double quotes group, a backslash escapes), so the description says what the queued
bytes say. A directive without a field in the version spoken is refused in one line, never
dropped. Two families of shapes (tests/fixtures/slurmrestd/README.md): OpenAPI v0.0.38
(SLURM 22.05: plain numbers, ``nodes: [min, max]``, ``environment`` a mapping) and v0.0.40 on
(``{set, infinite, number}`` numbers, lists of flags, ``environment`` a list of ``K=V``).
Answers are read into ``scontrol show job`` and ``sacct`` keys, so one reader
(``hpcdist.slurm.query``) interprets both transports.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from hpcdist.errors import UserError
from hpcdist.facts.warning import parse_warning
from hpcdist.slurm.parse import SlurmOutputError, format_duration, parse_memory_mb
from hpcdist.slurm.timelimit import parse_time_limit


class DescriptionError(UserError):
    """A directive slurmrestd's job description cannot carry."""


def is_legacy(version: str) -> bool:
    """OpenAPI v0.0.38 and before (SLURM 22.05): the older shapes."""
    return version < "v0.0.40"


def sbatch_directives(script: str) -> list[tuple[str, str | None]]:
    """``(option, value)`` of each ``#SBATCH`` line, as sbatch reads them: from the line
    after ``#!`` up to the first line that is neither blank nor a comment; ``value`` None
    for a flag (``--requeue``)."""
    found: list[tuple[str, str | None]] = []
    for line in script.splitlines()[1:]:
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        # sbatch reads "#SBATCH" only at the start of a line: an indented one is a comment.
        if not line.startswith("#SBATCH"):
            continue
        for word in _sbatch_words(line[len("#SBATCH") :]):
            if not word.startswith("--"):
                raise DescriptionError(
                    f"#SBATCH {word!r}: only long options (--name=value) are read for "
                    "slurmrestd's job description"
                )
            option, sep, value = word[2:].partition("=")
            found.append((option, value if sep else None))
    return found


def _sbatch_words(text: str) -> list[str]:
    """sbatch's own splitting of a ``#SBATCH`` line's arguments (up to an unquoted ``#``,
    even inside a word): blanks separate, double or single quotes group, a backslash escapes
    the next character."""
    words: list[str] = []
    word: list[str] = []
    quote = ""
    started = False
    chars = iter(text)
    for char in chars:
        if char == "\\":
            word.append(next(chars, ""))
            started = True
        elif char == quote:
            quote = ""
        elif char in "\"'" and not quote:
            quote = char
            started = True
        elif char in " \t" and not quote:
            if started:
                words.append("".join(word))
            word, started = [], False
        elif char == "#" and not quote:
            break
        else:
            word.append(char)
            started = True
    if started:
        words.append("".join(word))
    return words


def _number(value: int, legacy: bool) -> Any:
    return value if legacy else {"set": True, "infinite": False, "number": value}


def _int(option: str, value: str | None) -> int:
    if value is None or not value.isdigit():
        raise DescriptionError(f"#SBATCH --{option}={value!r}: expected a whole number")
    return int(value)


def _memory(option: str, value: str | None) -> int:
    try:
        parsed = parse_memory_mb(value or "")
    except SlurmOutputError:  # its words are for SLURM's output, not a user's directive
        parsed = None
    if parsed is None:
        raise DescriptionError(f"#SBATCH --{option}={value!r}: expected a size such as 16G")
    return int(parsed[0])


def _minutes(value: str | None) -> int:
    seconds = parse_time_limit(value or "", "#SBATCH --time")
    if seconds is None:
        raise DescriptionError(f"#SBATCH --time={value!r}: expected a finite time limit")
    return -(-seconds // 60)


def _gpus(option: str, value: str | None) -> str:
    """``gres/gpu:N`` or ``gres/gpu:TYPE:N`` from --gpus-per-node, --gpus-per-task, --gres."""
    text = value or ""
    if option == "gres":
        text = text.removeprefix("gpu:") if text.startswith("gpu:") else ""
        if not text:
            raise DescriptionError(f"#SBATCH --gres={value!r}: only gpu:[TYPE:]N is read here")
    return f"gres/gpu:{text}"


def exported(value: str | None, environment: Mapping[str, str]) -> dict[str, str]:
    """The job's environment as ``--export=VALUE`` gives it: ALL (also the default), NONE,
    or names and NAME=VALUE pairs, with or without ALL."""
    words = [w for w in (value or "ALL").split(",") if w]
    keep_all = not words or any(w.upper() == "ALL" for w in words)
    env = dict(environment) if keep_all else {}
    for word in words:
        name, sep, text = word.partition("=")
        if word.upper() in ("ALL", "NONE"):
            continue
        if sep:
            env[name] = text
        elif name in environment:
            env[name] = environment[name]
    return env


_PLAIN = {
    "job-name": "name",
    "partition": "partition",
    "account": "account",
    "qos": "qos",
    "reservation": "reservation",
    "output": "standard_output",
    "error": "standard_error",
    "constraint": "constraints",
    "mail-user": "mail_user",
    "array": "array",
    "dependency": "dependency",
    "chdir": "current_working_directory",
}
_COUNTS = {"ntasks": "tasks", "ntasks-per-node": "tasks_per_node", "cpus-per-task": "cpus_per_task"}


def _nodes(value: str, legacy: bool) -> dict[str, Any]:
    """--nodes as sbatch's own text (``2``, ``2-4``): SLURM 22.05 documents ``[min, max]``
    but reads ``[2, 2]`` as one node; its option parser takes the text, as v0.0.40 on do."""
    low, _, high = value.partition("-")
    _int("nodes", low)
    if high:
        _int("nodes", high)
    return {"nodes": value}


def _flag(option: str, legacy: bool) -> dict[str, Any] | None:
    if option == "exclusive":
        # v0.0.38 reads sbatch's own words (its schema's "true" is refused as an "Invalid
        # exclusive specification"); v0.0.40 on: the job shares its nodes with none.
        return {"exclusive": "exclusive"} if legacy else {"shared": ["none"]}
    if option == "no-requeue" and legacy:
        # SLURM 22.05's REST parser leaves Requeue=1 for false, "false", 0 and "no" alike.
        raise DescriptionError(
            "#SBATCH --no-requeue: slurmrestd v0.0.38 (SLURM 22.05) cannot turn requeue off "
            "(the job would be requeued); submit with --transport cli"
        )
    if option in ("requeue", "no-requeue"):
        return {"requeue": option == "requeue"}
    return None


def _valued(option: str, value: str, legacy: bool) -> dict[str, Any] | None:
    """The fields of one ``--option=value`` directive; None where there is none."""
    if option in _PLAIN:
        return {_PLAIN[option]: value}
    if option in _COUNTS:
        return {_COUNTS[option]: _int(option, value)}
    if option == "exclusive" and value in ("user", "mcs"):  # shared with the same user/MCS
        return {"exclusive": value} if legacy else {"shared": [value]}
    simple = {
        "nodes": lambda: _nodes(value, legacy),
        "time": lambda: {"time_limit": _number(_minutes(value), legacy)},
        "mem": lambda: {"memory_per_node": _number(_memory(option, value), legacy)},
        "signal": lambda: _signal(value, legacy),
        "mail-type": lambda: {"mail_type": value if legacy else value.split(",")},
    }
    if option in simple:
        return simple[option]()
    if option == "open-mode" and value in ("append", "truncate"):
        return {"open_mode": value if legacy else [value.upper()]}
    if legacy:
        legacy_fields = {"mem-per-gpu": "memory_per_gpu", "gpus-per-task": "gpus_per_task"}
        if option in legacy_fields:
            return {
                legacy_fields[option]: _memory(option, value) if option == "mem-per-gpu" else value
            }
        if option in ("gpus-per-node", "gres") and value.startswith(("gpu:", *"0123456789")):
            return {"gpus_per_node": value.removeprefix("gpu:")}
        return None
    if option in ("nodelist", "exclude"):
        return {"required_nodes" if option == "nodelist" else "excluded_nodes": [value]}
    if option in ("gpus-per-node", "gres"):
        return {"tres_per_node": _gpus(option, value)}
    if option == "gpus-per-task":
        return {"tres_per_task": _gpus(option, value)}
    return None


def description(
    script: str,
    version: str,
    environment: Mapping[str, str],
    workdir: str,
    overrides: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The body of ``POST job/submit``: the script's bytes and its directives as fields;
    ``overrides`` (``--array``, ``--export``, ``--dependency`` of one array of a split
    sweep) replace the script's own lines, as sbatch's command-line options do."""
    legacy = is_legacy(version)
    job: dict[str, Any] = {"current_working_directory": workdir}
    given = overrides or {}
    lines = [(o, v) for o, v in sbatch_directives(script) if o not in given]
    env = dict(environment)
    for option, value in [*lines, *given.items()]:
        if option == "export":
            env = exported(value, environment)
            continue
        fields = _flag(option, legacy) if value is None else _valued(option, value, legacy)
        if fields is None:
            shown = f"--{option}" + ("" if value is None else f"={value}")
            raise DescriptionError(
                f"#SBATCH {shown}: slurmrestd's job description ({version}) has no field for "
                "it; submit with --transport cli, or leave it out"
            )
        job.update(fields)
    if legacy:
        job["environment"] = env
        return {"script": script, "job": job}
    if "cpus_per_task" in job:
        # sbatch also asks for the CPUs as a TRES of each task (TresPerTask=cpu=N, from
        # SLURM 23.11 what srun in the job inherits); the daemon sets only the count.
        cpus = f"cpu={job['cpus_per_task']}"
        job["tres_per_task"] = ",".join(filter(None, (cpus, job.get("tres_per_task"))))
    job["environment"] = [f"{key}={value}" for key, value in env.items()]
    job["script"] = script
    return {"job": job}


def _signal(value: str, legacy: bool) -> dict[str, Any]:
    """``--signal=[{B,R}...:]SIG[@SECONDS]``, read by the one parser every side uses
    (``parse_warning``: ``RB:``, ``SIGusr2``, ``12``; SLURM's default lead of 60 s)."""
    parsed = parse_warning(value)
    if parsed is None:
        raise DescriptionError(f"#SBATCH --signal={value!r}: expected [B:|R:]SIGNAL[@SECONDS]")
    # parse_warning keeps B (who is warned); R (the job may overlap a reservation) is a flag
    # of the description too.
    reservation = ":" in value and "R" in value.partition(":")[0].upper()
    if legacy and (reservation or parsed.batch_shell):
        # SLURM 22.05's REST parser refuses every flag ("Invalid SIGNAL specification" for
        # B:USR2@120 as for R:), though its schema and its sbatch take them.
        raise DescriptionError(
            f"#SBATCH --signal={value!r}: slurmrestd v0.0.38 (SLURM 22.05) takes a signal "
            "without B: or R: only; submit with --transport cli"
        )
    if legacy:
        return {"signal": value}
    flags = [
        flag
        for flag, on in (("BATCH_JOB", parsed.batch_shell), ("RESERVATION_JOB", reservation))
        if on
    ]
    fields: dict[str, Any] = {
        "kill_warning_signal": parsed.name,
        "kill_warning_delay": _number(parsed.lead_s, False),
    }
    if flags:
        fields["kill_warning_flags"] = flags
    return fields


# ---- answers ---------------------------------------------------------------------------


def _value(raw: object) -> object:
    """A number of either family: plain, or ``{set, infinite, number}`` (None when unset,
    "INFINITE" when infinite)."""
    if isinstance(raw, dict) and "set" in raw:
        if raw.get("infinite"):
            return "INFINITE"
        return raw.get("number") if raw.get("set") else None
    return raw


def _text(raw: object) -> str:
    """A field as scontrol writes it: a list of flags joined with commas, none empty."""
    raw = _value(raw)
    if raw is None:
        return ""
    if isinstance(raw, list):
        return ",".join(str(one) for one in raw)
    if isinstance(raw, bool):
        return "1" if raw else "0"
    return str(raw)


def _stamp(raw: object) -> str:
    number = _value(raw)
    if not isinstance(number, int) or number <= 0:
        return "Unknown"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(number))


def job_state(raw: object) -> str:
    """``RUNNING``; v0.0.40 on give a list (``["CANCELLED", "COMPLETING"]``): its first is
    the base state, as scontrol's ``JobState``."""
    if isinstance(raw, list):
        return str(raw[0]) if raw else ""
    return str(raw or "")


def exit_code(raw: object) -> str:
    """scontrol's ``ExitCode`` (``code:signal``) of either family's exit code."""
    if isinstance(raw, dict):
        code = _value(raw.get("return_code")) or 0
        signal = raw.get("signal") or {}
        number = _value(signal.get("id")) if isinstance(signal, dict) else None
        return f"{code}:{number or 0}"
    # v0.0.38 and before give the controller's raw wait status (15: killed by SIGTERM;
    # 256: exit code 1), which scontrol prints as WEXITSTATUS:WTERMSIG.
    status = raw if isinstance(raw, int) else 0
    return f"{(status >> 8) & 0xFF}:{status & 0x7F}"


def _log(raw: object, record: Mapping[str, str]) -> str:
    """A log path with SLURM's ``%j``-style names filled in (some versions answer them
    unexpanded)."""
    text = _text(raw)
    job, array, task = record["JobId"], record.get("ArrayJobId", ""), record.get("ArrayTaskId", "")
    names = {"j": job, "A": array or job, "a": task or "4294967294", "x": record["JobName"]}
    names["u"] = record.get("UserName", "")
    return re.sub(r"%([jAaxu%])", lambda m: "%" if m[1] == "%" else names[m[1]], text)


def job_record(job: Mapping[str, Any], now: float | None = None) -> dict[str, str]:
    """One job of ``GET job/{id}`` or ``GET jobs`` in ``scontrol show job -o`` keys."""
    now = time.time() if now is None else now
    start, end = _value(job.get("start_time")), _value(job.get("end_time"))
    state = job_state(job.get("job_state"))
    if isinstance(start, int) and start > 0 and state != "PENDING":
        stop = end if isinstance(end, int) and 0 < end <= now else now
        run = format_duration(max(0.0, stop - start))
    else:
        run = "00:00:00"
    limit = _value(job.get("time_limit"))
    array_job = _value(job.get("array_job_id"))
    array_task = _value(job.get("array_task_id"))
    record = {
        "JobId": str(job.get("job_id", "")),
        "JobName": _text(job.get("name")),
        "UserName": _text(job.get("user_name")),
        "JobState": state,
        "Reason": _text(job.get("state_reason")) or "None",
        "NodeList": _text(job.get("nodes")) or "(null)",
        "NumNodes": _text(job.get("node_count")),
        "RunTime": run,
        "TimeLimit": "UNLIMITED"
        if limit == "INFINITE"
        else format_duration(limit * 60 if isinstance(limit, int) else None),
        "ExitCode": exit_code(job.get("exit_code")),
        "Restarts": _text(job.get("restart_cnt")) or "0",
        "WorkDir": _text(job.get("current_working_directory")),
        "SubmitTime": _stamp(job.get("submit_time")),
        "StartTime": _stamp(start),
        "EndTime": _stamp(end),
        "Dependency": _text(job.get("dependency")) or "(null)",
        "ArrayJobId": str(array_job) if isinstance(array_job, int) and array_job else "",
        "ArrayTaskId": str(array_task) if isinstance(array_task, int) else "",
    }
    if record["ArrayJobId"] and not record["ArrayTaskId"]:
        record["ArrayTaskId"] = _text(job.get("array_task_string"))
    record["StdOut"] = _log(job.get("standard_output"), record)
    record["StdErr"] = _log(job.get("standard_error"), record) or record["StdOut"]
    return record


def db_rows(jobs: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """slurmdbd's job records (``GET /slurmdb/V/job/{id}``) as ``sacct -P`` rows (the job's
    own row; its steps are the database's detail, not read here)."""
    rows = []
    for job in jobs:
        state = job.get("state") or {}
        current = state.get("current") if isinstance(state, dict) else None
        times = job.get("time") or {}
        array = job.get("array") or {}
        task = _value(array.get("task_id")) if isinstance(array, dict) else None
        array_job = _value(array.get("job_id")) if isinstance(array, dict) else None
        job_id = str(job.get("job_id", ""))
        shown = f"{array_job}_{task}" if isinstance(task, int) and array_job else job_id
        start, end = _value(times.get("start")), _value(times.get("end"))
        elapsed = _value(times.get("elapsed"))
        limit = _value(times.get("limit"))
        rows.append(
            {
                "JobID": shown,
                "JobIDRaw": job_id,
                "JobName": _text(job.get("name")),
                "State": job_state(current),
                "ExitCode": exit_code(job.get("exit_code")),
                "Elapsed": format_duration(elapsed if isinstance(elapsed, int) else None),
                "Timelimit": format_duration(limit * 60 if isinstance(limit, int) else None),
                "NNodes": str(_value(job.get("allocation_nodes")) or ""),
                "NodeList": _text(job.get("nodes")),
                "Reason": _text(state.get("reason") if isinstance(state, dict) else ""),
                "Start": _stamp(start),
                "End": _stamp(end),
                "Submit": _stamp(times.get("submission")),
                "WorkDir": _text(job.get("working_directory")),
                "User": _text(job.get("user")),
                "RestartCnt": _text(job.get("restart_cnt")),
                "STDOUT": _text(job.get("stdout_expanded") or job.get("stdout")),
                "STDERR": _text(job.get("stderr_expanded") or job.get("stderr")),
            }
        )
    return rows


# ---- the cluster -----------------------------------------------------------------------


def release(answer: Mapping[str, Any]) -> str:
    """SLURM's release from an answer's ``meta`` (``Slurm`` in v0.0.38, ``slurm`` after)."""
    meta = answer.get("meta") or {}
    slurm = meta.get("slurm") or meta.get("Slurm") or {}
    return str(slurm.get("release") or "")


def cluster(answer: Mapping[str, Any]) -> str | None:
    """The cluster's name from an answer's ``meta`` (v0.0.40 on; None before)."""
    meta = answer.get("meta") or {}
    return str((meta.get("slurm") or {}).get("cluster") or "") or None


def legacy_partitions(answer: Mapping[str, Any]) -> list[dict[str, Any]]:
    """v0.0.38's partitions in the shapes of v0.0.40 on (``scontrol --json``), so that one
    reader (``partitions_from_json``) reads both."""
    out = []
    for raw in answer.get("partitions") or []:
        maximum = raw.get("max_time_limit")
        nodes_max = raw.get("maximum_nodes_per_job")
        default_time = raw.get("default_time_limit")
        out.append(
            {
                "name": raw.get("name", ""),
                "nodes": {"configured": raw.get("nodes", ""), "total": raw.get("total_nodes", 0)},
                "maximums": {
                    "time": {"set": True, "infinite": True, "number": 0}
                    if not isinstance(maximum, int) or maximum < 0
                    else {"set": True, "infinite": False, "number": maximum},
                    "nodes": {"set": True, "infinite": True, "number": 0}
                    if not isinstance(nodes_max, int) or nodes_max < 0
                    else {"set": True, "infinite": False, "number": nodes_max},
                },
                "defaults": {
                    "time": {"set": isinstance(default_time, int), "number": default_time or 0}
                },
                "qos": {"assigned": raw.get("qos", ""), "allowed": raw.get("allowed_qos", "")},
                "accounts": {"allowed": raw.get("allowed_accounts", "")},
                "flags": [str(f).upper() for f in raw.get("flags") or []],
                "partition": {"state": [raw.get("state", "UP")]},
            }
        )
    return out


def node_rows(answer: Mapping[str, Any]) -> str:
    """``GET nodes`` as ``sinfo -h -N -o NODE_FORMAT`` lines (a line per node and
    partition), so that one reader (``nodes_from_sinfo``) reads both transports."""
    lines = []
    for node in answer.get("nodes") or []:
        features = _text(node.get("active_features") or node.get("features")) or "(null)"
        state = _text(node.get("state")).lower().split(",")[0]
        fields = [
            _text(node.get("cpus")),
            _text(node.get("gres")) or "(null)",
            features,
            _text(node.get("real_memory")),
            _text(node.get("sockets")),
            _text(node.get("cores")),
            _text(node.get("threads")),
            state,
        ]
        for partition in node.get("partitions") or []:
            name = _text(node.get("name"))
            lines.append("|".join([name, str(partition), *fields]))
    return "\n".join(lines)
