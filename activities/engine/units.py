"""Refusing an epoch column in the wrong unit before a delete reads it so.

A column of epoch seconds read as milliseconds puts every row in January 1970: every row looks
expired and a sweep deletes the table. One in microseconds puts every row thousands of years
ahead: nothing is ever deleted. Both are caught from a sample of the column's values (the
planner's statistics when the table was analyzed, else a few hundred rows, never a scan).
"""

from __future__ import annotations

import statistics
from typing import Any

from psycopg import AsyncConnection

from activities.engine.rules import ident
from activities.engine.statements import column_sample, column_statistics
from activities.errors import BadPurgeTarget
from purge_config.names import TableName

#: Milliseconds per stored unit.
UNIT_MS = {"s": 1000.0, "ms": 1.0, "us": 0.001, "ns": 0.000001}
#: Below this many milliseconds an instant is before 1973; above, after the year 5138.
EARLIEST_MS, LATEST_MS = 1e11, 1e14
#: The largest integers: "never expires" sentinels, which say nothing about the unit.
SENTINELS = frozenset({2**63 - 1, 2**31 - 1, -(2**63), -(2**31)})
#: How many rows are read when the planner has no statistics of the column.
SAMPLE_ROWS = 200


async def check_unit(conn: AsyncConnection[Any], table: TableName, column: str, unit: str) -> None:
    """BadPurgeTarget, before anything is deleted, when most of `column`'s values do not read as
    plausible instants in `unit`; an empty column passes."""
    weighted = await _sample(conn, table, column)
    values = [(v, w) for v, w in weighted if v not in SENTINELS]
    total = sum(w for _, w in values)
    if not total:
        return
    factor = UNIT_MS[unit]
    outside = sum(w for v, w in values if not EARLIEST_MS <= v * factor <= LATEST_MS)
    if outside / total <= 0.5:
        return
    typical = statistics.median(v for v, _ in values)
    looks = _looks_like(typical)
    fix = (
        f'set unit = "{looks}" on this target (kind expiring)'
        if looks in ("s", "ms", "us")
        else "store epoch milliseconds in it"
    )
    raise BadPurgeTarget(
        f"table {table} column {column}: its values do not look like epoch {_NAMES[unit]} "
        f"(e.g. {typical:.0f}, which reads as {_reads_as(typical * factor)}); they look like "
        f"epoch {_NAMES.get(looks, 'values in another unit')}. Nothing was deleted; {fix}"
    )


_NAMES = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}


def _looks_like(value: float) -> str:
    for unit, factor in UNIT_MS.items():
        if EARLIEST_MS <= abs(value) * factor <= LATEST_MS:
            return unit
    return "?"


def _reads_as(ms: float) -> str:
    if ms < EARLIEST_MS:
        return "a time before 1973"
    return "a time after the year 5000"


async def _sample(
    conn: AsyncConnection[Any], table: TableName, column: str
) -> list[tuple[float, float]]:
    """(value, weight) pairs: the planner's histogram bounds and most common values with their
    share of the rows, or, without statistics, a few rows read as they come."""
    rel = ident(table).as_string(conn)
    cur = await conn.execute(column_statistics(), {"rel": rel, "column": column})
    row = await cur.fetchone()
    if row is not None:
        bounds, common, freqs = row[0] or [], row[1] or [], row[2] or []
        rest = max(0.0, 1.0 - sum(freqs))
        pairs = [(float(v), float(f)) for v, f in zip(common, freqs, strict=False)]
        pairs += [(float(v), rest / len(bounds)) for v in bounds]
        if pairs:
            return pairs
    cur = await conn.execute(column_sample(table, column, SAMPLE_ROWS))
    return [(float(r[0]), 1.0) for r in await cur.fetchall()]
