"""The one TOML file a deployment is described by, checked whole before anything connects.

Every refusal is a ConfigError whose message is one line naming the file, the key and the value.
"""

from __future__ import annotations

import importlib
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from psycopg.conninfo import conninfo_to_dict

from activities.batching import SweepSettings
from activities.dsn import redact
from activities.errors import ConfigError
from activities.guards import Guards
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
#: Guards a built-in target may carry (see activities/guards.py); all off unless set.
_GUARD_KEYS = frozenset({"max_rows", "max_fraction", "max_clock_jump"})
_TOP_KEYS = frozenset({"database_url", "task_queue", "metrics", "schedule", "sweep", "targets"})

#: The `[sweep]` keys (also allowed in any built-in target, to override them there), the
#: SweepSettings field each sets, and its bounds in ms. The time budget stays well inside the
#: activity's 30-minute start-to-close, so a sweep always ends by its own budget.
_SWEEP_KEYS: dict[str, tuple[str, int, int]] = {
    "lock_timeout": ("lock_timeout_ms", 1, 60_000),
    "statement_timeout": ("statement_timeout_ms", 100, 600_000),
    "batch_target": ("batch_target_ms", 1, 10_000),
    "time_budget": ("time_budget_ms", 1_000, 20 * 60_000),
}
_SCHEDULE_KEYS = frozenset({"id", "cron", "time_zone", "catchup_window", "jitter", "ensure"})

#: Spread fire times a little, so deployments sharing a cluster or a database do not all start
#: at :23:00 sharp.
DEFAULT_JITTER_MS = 30_000
#: Temporal refuses a catch-up window under 10 s.
MIN_CATCHUP_MS = 10_000
HOUR_MS = 3_600_000
_METRICS = re.compile(r"(?P<host>[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\]):(?P<port>[0-9]{1,5})")

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_AGE_PART = re.compile(r"([0-9]+)(ms|s|m|h|d|w)")
#: A century: far beyond any retention period, and small enough that no instant overflows.
MAX_AGE_LIMIT_MS = 36_525 * 86_400_000
_FACTORY = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_QUEUE = re.compile(r"[A-Za-z0-9_.:/-]{1,200}")
_CRON_NUMBER = re.compile(r"[0-9]{1,4}")
_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august",
           "september", "october", "november", "december")  # fmt: skip
_WEEKDAYS = ("sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday")
#: The five cron fields as Temporal's server reads them: lowest and highest value, and the names
#: it takes for a value (a prefix of at least 3 letters of a month, 2 of a weekday). It has no
#: `L`, `W`, `#` or `?`: a cron it would refuse is refused here, before anything starts.
_CRON_FIELDS: tuple[tuple[int, int, tuple[str, ...], int], ...] = (
    (0, 59, (), 0),
    (0, 23, (), 0),
    (1, 31, (), 0),
    (1, 12, _MONTHS, 3),
    (0, 7, _WEEKDAYS, 2),
)


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
    settings: SweepSettings = field(default_factory=SweepSettings)
    """The bounds of this target's sweep: `[sweep]`, overridden by the entry's own keys."""
    guards: Guards = field(default_factory=Guards)
    """max_rows, max_fraction, max_clock_jump: off unless set."""


@dataclass(frozen=True)
class ScheduleSpec:
    """The `[schedule]` table."""

    id: str = DEFAULT_SCHEDULE_ID
    cron: str = DEFAULT_CRON
    time_zone: str = DEFAULT_TIME_ZONE
    catchup_window_ms: int = HOUR_MS
    """How late a missed pass may still run after an outage: about one period, so at most one."""
    jitter_ms: int = DEFAULT_JITTER_MS
    ensure: bool = False
    """Whether `run` creates or updates the schedule at start."""


@dataclass(frozen=True)
class PurgeConfig:
    """A whole deployment: where to delete, which targets, when."""

    path: Path | None = None
    database_url: str | None = None
    task_queue: str = DEFAULT_TASK_QUEUE
    schedule: ScheduleSpec = field(default_factory=ScheduleSpec)
    targets: tuple[TargetSpec, ...] = ()
    metrics: str | None = None
    """HOST:PORT where a worker serves Prometheus metrics, if anywhere."""

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

    # The file's own value is checked even when the environment overrides it: the file is
    # checked whole, and it is what the next deployment without the variable will use.
    file_url = _opt_str(where, "database_url", raw)
    if file_url is not None:
        _check_dsn(where, "database_url", file_url)
    env_url = env.get("PURGE_DATABASE_URL") or None
    if env_url is not None:
        _check_dsn(where, "PURGE_DATABASE_URL", env_url)
    database_url = env_url or file_url

    task_queue = _opt_str(where, "task_queue", raw) or DEFAULT_TASK_QUEUE
    if not _QUEUE.fullmatch(task_queue):
        raise ConfigError(f"{where}: task_queue: not a task queue name, got {task_queue!r}")

    schedule = _parse_schedule(where, raw.get("schedule", {}))

    metrics = _opt_str(where, "metrics", raw)
    if metrics is not None:
        check_metrics_address(metrics, f"{where}: metrics")

    entries = raw.get("targets", [])
    if not isinstance(entries, list):
        raise ConfigError(
            f"{where}: targets: must be an array of [[targets]] tables, got {entries!r}"
        )
    sweep = raw.get("sweep", {})
    if isinstance(sweep, dict):
        _no_unknown(where, "sweep.", sweep, frozenset(_SWEEP_KEYS))
    defaults = _sweep_settings(where, "sweep.", sweep, SweepSettings())
    targets = tuple(_parse_target(where, i, entry, defaults) for i, entry in enumerate(entries, 1))
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
        metrics=metrics,
    )


def parse_max_age(text: str) -> int:
    """`"30d"`, `"1h30m"`, `"0s"` to milliseconds; ConfigError (without the key) otherwise."""
    pos, total, seen = 0, 0, set()
    # Each part is matched where the last one ended: a search (finditer) would rescan a long
    # run of digits from every position in it, quadratic in the length of the value.
    while match := _AGE_PART.match(text, pos):
        unit = match.group(2)
        if unit in seen:
            raise ConfigError(f"unit {unit!r} appears twice in {text!r}")
        seen.add(unit)
        # More than 20 significant digits is past the century anyway, and int() raises a
        # ValueError (not a ConfigError, so a traceback) on a string of over 4300 digits.
        digits = match.group(1).lstrip("0") or "0"
        if len(digits) > 20:
            raise ConfigError(f"{text!r} is longer than 100 years")
        total += int(digits) * _UNITS_MS[unit]
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
    cron = _opt_str(where, "schedule.cron", raw, "cron") or DEFAULT_CRON
    if not _cron_ok(cron):
        raise ConfigError(
            f"{where}: schedule.cron: want five cron fields (minute hour day month weekday) "
            f"like '23 * * * *', got {cron!r}"
        )
    ensure = raw.get("ensure", False)
    if not isinstance(ensure, bool):
        raise ConfigError(f"{where}: schedule.ensure: must be true or false, got {ensure!r}")
    spec = ScheduleSpec(
        id=_opt_str(where, "schedule.id", raw, "id") or DEFAULT_SCHEDULE_ID,
        cron=cron,
        time_zone=_opt_str(where, "schedule.time_zone", raw, "time_zone") or DEFAULT_TIME_ZONE,
        catchup_window_ms=_duration(where, "schedule.catchup_window", raw, "catchup_window")
        if "catchup_window" in raw
        else default_catchup_ms(cron),
        jitter_ms=_duration(where, "schedule.jitter", raw, "jitter")
        if "jitter" in raw
        else DEFAULT_JITTER_MS,
        ensure=ensure,
    )
    if spec.catchup_window_ms < MIN_CATCHUP_MS:
        raise ConfigError(
            f"{where}: schedule.catchup_window: at least 10s (Temporal's minimum), "
            f"got {raw['catchup_window']!r}"
        )
    if spec.jitter_ms > HOUR_MS:
        raise ConfigError(
            f"{where}: schedule.jitter: at most 1h, so a pass stays near its time, "
            f"got {raw['jitter']!r}"
        )
    if not _QUEUE.fullmatch(spec.id):
        raise ConfigError(f"{where}: schedule.id: not a schedule id, got {spec.id!r}")
    try:
        ZoneInfo(spec.time_zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(
            f"{where}: schedule.time_zone: not an IANA time zone, got {spec.time_zone!r}"
        ) from None
    return spec


def default_catchup_ms(cron: str) -> int:
    """About one period of `cron`: a day for a daily schedule, else an hour (the default
    schedule is hourly; a finer cron with an hour's window still runs at most one late pass,
    since the schedule skips overlaps)."""
    minute, hour, day, month, weekday = cron.split()
    fixed = all(part.isdigit() for part in (minute, hour))
    if fixed and day == month == weekday == "*":
        return 24 * HOUR_MS
    return HOUR_MS


def check_metrics_address(text: str, where: str) -> str:
    """`HOST:PORT` for the metrics endpoint, or a ConfigError naming `where`."""
    match = _METRICS.fullmatch(text)
    if not match or not 1 <= int(match.group("port")) <= 65535:
        raise ConfigError(f"{where}: want HOST:PORT like '0.0.0.0:9464', got {text!r}")
    return text


def _duration(where: str, key: str, raw: Mapping[str, Any], field_name: str) -> int:
    value = raw[field_name]
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {key}: must be a string like '30d', got {value!r}")
    try:
        return parse_max_age(value)
    except ConfigError as err:
        raise ConfigError(f"{where}: {key}: {err}") from None


def _cron_ok(cron: str) -> bool:
    """Five fields, each a comma list of `*`, `n` or `n-m`, each optionally `/step`, in range."""
    fields = cron.split()
    return len(fields) == 5 and all(
        _cron_field_ok(text, *spec) for text, spec in zip(fields, _CRON_FIELDS, strict=True)
    )


def _cron_field_ok(text: str, low: int, high: int, names: tuple[str, ...], shortest: int) -> bool:
    for part in text.split(","):
        span, slash, step = part.partition("/")
        if slash and not (_CRON_NUMBER.fullmatch(step) and int(step) >= 1):
            return False
        if span == "*":
            continue
        first, dash, last = span.partition("-")
        start = _cron_value(first, low, high, names, shortest)
        end = _cron_value(last, low, high, names, shortest) if dash else start
        if start is None or end is None or end < start:
            return False
    return True


def _cron_value(
    text: str, low: int, high: int, names: tuple[str, ...], shortest: int
) -> int | None:
    if _CRON_NUMBER.fullmatch(text):
        value = int(text)
    elif names and len(text) >= shortest:
        lowered = text.lower()
        value = next((low + i for i, name in enumerate(names) if name.startswith(lowered)), -1)
    else:
        return None
    return value if low <= value <= high else None


def _sweep_settings(where: str, prefix: str, raw: object, base: SweepSettings) -> SweepSettings:
    """`base` with the sweep keys of `raw` applied (only those keys are read here)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: {prefix.rstrip('.')}: must be a table, got {raw!r}")
    changes: dict[str, int] = {}
    for key, (attr, low, high) in _SWEEP_KEYS.items():
        if key not in raw:
            continue
        value = _duration(where, prefix + key, raw, key)
        if not low <= value <= high:
            raise ConfigError(
                f"{where}: {prefix}{key}: must be from {_ms_text(low)} to {_ms_text(high)}, "
                f"got {raw[key]!r}"
            )
        changes[attr] = value
    settings = replace(base, **changes)
    if settings.batch_target_ms * 10 > settings.statement_timeout_ms:
        raise ConfigError(
            f"{where}: {prefix}statement_timeout: must be at least 10 times batch_target "
            f"({_ms_text(settings.batch_target_ms)}), got {_ms_text(settings.statement_timeout_ms)}"
        )
    return settings


def _guards(at: str, raw: Mapping[str, Any]) -> Guards:
    max_rows = raw.get("max_rows")
    if max_rows is not None and (
        isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1
    ):
        raise ConfigError(f"{at}: max_rows: must be a whole number of at least 1, got {max_rows!r}")
    fraction = raw.get("max_fraction")
    if fraction is not None and (
        isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction <= 1
    ):
        raise ConfigError(
            f"{at}: max_fraction: must be a share above 0 and at most 1 (0.25 for a quarter), "
            f"got {fraction!r}"
        )
    jump = None
    if "max_clock_jump" in raw:
        jump = _duration(at, "max_clock_jump", raw, "max_clock_jump")
        if jump < 1000:
            raise ConfigError(f"{at}: max_clock_jump: at least 1s, got {raw['max_clock_jump']!r}")
    return Guards(
        max_rows=max_rows,
        max_fraction=float(fraction) if fraction is not None else None,
        max_clock_jump_ms=jump,
    )


def _ms_text(ms: int) -> str:
    for unit, size in (("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def _parse_target(where: str, index: int, raw: object, defaults: SweepSettings) -> TargetSpec:
    at = f"{where}: [[targets]] #{index}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{at}: must be a table, got {raw!r}")
    kind = raw.get("kind")
    if kind is None:
        raise ConfigError(f"{at}: kind: missing; want one of {', '.join(KINDS)}")
    if kind not in KINDS:
        raise ConfigError(f"{at}: kind: must be one of {', '.join(KINDS)}, got {kind!r}")
    name_hint = raw.get("name")
    # Only a valid name labels the entry: an invalid one (a newline, say) is shown, quoted, by
    # the check of `name` below, and would otherwise break the one-line message here.
    if isinstance(name_hint, str) and TARGET_NAME.fullmatch(name_hint):
        at = f"{at} ({name_hint})"
    sweep_keys = frozenset({*_SWEEP_KEYS, *_GUARD_KEYS}) if kind != "python" else frozenset()
    _no_unknown(at, "", raw, _TARGET_KEYS[kind] | sweep_keys | {"kind"})

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
    settings = _sweep_settings(at, "", raw, defaults)
    guards = _guards(at, raw)
    if kind == "auth":
        tables = (
            _table(at, "failures_table", raw, "x_auth_failures"),
            _table(at, "lockouts_table", raw, "x_auth_lockouts"),
        )
        return TargetSpec(kind=kind, name=name, tables=tables, settings=settings, guards=guards)
    if kind in KIND_DEFAULTS:
        table = _table(at, "table", raw, kind_table(kind))
        return TargetSpec(kind=kind, name=name, tables=(table,), settings=settings, guards=guards)

    table = _table(at, "table", raw, None)
    column = _req_str(at, "column", raw)
    if not SQL_NAME.fullmatch(column):
        raise ConfigError(
            f"{at}: column: not a column name (letters, digits and _, starting with a letter "
            f"or _, at most 63), got {column!r}"
        )
    max_age_ms = 0
    if "max_age" in raw:
        max_age_ms = _duration(at, "max_age", raw, "max_age")
    return TargetSpec(
        kind=kind,
        name=name,
        tables=(table,),
        column=column,
        max_age_ms=max_age_ms,
        settings=settings,
        guards=guards,
    )


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
    except Exception as err:
        # Any error of the module's own import (a SyntaxError, a failing top-level call) is a
        # bad factory for this config: one line, not a traceback.
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ConfigError(
            f"{at}: factory: cannot import {module_name!r}: {type(err).__name__}: {first}"
        ) from None
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
        params = conninfo_to_dict(dsn)
    except Exception:
        # The parser's message may quote the string, password included: never pass it on.
        params = None
    ports = str((params or {}).get("port") or "")
    if params is None or not all(p.isdigit() for p in ports.split(",") if p):
        raise ConfigError(
            f"{where}: {key}: not a PostgreSQL connection string, got {redact(dsn)!r}"
        ) from None


def _no_unknown(where: str, prefix: str, raw: Mapping[str, Any], allowed: frozenset[str]) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        # A quoted TOML key may hold a newline; shown as written it would split the line.
        key = unknown[0] if unknown[0].isprintable() else repr(unknown[0])
        raise ConfigError(
            f"{where}: {prefix}{key}: unknown key; allowed here: {', '.join(sorted(allowed))}"
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
