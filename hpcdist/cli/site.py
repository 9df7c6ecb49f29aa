"""``hpcdist doctor`` and ``hpcdist profile init``: what this cluster offers, and a profile
written from it.

``doctor`` prints one table (hpcdist.cli.doctor: the probe of hpcdist.slurm.probe, the site's
settings, what in its policies stops a job, then what in the profile, if one is named,
disagrees with the cluster), each problem with one line of advice, or the same as one JSON
object; it exits 0 when there is nothing to report, 1 when something blocks a job, 3 on
warnings only. ``profile init NAME`` writes the user's profile NAME from the same probe,
refusing to overwrite one.
"""

from __future__ import annotations

import json
import os
import re
import sys
from datetime import datetime, timezone

import click

from hpcdist.cli.doctor import (
    Row,
    blocker_rows,
    cluster_rows,
    compute_node_row,
    doctor_json,
    print_rows,
    profile_rows,
    verdict,
)
from hpcdist.errors import ProfileError, UserError
from hpcdist.slurm.probe import ClusterProbe, Partition, probe, time_text
from hpcdist.spec.profiles import Profile, config_dir, load_profile, shipped_profiles

__all__ = ["Row", "doctor", "doctor_rows", "profile", "profile_rows", "profile_text"]


def _checked_profile(profile_name: str | None) -> Profile | None:
    """The profile to check: --profile, else $HPCDIST_PROFILE, else none."""
    if profile_name is not None and not profile_name.strip():
        raise ProfileError(f"--profile is empty ({profile_name!r}); leave it out or name one")
    name = profile_name or os.environ.get("HPCDIST_PROFILE")
    return load_profile(name) if name else None


def doctor_rows(found: ClusterProbe, profile: Profile | None, job: bool) -> list[Row]:
    """The whole table: the cluster, the blockers of a job (in the profile's partition, else
    the default one), then what in the profile disagrees with the cluster."""
    rows = cluster_rows(found)
    if not found.controller:
        return rows
    rows.append(compute_node_row() if job else Row("scontrol in a job", "not tested (--job)"))
    partition = profile.partition if profile else None
    checks = profile_rows(profile, found) if profile else []
    missing = f"partition {partition!r} does not exist"
    # A profile naming a partition the cluster lacks is said once, by the profile's row.
    rows += [r for r in blocker_rows(found, partition) if r.value != missing or not checks]
    return rows + (checks or [Row("profile", "none checked (--profile NAME checks one)")])


@click.command()
@click.option(
    "--profile",
    "profile_name",
    default=None,
    help="Profile to check against the cluster (default: $HPCDIST_PROFILE, else none).",
)
@click.option(
    "--job", is_flag=True, help="Also run one tiny job: does scontrol work on a compute node?"
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the facts and problems as one JSON object instead of the table.",
)
def doctor(profile_name: str | None, job: bool, as_json: bool) -> int:
    """Probe this cluster's SLURM, name what would stop a job, and check the profile.

    Exit status: 0 nothing to report, 1 at least one problem blocks a job (FAIL), 3 warnings
    only, 2 a mistake in the command line or the profile.
    """
    profile = _checked_profile(profile_name)
    found = probe()
    rows = doctor_rows(found, profile, job)
    summary, status = verdict(rows)
    if as_json:
        partition = profile.partition if profile else None
        name = profile.name if profile else None
        click.echo(json.dumps(doctor_json(found, rows, name, partition), indent=2))
    else:
        print_rows(rows)
        click.echo(summary)
    sys.exit(status)


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def profile_text(name: str, found: ClusterProbe, part: Partition) -> str:
    nodes = found.nodes_of(part.name)
    cpus = min((n.cpus for n in nodes), default=1)
    gpus = min((n.gpus for n in nodes), default=0)
    types = sorted({t for n in nodes for t in n.gpu_types})
    features = sorted({f for n in nodes for f in n.features})
    lines = [
        f"# Written by `hpcdist profile init {name}` from SLURM {found.version or 'unknown'} on "
        f"{datetime.now(timezone.utc):%Y-%m-%d}; edit freely.",
        f'description: "{part.name} partition: {part.total_nodes} nodes x {cpus} CPUs'
        + (f", {gpus} GPUs" if gpus else "")
        + '"',
        f"partition: {part.name}",
        f"partitions: [{', '.join(p.name for p in found.partitions)}]",
        f"max_nodes: {part.max_nodes or part.total_nodes}",
        f"cores_per_node: {cpus}",
        f"gpus_per_node: {gpus}",
        f"gpu_types: [{', '.join(types)}]",
        f"features: [{', '.join(features)}]",
    ]
    if part.max_time_s is not None:
        lines.append(f'max_time: "{time_text(part.max_time_s)}"')
    if part.qos:
        lines.append(f"qos: {part.qos}")
    lines += [
        "defaults:",
        f'  time: "{time_text(min(part.max_time_s or 3600, 3600))}"',
        "env: {}",
        "gloo_env: {}",
        "nccl_env: {}",
        "setup: []",
        "",
    ]
    return "\n".join(lines)


@click.group()
def profile() -> None:
    """Cluster profiles of this user."""


@profile.command("init")
@click.argument("name")
@click.option("--partition", default=None, help="Partition to use (default: the cluster's).")
def profile_init(name: str, partition: str | None) -> int:
    """Write profile NAME from a probe of this cluster (never overwrites one)."""
    if not _NAME.fullmatch(name):
        raise UserError(f"profile name {name!r}; expected letters, digits, '_', '.', '-'")
    stem = name.removesuffix(".yaml")
    if stem in shipped_profiles():
        raise UserError(f"profile name {name!r} is a shipped profile's; choose another name")
    folder = config_dir()
    target = folder / f"{stem}.yaml"
    if target.exists() or (folder / f"{stem}.yml").exists():
        raise UserError(f"profile {name!r} exists ({target}); remove it or choose another name")
    found = probe()
    if not found.controller:
        raise UserError("the SLURM controller does not answer (scontrol ping); check SLURM_CONF")
    by_name = {p.name: p for p in found.partitions}
    part = by_name.get(partition) if partition else found.default_partition()
    if part is None:
        known = ", ".join(by_name) or "none"
        raise UserError(
            f"--partition {partition!r} is not a partition here; expected one of {known}"
        )
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    text = profile_text(stem, found, part)
    try:
        # O_EXCL: a profile made meanwhile is not overwritten either.
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise UserError(
            f"profile {name!r} exists ({target}); remove it or choose another name"
        ) from None
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    click.echo(f"wrote {target}", err=True)
    click.echo(f"use it: hpcdist render --profile {stem} ...", err=True)
    return 0
