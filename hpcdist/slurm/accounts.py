"""The user's accounts and QOS, as ``sacctmgr`` lists the user's associations.

Pure parsers of ``sacctmgr -n -P`` output (``|`` between fields, no header), and the name of
the user running this.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass

# The fields of `sacctmgr -n -P show assoc user=NAME format=...`, in this order.
ASSOC_FORMAT = "Cluster,Account,Partition,QOS,DefaultQOS"


@dataclass(frozen=True)
class UserAssociations:
    """What accounting lets one user use: () accounts means no association at all."""

    accounts: tuple[str, ...]
    default_account: str | None
    qos: tuple[str, ...]  # every QOS one of the user's associations may use
    default_qos: str | None  # what a job without --qos gets
    user: str = ""


def _default_qos(rows: list[list[str]], default_account: str | None) -> str | None:
    """The QOS SLURM gives a job without --qos, from the default account's association: its
    DefaultQOS, else its only QOS, else ``normal`` (slurmctld's own fallback)."""
    mine = [r for r in rows if r[1] == default_account] or rows
    if not mine:
        return None
    # The association of the whole account (no partition) comes before per-partition ones.
    mine.sort(key=lambda r: r[2] != "")
    _, _, _, qos, default = mine[0]
    allowed = [q for q in qos.split(",") if q]
    if default:
        return default
    return allowed[0] if len(allowed) == 1 else "normal"


def associations_from_sacctmgr(
    assoc_text: str, user_text: str, user: str, cluster: str | None
) -> UserAssociations:
    """``sacctmgr -n -P show assoc user=USER format=ASSOC_FORMAT`` and ``sacctmgr -n -P show
    user USER format=DefaultAccount``; the rows of another cluster are left out."""
    rows = [line.split("|") for line in assoc_text.splitlines()]
    rows = [r[:5] for r in rows if len(r) >= 5 and r[1] and (cluster is None or r[0] == cluster)]
    accounts = tuple(dict.fromkeys(r[1] for r in rows))
    qos = tuple(sorted({q for r in rows for q in r[3].split(",") if q}))
    default_account = next((line.strip() for line in user_text.splitlines() if line.strip()), None)
    if default_account is None and accounts:
        default_account = accounts[0]
    return UserAssociations(
        accounts=accounts,
        default_account=default_account,
        qos=qos,
        default_qos=_default_qos(rows, default_account),
        user=user,
    )


def current_user() -> str:
    """The name SLURM knows this process's user by (the uid's, not $USER's)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())
