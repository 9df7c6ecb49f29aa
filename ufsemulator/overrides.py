"""Config overrides given on a command line: ``training.lr=3e-4``, ``model.hidden_sizes=[32,32]``.

One spelling for every tool: ``python -m ufsemulator train --set KEY=VALUE`` applies them,
and ``hpcdist render/submit --set/--sweep`` checks them against the same schema (the config
dataclasses) before anything is queued. The key is a dotted path into the YAML config; the
value is read as a YAML scalar or flow list (``1e-3``, ``true``, ``null``, ``[64, 64]``).

No torch here: the CLI that renders and submits runs on login nodes.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from ufsemulator.config import Config, ConfigError, _convert, _schema

# libyaml's loader where PyYAML has it (the same rules as yaml.safe_load, several times
# faster: a sweep of thousands of values reads each one).
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def valid_key(key: str) -> bool:
    """A dotted config key's form (``training.lr``); whether it exists is the schema's say."""
    return _KEY.fullmatch(key) is not None


def parse_override(text: str, flag: str = "--set") -> tuple[str, Any]:
    """``KEY=VALUE`` -> (dotted key, YAML value); a ConfigError names what is wrong."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not _KEY.fullmatch(key):
        raise ConfigError(f"{flag} {text!r}; expected KEY=VALUE with a dotted config key")
    return key, parse_value(raw, f"{flag} {key}")


def parse_value(raw: str, where: str) -> Any:
    """A value as YAML reads it in a config file: number, bool, null, string or flow list."""
    if "\n" in raw or "\r" in raw or "\x00" in raw:
        shown = raw.encode("unicode_escape").decode("ascii")
        raise ConfigError(f"{where}={shown!r} contains a newline or NUL; expected one line")
    try:
        return yaml.load(raw, Loader=_LOADER) if raw.strip() else ""
    except yaml.YAMLError as exc:
        reason = str(exc).splitlines()[0]
        raise ConfigError(
            f"{where}={raw!r} is not a YAML value ({reason}); expected e.g. 3e-4 or [64,64]"
        ) from None


def apply_overrides(
    data: Mapping[str, Any], overrides: Iterable[tuple[str, Any]]
) -> dict[str, Any]:
    """A copy of the config mapping ``data`` with each dotted key set (later ones win)."""
    out = _copy(data)
    for key, value in overrides:
        *sections, leaf = key.split(".")
        node = out
        for i, section in enumerate(sections):
            child = node.get(section)
            if child is None:
                # An unknown section: the schema check names it with the allowed ones.
                child = node[section] = {}
            elif not isinstance(child, dict):
                where = ".".join(sections[: i + 1])
                raise ConfigError(
                    f"'{key}': '{where}' is a value, not a section; expected a key such as "
                    "training.lr"
                )
            node = child
        node[leaf] = value
    return out


def _copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def config_with(base: Mapping[str, Any], texts: Iterable[str], flag: str = "--set") -> Config:
    """The config ``base`` (a mapping, e.g. ``Config().to_dict()``) with ``KEY=VALUE`` texts
    applied, validated against the schema (unknown key or wrong type: ConfigError)."""
    parsed = [parse_override(text, flag) for text in texts]
    return Config.from_dict(apply_overrides(base, parsed))


def check_overrides(texts: Iterable[str], flag: str = "--set") -> Config:
    """Validate overrides against the default config (``Config()``); the resulting Config.
    Known keys are checked on the default config object, each section built again once
    with its new values (its own checks run as in a full build): a sweep of thousands of
    points is checked in a second. An unknown key or a whole section takes the full build,
    whose message names what is allowed."""
    parsed = [parse_override(text, flag) for text in texts]
    changes = _changes(parsed)
    if changes is None:
        return Config.from_dict(apply_overrides(_default_dict(), parsed))
    return _replaced(_default_config(), changes)


@functools.cache
def _default_config() -> Config:
    return Config()


def _default_dict() -> dict[str, Any]:
    return _default_config().to_dict()


def _changes(parsed: Iterable[tuple[str, Any]]) -> dict[str, Any] | None:
    """The overrides as {section: {field: converted value}}, nested as the config is; None
    where a key is not a field of the schema or names a whole section."""
    out: dict[str, Any] = {}
    for key, value in parsed:
        cls: Any = Config
        node = out
        *sections, leaf = key.split(".")
        for section in sections:
            hints, names = _schema(cls)
            if section not in names or not dataclasses.is_dataclass(hints[section]):
                return None
            cls = hints[section]
            node = node.setdefault(section, {})
            if not isinstance(node, dict):
                return None
        hints, names = _schema(cls)
        if leaf not in names or dataclasses.is_dataclass(hints[leaf]):
            return None
        node[leaf] = _Value(_convert(hints[leaf], value, key))
    return out


class _Value:
    """A converted leaf value (a plain dict is a section of changes)."""

    def __init__(self, value: Any) -> None:
        self.value = value


def _replaced(obj: Any, changes: dict[str, Any]) -> Any:
    """``obj`` with ``changes`` applied, each dataclass rebuilt once (its checks run)."""
    values = {
        name: change.value if isinstance(change, _Value) else _replaced(getattr(obj, name), change)
        for name, change in changes.items()
    }
    return dataclasses.replace(obj, **values)


def apply_to(config: Config, texts: Iterable[str], flag: str = "--set") -> Config:
    """``config`` with the ``KEY=VALUE`` texts applied, validated again."""
    texts = list(texts)
    return config_with(config.to_dict(), texts, flag) if texts else config


def overrides_record(config: Config, texts: Iterable[str]) -> dict[str, Any]:
    """Each overridden key with the value the run used (``1e-3`` read as 0.001), for
    training_results.json."""
    data: Any = config.to_dict()
    record: dict[str, Any] = {}
    for text in texts:
        key, _ = parse_override(text)
        node = data
        for part in key.split("."):
            node = node[part]
        record[key] = node
    return record
