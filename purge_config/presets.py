"""Framework presets: a `kind = "django_sessions"` entry is an `expiring` entry with the
framework's own table, column, age and filter filled in (see docs/presets.md).

Config only: an entry is expanded here, before it is read as any `expiring` entry, so the engine
sees an `expiring` target and nothing new. Every key the user writes wins over the preset's, but
for `column` and `unit`, which are the framework's (FIXED_KEYS).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from purge_config.errors import ConfigError
from purge_config.names import TableName
from purge_config.patterns import parse_table
from purge_config.values import quoted


@dataclass(frozen=True)
class FrameworkPreset:
    """What one preset fills in; its target is named after the preset unless `name` is set."""

    table: str
    column: str
    max_age: str | None
    """The framework's own default age; None where it has none and the entry must say it."""
    match: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """The filter the framework's cleanup applies by default (`match`)."""
    allowed: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """For a column of `match`: the only values an entry may widen it to (finished states)."""
    age_from: str | None = None
    """The table holding each row's age (through its foreign key), when not the row's own."""


#: Each preset by its `kind`. The ages are the frameworks' defaults (docs/presets.md says where
#: each comes from); procrastinate's remove_old_jobs has no default (max_hours is required).
PRESETS: dict[str, FrameworkPreset] = {
    "django_sessions": FrameworkPreset("django_session", "expire_date", "0s"),
    "celery_results": FrameworkPreset("django_celery_results_taskresult", "date_done", "1d"),
    "celery_group_results": FrameworkPreset("django_celery_results_groupresult", "date_done", "1d"),
    "celery_taskmeta": FrameworkPreset("celery_taskmeta", "date_done", "1d"),
    "celery_tasksetmeta": FrameworkPreset("celery_tasksetmeta", "date_done", "1d"),
    "procrastinate": FrameworkPreset(
        "procrastinate_jobs",
        "at",
        None,
        match={"status": ("succeeded",)},
        allowed={"status": frozenset({"succeeded", "failed", "cancelled", "aborted"})},
        age_from="procrastinate_events",
    ),
}

#: The keys of an `expiring` entry a preset fixes: its column is the framework's, and a
#: timestamp column has no epoch unit.
FIXED_KEYS = frozenset({"column", "unit"})


def expand(at: str, kind: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    """The `expiring` entry `raw` (of preset `kind`) stands for: the preset's keys, then the
    entry's own over them. Keys are checked by the caller; values here only where the preset
    gives them a meaning (the related table, the widened match)."""
    preset = PRESETS[kind]
    entry: dict[str, Any] = {"name": kind, "table": preset.table, "column": preset.column}
    if preset.max_age is not None:
        entry["max_age"] = preset.max_age
    if preset.match:
        entry["match"] = {column: list(values) for column, values in preset.match.items()}
    entry |= {key: value for key, value in raw.items() if key != "kind"}
    entry["kind"] = "expiring"
    if "max_age" not in entry:
        raise ConfigError(
            f"{at}: max_age: missing; {kind} has no default age (how long a finished job is "
            'kept, like max_age = "3d")'
        )
    _check_match(at, preset, entry.get("match"))
    if preset.age_from is not None and "age_from" not in raw:
        entry["age_from"] = str(_beside(at, entry["table"], preset.age_from))
    return entry


def _check_match(at: str, preset: FrameworkPreset, match: object) -> None:
    """A widened match stays within the values the framework's cleanup may remove: a job still
    queued or running is never old, whatever its events say."""
    if not preset.allowed:
        return
    if not isinstance(match, dict):
        return  # the filter's own check says what is wrong with it
    for column, allowed in preset.allowed.items():
        value = match.get(column)
        if value is None:
            raise ConfigError(
                f"{at}: match: must keep {column} (one or more of "
                f"{', '.join(sorted(allowed))}), got {quoted(match)}"
            )
        values = value if isinstance(value, list) else [value]
        for one in values:
            if not isinstance(one, str) or one not in allowed:
                raise ConfigError(
                    f"{at}: match.{column}: only finished states ({', '.join(sorted(allowed))}), "
                    f"got {quoted(one)}"
                )


def _beside(at: str, table: object, related: str) -> TableName:
    """The related table in the schema of the entry's table (its pattern's, for a pattern)."""
    if not isinstance(table, str):
        return TableName(related)  # the table's own check says what is wrong with it
    try:
        schema = parse_table(table).schema
    except ConfigError:
        return TableName(related)
    return TableName(related, schema)
