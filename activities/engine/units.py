"""Refusing an epoch column in the wrong unit before a delete reads it so.

A column of epoch seconds read as milliseconds puts every row in January 1970: every row looks
expired and a sweep deletes the table. One in microseconds puts every row thousands of years
ahead: nothing is ever deleted. Both are caught from a sample of the column's values (the
planner's statistics when the table was analyzed, else a few hundred rows, never a scan).

Some rows alone in a coarser unit (legacy rows; a deploy that starts writing seconds into a
column of milliseconds) would each be deleted as long expired, while the rest keep the sample's
verdict: any such value in the sample refuses the table too, and where an index leads with the
column, every check probes it for one (`coarse_band`), since the planner's sample may predate
them.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any

from psycopg import AsyncConnection, AsyncCursor

from activities.engine import column_memory
from activities.engine.catalog import column_sample, column_statistics, value_in_range
from activities.engine.errors import BadTable
from activities.engine.rules import ident
from purge_config.names import TableName
from purge_config.settings import EPOCH_UNITS, EpochUnit

#: The plausible instants in each unit, as exact integers: from 1e11 ms (1973) to 1e14 ms (the
#: year 5138). Below, an instant is in 1973 or before; above, after the year 5138.
WINDOW = {
    "s": (10**8, 10**11),
    "ms": (10**11, 10**14),
    "us": (10**14, 10**17),
    "ns": (10**17, 10**20),
}
#: The largest integers: "never expires" sentinels, which say nothing about the unit.
SENTINELS = frozenset({2**63 - 1, 2**31 - 1, -(2**63), -(2**31)})
#: How many rows are read when the planner has no statistics of the column.
SAMPLE_ROWS = 200


def coarse_band(unit: EpochUnit) -> tuple[int, int] | None:
    """The values of a column in `unit` that read as instants before 1973 there but as
    plausible instants in a coarser unit (from 1e8 up to `unit`'s window: seconds in a column
    of milliseconds, seconds or milliseconds in one of microseconds): a sweep would delete
    each such row as long expired, where it most likely expires years ahead. None for seconds:
    nothing is coarser (a finer value in seconds reads as far ahead, and is kept)."""
    if unit == "s":
        return None
    return WINDOW["s"][0], WINDOW[unit][0]


async def check_unit(
    conn: AsyncConnection[Any], table: TableName, column: str, unit: EpochUnit
) -> None:
    """BadTable, before anything is deleted, when most of `column`'s values do not read as
    plausible instants in `unit`; an empty column passes."""
    await (await UnitCheck.send(conn, table, column, unit)).judge(conn)


class UnitCheck:
    """`check_unit` in two steps, for a caller in a pipeline: `send` queues the statistics'
    read with whatever else the caller sends, `judge` reads it (flushing the pipeline) and
    gives the verdict."""

    def __init__(
        self,
        table: TableName,
        column: str,
        unit: EpochUnit,
        cur: AsyncCursor[Any],
        probe: AsyncCursor[Any] | None = None,
    ) -> None:
        self.table, self.column, self.unit, self._cur = table, column, unit, cur
        self._probe = probe

    @classmethod
    async def send(
        cls, conn: AsyncConnection[Any], table: TableName, column: str, unit: EpochUnit
    ) -> UnitCheck:
        rel = {"rel": ident(table).as_string(conn), "column": column}
        # Prepared: the same text for every table, and pg_stats is a view of many joins.
        read = await conn.execute(column_statistics(), rel, prepare=True)
        band = coarse_band(unit)
        probe = None
        if band is not None:
            # The sample is as old as the table's last ANALYZE (autovacuum's waits for a tenth
            # of the table to change): rows written in a coarser unit since are not in it. An
            # index on the column finds one at the cost of a probe.
            # A table not kept in memory (a bind outside a plan's round trip) is probed as a
            # partitioned one: the constants cost a plain table planning time, never more.
            split = column_memory.partitioned(conn, rel["rel"]) is not False
            probe = await conn.execute(
                value_in_range(ident(table), column, *band, partitioned=split), rel, prepare=True
            )
        return cls(table, column, unit, read, probe)

    async def judge(self, conn: AsyncConnection[Any]) -> None:
        """BadTable, as `check_unit`; a table never analyzed has a few rows read first."""
        judge_unit(self.table, self.column, self.unit, await self._sample(conn))
        row = await self._probe.fetchone() if self._probe is not None else None
        if row and row[0] is not None:
            refuse_coarse(self.table, self.column, self.unit, (int(row[0]),))

    async def _sample(self, conn: AsyncConnection[Any]) -> list[tuple[int, float]]:
        """(value, weight) pairs: the planner's histogram bounds and most common values with
        their share of the rows, or, without statistics, a few rows read as they come."""
        row = await self._cur.fetchone()
        if row is not None:
            pairs = weighted_statistics(row[0] or [], row[1] or [], row[2] or [])
            if pairs:
                return pairs
        cur = await conn.execute(column_sample(ident(self.table), self.column, SAMPLE_ROWS))
        return [(int(r[0]), 1.0) for r in await cur.fetchall()]


def judge_unit(
    table: TableName, column: str, unit: EpochUnit, weighted: list[tuple[int, float]]
) -> None:
    """`check_unit`'s verdict on a sample already read: (value, weight) pairs."""
    values = [(v, w) for v, w in weighted if v not in SENTINELS]
    total = sum(w for _, w in values)
    if not total:
        return
    low, high = WINDOW[unit]
    outside = sum(w for v, w in values if not low <= v <= high)
    if outside / total <= 0.5:
        refuse_coarse(table, column, unit, (v for v, _ in values))
        return
    typical = statistics.median_low(v for v, _ in values)
    looks = _looks_like(typical)
    head = (
        f"table {table} column {column}: its values do not look like epoch {_NAMES[unit]} "
        f"(e.g. {typical}, which reads as {_reads_as(typical, unit)})"
    )
    if looks in EPOCH_UNITS:
        raise BadTable(
            f"{head}; they look like epoch {_NAMES[looks]}. Nothing was deleted; set "
            f'unit = "{looks}" on this target (kind expiring; a built-in kind takes epoch '
            "milliseconds only: sweep such a table as an expiring entry)"
        )
    if looks in _NAMES:
        raise BadTable(
            f"{head}; they look like epoch {_NAMES[looks]}, a unit no target takes. Nothing "
            "was deleted; store epoch seconds, milliseconds or microseconds in it (an expiring "
            "target's unit = says which)"
        )
    # No unit reads them as instants of the last fifty years or the next three thousand: most
    # likely the target names the wrong column (an id, a count).
    raise BadTable(
        f"{head}, nor like an instant in any unit (s, ms, us, ns). Nothing was deleted; is "
        f"{column} the column that says when a row expires? (An expiring target names it with "
        "column =.)"
    )


_NAMES = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}


def refuse_coarse(table: TableName, column: str, unit: EpochUnit, values: Iterable[int]) -> None:
    """BadTable when any of `values` of a column in `unit` is in its `coarse_band`: such a
    value among the others would be deleted as long expired."""
    band = coarse_band(unit)
    if band is None:
        return
    for value in (v for v in values if band[0] <= v < band[1]):
        looks = _NAMES[_looks_like(value)]
        raise BadTable(
            f"table {table} column {column}: some of its values look like epoch {looks}, not "
            f"{_NAMES[unit]} (e.g. {value}, which reads as a time before 1973): a sweep would "
            f"delete each such row as long expired. Nothing was deleted; store those values in "
            f"{_NAMES[unit]}, as the others are, and ANALYZE the table (the check reads its "
            f"statistics); or, where the column now holds {looks} throughout, say so with an "
            "expiring target's unit ="
        )


def _looks_like(value: int) -> str:
    for unit, (low, high) in WINDOW.items():
        if low <= abs(value) <= high:
            return unit
    return "?"


def _reads_as(value: int, unit: EpochUnit) -> str:
    if value < WINDOW[unit][0]:
        return "a time before 1973"
    return "a time after the year 5138"


def weighted_statistics(
    bounds: Sequence[object], common: Sequence[object], freqs: Sequence[object]
) -> list[tuple[int, float]]:
    """(value, weight) pairs from the planner's statistics of a column: each most common value
    with its share of the rows, each histogram bound with an even part of the rest."""
    rest = max(0.0, 1.0 - sum(float(str(f)) for f in freqs))
    pairs = [(_integer(v), float(str(f))) for v, f in zip(common, freqs, strict=False)]
    pairs += [(_integer(v), rest / len(bounds)) for v in bounds]
    return pairs


def _integer(value: object) -> int:
    """An integer column's value as the statistics give it (numeric, or its text)."""
    return int(Decimal(str(value)))
