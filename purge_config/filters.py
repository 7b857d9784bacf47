"""Row filters (`match`, `match_null`, `match_not_null`) and archive tables, as a config writes
them: checked here as values and names; turned into SQL (names as identifiers, values as
parameters) only in `activities.engine.filter_binding` and `activities.engine.archive`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime, time
from typing import Any

from purge_config.errors import ConfigError
from purge_config.names import SQL_NAME, TableName
from purge_config.patterns import parse_table
from purge_config.values import quoted

#: What a `match` value may be: the TOML types some column can hold. A TOML table cannot be one,
#: and a date-time without an offset names no instant (it would be read in some session's zone).
MatchValue = str | int | float | bool | datetime | date | time

#: The keys of a target that filter its rows.
FILTER_KEYS = frozenset({"match", "match_null", "match_not_null"})


@dataclass(frozen=True)
class RowFilter:
    """Which rows of a table a target may touch, beside its age rule: every entry must hold."""

    match: tuple[tuple[str, tuple[MatchValue, ...]], ...] = ()
    """(column, values): the column equals one of the values."""
    null: tuple[str, ...] = ()
    """Columns that must be NULL."""
    not_null: tuple[str, ...] = ()
    """Columns that must not be NULL."""

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column the filter names, in the order it names them."""
        return (*(column for column, _ in self.match), *self.null, *self.not_null)


def parse_filter(at: str, raw: Mapping[str, Any], expiry_column: str) -> RowFilter | None:
    """The entry's filter keys, checked; None when it has none."""
    if not FILTER_KEYS & raw.keys():
        return None
    match: list[tuple[str, tuple[MatchValue, ...]]] = []
    table = raw.get("match", {})
    if not isinstance(table, dict) or ("match" in raw and not table):
        raise ConfigError(
            f"{at}: match: must be a table of column = value or [values], like "
            f'{{ state = "failed" }}, got {quoted(table)}'
        )
    for column, value in table.items():
        _column(at, f"match.{column}" if column.isprintable() else "match", column)
        match.append((column, _values(at, f"match.{column}", value)))
    null = _columns(at, "match_null", raw)
    not_null = _columns(at, "match_not_null", raw)
    both = sorted(set(null) & set(not_null))
    if both:
        raise ConfigError(
            f"{at}: match_not_null: {quoted(both[0])} is also in match_null: no row could match "
            "both"
        )
    equal_and_null = sorted({column for column, _ in match} & set(null))
    if equal_and_null:
        raise ConfigError(
            f"{at}: match_null: {quoted(equal_and_null[0])} is also in match: a NULL equals no "
            "value, so no row could match both"
        )
    if expiry_column in null:
        raise ConfigError(
            f"{at}: match_null: {quoted(expiry_column)} is the target's column: a row whose "
            "column is NULL never expires, so no row could match"
        )
    return RowFilter(tuple(match), null, not_null)


def _column(at: str, key: str, column: object) -> str:
    if not isinstance(column, str) or not SQL_NAME.fullmatch(column):
        raise ConfigError(
            f"{at}: {key}: not a column name (letters, digits and _, starting with a letter or _, "
            f"at most 63), got {quoted(column)}"
        )
    return column


def _columns(at: str, key: str, raw: Mapping[str, Any]) -> tuple[str, ...]:
    if key not in raw:
        return ()
    value = raw[key]
    if not isinstance(value, list) or not value:
        raise ConfigError(
            f"{at}: {key}: must be a non-empty list of column names, got {quoted(value)}"
        )
    columns = tuple(_column(at, key, column) for column in value)
    twice = sorted({c for c in columns if columns.count(c) > 1})
    if twice:
        raise ConfigError(f"{at}: {key}: {quoted(twice[0])} appears twice")
    return columns


def _values(at: str, key: str, value: object) -> tuple[MatchValue, ...]:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise ConfigError(f"{at}: {key}: an empty list matches no row; give at least one value")
    for item in values:
        _value(at, key, item)
    # By type(), not isinstance(): [1, true] is two types, as it is to any column.
    if len({type(v) for v in values}) > 1:
        raise ConfigError(
            f"{at}: {key}: values of one column must be of one type, got {quoted(value)}"
        )
    return tuple(values)


def _value(at: str, key: str, value: object) -> None:
    if isinstance(value, datetime) and value.tzinfo is None:
        raise ConfigError(
            f"{at}: {key}: a date-time needs an offset (Z or +01:00) to name one instant, "
            f"got {value.isoformat()}"
        )
    if not isinstance(value, str | int | float | bool | datetime | date | time):
        raise ConfigError(
            f"{at}: {key}: a value must be a string, number, boolean, date, time or date-time "
            f"with an offset (or a list of them), got {quoted(value)}"
        )
    if isinstance(value, str) and "\x00" in value:
        # PostgreSQL's text holds no NUL: every sweep of the target would fail on it.
        raise ConfigError(f"{at}: {key}: PostgreSQL's text cannot hold a NUL, got {quoted(value)}")


def archive_table(at: str, key: str, raw: Mapping[str, Any], source: TableName) -> TableName | None:
    """The archive table at `key`, checked; None when the entry has none."""
    if key not in raw:
        return None
    text = raw[key]
    if not isinstance(text, str) or not text:
        raise ConfigError(f"{at}: {key}: must be a non-empty string, got {quoted(text)}")
    try:
        table = parse_table(text)
    except ConfigError as err:
        raise ConfigError(f"{at}: {key}: {err}") from None
    if table == source:
        # Written differently they may still be one table: the sweep compares them in the
        # catalog before anything moves (activities.engine.archive).
        raise ConfigError(
            f"{at}: {key}: the archive must be another table than the one swept, got {quoted(text)}"
        )
    return table
