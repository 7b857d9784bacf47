"""The one TOML file a deployment is described by, checked whole before anything connects.

Every refusal is a ConfigError whose message is one line naming the file, the key and the value.
"""

from __future__ import annotations

import importlib
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from psycopg.conninfo import conninfo_to_dict

from activities.dsn import redact
from activities.errors import ConfigError
from activities.payloads import TARGET_NAME
from activities.tables import SQL_NAME, TableName
from activities.targets import TargetFactory

DEFAULT_PATH = Path("purge.toml")
DEFAULT_TASK_QUEUE = "purge"
DEFAULT_SCHEDULE_ID = "purge-hourly"
DEFAULT_CRON = "23 * * * *"
DEFAULT_TIME_ZONE = "UTC"

#: The built-in kinds, their default target names and default tables.
KIND_DEFAULTS: dict[str, str] = {
    "idempotency": "x_idempotency",
    "rate_limit": "x_rate_limit",
    "auth": "x_auth",
}
KINDS = (*KIND_DEFAULTS, "expiring", "python")

#: Keys each kind takes beside `kind`; anything else is a typo worth stopping for.
_TARGET_KEYS: dict[str, frozenset[str]] = {
    "idempotency": frozenset({"name", "table"}),
    "rate_limit": frozenset({"name", "table"}),
    "auth": frozenset({"name", "failures_table", "lockouts_table"}),
    "expiring": frozenset({"name", "table", "column", "max_age"}),
    "python": frozenset({"factory", "names"}),
}
_TOP_KEYS = frozenset({"database_url", "task_queue", "schedule", "targets"})
_SCHEDULE_KEYS = frozenset({"id", "cron", "time_zone"})

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_AGE_PART = re.compile(r"(\d+)(ms|s|m|h|d|w)")
#: A century: far beyond any retention period, and small enough that no instant overflows.
MAX_AGE_LIMIT_MS = 36_525 * 86_400_000
_FACTORY = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_QUEUE = re.compile(r"[A-Za-z0-9_.:/-]{1,200}")
_CRON_FIELD = re.compile(r"[0-9A-Za-z*/,\-?LW#]+")


@dataclass(frozen=True)
class TargetSpec:
    """One `[[targets]]` entry, checked; building it into a target needs a pool (see kinds)."""

    kind: str
    name: str
    """The target's name; for `python`, the factory's path (its targets carry their own names)."""
    tables: tuple[TableName, ...] = ()
    column: str = ""
    max_age_ms: int = 0
    factory: TargetFactory | None = None
    names: tuple[str, ...] = ()
    """For `python`: the names its factory provides that a scheduled pass should sweep."""


@dataclass(frozen=True)
class ScheduleSpec:
    """The `[schedule]` table."""

    id: str = DEFAULT_SCHEDULE_ID
    cron: str = DEFAULT_CRON
    time_zone: str = DEFAULT_TIME_ZONE


@dataclass(frozen=True)
class PurgeConfig:
    """A whole deployment: where to delete, which targets, when."""

    path: Path | None = None
    database_url: str | None = None
    task_queue: str = DEFAULT_TASK_QUEUE
    schedule: ScheduleSpec = field(default_factory=ScheduleSpec)
    targets: tuple[TargetSpec, ...] = ()

    @property
    def target_names(self) -> list[str]:
        """The names a scheduled pass sweeps, in file order; a factory's come from its `names`."""
        return [n for t in self.targets for n in (t.names if t.kind == "python" else (t.name,))]

    def require_database_url(self) -> str:
        """The database URL, or a ConfigError saying where to put one."""
        if not self.database_url:
            raise ConfigError(
                f"{self.path or DEFAULT_PATH}: database_url: missing; "
                "set it in the file or in PURGE_DATABASE_URL"
            )
        return self.database_url


def config_path(explicit: str | None, env: Mapping[str, str] = os.environ) -> Path:
    """`--config`, else PURGE_CONFIG, else ./purge.toml."""
    return Path(explicit or env.get("PURGE_CONFIG") or DEFAULT_PATH)


def load_config(path: Path, env: Mapping[str, str] = os.environ) -> PurgeConfig:
    """Read and check `path`; PURGE_DATABASE_URL in `env` overrides the file's database_url."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: no such file; pass --config, set PURGE_CONFIG, or create ./purge.toml"
        ) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read: {err}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None
    return parse_config(raw, path, env)


def parse_config(
    raw: Mapping[str, Any], path: Path | None = None, env: Mapping[str, str] = os.environ
) -> PurgeConfig:
    """Check an already-parsed TOML document."""
    where = str(path or "<config>")
    _no_unknown(where, "", raw, _TOP_KEYS)

    database_url = env.get("PURGE_DATABASE_URL") or _opt_str(where, "database_url", raw)
    if database_url is not None:
        key = "PURGE_DATABASE_URL" if env.get("PURGE_DATABASE_URL") else "database_url"
        _check_dsn(where, key, database_url)

    task_queue = _opt_str(where, "task_queue", raw) or DEFAULT_TASK_QUEUE
    if not _QUEUE.fullmatch(task_queue):
        raise ConfigError(f"{where}: task_queue: not a task queue name, got {task_queue!r}")

    schedule = _parse_schedule(where, raw.get("schedule", {}))

    entries = raw.get("targets", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: targets: must be an array of [[targets]] tables")
    targets = tuple(_parse_target(where, i, entry) for i, entry in enumerate(entries, 1))
    seen: dict[str, int] = {}
    for i, spec in enumerate(targets, 1):
        key = "names" if spec.kind == "python" else "name"
        for name in spec.names if spec.kind == "python" else (spec.name,):
            if name in seen:
                raise ConfigError(
                    f"{where}: [[targets]] #{i}: {key}: {name!r} is already a name of "
                    f"[[targets]] #{seen[name]}; two targets cannot share a name"
                )
            seen[name] = i
    return PurgeConfig(
        path=path,
        database_url=database_url,
        task_queue=task_queue,
        schedule=schedule,
        targets=targets,
    )


def parse_max_age(text: str) -> int:
    """`"30d"`, `"1h30m"`, `"0s"` to milliseconds; ConfigError (without the key) otherwise."""
    pos, total, seen = 0, 0, set()
    for match in _AGE_PART.finditer(text):
        if match.start() != pos:
            break
        unit = match.group(2)
        if unit in seen:
            raise ConfigError(f"unit {unit!r} appears twice in {text!r}")
        seen.add(unit)
        total += int(match.group(1)) * _UNITS_MS[unit]
        pos = match.end()
    if not text or pos != len(text):
        raise ConfigError(
            f"not a duration, got {text!r}; want a number and a unit (ms s m h d w), "
            "or several: '30d', '1h30m', '0s'"
        )
    if total > MAX_AGE_LIMIT_MS:
        raise ConfigError(f"{text!r} is longer than 100 years")
    return total


def _parse_schedule(where: str, raw: object) -> ScheduleSpec:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: schedule: must be a [schedule] table, got {raw!r}")
    _no_unknown(where, "schedule.", raw, _SCHEDULE_KEYS)
    spec = ScheduleSpec(
        id=_opt_str(where, "schedule.id", raw, "id") or DEFAULT_SCHEDULE_ID,
        cron=_opt_str(where, "schedule.cron", raw, "cron") or DEFAULT_CRON,
        time_zone=_opt_str(where, "schedule.time_zone", raw, "time_zone") or DEFAULT_TIME_ZONE,
    )
    if not _QUEUE.fullmatch(spec.id):
        raise ConfigError(f"{where}: schedule.id: not a schedule id, got {spec.id!r}")
    fields = spec.cron.split()
    if len(fields) != 5 or not all(_CRON_FIELD.fullmatch(f) for f in fields):
        raise ConfigError(
            f"{where}: schedule.cron: want five cron fields like '23 * * * *', got {spec.cron!r}"
        )
    try:
        ZoneInfo(spec.time_zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(
            f"{where}: schedule.time_zone: not an IANA time zone, got {spec.time_zone!r}"
        ) from None
    return spec


def _parse_target(where: str, index: int, raw: object) -> TargetSpec:
    at = f"{where}: [[targets]] #{index}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{at}: must be a table, got {raw!r}")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"{at}: kind: must be one of {', '.join(KINDS)}, got {kind!r}")
    name_hint = raw.get("name")
    if isinstance(name_hint, str):
        at = f"{at} ({name_hint})"
    _no_unknown(at, "", raw, _TARGET_KEYS[kind] | {"kind"})

    if kind == "python":
        path = _req_str(at, "factory", raw)
        names = raw.get("names", [])
        if not isinstance(names, list) or not all(
            isinstance(n, str) and TARGET_NAME.fullmatch(n) for n in names
        ):
            raise ConfigError(f"{at}: names: must be a list of target names, got {names!r}")
        return TargetSpec(
            kind=kind, name=path, factory=_resolve_factory(at, path), names=tuple(names)
        )

    name = _opt_str(at, "name", raw) if kind != "expiring" else _req_str(at, "name", raw)
    name = name or KIND_DEFAULTS[kind]
    if not TARGET_NAME.fullmatch(name):
        raise ConfigError(
            f"{at}: name: letters, digits and _ . : - (at most 100), starting with a letter, "
            f"digit or _, got {name!r}"
        )
    if kind == "auth":
        tables = (
            _table(at, "failures_table", raw, "x_auth_failures"),
            _table(at, "lockouts_table", raw, "x_auth_lockouts"),
        )
        return TargetSpec(kind=kind, name=name, tables=tables)
    if kind in KIND_DEFAULTS:
        return TargetSpec(
            kind=kind, name=name, tables=(_table(at, "table", raw, kind_table(kind)),)
        )

    table = _table(at, "table", raw, None)
    column = _req_str(at, "column", raw)
    if not SQL_NAME.fullmatch(column):
        raise ConfigError(
            f"{at}: column: not a column name (letters, digits and _, starting with a letter "
            f"or _, at most 63), got {column!r}"
        )
    max_age_ms = 0
    if "max_age" in raw:
        max_age = raw["max_age"]
        if not isinstance(max_age, str):
            raise ConfigError(f"{at}: max_age: must be a string like '30d', got {max_age!r}")
        try:
            max_age_ms = parse_max_age(max_age)
        except ConfigError as err:
            raise ConfigError(f"{at}: max_age: {err}") from None
    return TargetSpec(kind=kind, name=name, tables=(table,), column=column, max_age_ms=max_age_ms)


def kind_table(kind: str) -> str:
    """The table a single-table built-in kind sweeps unless told otherwise."""
    return KIND_DEFAULTS[kind]


def _table(at: str, key: str, raw: Mapping[str, Any], default: str | None) -> TableName:
    text = _opt_str(at, key, raw) if default is not None else _req_str(at, key, raw)
    try:
        return TableName.parse(text or str(default))
    except ConfigError as err:
        raise ConfigError(f"{at}: {key}: {err}") from None


def _resolve_factory(at: str, path: str) -> TargetFactory:
    if not _FACTORY.fullmatch(path):
        raise ConfigError(f"{at}: factory: want 'package.module:function', got {path!r}")
    module_name, _, attr_path = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(f"{at}: factory: cannot import {module_name!r}: {err}") from None
    for attr in attr_path.split("."):
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            raise ConfigError(f"{at}: factory: {module_name!r} has no {attr_path!r}") from None
    if not callable(obj):
        raise ConfigError(f"{at}: factory: {path!r} is not callable")
    factory: TargetFactory = obj
    return factory


def _check_dsn(where: str, key: str, dsn: str) -> None:
    try:
        conninfo_to_dict(dsn)
    except Exception:
        # The message of the parser may quote the string, password included: do not pass it on.
        raise ConfigError(
            f"{where}: {key}: not a PostgreSQL connection string, got {redact(dsn)!r}"
        ) from None


def _no_unknown(where: str, prefix: str, raw: Mapping[str, Any], allowed: frozenset[str]) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ConfigError(
            f"{where}: {prefix}{unknown[0]}: unknown key; "
            f"allowed here: {', '.join(sorted(allowed))}"
        )


def _opt_str(
    where: str, key: str, raw: Mapping[str, Any], field_name: str | None = None
) -> str | None:
    value = raw.get(field_name or key.rsplit(".", 1)[-1])
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: {key}: must be a non-empty string, got {value!r}")
    return value


def _req_str(where: str, key: str, raw: Mapping[str, Any]) -> str:
    value = _opt_str(where, key, raw)
    if value is None:
        raise ConfigError(f"{where}: {key}: missing")
    return value
