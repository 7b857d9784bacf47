"""A small table swept in one transaction: one round trip of reads, then one statement.

A pattern's matches are mostly small tables (a tenant's sessions, a few rows expired a pass).
Swept in batches, each cost about 25 statements: the rule bound and the unit checked, the plan
read (sizes, the planner's estimate, indexes, statistics), the advisory lock, the batch, the
reads after it (what it left, the day's shares) and the timeouts and transactions of each, for
a DELETE of a few rows. A table whose heap one walk batch covers (`FIRST_PAGES`) needs no plan:
whatever its plan, its expired rows are one batch (`FIRST_ROWS`). So, in one transaction:

1. the table's advisory lock, tried, never waited for (a table another sweep holds is left to
   the batched sweep, which waits up to `busy_wait`), the sweep's timeouts, and the session's
   statistics asked to be flushed as the transaction ends, as a batched sweep's last batch
   asks (so the views count its deletes at once: never after an `ANALYZE` that follows);
2. in the same round trip, what can differ from table to table, in one statement
   (`catalog.small_table`): its kind, its size, its dead tuples, whether a foreign key
   references it, the unit check's sample of its column, whether the ledger may be used; and
   the rule bound to it (its columns' types, `rules.column_types`);
3. one statement: the DELETE of at most `FIRST_ROWS` expired rows, each checked again on the
   row, its count added to the ledger and the ledger's count before it (exact through kills,
   as every batch's), the table's rows before it (what is left, exactly), and the pass's
   record in `purge_shares` with the day's passes (the partition advice's memory).

Nothing else is needed after it: a sweep that found fewer than a batch left no expired row
(its oldest is 0 old), the advice thresholds of a table this small cannot be reached (an index
is advised from `planning.LARGE_PAGES`, VACUUM from `leftover.ADVICE_MIN_ROWS`, partitions
from one pass's `partition_advice.PARTITION_ADVICE_ROWS`) but the day's shares, recorded in
the statement. Anything the path does not fit (a table grown past it, partitioned, inherited,
ruled or referenced; a rule with a filter, an archive or an age kept in another table; a held
lock; any server error) leaves the table, with nothing deleted, to the batched sweep, which
reads and says everything as before. A batch's worth of expired rows found means more may
be left: the batched sweep goes on after it.

Why (and what was measured): docs/decisions/spread-passes.md.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import AsyncConnection, sql

from activities.engine import catalog
from activities.engine.access import TableAccess, try_lock_in_transaction
from activities.engine.batch_sql import flushes_statistics
from activities.engine.batching import FIRST_PAGES, FIRST_ROWS
from activities.engine.context import SweepContext
from activities.engine.ledger import BatchTally, Ledger, ledger_writable, usable
from activities.engine.leftover import Leftover, analyze_after, vacuum_advice
from activities.engine.partition_advice import (
    remembered_advice,
    share_params,
    share_passes,
    shared,
)
from activities.engine.pipelines import settled_pipeline
from activities.engine.rules import ExpiryRule, FullBucketRule, Predicate, Rule, ident
from activities.engine.units import (
    SAMPLE_ROWS,
    coarse_band,
    judge_unit,
    refuse_coarse,
    weighted_statistics,
)
from activities.progress import SweepStats
from purge_config.names import TableName
from purge_config.settings import EpochUnit

#: A table this small (heap pages, exact) is swept in one statement: one walk batch covers it.
SMALL_PAGES = FIRST_PAGES
#: The most expired rows that statement deletes: one index batch. Finding as many means more
#: may be left (the table grew, or is dense): the batched sweep goes on after it.
SMALL_ROWS = FIRST_ROWS


class SmallTables:
    """Which of a target's tables were too large (or did not fit) when last seen: the next
    pass sweeps those in batches at once, without first trying them as small."""

    def __init__(self) -> None:
        self._not_small: set[TableName] = set()

    def worth_trying(self, table: TableName) -> bool:
        return table not in self._not_small

    def saw(self, table: TableName, small: bool) -> None:
        if small:
            self._not_small.discard(table)
        else:
            self._not_small.add(table)


def rule_column(rule: Rule) -> tuple[str, EpochUnit] | None:
    """The column a rule that binds from its table's column types alone compares (its unit
    checked from the same read), or None for a rule that reads more to bind (a filter's values,
    an archive's shape, a foreign key to another table)."""
    if isinstance(rule, ExpiryRule) and rule.row_filter is None and rule.archive is None:
        return rule.column, rule.unit
    if isinstance(rule, FullBucketRule) and rule.archive is None:
        return "last_ms", "ms"
    return None


@dataclass
class SmallSweep:
    """What the one statement did."""

    stats: SweepStats
    """The table's figures: its rows, its batch, what it left, its advice."""
    ledger: bool
    """Whether the count is the ledger's (`purge_progress`)."""
    ledger_start: int = 0
    """The ledger's count before this attempt: earlier attempts' rows."""
    more: bool = False
    """A batch's worth of expired rows was found: more may be left."""


@dataclass
class _Done:
    """The statement's row, and how long its transaction took."""

    row: tuple[Any, ...]
    facts: tuple[Any, ...]
    pred: Predicate
    ledger: Ledger | None
    shares: bool
    ms: float
    writable: tuple[Any, ...] = field(default=())


async def sweep_small(
    access: TableAccess, rule: Rule, ctx: SweepContext, memory: SmallTables
) -> SmallSweep | None:
    """Sweep `rule`'s table in one transaction if it is small (see the module); None, with
    nothing deleted, when it is not (or the path cannot tell): the caller sweeps it in batches.
    BadTable when its column is missing, of a type the rule does not take, or in the wrong
    unit, as the batched sweep would say it, nothing deleted."""
    column = rule_column(rule)
    if column is None or not memory.worth_trying(rule.table) or ctx.out_of_time():
        return None
    current = asyncio.current_task()
    if current is not None and current.cancelling():
        raise asyncio.CancelledError
    async with access.pool.connection() as conn:
        # Cancelled meanwhile, the transaction still finishes and is recorded before the
        # cancellation goes on, as a batch is (`batching.BatchSweeper._batch`).
        task = asyncio.ensure_future(_transaction(conn, access, rule, column, ctx, memory))
        try:
            done = await asyncio.shield(task)
        except asyncio.CancelledError:
            finished = await task
            if finished is not None:
                _record(ctx, finished)
            raise
        if done is None:
            return None
        small = _record(ctx, done)
        await _after(conn, access, ctx, done, small)
    return small


async def _transaction(
    conn: AsyncConnection[Any],
    access: TableAccess,
    rule: Rule,
    column: tuple[str, EpochUnit],
    ctx: SweepContext,
    memory: SmallTables,
) -> _Done | None:
    """The one transaction (module docstring, 1-3); None when the table is left to the batched
    sweep. A server error is that too: the transaction ends with nothing deleted, and the
    batched sweep meets the same fault and says it as it always has."""
    settings = access.settings
    relation = ident(rule.table)
    params = {
        "rel": relation.as_string(conn),
        "column": column[0],
        "lock_ms": settings.lock_timeout_ms,
        "statement_ms": settings.statement_timeout_ms,
    }
    facts_read = sql.SQL("SELECT * FROM ({}) f, ({}) l").format(
        catalog.small_table(), ledger_writable()
    )
    sample_read = sql.SQL("SELECT {}").format(
        catalog.sample_texts(relation, column[0], SAMPLE_ROWS)
    )
    started = time.perf_counter()
    try:
        # One implicit transaction, up to the pipeline's Sync: its reads flushed in one round
        # trip by the rule's own read of its columns, its statement and the commit in another.
        async with settled_pipeline(conn):
            locked = await conn.execute(try_lock_in_transaction(flushes_statistics(conn)), params)
            reading = await conn.execute(facts_read, params, prepare=True)
            sampling = await conn.execute(sample_read)
            pred = await rule.bind(conn, ctx.now_ms)
            taken = await locked.fetchone()
            facts = await reading.fetchone()
            sample = await sampling.fetchone()
            if not taken or not taken[0] or facts is None:
                return None  # another sweep holds it: the batched sweep waits for it
            small = _fits(facts)
            memory.saw(rule.table, small)
            if not small or pred.epoch_table is not None:
                return None
            for name, unit in pred.epoch_columns:
                if name != column[0]:
                    return None
                judge_unit(rule.table, name, unit, _sample(facts, sample))
                # The statistics may predate rows in a coarser unit; the first values, read
                # every pass, are looked at too (units.refuse_coarse).
                refuse_coarse(rule.table, name, unit, _firsts(sample))
                band = coarse_band(unit)
                if band is not None:
                    # And the column's index, as every batched sweep probes it: sent before the
                    # statement, in its round trip, failing where it finds one.
                    await conn.execute(_no_coarse_value(relation, name, band), params)
            writable = tuple(facts[8:12])
            ledger_ok, shares_ok = usable(writable)
            ledger = ctx.ledger if ledger_ok else None
            shares = ctx.ledger is not None and shares_ok and pred.range_key is not None
            statement, extra = _statement(pred, relation, BatchTally(ledger), shares)
            if shares:
                extra.update(share_params(ctx.target, str(pred.table), ctx.now_ms))
            cur = await conn.execute(statement, {**pred.params, **extra})
        row = await cur.fetchone()
    except psycopg.Error:
        return None
    if row is None:
        return None
    ms = (time.perf_counter() - started) * 1000
    return _Done(tuple(row), tuple(facts), pred, ledger, shares, ms, writable)


def _fits(facts: tuple[Any, ...]) -> bool:
    """Whether the table is one the one statement sweeps: a plain table (not partitioned, no
    inheritance children or rules), no larger than SMALL_PAGES, that no foreign key
    references (its deletes would reach child tables, whose indexes the batched sweep checks:
    `access.TableAccess.prepare`)."""
    relkind, inherits, pages, referenced = facts[0], facts[1], facts[2], facts[4]
    return relkind == "r" and not inherits and int(pages) <= SMALL_PAGES and not referenced


def _sample(facts: tuple[Any, ...], sample: Any) -> list[tuple[int, float]]:
    """The unit check's (value, weight) pairs, as `units.check_unit` reads them: the column's
    statistics, or without them a few of its values."""
    bounds, common, freqs = facts[5], facts[6], facts[7]
    pairs = weighted_statistics(_items(bounds), _items(common), _items(freqs))
    return pairs or [(v, 1.0) for v in _firsts(sample)]


def _no_coarse_value(relation: sql.Identifier, column: str, band: tuple[int, int]) -> sql.Composed:
    """A statement that fails where an index leading with `column` holds a value in `band` (one
    in a coarser unit: `units.coarse_band`), and reads no row of the table without such an
    index. It ends the transaction with nothing deleted; the batched sweep, whose unit check
    probes the same index, then refuses the table naming the value (`units.refuse_coarse`).
    Its error, which the server logs every pass until the row is fixed, says so itself, naming
    the table, the column and the value: plain SQL has no statement that raises, so it is a
    cast of that sentence to an integer (the sentence holds the value found, so it is never
    cast while planning)."""
    probe = catalog.value_in_range(relation, column, *band)
    return sql.SQL(
        "SELECT ('pg-purge: ' || %(rel)s || ' column ' || %(column)s || ' holds ' || p.v"
        " || ', an instant before 1973 in its unit (a value in a coarser unit?):"
        " the table is refused, nothing deleted')::int"
        " FROM ({}) p(v) WHERE p.v IS NOT NULL"
    ).format(probe)


def _firsts(sample: Any) -> list[int]:
    """The column's first values, as the path reads them every pass."""
    return [int(v) for v in (sample[0] if sample else None) or []]


def _items(array_text: str | None) -> list[str]:
    """The elements of a number array's text form (`{1,2,3}`): the statistics' arrays are of
    the column's type, read as text so that any type's reads in one statement."""
    if not array_text or array_text == "{}":
        return []
    return array_text.strip("{}").split(",")


def _statement(
    pred: Predicate, relation: sql.Identifier, tally: BatchTally, shares: bool
) -> tuple[sql.Composed, dict[str, object]]:
    """The one statement and its parameters beside the rule's: at most SMALL_ROWS expired rows
    deleted (found by ctid, the rule checked again on the row), counted, added to the ledger;
    then, in its row, the ledger's count before it (NULL without the ledger or before its
    first row), the table's rows before it, and the day's passes over the table (NULL without
    the record)."""
    before = sql.SQL("(SELECT count(*) FROM {})").format(relation)
    counted = tally.ledger.counted() if tally.ledger is not None else sql.SQL("NULL::bigint")
    record: sql.Composable = sql.SQL("")
    passes: sql.Composable = sql.SQL("NULL::bigint[]")
    if shares:
        values = sql.SQL("(SELECT n, {} - n FROM counted) v(removed, live)").format(before)
        record, passes = shared(values)
    statement = sql.SQL(
        "WITH found AS MATERIALIZED (SELECT ctid FROM {table} WHERE {where} LIMIT {limit}),"
        " deleted AS (DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM found))"
        " AND {where} RETURNING 1), counted AS (SELECT count(*) AS n FROM deleted){record}"
        "{closing}"
    ).format(
        table=relation,
        where=pred.where,
        limit=sql.Literal(SMALL_ROWS),
        record=record,
        closing=tally.closing(
            sql.SQL("(SELECT count(*) FROM found)"),
            sql.SQL(", {}, {}, {}").format(counted, before, passes),
        ),
    )
    return statement, dict(tally.params)


def _record(ctx: SweepContext, done: _Done) -> SmallSweep:
    """The statement's row into the progress (heartbeated, as a batch's) and the figures."""
    found, removed, total, prior, before, passes = done.row
    removed, progress = int(removed), ctx.progress
    start = int(prior) if prior is not None else 0
    if done.ledger is not None:
        progress.removed = start  # every earlier attempt's rows, as the ledger holds them
    progress.removed = int(total) if total is not None else progress.removed + removed
    progress.batch_removed, progress.batches, progress.page = removed, progress.batches + 1, 0
    progress.strategy, progress.batch_ms = "single", done.ms
    more = int(found) >= SMALL_ROWS
    progress.final = not more
    ctx.on_batch(progress)
    stats = SweepStats(removed=removed, batches=1, strategies=["single"], batch_ms=[done.ms])
    small = SmallSweep(stats, done.ledger is not None, start if done.ledger else 0, more)
    if more:
        return small  # the batched sweep goes on, and says what is left
    # Found fewer than a batch: no expired row is left. The rows before it less those it
    # deleted are exactly the rows left; its deletes are the views' dead tuples, with theirs.
    left = Leftover(0, max(int(before) - removed, 0), int(done.facts[3]) + removed)
    stats.live_rows, stats.dead_rows = left.live, left.dead
    # What binding the rule said first (a `timestamp` read as UTC over a local TimeZone), as
    # the batched sweep's plan says it.
    advice = [done.pred.advice, vacuum_advice(done.pred, removed, left)]
    key = done.pred.range_key
    if done.shares and passes and key is not None:
        day = share_passes(passes)
        advice.append(remembered_advice(ctx.target, str(done.pred.table), key.column, day))
    stats.advice += [a for a in advice if a]
    return small


async def _after(
    conn: AsyncConnection[Any],
    access: TableAccess,
    ctx: SweepContext,
    done: _Done,
    small: SmallSweep,
) -> None:
    """After the commit: ANALYZE when `analyze_after` asks for it, and old passes' ledger rows
    removed (once per pass and database on this worker, as `Ledger.open` does)."""
    stats = small.stats
    if access.settings.analyze_after and not small.more:
        left = Leftover(0, stats.live_rows, stats.dead_rows)
        analyzed, warning = await analyze_after(
            conn, done.pred, stats.removed, left, access.settings.statement_timeout_ms
        )
        stats.analyzed = analyzed
        stats.advice += [warning] if warning else []
    if ctx.ledger is not None:
        await ctx.ledger.expire_old(conn, access.settings, done.writable)
