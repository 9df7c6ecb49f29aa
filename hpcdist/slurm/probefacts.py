"""A cluster probe as plain JSON-ready data (what ``hpcdist doctor --json`` prints as its
``cluster``): every field of ``ClusterProbe`` but the raw configuration, with the version as
text and tuples as lists."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from hpcdist.slurm.probe import ClusterProbe


def probe_facts(found: ClusterProbe) -> dict[str, Any]:
    """The probe's facts: version (``22.05.8`` or None), controller, accounting, partitions,
    nodes, containers, MPI types, the site's settings and the user's associations."""
    facts = asdict(found)
    facts.pop("config")
    facts["version"] = str(found.version) if found.version else None
    facts["default_partition"] = next((p.name for p in found.partitions if p.default), None)
    return facts
