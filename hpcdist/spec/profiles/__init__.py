"""Cluster profiles: YAML files naming a cluster's partitions, limits, setup and environment.

A profile is chosen with ``--profile NAME|PATH`` (or ``$HPCDIST_PROFILE``); with neither,
the cluster describes itself (``hpcdist.spec.clusterprofile``). A NAME (no slash) is a
profile of the user's config folder (``$XDG_CONFIG_HOME/hpcdist/profiles/NAME.yaml``,
default ``~/.config/...``) or the one shipped beside this module (``generic``: nothing of a
site assumed), never a file of the current folder; a PATH (with a slash: ``./x.yaml``) is
that file. A profile's setup lines run in the job as the user, so a file that another
user owns or can write is refused unless ``trust`` (``--trust-profile``) is given.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hpcdist.errors import ProfileError
from hpcdist.spec.jobspec import JOB_OPTIONS
from hpcdist.state.trustedfile import Refused, read_once, read_trusted, trusted_root

PROFILE_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Profile:
    name: str
    description: str = ""
    partition: str | None = None
    partitions: tuple[str, ...] = ()
    account: str | None = None
    qos: str | None = None
    max_nodes: int | None = None
    cores_per_node: int | None = None
    gpus_per_node: int = 0
    max_time: str | None = None
    # The smallest node's memory (--mem above it is refused) and the site's MaxArraySize.
    memory_mb: int | None = None
    max_array_size: int | None = None
    defaults: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    gloo_env: Mapping[str, str] = field(default_factory=dict)
    nccl_env: Mapping[str, str] = field(default_factory=dict)
    setup: tuple[str, ...] = ()
    # Where it was read from: "shipped:NAME.yaml" or the file's absolute path.
    source: str = ""
    # Site keys: how GPUs are asked for, what the nodes offer, options for every job.
    gpu_request: str | None = None
    gpu_types: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    sbatch: Mapping[str, str | None] = field(default_factory=dict)
    srun_args: tuple[str, ...] = ()
    container: Mapping[str, Any] = field(default_factory=dict)
    # render --script may write into a folder others can write (--trust-folder's key): the
    # user's word for every script rendered with this profile.
    trust_folder: bool = False
    # How SLURM is reached where neither --transport nor $HPCDIST_TRANSPORT says (cli, rest)
    # and slurmrestd's address where $HPCDIST_SLURMRESTD does not.
    transport: str | None = None
    slurmrestd: str | None = None

    def key(self, name: str) -> str:
        """How a message names one of this profile's keys: its file and the key."""
        return f"profile {self.name!r} ({self.source or 'built in'}) key {name}"


_KEYS = tuple(f for f in Profile.__dataclass_fields__ if f not in ("name", "source"))
_INT_KEYS = ("max_nodes", "cores_per_node", "gpus_per_node", "memory_mb", "max_array_size")
_STR_KEYS = (
    "description",
    "partition",
    "account",
    "qos",
    "max_time",
    "gpu_request",
    "slurmrestd",
)
TRANSPORTS = ("cli", "rest")
_ENV_KEYS = ("env", "gloo_env", "nccl_env")
_BOOL_KEYS = ("trust_folder",)


def shipped_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def config_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The user's own named profiles: ``$XDG_CONFIG_HOME/hpcdist/profiles``."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME", "").strip() or str(Path.home() / ".config")
    return Path(base).expanduser() / "hpcdist" / "profiles"


def resolve_profile_path(name_or_path: str) -> Path:
    """A PATH has a slash; a NAME is the user's config folder's, else a shipped one."""
    if "/" in name_or_path:
        candidate = Path(name_or_path).expanduser()
        if not candidate.is_file():
            raise ProfileError(f"--profile {name_or_path!r}: no such file")
        return candidate.resolve()
    stem = name_or_path.removesuffix(".yaml").removesuffix(".yml")
    for folder in (config_dir(), PROFILE_DIR):
        for suffix in (".yaml", ".yml"):
            candidate = folder / f"{stem}{suffix}"
            if candidate.is_file():
                return candidate.resolve()
    known = ", ".join(shipped_profiles())
    here = Path(name_or_path)
    hint = f"; for the file in this folder write ./{name_or_path}" if here.is_file() else ""
    raise ProfileError(
        f"--profile {name_or_path!r} is not a shipped profile ({known}) nor one of "
        f"{str(config_dir())!r}{hint}"
    )


def is_shipped(path: Path) -> bool:
    return path.parent == PROFILE_DIR


def describe_source(path: Path) -> str:
    """How a rendered script names its profile file: shipped ones without this machine's
    install path (the committed scripts must not depend on it)."""
    return f"shipped:{path.name}" if is_shipped(path) else str(path)


def trust_problem(path: Path) -> str:
    """Why a profile file cannot be trusted as it is: "" for a shipped profile and a file
    owned by this user (or root) that neither group nor others can write, in folders that
    are so too (from the home folder for a file below it, else from its own folder). The
    file is opened and checked as ``load_profile`` does."""
    try:
        read_profile(path, trust=False)
    except ProfileError as exc:
        return str(exc)
    except OSError:
        return ""  # not a trust problem: load_profile says it cannot be read
    return ""


def read_profile(path: Path, trust: bool) -> bytes:
    """The profile's bytes, from one open: checked by its descriptor (and its folders by
    theirs) unless shipped or ``trust``, so that what was checked is what is parsed."""
    if is_shipped(path) or trust:
        return read_once(path).data
    try:
        found = read_trusted(
            path, "profile", trusted_root(path.parent), allow_root_owner=True, pause_label="profile"
        )
    except Refused as exc:
        where = "profile" if exc.path == path else "the folder of profile"
        named = f"{str(exc.path)!r}" if exc.path == path else f"{str(path)!r}, {str(exc.path)!r},"
        raise ProfileError(
            f"{where} {named} {exc.problem}; its setup lines would run as you: pass "
            "--trust-profile if you trust it, or copy it to a folder only you can write"
        ) from exc
    return found.data


def load_profile(name_or_path: str, trust: bool = False) -> Profile:
    path = resolve_profile_path(name_or_path)
    try:
        raw = yaml.safe_load(read_profile(path, trust).decode("utf-8"))
    except OSError as exc:
        raise ProfileError(f"profile {str(path)!r} cannot be read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ProfileError(
            f"profile {str(path)!r} is not UTF-8 text (byte {exc.start}); expected a YAML file"
        ) from exc
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise ProfileError(f"profile {str(path)!r} is not valid YAML{line}") from exc
    profile = profile_from_mapping(path.stem, raw if raw is not None else {}, source=str(path))
    return dataclasses.replace(profile, source=describe_source(path))


def profile_from_mapping(name: str, raw: object, source: str = "<profile>") -> Profile:
    if not isinstance(raw, Mapping):
        raise ProfileError(f"profile {source!r} must be a mapping of keys, got {_kind(raw)}")
    unknown = sorted(set(raw) - set(_KEYS))
    if unknown:
        raise ProfileError(
            f"profile {source!r} has unknown key {unknown[0]!r}; allowed: {', '.join(_KEYS)}"
        )
    values = {
        str(key): _expect_value(source, str(key), value)
        for key, value in raw.items()
        if value is not None
    }
    return Profile(name=name, **values)


def _expect_value(source: str, key: str, value: object) -> Any:
    """A known key's value, checked for its type (ProfileError naming the key otherwise)."""
    if key in _INT_KEYS:
        return _expect_int(source, key, value)
    if key == "transport":
        if value not in TRANSPORTS:
            raise ProfileError(f"profile {source!r}: transport must be cli or rest, got {value!r}")
        return value
    if key in _STR_KEYS:
        return _expect_str(source, key, value)
    if key in _ENV_KEYS:
        return _expect_env(source, key, value)
    if key in _BOOL_KEYS:
        return _expect_bool(source, key, value)
    if key in ("partitions", "setup", "gpu_types", "features", "srun_args"):
        return tuple(_expect_str(source, key, v) for v in _expect_list(source, key, value))
    if key == "defaults":
        return _expect_defaults(source, value)
    if key == "sbatch":
        return _expect_sbatch(source, value)
    return _expect_container(source, value)  # "container": the last of _KEYS


def _kind(value: object) -> str:
    return type(value).__name__


def _expect_int(source: str, key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProfileError(f"profile {source!r}: {key} must be an integer >= 0, got {value!r}")
    return value


def _expect_str(source: str, key: str, value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ProfileError(f"profile {source!r}: {key} must be a string, got {_kind(value)}")
    return str(value)


def _expect_bool(source: str, key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ProfileError(f"profile {source!r}: {key} must be true or false, got {value!r}")
    return value


def _expect_list(source: str, key: str, value: object) -> list[object]:
    if not isinstance(value, list):
        raise ProfileError(f"profile {source!r}: {key} must be a list, got {_kind(value)}")
    return value


def _expect_env(source: str, key: str, value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise ProfileError(f"profile {source!r}: {key} must be a mapping, got {_kind(value)}")
    return {str(k): _expect_str(source, f"{key}.{k}", v) for k, v in value.items()}


def _expect_defaults(source: str, value: object) -> dict[str, Any]:
    # The JobSpec declares which of its fields a profile may preset, and their types.
    options = {o.name: o for o in JOB_OPTIONS if o.profile}
    value = _expect_keys(source, "defaults", value, tuple(options))
    out: dict[str, Any] = {}
    for key, item in value.items():
        if item is None:
            continue
        kind = options[key].value_type
        if kind == "int" or (kind == "count" and item != "auto"):
            out[key] = _expect_int(source, f"defaults.{key}", item)
        elif kind == "bool":
            out[key] = _expect_bool(source, f"defaults.{key}", item)
        else:
            out[key] = _expect_str(source, f"defaults.{key}", item)
        if options[key].choices and out[key] not in options[key].choices:
            raise ProfileError(
                f"profile {source!r}: defaults.{key} {item!r}; expected one of "
                f"{', '.join(options[key].choices)}"
            )
    return out


def _expect_keys(
    source: str, name: str, value: object, allowed: tuple[str, ...]
) -> Mapping[str, Any]:
    """A mapping whose keys are all in ``allowed``; the first other key is named."""
    if not isinstance(value, Mapping):
        raise ProfileError(f"profile {source!r}: {name} must be a mapping, got {_kind(value)}")
    unknown = sorted(set(value) - set(allowed), key=str)
    if unknown:
        raise ProfileError(
            f"profile {source!r} has unknown key '{name}.{unknown[0]}'; "
            f"allowed: {', '.join(allowed)}"
        )
    return value


def _expect_sbatch(source: str, value: object) -> dict[str, str | None]:
    """``sbatch:`` maps option names to values; null (or true) is a flag such as --exclusive.
    The names themselves are checked with the job (hpcdist/spec/siteopts.py), as --sbatch's are."""
    if not isinstance(value, Mapping):
        raise ProfileError(f"profile {source!r}: sbatch must be a mapping, got {_kind(value)}")
    out: dict[str, str | None] = {}
    for key, item in value.items():
        flag = item is None or item is True
        out[str(key)] = None if flag else _expect_str(source, f"sbatch.{key}", item)
    return out


CONTAINER_KEYS = ("runtime", "image", "mounts", "options")


def _expect_container(source: str, value: object) -> dict[str, Any]:
    value = _expect_keys(source, "container", value, CONTAINER_KEYS)
    out: dict[str, Any] = {}
    for key, item in value.items():
        if item is None:
            continue
        if key in ("mounts", "options"):
            items = _expect_list(source, f"container.{key}", item)
            out[key] = tuple(_expect_str(source, f"container.{key}", v) for v in items)
        else:
            out[key] = _expect_str(source, f"container.{key}", item)
    return out
