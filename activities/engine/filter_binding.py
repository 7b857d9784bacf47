"""A target's row filter (`match`, `match_null`, `match_not_null`) bound to its real table.

Column names become `sql.Identifier`s; values are only ever parameters. Each value is sent as
text of unknown type, so the server reads it as the column's own type: `state = $1` against an
enum column compares enum with enum, and the planner (which sees the values of a statement's
parameters) can match a partial index such as `WHERE state = 'failed'`. A value the column's
type cannot read (an enum label that does not exist, an integer out of range) fails the target
before anything is deleted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from typing import Any

import psycopg
from psycopg import AsyncConnection, sql

from activities.engine import catalog
from activities.engine.errors import BadTable, first_line
from purge_config.errors import did_you_mean
from purge_config.filters import MatchValue, RowFilter
from purge_config.names import TableName

_BOOLEAN = frozenset({"boolean"})
_INTEGERS = frozenset({"smallint", "integer", "bigint"})
_FLOATS = frozenset({"real", "double precision"})
_INSTANTS = frozenset({"timestamp with time zone", "timestamp without time zone"})
_DAY, _TIME_OF_DAY = "date", "time without time zone"
#: Column types with a TOML type of their own: a string is refused for them, so a quoted "5"
#: or "true" is caught as the slip it usually is. (`numeric` still takes a string: "12.50" is
#: the exact way to write a decimal.)
_NOT_FROM_TEXT = _BOOLEAN | _INTEGERS | _FLOATS | _INSTANTS | {_DAY, _TIME_OF_DAY}


@dataclass(frozen=True)
class BoundFilter:
    """A row filter checked against the table: its SQL and the facts planning needs."""

    where: sql.Composable
    """The filter's own conditions, AND-ed (the rule's age condition is not in it)."""
    params: dict[str, object]
    age_where: sql.Composable
    """The rule's condition alone, without the filter: what an index on the expiry column
    alone would find."""
    equal: tuple[tuple[str, tuple[str, ...]], ...]
    """(column, the values' text) of each `match` entry: one value, or several (IN)."""
    null: tuple[str, ...]
    not_null: tuple[str, ...]

    @property
    def index_columns(self) -> frozenset[str]:
        """Columns a btree index may lead with and still give its rows in order for a walk:
        each takes one value, a few (one scan each) or NULL, never a range."""
        return frozenset(column for column, _ in self.equal) | frozenset(self.null)


async def bind_filter(
    conn: AsyncConnection[Any],
    table: TableName,
    relation: sql.Identifier,
    types: dict[str, str],
    row_filter: RowFilter,
    age_where: sql.Composable,
) -> BoundFilter:
    """The filter's SQL for `table` (whose column types are `types`); BadTable, before
    any delete, for a column it lacks or a value its column's type cannot hold."""
    for column in row_filter.columns:
        if column not in types:
            raise BadTable(
                f"table {table} has no column {column!r} (named by the filter)"
                f"{did_you_mean(column, types)}"
            )
    parts: list[sql.Composable] = []
    params: dict[str, object] = {}
    equal: list[tuple[str, tuple[str, ...]]] = []
    for i, (column, values) in enumerate(row_filter.match):
        kind = types[column]
        texts = tuple(_text(table, column, kind, value) for value in values)
        names = [f"match_{i}_{j}" for j in range(len(texts))]
        params.update(zip(names, texts, strict=True))
        equal.append((column, texts))
        holders = sql.SQL(", ").join(sql.Placeholder(name) for name in names)
        form = "{} = {}" if len(names) == 1 else "{} IN ({})"
        parts.append(sql.SQL(form).format(sql.Identifier(column), holders))
    parts += [sql.SQL("{} IS NULL").format(sql.Identifier(c)) for c in row_filter.null]
    parts += [sql.SQL("{} IS NOT NULL").format(sql.Identifier(c)) for c in row_filter.not_null]
    bound = BoundFilter(
        where=sql.SQL(" AND ").join(parts),
        params=params,
        age_where=age_where,
        equal=tuple(equal),
        null=row_filter.null,
        not_null=row_filter.not_null,
    )
    await _check_values(conn, table, relation, bound)
    return bound


async def _check_values(
    conn: AsyncConnection[Any], table: TableName, relation: sql.Identifier, bound: BoundFilter
) -> None:
    """Have the server read every value as its column's type: the parameters of a statement
    are read when it is bound, so one that reads no row finds any value that cannot be one."""
    if not bound.params:
        return
    try:
        # A savepoint inside the caller's transaction: a refused value must not abort it.
        async with conn.transaction():
            await conn.execute(catalog.filter_values(relation, bound.where), bound.params)
    except (psycopg.DataError, psycopg.ProgrammingError) as err:
        column = await _culprit(conn, relation, bound)
        where = f"match.{column}" if column else "match"
        raise BadTable(f"table {table}: {where}: {first_line(err)}; nothing was deleted") from err


async def _culprit(
    conn: AsyncConnection[Any], relation: sql.Identifier, bound: BoundFilter
) -> str | None:
    """The first `match` column whose values the server refuses, to name it."""
    for i, (column, texts) in enumerate(bound.equal):
        names = [f"match_{i}_{j}" for j in range(len(texts))]
        probe = catalog.filter_column_values(relation, column, names)
        try:
            async with conn.transaction():
                await conn.execute(probe, {name: bound.params[name] for name in names})
        except (psycopg.DataError, psycopg.ProgrammingError):
            return column
    return None


def _text(table: TableName, column: str, kind: str, value: MatchValue) -> str:
    """The value as the text its column's type reads; BadTable if it is not of a kind
    that column can hold."""
    if not _accepts(kind, value):
        raise BadTable(
            f"table {table}: match.{column}: {_shown(value)} cannot be a value of column "
            f"{column}, which is {kind}: want {_wanted(kind)}; nothing was deleted"
        )
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        return ("Infinity" if value > 0 else "-Infinity") if math.isinf(value) else repr(value)
    if isinstance(value, datetime):
        if kind == "timestamp without time zone":
            # A `timestamp` column is read as UTC, as the age rule reads it.
            return value.astimezone(UTC).replace(tzinfo=None).isoformat()
        return value.isoformat()
    if isinstance(value, date | time):
        return value.isoformat()
    return str(value)


def _accepts(kind: str, value: MatchValue) -> bool:
    if kind.endswith("[]"):
        return False
    if isinstance(value, bool):
        return kind in _BOOLEAN
    if isinstance(value, int):
        return kind in _INTEGERS | _FLOATS or kind == "numeric"
    if isinstance(value, float):
        return kind in _FLOATS or kind == "numeric"
    if isinstance(value, datetime):
        return kind in _INSTANTS
    if isinstance(value, date):
        return kind == _DAY
    if isinstance(value, time):
        return kind == _TIME_OF_DAY
    return kind not in _NOT_FROM_TEXT


def _wanted(kind: str) -> str:
    if kind.endswith("[]"):
        return "no filter: it compares whole values, and this column holds arrays"
    if kind in _BOOLEAN:
        return "true or false"
    if kind in _INTEGERS:
        return "an integer"
    if kind in _FLOATS:
        return "a number"
    if kind == "numeric":
        return 'a number, or a string such as "12.50"'
    if kind in _INSTANTS:
        return "a date-time with an offset, such as 2026-01-01T00:00:00Z"
    if kind == _DAY:
        return "a date, such as 2026-01-01"
    if kind == _TIME_OF_DAY:
        return "a time of day, such as 12:30:00"
    return "a string"


def _shown(value: MatchValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    return repr(value)
