"""The advice to partition a plain table whose passes remove a large share of it: from one
pass's evidence (`pass_advice`: that pass removed a large share, and many rows), or from the
day's passes, each table's share kept for a day in `purge_shares` (`remembered_advice`: a large
share in most passes of the day, even when no single pass removes much).

One row per table and pass, written and read back in one statement through the primary key:
a pass of thousands of tables pays one short indexed round trip per table, never a read of
the whole record or the catalog. Without the table, or without the rights on it, sweeps run as
before and the remembered advice is never given.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection, errors, sql

from activities.engine.batch_sql import local_timeouts
from activities.engine.leftover import (
    GAVE_UP,
    LARGE_SHARE,
    Leftover,
    read_limits,
    report_limits,
    table_tuples,
)
from activities.engine.pipelines import settled_pipeline
from activities.engine.planning import TablePlan
from activities.engine.rules import Predicate, ident

#: How far back the advice looks, and how long a pass's row is kept (by the pass's clock).
WINDOW_MS = 86_400_000
#: A pass "removed a large share" of a table when it removed more than this of the rows the
#: table held before it (the rows it removed and the live rows it left).
SHARE = 0.10
#: The advice needs this many passes in the window: "most" of one or two is no pattern.
MIN_PASSES = 3
#: ... and this many rows removed over the window, in all: below it a day's batched deletes
#: cost a fraction of a second (the one-pass advice's own bar, `PARTITION_ADVICE_ROWS`).
WINDOW_ROWS = 100_000
#: Partition widths offered, narrowest first: round widths an operator's tooling makes.
WIDTHS_MS = (
    (300_000, "5-minute"),
    (900_000, "15-minute"),
    (3_600_000, "hourly"),
    (21_600_000, "6-hour"),
    (86_400_000, "daily"),
    (604_800_000, "weekly"),
)
#: A partition's width is at most this share of the time between passes: the partition that
#: straddles the cutoff (about W/2P of a pass's rows) is still deleted row by row.
WIDTH_OF_PERIOD = 0.25
#: How long the record may take: a report, never worth holding up a pass.
RECORD_TIMEOUT_MS = 2_000


#: A plain table whose pass removed at least this many rows, and more than LARGE_SHARE of it, is
#: told it wants partitions: below it a batched delete costs a fraction of a second a pass.
PARTITION_ADVICE_ROWS = 100_000


#: The fewest live rows left from which the advice reads the rate rows arrive at.
RATE_MIN_ROWS = 1_000


async def pass_advice(
    conn: AsyncConnection[Any], pred: Predicate, plan: TablePlan, removed: int, left: Leftover
) -> str:
    """One pass's evidence that a plain table wants RANGE partitions on its expiry column: the
    pass removed a large share of it (more than LARGE_SHARE, PARTITION_ADVICE_ROWS rows or more).
    The rows a day, read from the span of the rows left (through the index), size the advice."""
    key = pred.range_key
    share = left.share(removed)
    if key is None or plan.partitioned or removed < PARTITION_ADVICE_ROWS or share is None:
        return ""
    if share <= LARGE_SHARE:
        return ""
    # From a few rows left (a pass that took most of the table) a rate would be noise.
    measurable = plan.index is not None and left.live >= RATE_MIN_ROWS
    per_day = await _rows_per_day(conn, pred, left.live) if measurable else None
    rate = f", about {per_day:,.0f} rows a day ({per_day / 24:,.0f} an hour)" if per_day else ""
    return (
        f"{pred.table}: this pass removed {removed:,} rows ({share:.0%} of the table){rate}; "
        f"partition it by RANGE on {key.column}, each partition narrower than the time between "
        "passes, and set partitions = 'drop': a partition wholly expired then goes with one DROP "
        "instead of a DELETE of each row, ~100x cheaper (measured here for a million rows: 1.2 "
        "MB of WAL against 246 MB). The partition straddling the cutoff at a pass is deleted "
        "row by row: with partitions W wide and passes every P, about W/2P of the rows (hourly "
        "partitions, daily passes: 2%; daily partitions, hourly passes: 98%, no gain)"
    )


async def _rows_per_day(conn: AsyncConnection[Any], pred: Predicate, live: int) -> float | None:
    """`live` rows over the days their values span (those not expired: the live rows): the
    rate rows arrive at, if the table keeps a steady retention."""
    assert pred.range_key is not None
    try:
        async with conn.transaction():
            await conn.execute(local_timeouts(), read_limits())
            cur = await conn.execute(
                value_span_days(pred, pred.range_key.sql_type), {"cutoff": pred.range_key.cutoff}
            )
            row = await cur.fetchone()
    except (*GAVE_UP, errors.DataError):
        return None
    days = float(row[0]) if row and row[0] is not None else 0.0
    return live / days if days > 0 else None


@dataclass(frozen=True)
class SharePass:
    """One pass over one table, as `purge_shares` keeps it."""

    now_ms: int
    """The pass's instant."""
    removed: int
    live: int
    """The live rows the sweep left (PostgreSQL's estimate, after the sweep's own deletes)."""

    @property
    def share(self) -> float:
        """The share of the table this pass removed."""
        before = self.removed + self.live
        return self.removed / before if before else 0.0


async def record_share(
    conn: AsyncConnection[Any],
    target: str,
    table: str,
    now_ms: int,
    removed: int,
    live: int,
    then: sql.SQL | None = None,
) -> tuple[list[SharePass], bool]:
    """Record this pass over `table` and return the table's passes of the window, oldest
    first, this one last; empty if the record could not be made (then no advice). With
    `then`, a statement that takes no parameters sent after the record in its round trip (the
    table's unlock, the sweep's last statement); the flag says whether it ran."""
    params = {**share_params(target, table, now_ms), "removed": removed, "live": live}
    rows = await _recorded(conn, share_record(), params, then)
    if rows is None:
        return [], False
    return share_passes(rows), then is not None


async def _recorded(
    conn: AsyncConnection[Any],
    statement: sql.Composed,
    params: dict[str, object],
    then: sql.SQL | None,
) -> list[Any] | None:
    """The rows of a statement that records a pass (`statement`, with `params`), then `then`
    (a statement without parameters, or None); None when the record could not be made, and
    `then` did not run."""
    try:
        # One round trip: pipelined up to one Sync, the timeouts and the record are one
        # implicit transaction. Its commit does not wait for its WAL to reach disk (0.5-1 ms
        # of a table's sweep here, fsync on): a server crash that lost the row would only leave
        # the day's advice one pass short; nothing reported or counted depends on it.
        async with settled_pipeline(conn):
            # A wait for a lock ends in LockNotAvailable, before the statement's own limit.
            await conn.execute(
                local_timeouts(lazy=True), report_limits(RECORD_TIMEOUT_MS), prepare=True
            )
            cur = await conn.execute(statement, params, prepare=True)
            if then is not None:
                await conn.execute(then, prepare=True)
        return await cur.fetchall()
    except (errors.InsufficientPrivilege, errors.UndefinedTable, *GAVE_UP):
        # Rights revoked or the table dropped since the pass looked, a lock held on the record,
        # or a record too slow: the advice waits; the sweep it is about has already succeeded.
        # What was to follow the record did not run (the transaction was aborted before it).
        return None


def share_passes(rows: list[Any]) -> list[SharePass]:
    """The passes a record returns, (now_ms, removed, live) rows or arrays, as `SharePass`es."""
    return [SharePass(int(r[0]), int(r[1]), int(r[2])) for r in rows]


@dataclass(frozen=True)
class TuplesRecorded:
    """`record_share_with_tuples`'s answer: the views' count and what became of the record."""

    tuples: tuple[int, int, int | None]
    """Live and dead tuples per the views, and the planner's estimate (`table_tuples`)."""
    passes: list[SharePass] | None
    """The table's passes of the window, this one last, as `record_share` returns them; None
    when the views' count was not certain enough to record (`leftover.judged`), or this pass
    alone is told to partition (`pass_advice`)."""


async def record_share_with_tuples(
    conn: AsyncConnection[Any],
    target: str,
    pred: Predicate,
    now_ms: int,
    removed: int,
    then: sql.SQL,
) -> TuplesRecorded | None:
    """The views' count of the table's tuples and, with the live rows they count, the record
    of this pass (`record_share`), in one statement, then `then` (the table's unlock), all in
    one round trip: for a finished sweep whose session's statistics are already in the views.
    None, with nothing recorded and `then` not run, when the record could not be made (rights,
    a dropped table, a lock or a slow record): the caller reads and records step by step.
    Otherwise `then` ran."""
    rel = ident(pred.table).as_string(conn)
    params = {
        **share_params(target, str(pred.table), now_ms),
        "removed": removed,
        "rel": rel,
        "advice_rows": PARTITION_ADVICE_ROWS,
        "large_share": LARGE_SHARE,
    }
    rows = await _recorded(conn, share_record_with_tuples(), params, then)
    if rows is None:
        return None
    # One row: the views' read is an aggregate.
    [(live, dead, estimated, recorded, day)] = rows
    tuples = (int(live), int(dead), None if estimated is None else int(estimated))
    return TuplesRecorded(tuples, share_passes(day) if recorded else None)


def remembered_advice(target: str, table: str, column: str, passes: list[SharePass]) -> str:
    """The advice to partition `table` when more than SHARE of it went in most of the
    window's passes (MIN_PASSES or more, WINDOW_ROWS or more removed in all), with the
    `partitions = "drop"` line for `target` and a partition width that fits its passes."""
    if len(passes) < MIN_PASSES:
        return ""
    large = sum(1 for p in passes if p.share > SHARE)
    removed = sum(p.removed for p in passes)
    if large * 2 <= len(passes) or removed < WINDOW_ROWS:
        return ""
    period_ms = (passes[-1].now_ms - passes[0].now_ms) / (len(passes) - 1)
    if period_ms <= 0:
        return ""
    share = statistics.median(p.share for p in passes)
    # In a steady state a pass removes what arrived since the last one, so a row stays about
    # the time between passes over the share a pass removes.
    kept_ms = period_ms / share
    width_ms, width = _width(period_ms)
    per_pass = removed / len(passes)
    per_partition = per_pass * width_ms / period_ms
    edge = width_ms / (2 * period_ms)
    return (
        f"{table}: {large} of the last day's {len(passes)} passes removed more than "
        f"{SHARE:.0%} of the table (median {share:.0%}, {removed:,} rows in all, a pass about "
        f"every {_span(period_ms)}, so a row stays about {_span(kept_ms)}); partition it by "
        f"RANGE on {column} in {width} partitions (about {per_partition:,.0f} rows each, "
        f"{kept_ms / width_ms:,.0f} of them live at a time, and a few made ahead) and set "
        f'partitions = "drop" on target "{target}": a partition wholly expired then goes with '
        "one DROP instead of a DELETE of each row; the partition straddling the cutoff, "
        f"about {edge:.0%} of a pass's rows, is still deleted row by row"
    )


def _width(period_ms: float) -> tuple[int, str]:
    """The widest offered width within WIDTH_OF_PERIOD of the period (else the narrowest)."""
    fitting = [w for w in WIDTHS_MS if w[0] <= period_ms * WIDTH_OF_PERIOD]
    return fitting[-1] if fitting else WIDTHS_MS[0]


def _span(ms: float) -> str:
    """A duration as a person says it: 40 min, 2.5 h, 3 d."""
    minutes = ms / 60_000
    if minutes < 90:
        return f"{minutes:.0f} min"
    hours = minutes / 60
    if hours < 48:
        return f"{hours:.1f} h".replace(".0 h", " h")
    return f"{hours / 24:.1f} d".replace(".0 d", " d")


# The reads and writes of the advice.


def value_span_days(pred: Predicate, sql_type: str) -> sql.Composed:
    """One row: the days between the least and the greatest value of the rule's column among
    the rows not expired, those past `%(cutoff)s` (NULL when there are none), read from the
    ends of its index. Not over every row: right after a sweep the least value would be found
    by walking the index from its start over an entry for every row the sweep deleted (why:
    docs/decisions/short-batches.md); the bound starts the scan past them."""
    assert pred.column is not None
    column = sql.Identifier(pred.column)
    span = (
        sql.SQL("(max({c}) - min({c}))::float8 / 86400000")
        if sql_type in ("bigint", "integer")
        else sql.SQL("extract(epoch FROM max({c}) - min({c}))::float8 / 86400")
    ).format(c=column)
    return sql.SQL("SELECT {} FROM {} WHERE {} > %(cutoff)s").format(
        span, ident(pred.table), column
    )


# `purge_shares`, written and read only here (and expired with the ledger: `ledger.Ledger.open`).


#: The record of one pass over one table (a retried attempt adds its rows to the pass's), from
#: a row source `{values}` of (removed, live), named by `%(share_target)s`, `%(share_table)s`
#: and `%(share_now)s`; it returns the row as recorded.
_SHARE_UPSERT = (
    "INSERT INTO purge_shares AS s (target, table_name, now_ms, removed, live)"
    " SELECT %(share_target)s, %(share_table)s, %(share_now)s, v.removed, v.live FROM {values}"
    " ON CONFLICT (target, table_name, now_ms) DO UPDATE"
    " SET removed = s.removed + EXCLUDED.removed, live = EXCLUDED.live"
    " RETURNING now_ms, removed, live"
)
#: The table's passes within the window (`%(share_window)s`) before this pass's instant.
_SHARE_WINDOW = (
    "SELECT now_ms, removed, live FROM purge_shares"
    " WHERE target = %(share_target)s AND table_name = %(share_table)s"
    " AND now_ms > %(share_now)s - %(share_window)s AND now_ms < %(share_now)s"
)


def share_params(target: str, table: str, now_ms: int) -> dict[str, object]:
    """The parameters naming one pass over one table in `share_record` and `shared`."""
    return {
        "share_target": target,
        "share_table": table,
        "share_now": now_ms,
        "share_window": WINDOW_MS,
    }


def share_record() -> sql.Composed:
    """Record what this pass removed from one table and the live rows it left (`%(removed)s`,
    `%(live)s`, with `share_params`), and return the table's passes within the window before
    this pass's instant, this one included, oldest first: (now_ms, removed, live). Through the
    primary key only: a read of a day's rows of one table, whatever else the table holds."""
    values = sql.SQL("(SELECT %(removed)s::bigint, %(live)s::bigint) v(removed, live)")
    return sql.SQL(
        "WITH this AS (" + _SHARE_UPSERT + ") " + _SHARE_WINDOW + " UNION ALL"
        " SELECT now_ms, removed, live FROM this ORDER BY 1"
    ).format(values=values)


def shared(values: sql.Composable) -> tuple[sql.Composed, sql.SQL]:
    """`share_record` inside another statement (a small table's one statement, which knows what
    it removed only as it runs): a CTE `, shared AS (...)` recording the row `values` gives
    (a row source of `removed` and `live`), and an expression, the table's passes as
    `share_record` returns them, as a bigint[][] (NULL when there are none)."""
    cte = sql.SQL(", shared AS (" + _SHARE_UPSERT + ")").format(values=values)
    passes = sql.SQL(
        "(SELECT array_agg(ARRAY[p.now_ms, p.removed, p.live] ORDER BY p.now_ms) FROM ("
        + _SHARE_WINDOW
        + " UNION ALL SELECT now_ms, removed, live FROM shared) p)"
    )
    return cte, passes


def share_record_with_tuples() -> sql.Composed:
    """`table_tuples` of `%(rel)s` and, when they count live rows or this pass removed none
    (`%(removed)s`: the test `leftover.judged` takes the views at their word on) and this pass
    alone is not told to partition (`pass_advice`: fewer than `%(advice_rows)s` removed, or a
    share of at most `%(large_share)s`; such a pass is not recorded), the record of this pass
    with the live rows they count (`share_record`, with `share_params`). One row: live, dead,
    the planner's estimate, whether the record was made, and the table's passes as `shared`
    returns them."""
    # The share as `Leftover.share` takes it, in float8 as Python's float: the same verdict.
    values = sql.SQL(
        "(SELECT %(removed)s::bigint, t.live FROM tuples t"
        " WHERE (t.live > 0 OR %(removed)s::bigint = 0)"
        " AND CASE WHEN %(removed)s::bigint < %(advice_rows)s::bigint THEN true"
        " ELSE %(removed)s::float8 / (%(removed)s::bigint + t.live)::float8"
        " <= %(large_share)s::float8 END) v(removed, live)"
    )
    record, passes = shared(values)
    return sql.SQL(
        "WITH tuples(live, dead, estimated) AS ({tuples}){record}"
        " SELECT t.live, t.dead, t.estimated, EXISTS (SELECT FROM shared), {passes}"
        " FROM tuples t"
    ).format(tuples=table_tuples(), record=record, passes=passes)


def shares_expire() -> sql.SQL:
    """Remove `purge_shares` rows of passes a window (`%(window_ms)s`) or more before this
    pass's instant: the advice reads no further back."""
    return sql.SQL("DELETE FROM purge_shares WHERE now_ms <= %(ledger_now)s - %(window_ms)s")
