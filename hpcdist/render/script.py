"""Render a JobSpec into an sbatch script with the Jinja templates in templates/."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import jinja2

from hpcdist.facts import badnodes, leads, protocol
from hpcdist.facts.launch import AGENT_VAR, torchrun_agent
from hpcdist.facts.runs import is_job_id
from hpcdist.render.directives import (
    CPUS_VAR,
    ShellWord,
    launch_argv,
    rank_log_options,
    sbatch_directives,
    srun_options,
)
from hpcdist.spec.jobspec import JobSpec
from hpcdist.spec.sweep import points, set_words

VERSION = "0.1.0"


def template_dir(here: Path | None = None) -> Path:
    """templates/ ships inside the wheel as hpcdist/templates; in a checkout it is at the top.

    ``here`` is the package folder (this module's, unless a test names another)."""
    here = here or Path(__file__).resolve().parents[1]
    for candidate in (here / "templates", here.parent / "templates"):
        if (candidate / "base.sh.j2").is_file():
            return candidate
    raise FileNotFoundError(f"hpcdist templates not found beside {here}")


def quote(value: object, context: str = "shell") -> str:
    """The one quoting filter: every user value passes through it on its way into a script.

    ``shell`` quotes a word for bash. ``sbatch`` quotes a ``#SBATCH`` argument for sbatch's
    own parser, which bash never sees: that parser groups with double quotes and takes a
    backslash as an escape everywhere (also inside quotes), so shell quoting would lose
    backslashes there.
    """
    text = str(value)
    if context == "shell":
        return shlex.quote(text)
    if context == "sbatch":
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    raise ValueError(f"unknown quoting context {context!r}; expected 'shell' or 'sbatch'")


def _environment() -> jinja2.Environment:
    # Shell, not HTML: no autoescaping (jinja's default); every user value goes through the
    # `q` filter instead. A name the template misspells fails instead of rendering empty.
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
    )
    env.filters["q"] = quote
    env.tests["job_id"] = is_job_id  # --continue JOB rather than RUN
    return env


def protocol_context() -> dict[str, object]:
    """The requeue protocol's names and numbers, as the templates use them."""
    return {
        "requeue_exit": protocol.REQUEUE_EXIT_CODE,
        "signal_var": protocol.SIGNAL_VAR,
        "marker_var": protocol.MARKER_VAR,
        "sweep_offset_var": protocol.SWEEP_OFFSET_VAR,
        "signal_lead_var": leads.SIGNAL_LEAD_VAR,
        "bad_node_hold_var": badnodes.BAD_NODE_HOLD_VAR,
    }


def runner_options(spec: JobSpec) -> tuple[str, str]:
    """What ``jobstep run`` is told (shell words) and the signals the script ignores while it
    starts; ("", "") where the script needs no runner (no warning signal, no requeue).

    The runner knows the job's warning (``--warning``), to say so when the command dies of
    it; it passes it on to srun only where SLURM warns the batch shell alone (``B:``)."""
    words, signals = [], []
    if spec.signal is not None:
        words.append(f"--warning={quote(spec.signal)}")
    if spec.warns_batch_shell:
        words += ["--relay", '--warned="${warned}"']
        signals.append(str(spec.warning_signal))
    if spec.requeue:
        words += [
            "--requeue",
            '--terminated="${terminated}"',
            f"--max-restarts={spec.max_restarts}",
            '--script="${BASH_SOURCE[0]}"',
        ]
        signals.append("TERM")
    return " ".join(words), " ".join(signals)


def render(spec: JobSpec) -> str:
    """The sbatch script text for a spec; pure, no file or process touched."""
    template = _environment().get_template(f"{spec.mode}.sh.j2")
    options, signals = runner_options(spec)
    if spec.gpus_auto:
        threads_expr = CPUS_VAR
    elif spec.launcher == "torchrun":
        # Under torchrun SLURM_CPUS_PER_TASK counts the node's share; each rank gets its own.
        threads_expr = str(spec.cpus_per_task)
    else:
        threads_expr = '"${SLURM_CPUS_PER_TASK:-1}"'
    return template.render(
        spec=spec,
        version=VERSION,
        directives=sbatch_directives(spec),
        srun_options=" ".join(_srun_words(spec)),
        threads_expr=threads_expr,
        layout=spec.cpu_layout,
        launch_argv=launch_argv(spec),
        points=[set_words(point) for point in points(spec)],
        log_record=log_record(spec),
        runner=bool(options),
        runner_options=options,
        runner_signals=signals,
        agent_var=AGENT_VAR,
        torchrun_agent=_agent(spec),
        signal_lead=leads.signal_lead_s(spec.signal),
        **protocol_context(),
    )


def _agent(spec: JobSpec) -> str:
    """torchrun's agent code (``hpcdist.facts.launch``), quoted; "" where torchrun needs none."""
    if spec.launcher != "torchrun" or spec.warning_signal is None:
        return ""
    return quote(torchrun_agent(spec.warning_signal))


def log_record(spec: JobSpec) -> str:
    """What the script leaves in ``logs/<job id>`` (``hpcdist.jobs.logpaths`` reads it): its
    logs, and how it asked for its warning and memory (``status``'s advice keeps to them)."""
    gpus = spec.gpus_per_node if isinstance(spec.gpus_per_node, int) else None
    return json.dumps(
        {
            "output": spec.output,
            "error": spec.error,
            "name": spec.job_name,
            "rank_logs": spec.rank_logs,
            "lead": leads.signal_lead_s(spec.signal),
            "memory": memory_option(spec),
            "gpus_per_node": gpus,
        },
        separators=(",", ":"),
    )


def memory_option(spec: JobSpec) -> str | None:
    """The sbatch option that carries the job's memory request (``mem``, ``mem-per-cpu``
    or ``mem-per-gpu``); None where it asks for none."""
    site = dict(spec.sbatch_options)
    for option in ("mem-per-gpu", "mem-per-cpu", "mem"):
        if option in site:
            return option
    if spec.mem_per_gpu is not None:
        return "mem-per-gpu"
    return "mem" if spec.memory is not None else None


def _srun_words(spec: JobSpec) -> list[str]:
    """srun's options as script words: the user's values quoted, the script's counts as
    they are; then the ranks' output (--rank-logs), which only a rendered script sets."""
    words = [*srun_options(spec), *rank_log_options(spec)]
    return [word if isinstance(word, ShellWord) else quote(word) for word in words]
