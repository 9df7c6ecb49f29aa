"""What ``hpcdist submit --executor local`` can honour of a job on one machine, and the
flags it refuses in one line rather than ignore.

Honoured: the ranks and their CPUs, the environment, the warning signal at its lead
before the time limit (``hpcdist.jobs.scriptexec.queue_local``), ``--launcher torchrun``
where torchrun is installed. Each rank's log is a file of its own in the job's folder
(``hpcdist logs JOB --rank N``), so a log name or layout of SLURM's (``-o``, ``-e``,
``--rank-logs``) is refused, as are srun's binding and options, and the queue's partition,
account and QOS that the user asked for beyond the profile's own.
"""

from __future__ import annotations

import shutil
from typing import Any

from hpcdist.errors import SpecError, UserError
from hpcdist.facts.leads import signal_lead_s
from hpcdist.spec.jobspec import DEFAULTS, JOB_OPTIONS, JobSpec

# Options the local executor cannot honour once they differ from their default.
_UNHONOURED = ("output", "error", "rank_logs", "cpu_bind", "srun_args")
_QUEUE = ("partition", "account", "qos")


def _profile_site(spec: JobSpec) -> dict[str, Any]:
    """The profile's own partition, account and QOS (a site's facts, not this job's ask)."""
    from hpcdist.spec.profiles import load_profile

    try:
        profile = load_profile(spec.profile)
    except (UserError, OSError):
        return {}
    return {name: getattr(profile, name, None) for name in _QUEUE}


def local_refusals(spec: JobSpec) -> list[str]:
    """The flags (``-o/--output``, ``--partition``, ...) of ``spec`` that a run on this
    machine would ignore: asked for beyond their default (or the profile's own value)."""
    flags = {o.name: o.flag.split("/")[0] for o in JOB_OPTIONS}
    shorts = {o.name: o.short for o in JOB_OPTIONS}

    def named(name: str) -> str:
        return f"{shorts[name]}/{flags[name]}" if shorts.get(name) else flags[name]

    asked = [named(n) for n in _UNHONOURED if getattr(spec, n) != DEFAULTS.get(n)]
    site = _profile_site(spec)
    asked += [named(n) for n in _QUEUE if getattr(spec, n) not in (None, site.get(n))]
    return asked


def check_local_launcher(spec: JobSpec) -> None:
    """torchrun runs here as on a node: it must be installed."""
    if spec.launcher == "torchrun" and shutil.which("torchrun") is None:
        raise SpecError(
            "--launcher torchrun: torchrun is not on PATH here, and the local executor runs "
            "it as a node would; install torch (it brings torchrun) or use --launcher srun"
        )


# How long before the time limit ``--signal`` asks for its warning; None: no warning.
warning_lead_s = signal_lead_s
