"""Deleting one table's expired rows in short batches, each its own transaction.

Every batch repeats the expiry predicate in its outer WHERE, so a row a writer renewed while the
batch waited for its lock is checked again on its new version and kept. Each batch is sized to
take about `batch_target_ms`, and the loop stops between batches: at its time budget, or when
the activity is cancelled.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import psycopg
from psycopg import AsyncConnection, errors, sql

from activities.engine.batch_sql import (
    count_expired,
    flushes_statistics,
    index_batch,
    local_timeouts,
    range_batch,
    range_delete,
)
from activities.engine.context import SweepContext
from activities.engine.keyset import (
    SPAN_RETRY_SHARE,
    WHOLE_LIMIT_TARGETS,
    KeyAfterCommit,
    KeyBatch,
    KeySpans,
    Ran,
    WholeSweep,
    run_key_batch,
    run_key_rest,
    run_key_span,
    run_key_whole,
    whole_limit_ms,
)
from activities.engine.ledger import BatchTally, Done, LazyCommits
from activities.engine.leftover import GAVE_UP
from activities.engine.pacing import Pacer
from activities.engine.pipelines import settled_pipeline
from activities.engine.planning import TablePlan, keyset_batches
from activities.engine.rules import Predicate
from activities.progress import SweepStats
from purge_config.settings import SweepSettings

#: Starting sizes, small so that a first batch on a cold cache holds its locks briefly; each batch
#: then resizes towards the target duration, growing at most 4x, so the steady size is reached
#: within a few batches (why: docs/decisions/short-batches.md).
FIRST_PAGES = 64
FIRST_ROWS = 500
#: An index sweep's first batch takes the rows that lie on about this many heap pages (the same
#: bound on a cold first batch's page reads as FIRST_PAGES gives a walk, twice over: an index
#: batch reads only expired rows' pages), by the planner's model of an index scan.
FIRST_INDEX_PAGES = 128
#: A keyset sweep whose expired rows the planner puts at most this many first batches' worth is
#: one batch, with no boundary read (`fits_first_batch`): a first batch takes about a third of
#: the batch target (bench case 2, 65 rows a page: 8,300 rows in 4.9 ms warm, 6.6 ms cold),
#: so three are about one batch at the target, with nothing read twice.
WHOLE_FIRST_BATCHES = 3
PAGES_RANGE = (8, 1 << 17)
ROWS_RANGE = (50, 100_000)
#: A backlog is counted exactly up to this many rows (then reported as this many).
BACKLOG_COUNT_CAP = 1_000_000
#: The longest a backlog's count may take (its statement_timeout); past it, it is estimated.
COUNT_LEFT_MS = 2_000


class Backlog(NamedTuple):
    """Expired rows left when a sweep ran out of time, and whether that is an estimate."""

    rows: int
    estimated: bool


class BatchSweeper:
    """Runs batches for one table (or one partition) by its plan, on the connection held for
    the table's whole sweep."""

    def __init__(self, ctx: SweepContext, conn: AsyncConnection[Any], plan: TablePlan) -> None:
        self.ctx, self.conn, self.plan = ctx, conn, plan
        self.settings = ctx.settings
        self.progress = ctx.progress
        # With the ledger, each batch adds its count to purge_progress in its own transaction,
        # and the progress takes the ledger's total.
        self.commits = LazyCommits(conn, ctx.ledger)
        self.flushed = False
        """Whether the sweep's last batch flushed the session's statistics as it committed
        (the rest's `local_timeouts(flush=True)`, or a last batch's own statement after its
        boundary read): the views then count every row it removed."""

    async def sweep(self, pred: Predicate) -> SweepStats:
        """Delete the table's expired rows by the plan's strategy, until done or out of time:
        what the batches did (their rows, durations, pacing), without the strategy's name."""
        result = SweepStats()
        # Each batch of a table with an archive inserted there exactly the rows it deleted.
        self.archiving = pred.archive is not None
        self.progress.strategy = self.plan.strategy
        self.pacer = Pacer(self.conn, self.settings, self.ctx.deadline, self.ctx.stopping)
        await self.pacer.start()
        by_key = keyset_batches(
            pred.column, pred.archive is not None, self.plan.partitioned, self.plan.order
        )
        self.tally = BatchTally.of(
            self.ctx.ledger, self.conn, pred.table, server_counts=self.plan.counts_deletes
        )
        async with self.commits.settled(self._report):
            if self.plan.strategy == "index" and by_key:
                try:
                    await self._by_key(pred, result)
                except psycopg.DataError as err:
                    if not _unloadable_key(err):
                        raise
                    # A key no Python value holds (`-infinity`, a date BC), read at the first
                    # boundary (the least expired key) before anything of its batch ran, or
                    # beside a first batch that took every expired row (counted by `_batch`):
                    # the index batches order by the key on the server and never load one.
                    await self._by_index(pred, result)
            elif self.plan.strategy == "index":
                await self._by_index(pred, result)
            else:
                await self._walk(pred, result)
        result.advice += [w for w in self.pacer.warnings if w not in result.advice]
        result.reason = self.pacer.reason
        result.paused_s = self.pacer.paused_s
        return result

    async def _out_of_time(self) -> bool:
        """Whether the sweep must stop before its next batch: the budget is spent, or pacing
        (replica lag, WAL rate) spent it waiting."""
        if self.ctx.out_of_time():
            return True
        return not await self.pacer.before_batch()

    async def _walk(self, pred: Predicate, result: SweepStats) -> None:
        # With an archive the DELETE must return its rows (they go to the archive in the same
        # statement); without one, a plain DELETE counted by its tag costs far less.
        plain = pred.archive is None
        statement = range_delete(pred) if plain else range_batch(pred, self.tally.closing)
        runner = self._plain if plain else self._counting
        # Its own place (lo), not the progress's page: a lazy batch's page reaches the progress
        # (the heartbeat a retry resumes from) only at a durable point (engine.ledger).
        pages, start = FIRST_PAGES, self.progress.page
        # Below the widest span that ran into statement_timeout, once one has: the timing of
        # the narrower spans that passed would otherwise widen the next one straight back.
        ceiling = PAGES_RANGE[1]
        lo = start
        while lo < self.plan.pages:
            if await self._out_of_time():
                result.complete = False
                # Estimated, not counted: with no index to serve it, a count would read every
                # page the walk had not reached.
                result.backlog = _walk_backlog(self.plan, result.removed, lo - start, lo)
                result.backlog_estimated = True
                return
            hi = min(lo + pages, self.plan.pages)
            params = {**pred.params, **self.tally.params, "lo": f"({lo},0)", "hi": f"({hi},0)"}
            lazy = self.commits.lazy(more_may_follow=hi < self.plan.pages)
            run = functools.partial(runner, statement, params, not self.plan.referenced, lazy)
            try:
                _, ms = await self._batch(result, run, page=hi)
            except errors.QueryCanceled:
                # Rolled back whole (its rows and its ledger row): the same pages again, a
                # quarter as many at a time; one page that cannot fails the attempt as before.
                if hi - lo <= 1:
                    raise
                pages = ceiling = max(1, (hi - lo) // SPAN_RETRY_SHARE)
                self._say_narrower(
                    pred, result, "range of heap pages", "some of its rows are slow to delete"
                )
                continue
            lo = hi
            pages = min(ceiling, _resize(pages, ms, self.settings.batch_target_ms, PAGES_RANGE))

    async def _by_index(self, pred: Predicate, result: SweepStats) -> None:
        # The index batch counts what it found (whether it was the last) in its own statement.
        rows = first_index_rows(self.plan)
        while True:
            if await self._out_of_time():
                result.complete = False
                result.backlog, result.backlog_estimated = await self._count_left(pred, result)
                return
            statement = index_batch(
                pred,
                rows,
                order=self.plan.order,
                partitioned=self.plan.partitioned,
                closing=self.tally.closing,
            )
            lazy = self.commits.lazy(more_may_follow=True)  # the last is known only after it
            params = {**pred.params, **self.tally.params}
            run = functools.partial(self._counting, statement, params, False, lazy)
            found, ms = await self._batch(result, run, page=0)
            if found < rows:
                return  # the index held fewer expired rows than asked for: that was all
            rows = _resize(rows, ms, self.settings.batch_target_ms, ROWS_RANGE)

    async def _by_key(self, pred: Predicate, result: SweepStats) -> None:
        # See activities.engine.keyset: the first batch (and every batch of a run of one key)
        # reads its boundary, unless the planner expects it to take every expired row; the
        # others delete a key span sized from the last one's density.
        rows, after = first_index_rows(self.plan), None
        spans = KeySpans.of(pred.column_cutoff)
        width: int | None = None
        tied = False  # the last boundary batch walked a run of one key
        rest = True  # the last batch may go without a boundary read (none has deleted nothing)
        whole = fits_first_batch(self.plan, rows)
        while True:
            if await self._out_of_time():
                result.complete = False
                result.backlog, result.backlog_estimated = await self._count_left(pred, result)
                return
            if whole:
                # The planner expects no more expired rows than the first batch may take: it
                # takes them all, with no boundary read before it (run_key_whole).
                whole = False
                first = WholeSweep(pred, rows)
                try:
                    found, _ = await self._batch(result, self._keyed(run_key_whole, first), page=0)
                except errors.QueryCanceled:
                    result.advice.append(self._estimate_missed(pred))
                    continue  # rolled back whole: the boundary read finds where the rows end
                if found or first.top is None:
                    self.flushed = flushes_statistics(self.conn)
                    return  # every expired row is gone, or none was there
                # A batch's worth of rows or more share the greatest key: the boundary read
                # walks that run.
                rest = False
                continue
            if rest and spans and width and after is not None and spans.reaches_rest(after, width):
                # The next span would reach past the last expired key, or leave less than half
                # a span after it: the rest is the last batch, with no boundary read before it.
                last = self._keyed(run_key_rest, pred, after, rows)
                try:
                    found, _ = await self._batch(result, last, page=0)
                except errors.QueryCanceled:
                    width = self._narrower(pred, result, width)
                    continue
                if found:
                    self.flushed = flushes_statistics(self.conn)
                    return  # every expired key from `after` on is gone
                # Nothing deleted: nothing was left, or a batch's worth of rows or more share
                # the greatest key. The boundary read says which (and walks that run).
                rest = False
                continue
            end = spans.end(after, width) if spans and width and after is not None else None
            if end is None:
                # The first batch, a run of one key, or a last batch that found a run of one
                # key at the top: the boundary read finds where the rows end (fewer than a
                # batch left: this batch is the sweep's last) and whether one key holds more
                # than a batch (walked).
                # The half-way probe sizes the span after the batch; inside a run of one key
                # (most likely after a batch of it) no span follows, so it is not read.
                keyed = KeyBatch(pred, rows, after, mid=spans is not None and not tied)
                found, ms = await self._batch(result, self._keyed(run_key_batch, keyed), page=0)
                if found < rows:
                    # Fewer expired rows than asked for were left: that was all of them.
                    self.flushed = keyed.flushed
                    return
                planned, after, tied = rows, keyed.next_after, keyed.tie
                rows = _resize(rows, ms, self.settings.batch_target_ms, ROWS_RANGE)
                # Sized from the batch's upper half: its rows from the middle key up to the
                # last one found, about half of them.
                held = (
                    spans.width(keyed.middle, after) if spans and keyed.mid and not tied else None
                )
                width = KeySpans.next_width(held, planned - planned // 2, rows) if held else None
                continue
            assert width is not None
            span = self._keyed(run_key_span, pred, after, end)
            try:
                found, ms = await self._batch(result, span, page=0)
            except errors.QueryCanceled:
                width = self._narrower(pred, result, width)
                continue
            after = end
            if found:
                rows = _resize(found, ms, self.settings.batch_target_ms, ROWS_RANGE)
            # The density met says what width holds the next span's rows; an empty span grows.
            width = KeySpans.next_width(width, found, rows)

    def _keyed(
        self, run: Callable[..., Awaitable[Ran]], *args: object
    ) -> Callable[[], Awaitable[Ran]]:
        """A keyset batch (`run_key_batch`, `run_key_span`, `run_key_rest` or `run_key_whole`,
        named at each use from this module's namespace, where `bench.steady_phases` wraps them)
        bound to this sweep's connection, settings, commits and tally, and to its own `args`."""
        return functools.partial(run, self.conn, self.settings, self.commits, self.tally, *args)

    def _estimate_missed(self, pred: Predicate) -> str:
        """The advice when a first batch sized by the planner's estimate ran past its limit."""
        return (
            f"{pred.table}: the planner expected about {self.plan.expired:,.0f} expired rows, "
            f"one batch, but deleting them ran past {whole_limit_ms(self.settings)} ms "
            f"({WHOLE_LIMIT_TARGETS} times the batch target); that batch was rolled back and "
            "the rows taken in "
            f"batches that read their boundary: if its statistics are stale, ANALYZE {pred.table}"
        )

    def _narrower(self, pred: Predicate, result: SweepStats, width: int | None) -> int | None:
        """After a span (or the rest) ran into statement_timeout and was rolled back whole: the
        width to take from the same start, a quarter of it (None: a run of one key narrower
        than that, which reads its boundary instead), and the advice, said once."""
        self._say_narrower(
            pred, result, f"span of {pred.column}", "its expired rows are unevenly spread"
        )
        return (width or 0) // SPAN_RETRY_SHARE or None

    def _say_narrower(self, pred: Predicate, result: SweepStats, what: str, why: str) -> None:
        """The advice, said once, that a batch's `what` ran into statement_timeout."""
        retried = (
            f"{pred.table}: a batch's {what} ran into statement_timeout "
            f"({self.settings.statement_timeout_ms} ms), was rolled back and taken "
            f"again in narrower spans: {why}"
        )
        if retried not in result.advice:
            result.advice.append(retried)

    def _advance(
        self, result: SweepStats, removed: int, total: int | None, ms: float, page: int
    ) -> None:
        result.removed += removed
        result.batches += 1
        result.batch_ms.append(ms)
        self._report(self.commits.hold(Done(removed, total, ms, page)))

    def _report(self, batches: list[Done]) -> None:
        """Batches a durable point covers, into the progress and its heartbeats, in order."""
        progress = self.progress
        for removed, total, ms, page in batches:
            # The ledger's total counts every committed batch of every attempt of this pass
            # (and partitions dropped beside: the larger total is the later one).
            if total is not None:
                progress.removed = max(progress.removed, total)
            else:
                progress.removed += removed
            progress.batch_removed = removed
            progress.archived += removed if self.archiving else 0
            progress.batches += 1
            progress.page = page
            progress.batch_ms = ms
            self.ctx.on_batch(progress)

    async def _batch(
        self,
        result: SweepStats,
        run: Callable[[], Awaitable[Ran]],
        page: int,
    ) -> tuple[int, float]:
        """One batch (`run`) in its own transaction, recorded in `result` and the progress, at
        `page`: (rows it found, ms). A walk's batch reports what it deleted as found.

        Cancelled meanwhile, it still finishes, commits and is recorded before the cancellation
        goes on: a sweep stops between batches, and its count and heartbeat stay true.
        """
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            # Cancelled since the last batch: start no other.
            raise asyncio.CancelledError
        task = asyncio.ensure_future(run())
        try:
            found, removed, total, ms = await asyncio.shield(task)
        except asyncio.CancelledError:
            _, removed, total, ms = await _ran(task)
            self._advance(result, removed, total, ms, page)
            raise
        except KeyAfterCommit as err:
            # Committed, then its key could not be loaded: counted, then the sweep goes on as
            # for a key met before any batch (`sweep`: by the index batches).
            self._advance(result, *err.ran[1:], page)
            raise err.error from None
        self._advance(result, removed, total, ms, page)
        return found, ms

    async def _plain(
        self, statement: sql.Composed, params: dict[str, object], walk: bool, lazy: bool
    ) -> Ran:
        """A plain DELETE, counted by its tag, its count then added to the ledger (see
        `_counting`); committed lazily when `lazy` (`ledger.LazyCommits`)."""
        started = time.perf_counter()
        async with settled_pipeline(self.conn):
            await self.conn.execute(*self.tally.begin(self.settings, walk, lazy=lazy))
            cur = await self.conn.execute(statement, params)
            added = await self.tally.add(self.conn, cur)
        ms = (time.perf_counter() - started) * 1000
        removed = max(cur.rowcount, 0)
        self.commits.committed(lazy, wrote=removed > 0)
        row = await added.fetchone() if added is not None else None
        return removed, removed, int(row[0]) if row else None, ms

    async def _counting(
        self, statement: sql.Composed, params: dict[str, object], walk: bool, lazy: bool
    ) -> Ran:
        """A batch statement that counts in SQL (and adds to the ledger) itself: (rows found,
        rows deleted, the ledger's total or None, ms); committed lazily when `lazy`."""
        started = time.perf_counter()
        # One round trip: the timeouts and the DELETE pipelined up to one Sync, which makes
        # them one implicit transaction (committed at the Sync, rolled back whole if either
        # fails; the timeouts, local to it, hold for the DELETE). Not conn.transaction():
        # psycopg waits for the BEGIN's and the COMMIT's replies even in a pipeline, 4 round
        # trips a batch (why: docs/decisions/server-count.md).
        async with settled_pipeline(self.conn):
            await self.conn.execute(
                local_timeouts(walk, lazy=lazy),
                (self.settings.lock_timeout_ms, self.settings.statement_timeout_ms),
            )
            cur = await self.conn.execute(statement, params)
        ms = (time.perf_counter() - started) * 1000
        row = await cur.fetchone()
        self.commits.committed(lazy, wrote=bool(row and row[1]))
        if not row:
            return 0, 0, None, ms
        # A batch that deleted nothing writes no ledger row: its total is NULL, the count stays.
        total = int(row[2]) if row[2] is not None else None
        return int(row[0]), int(row[1]), total, ms

    async def _count_left(self, pred: Predicate, result: SweepStats) -> Backlog:
        return await count_left(self.conn, self.settings, pred, self.plan, result.removed)


async def count_left(
    conn: AsyncConnection[Any],
    settings: SweepSettings,
    pred: Predicate,
    plan: TablePlan,
    removed: int,
) -> Backlog:
    """Expired rows still there, counted (through the index, where there is one) up to
    BACKLOG_COUNT_CAP; estimated from the plan and the rows `removed` since when the count
    takes longer than COUNT_LEFT_MS, or waits longer than the lock_timeout for the table."""
    query = count_expired(pred, cap=BACKLOG_COUNT_CAP)
    try:
        async with conn.transaction():
            await conn.execute(local_timeouts(False), (settings.lock_timeout_ms, COUNT_LEFT_MS))
            cur = await conn.execute(query, pred.params)
            row = await cur.fetchone()
            return Backlog(int(row[0]) if row else 0, estimated=False)
    except GAVE_UP:
        # Past COUNT_LEFT_MS, or past the sweep's lock_timeout waiting behind DDL (a
        # lock_timeout under COUNT_LEFT_MS ends the wait first): the sweep's rows are gone
        # either way, and an estimate says so rather than failing it.
        return Backlog(max(int(plan.expired) - removed, 0), estimated=True)


async def _ran(task: asyncio.Future[Ran]) -> Ran:
    """A batch's figures once it ended, one whose key read failed after its commit included."""
    try:
        return await task
    except KeyAfterCommit as err:
        return err.ran


def _unloadable_key(err: psycopg.DataError) -> bool:
    """Whether psycopg refused to load a timestamp or date key into Python (out of its range:
    `-infinity`, `infinity`, a year BC), rather than the server refusing a statement."""
    return err.sqlstate is None and ("too small" in str(err) or "too large" in str(err))


def first_index_rows(plan: TablePlan) -> int:
    """The first index batch's rows: as many as lie on FIRST_INDEX_PAGES heap pages, never
    fewer than FIRST_ROWS.

    The pages n rows lie on follow the planner's own model of an index scan: n / rows_per_page
    when the heap is in the column's order (correlation +-1: a fixed TTL's table, its expired
    rows together at its front), n when in no order, between the two by the correlation's
    square. 20,000 expired rows of 2M in expiry order (bench case 2, 65 rows a page: 8,300
    a first batch) are then one batch (`fits_first_batch`) instead of the 4-5 a first batch
    of 500 grows through at 4x a batch, with a bounded first read.
    """
    per_page = plan.rows_per_page
    if plan.correlation is None or not per_page:
        return FIRST_ROWS
    packed = plan.correlation**2
    pages_per_row = packed / max(per_page, 1.0) + (1.0 - packed)
    return min(ROWS_RANGE[1], max(FIRST_ROWS, int(FIRST_INDEX_PAGES / pages_per_row)))


def fits_first_batch(plan: TablePlan, rows: int) -> bool:
    """Whether a keyset sweep's first batch takes every expired row, with no boundary read:
    the table was analyzed, and the planner expects at most WHOLE_FIRST_BATCHES times the first
    batch's `rows` expired (about one batch at the target). Its time is bounded all the same
    (`keyset.whole_limit_ms`): an estimate can be wrong where a span's measured density is
    not."""
    return plan.rows is not None and plan.expired <= rows * WHOLE_FIRST_BATCHES


def _walk_backlog(plan: TablePlan, removed: int, walked: int, page: int) -> int:
    """Expired rows estimated in the pages not walked: at the density met so far (`removed`
    in `walked` pages), or, before any page was walked, the planner's estimate spread evenly
    over the table."""
    left = plan.pages - page
    if walked > 0:
        return round(left * removed / walked)
    if plan.pages <= 0:
        return 0
    return round(plan.expired * left / plan.pages)


def _resize(size: int, ms: float, target_ms: int, size_range: tuple[int, int]) -> int:
    """The next batch's size: scaled towards the target duration, growing at most 4x (a small
    first batch reaches full size in a few) and shrinking at most by half (one slow batch, a
    checkpoint or a lock wait, does not swing it wildly)."""
    factor = min(4.0, max(0.5, target_ms / max(ms, 0.1)))
    return min(size_range[1], max(size_range[0], int(size * factor)))
