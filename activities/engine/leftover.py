"""What a table's sweep left: its oldest expired row, its live and dead tuples, and the advice
and the ANALYZE they call for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from psycopg import AsyncConnection, errors, sql

from activities.engine.batch_sql import flush_statistics, flushes_statistics, local_timeouts
from activities.engine.pipelines import settled_pipeline
from activities.engine.rules import Predicate, ident

#: A sweep that removed more than this share of a table calls for fresh statistics (and, when
#: `analyze_after` is set, runs ANALYZE).
LARGE_SHARE = 0.10
#: Below this many rows removed, a large share of a small table is not worth an advice line.
ADVICE_MIN_ROWS = 1_000
#: How long the after-sweep reads may take: they are reports, never worth holding up a pass.
READ_TIMEOUT_MS = 2_000
#: How a report's read gives up: past its statement_timeout, or waiting for a lock (a table held
#: by DDL or a VACUUM FULL at the sweep's end). Either way the sweep it reports on has already
#: removed its rows: the read falls back, and never fails the sweep.
GAVE_UP = (errors.QueryCanceled, errors.LockNotAvailable)


def report_limits(limit_ms: int) -> tuple[int, int]:
    """The lock and statement timeouts of a statement a report needs, to end by `limit_ms`:
    the lock wait ends first, at half of it, so a table held at the sweep's end always ends
    the statement the same way (LockNotAvailable), whichever of two equal timers PostgreSQL
    would report."""
    return limit_ms // 2, limit_ms


def read_limits() -> tuple[int, int]:
    """`report_limits` of an after-sweep read of the table: READ_TIMEOUT_MS."""
    return report_limits(READ_TIMEOUT_MS)


#: Where a table's live rows after its sweep come from: PostgreSQL's statistics views; the
#: planner's estimate (`pg_class.reltuples`) less the rows the pass removed, when the views have
#: no count of the table; or nowhere (`unknown`), when neither can be trusted.
TuplesFrom = Literal["stats", "estimate", "unknown"]


@dataclass(frozen=True)
class Leftover:
    """One table after its sweep."""

    oldest_age_ms: int | None
    """How long its oldest expired row has been expired: 0 when none, None when unknown."""
    live: int
    dead: int
    live_from: TuplesFrom = "stats"

    def share(self, removed: int) -> float | None:
        """The share of the table the pass removed; None when the live rows are unknown."""
        before = removed + self.live
        if self.live_from == "unknown" or not before:
            return None
        return removed / before


async def leftover(
    conn: AsyncConnection[Any],
    pred: Predicate,
    now_ms: int,
    complete: bool,
    removed: int,
    flushed: bool = False,
) -> Leftover:
    """What the sweep left in the table. The oldest expired row is looked for only when the
    sweep ran out of time: a finished sweep left none as of `now_ms` (a walk read every page;
    an index sweep's last batch found fewer expired rows than it asked for, so none was left
    behind it). After a finished sweep the read would also be the costliest of all: through
    the index from its start, over a dead entry for every row the sweep deleted (a third of a
    second or more for a million rows), to find none."""
    age: int | None = 0
    if not complete:
        try:
            async with conn.transaction():
                await conn.execute(local_timeouts(), read_limits())
                cur = await conn.execute(oldest_expired(pred), pred.params)
                row = await cur.fetchone()
            instant = row[0] if row else None
            age = max(0, now_ms - int(instant)) if instant is not None else 0
        except GAVE_UP:
            age = None
    tuples = await _tuples(conn, pred, flushed)
    if tuples is None:
        return Leftover(age, 0, 0, "unknown")  # the views could not be read in time
    return await judged(conn, pred, age, removed, tuples)


async def judged(
    conn: AsyncConnection[Any],
    pred: Predicate,
    age: int | None,
    removed: int,
    tuples: tuple[int, int, int | None],
) -> Leftover:
    """What the sweep left, once the views were read (`tuples`: live, dead and the planner's
    estimate, as `table_tuples` returns them) and the oldest expired row's `age` is known. The
    views are taken as they are when they count live rows or the sweep removed none
    (`partition_advice.share_record_with_tuples` records a share on the same test)."""
    live, dead, estimated = tuples
    if live or not removed:
        return Leftover(age, live, dead)
    # The views say no row is left. True after a sweep that emptied the table; but the views
    # also say 0 for a table they hold no count of (a database made from a template, a restored
    # copy, a promoted standby, crash recovery, pg_stat_reset()), and then this pass would read
    # as having removed all of it. One row left says which.
    if not await _any_row(conn, pred):
        return Leftover(age, 0, dead)
    if estimated is not None and estimated > removed:
        return Leftover(age, estimated - removed, dead, "estimate")
    return Leftover(age, 0, dead, "unknown")


async def _tuples(
    conn: AsyncConnection[Any], pred: Predicate, flushed: bool
) -> tuple[int, int, int | None] | None:
    """Live and dead tuples per the views, and the planner's row estimate (None: never made);
    None when the read gave up (`read_limits`: a partitioned table's tree waits for a lock on
    every partition, one of which DDL may hold). `flushed`: the sweep's last batch flushed the
    session's statistics already."""
    rel = {"rel": ident(pred.table).as_string(conn)}
    await flush_views(conn, flushed)
    try:
        # One implicit transaction up to one Sync: the timeouts cost no round trip.
        async with settled_pipeline(conn):
            await conn.execute(local_timeouts(), read_limits())
            cur = await conn.execute(table_tuples(), rel)
        row = await cur.fetchone()
    except GAVE_UP:
        return None
    if not row:
        return 0, 0, None
    return int(row[0]), int(row[1]), None if row[2] is None else int(row[2])


async def flush_views(conn: AsyncConnection[Any], flushed: bool) -> None:
    """Before a read of the views after a sweep: the session's statistics flushed, unless the
    sweep's last batch did (`flushed`) or the server cannot be asked (before PostgreSQL 15)."""
    if flushes_statistics(conn) and not flushed:
        # Our own batches' dead tuples reach the views when this session goes idle: after
        # this round trip, not in a pipeline with the read.
        await conn.execute(flush_statistics())


async def _any_row(conn: AsyncConnection[Any], pred: Predicate) -> bool:
    """Whether the table holds a row; True when the read gives up (rows behind the pages the
    sweep emptied, or a lock held on the table: assume some, and give no share rather than a
    wrong one)."""
    try:
        async with conn.transaction():
            await conn.execute(local_timeouts(), read_limits())
            cur = await conn.execute(any_row(pred))
            row = await cur.fetchone()
    except GAVE_UP:
        return True
    return bool(row and row[0])


#: PostgreSQL's defaults for `autovacuum_vacuum_scale_factor` and
#: `autovacuum_analyze_scale_factor`.
VACUUM_SCALE_DEFAULT = 0.2
ANALYZE_SCALE_DEFAULT = 0.1


def vacuum_advice(pred: Predicate, removed: int, left: Leftover) -> str:
    """An advice line when the sweep removed a large share of the table: VACUUM now, and the
    autovacuum setting that would keep up with this rate (a vacuum after every pass)."""
    share = left.share(removed)
    if removed < ADVICE_MIN_ROWS or share is None or share <= LARGE_SHARE:
        return ""
    about = (
        " (by the planner's estimate: the statistics views hold no count)"
        if (left.live_from == "estimate")
        else ""
    )
    dead = left.dead / (left.live + left.dead) if left.live + left.dead else 0.0
    # Autovacuum starts at 50 + scale_factor x live rows dead: half this pass's share makes it
    # run once per pass at this rate. Only a factor below PostgreSQL's default is advice: at
    # or above it, the default already runs once per pass (and 0.2 for ANALYZE, whose default
    # is 0.1, would run it less often).
    factor = max(0.01, round(removed / max(left.live, 1) / 2, 2))
    settings = [
        f"{name} = {factor}"
        for name, default in (
            ("autovacuum_vacuum_scale_factor", VACUUM_SCALE_DEFAULT),
            ("autovacuum_analyze_scale_factor", ANALYZE_SCALE_DEFAULT),
        )
        if factor < default
    ]
    keep_up = (
        f", and keep up at this rate with ALTER TABLE {pred.table} SET ({', '.join(settings)})"
        if settings
        else " (at this rate autovacuum's default settings already run after every pass)"
    )
    return (
        f"{pred.table}: this pass removed {removed:,} rows ({share:.0%} of the table{about}) "
        "and left "
        f"{dead:.0%} of it dead tuples; reclaim them now with VACUUM (ANALYZE) {pred.table}"
        + keep_up
    )


async def analyze_after(
    conn: AsyncConnection[Any], pred: Predicate, removed: int, left: Leftover, budget_ms: int
) -> tuple[bool, str]:
    """ANALYZE the table when the sweep removed more than a tenth of it: (analyzed, a warning
    when the role may not, or when it could not within its time: a lock held on the table for
    READ_TIMEOUT_MS (or half of `budget_ms`, if less), or `budget_ms` of ANALYZE). The sweep's
    result stands either way."""
    share = left.share(removed)
    if share is None or share <= LARGE_SHARE:
        return False, ""
    rel = {"rel": ident(pred.table).as_string(conn)}
    cur = await conn.execute(may_analyze(conn.info.server_version), rel)
    row = await cur.fetchone()
    if not row or not row[0]:
        return False, (
            f"{pred.table}: analyze_after is set but this role may not ANALYZE it (it needs the "
            f"MAINTAIN privilege, PostgreSQL 17+: GRANT MAINTAIN ON {pred.table} TO <role>; or "
            "ownership); statistics left as they were"
        )
    # The lock wait ends first (at most half of `budget_ms`), so a held table is said as one.
    lock_ms = min(READ_TIMEOUT_MS, report_limits(budget_ms)[0])
    try:
        async with conn.transaction():
            await conn.execute(local_timeouts(), (lock_ms, budget_ms))
            await conn.execute(analyze(pred))
    except errors.LockNotAvailable:
        # The sweep it is about has succeeded: the statistics wait for the next pass, or for
        # whatever holds the table (a VACUUM, an ANALYZE, DDL), which may refresh them itself.
        return False, (
            f"{pred.table}: not analyzed after the sweep: another session held a lock ANALYZE "
            f"waits for (a VACUUM, an ANALYZE or DDL) for {lock_ms} ms; statistics "
            "left as they were"
        )
    except errors.QueryCanceled:
        return False, (
            f"{pred.table}: not analyzed after the sweep: ANALYZE ran past statement_timeout "
            f"({budget_ms} ms); statistics left as they were"
        )
    return True, ""


# The reads after a sweep, and its ANALYZE.


def oldest_expired(pred: Predicate) -> sql.Composed:
    """One row: the least `expired_at` among the rows still expired (NULL when none), through
    the index on the rule's column when there is one."""
    if pred.column is not None:
        return sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY {} LIMIT 1").format(
            pred.expired_at, ident(pred.table), pred.where, sql.Identifier(pred.column)
        )
    return sql.SQL("SELECT min({}) FROM {} WHERE {}").format(
        pred.expired_at, ident(pred.table), pred.where
    )


def table_tuples() -> sql.SQL:
    """One row: live and dead tuples of `%(rel)s` (over its leaf partitions) per the views."""
    # By OID, not through pg_stat_all_tables: the view computes every relation's row before
    # it filters (why: docs/decisions/catalog-reads-by-oid.md).
    # reltuples is -1 for a table never vacuumed or analyzed (PostgreSQL 14+): no estimate.
    return sql.SQL(
        "SELECT coalesce(sum(pg_stat_get_live_tuples(t.relid)), 0),"
        " coalesce(sum(pg_stat_get_dead_tuples(t.relid)), 0),"
        # A scalar read per table, by OID: a join let the planner scan all of pg_class.
        " sum((SELECT c.reltuples FROM pg_class c"
        " WHERE c.oid = t.relid AND c.relkind = 'r' AND c.reltuples >= 0))::bigint"
        " FROM (SELECT relid FROM pg_partition_tree(%(rel)s::regclass) WHERE isleaf"
        " UNION SELECT %(rel)s::regclass) t"
    )


def any_row(pred: Predicate) -> sql.Composed:
    """One row: whether the table holds any row at all."""
    return sql.SQL("SELECT EXISTS (SELECT FROM {})").format(ident(pred.table))


def may_analyze(server_version: int) -> sql.SQL:
    """Whether this role may ANALYZE `%(rel)s`: the MAINTAIN privilege (PostgreSQL 17+) or
    membership in the owning role."""
    owner = "pg_has_role(c.relowner, 'USAGE')"
    if server_version >= 170000:
        owner += " OR has_table_privilege(c.oid, 'MAINTAIN')"
    return sql.SQL("SELECT " + owner + " FROM pg_class c WHERE c.oid = %(rel)s::regclass")


def analyze(pred: Predicate) -> sql.Composed:
    """Refresh the planner's statistics of the table after a sweep removed a large share."""
    return sql.SQL("ANALYZE {}").format(ident(pred.table))
