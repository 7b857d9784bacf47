"""Keyset batches: each deletes one span of the expiry index's keys as one plain DELETE,
counted by its command tag.

A sweep's first batch reads its boundary: where the next n expired rows end in the index (the
least key, the n-th and the one half-way), then deletes that key range; where the planner
expects no more expired rows than about one batch at the target (three first batches,
`batching.fits_first_batch`), it takes them all with no read (`run_key_whole`), in one round
trip (two where the ledger cannot take the DELETE's rows from its command tag: `BatchTally`),
under a statement_timeout of ten batch targets, and the boundary read takes over if it
runs past that or finds a run of one key at the top. Every other batch
deletes a key span sized from the rows the last one found in its span (`KeySpans`), with no
read before it: the bound a user feels is how long a batch holds its locks, not how many rows
it holds, so a span's rows may exceed the plan, and the next span follows the density met. The
last takes the rest up to the cutoff, also with no read, once the next span would reach past
it or leave less than half a span (`run_key_rest`); if a batch's worth of rows or more share
the greatest expired key, it deletes nothing and the boundary read takes over. A span (or the
rest) that runs into `statement_timeout` is rolled back and tried again at a quarter of its
width. The next batch starts at the key this one stopped below, so no batch steps over the
index entries of rows earlier batches deleted. Where a boundary read finds a batch's worth of
rows or more sharing one key, that run is taken by ctid, a batch at a time (the tie walk),
every batch of it reading its boundary; a run inside a span goes with the span. Used where
`planning.keyset_batches` holds; see `batching.BatchSweeper` (why:
docs/decisions/keyset-batches.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from psycopg import AsyncConnection, errors, sql

from activities.engine.batch_sql import (
    flush_statistics,
    flushes_statistics,
    key_boundary,
    key_delete,
    key_rest,
    key_top,
    tie_delete,
    tie_walk,
)
from activities.engine.ledger import BatchTally, LazyCommits, lazy_commit
from activities.engine.pipelines import settled_pipeline
from activities.engine.rules import Predicate
from purge_config.settings import SweepSettings

#: (rows found, rows deleted, the ledger's total or None, ms) of one batch.
Ran = tuple[int, int, int | None, float]


class KeyBatch:
    """One keyset batch's inputs, and the statement its boundary calls for."""

    def __init__(self, pred: Predicate, rows: int, after: object | None, mid: bool = False) -> None:
        self.pred, self.rows, self.after, self.mid = pred, rows, after, mid
        self.next_after: object | None = after
        self.middle: object | None = None
        """With `mid`: the key half a batch past the least found (None: fewer were left)."""
        self.tie = False
        """Whether the last `delete` was a `tie_delete`: it wants `tie_walk` before it."""
        self.flushed = False
        """Whether the batch asked for the session's statistics to be flushed as it commits:
        its read found fewer than a batch left, so it is the sweep's last (`run_key_batch`)."""

    def delete(self, least: object, last: object | None) -> tuple[sql.Composed, dict[str, object]]:
        """The DELETE for a boundary read: the least expired key left, and the `rows`-th (None
        when fewer are left)."""
        # From the least key found, not the last batch's bound: the first batch's DELETE then
        # starts where the live index entries do, not over every entry of rows deleted before
        # (by earlier passes, not yet vacuumed), which its boundary read already stepped over.
        params = {**self.pred.params, "key_after": least}
        self.tie = False
        if last is None:
            # The rest: fewer than a batch were left.
            return key_delete(self.pred, after=True, below=False), params
        if least == last:
            # A whole batch shares one key: take `rows` of them by ctid; the next batch reads
            # from that key again, until fewer than a batch of it are left.
            self.next_after, self.tie = least, True
            return tie_delete(self.pred), {**params, "key_at": least, "key_rows": self.rows}
        # Up to the last key found, not including it: its rows (and ties) open the next batch.
        self.next_after = last
        return key_delete(self.pred, after=True, below=True), {**params, "key_below": last}


async def run_key_batch(
    conn: AsyncConnection[Any],
    settings: SweepSettings,
    commits: LazyCommits,
    tally: BatchTally,
    keyed: KeyBatch,
) -> Ran:
    """One keyset batch in one implicit transaction: its boundary read (one round trip, the
    pipeline flushed without a Sync), then the DELETE of that key range and the ledger's row
    (its count taken on the server where the plan allows: no round trip between them),
    committed at the Sync: lazily when a whole batch was found (more may follow) and
    `commits` allows it, else as the session does. When fewer than a batch were found, the
    batch is the sweep's last: it asks, in the same round trip, for the session's statistics
    to be flushed as it commits (`keyed.flushed`), as the rest does, so the read of what the
    sweep left sends no flush of its own."""
    started = time.perf_counter()
    params = {**keyed.pred.params, **tally.params}
    async with settled_pipeline(conn):
        # Its statements prepared at once, planned once for all batches (local_timeouts).
        await conn.execute(*tally.begin(settings, generic=True), prepare=True)
        boundary = await conn.execute(
            key_boundary(keyed.pred, keyed.after is not None, keyed.mid),
            {
                **params,
                "key_after": keyed.after,
                "key_skip": keyed.rows - 1,
                "key_mid": keyed.rows // 2,
            },
            prepare=True,
        )
        least, last, *middle = await boundary.fetchone() or (None, None)
        keyed.middle = middle[0] if middle else None
        if last is None and flushes_statistics(conn):
            # The sweep's last batch (none found, or fewer than a batch): the views count its
            # deletes once the session goes idle after this transaction.
            await conn.execute(flush_statistics())
            keyed.flushed = True
        added, lazy = None, False
        if least is not None:
            lazy = commits.lazy(more_may_follow=last is not None)
            if lazy:
                await conn.execute(lazy_commit(), prepare=True)
            delete = keyed.delete(least, last)
            if keyed.tie:
                await conn.execute(tie_walk(), prepare=True)
            cur = await conn.execute(*delete, prepare=True)
            added = await tally.add(conn, cur)
    ms = (time.perf_counter() - started) * 1000
    if least is None:
        return 0, 0, None, ms
    removed = max(cur.rowcount, 0)
    commits.committed(lazy, wrote=removed > 0)
    row = await added.fetchone() if added is not None else None
    # A whole batch was there (its last key was found); else what was left, all deleted.
    found = keyed.rows if last is not None else removed
    return found, removed, int(row[0]) if row else None, ms


#: A span grows at most this many times over the last one's width: across a stretch with few
#: expired keys, the density met says little about what follows it.
SPAN_GROWTH = 4
#: A span that ran into statement_timeout is tried again at this share of its width.
SPAN_RETRY_SHARE = 4
#: The last batch takes the rest when it is at most this many halves of the next span's width:
#: a remainder narrower than half a span rides with it (at most 1.5x the batch's planned rows,
#: under the 2x at which a long batch halves the next) instead of being a batch of its own.
REST_HALVES = 3
_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True)
class KeySpans:
    """Key arithmetic for one keyset sweep: a key span's end from its start and width, and the
    width that holds the rows a batch should take at the density the last span met. Keys are
    integers (an epoch in any unit) or timestamps, whose widths are counted in microseconds."""

    stop: int | datetime
    """The greatest expired key (`Predicate.column_cutoff`): no span reaches past it (the
    boundary read finds where the last rows end)."""

    @staticmethod
    def of(cutoff: object | None) -> KeySpans | None:
        """The spans of a sweep whose rule bounds its key by `cutoff`; None when there is no
        such bound or no arithmetic on its type (every batch then reads its boundary)."""
        if isinstance(cutoff, int | datetime) and not isinstance(cutoff, bool):
            return KeySpans(cutoff)
        return None

    def width(self, least: object, last: object) -> int | None:
        """The width of the key range [least, last), None when the keys are not of the
        cutoff's type (then no span is tried)."""
        if isinstance(self.stop, datetime):
            if not isinstance(least, datetime) or not isinstance(last, datetime):
                return None
            try:
                return (last - least) // _MICROSECOND
            except TypeError:  # one naive, one aware: never a span
                return None
        if isinstance(least, int) and isinstance(last, int):
            return last - least
        return None

    def end(self, start: object, width: int) -> object | None:
        """The key `width` past `start`, or None when that reaches past the last expired key
        (the boundary read then finds where the rows end)."""
        if isinstance(self.stop, datetime):
            assert isinstance(start, datetime)
            try:
                end = start + width * _MICROSECOND
                return end if end <= self.stop else None
            except (OverflowError, TypeError):  # past the calendar, or naive against aware
                return None
        assert isinstance(start, int)
        end_key = start + width
        return end_key if end_key <= self.stop else None

    def reaches_rest(self, start: object, width: int) -> bool:
        """Whether the keys from `start` to the last expired one are at most REST_HALVES
        halves of `width`: the next batch is then the sweep's last, the rest (`key_rest`)."""
        return self.end(start, width * REST_HALVES // 2) is None

    @staticmethod
    def next_width(width: int, found: int, rows: int) -> int | None:
        """The next span's width: the width that held `rows` at the density this one met
        (`found` rows in `width`), growing at most SPAN_GROWTH times. None when `rows` take less
        than one step of the key (more rows than a batch to a second, for epoch seconds): the
        next batch then reads its boundary, and a run of one key is walked."""
        if found <= 0:
            return width * SPAN_GROWTH
        return min(width * SPAN_GROWTH, width * rows // found) or None


async def run_key_span(
    conn: AsyncConnection[Any],
    settings: SweepSettings,
    commits: LazyCommits,
    tally: BatchTally,
    pred: Predicate,
    start: object,
    end: object,
) -> Ran:
    """One key span: the plain DELETE of the expired rows with keys from `start` up to, not
    including, `end` (`_plain_batch`), committed lazily when `commits` allows it (a span is
    never a sweep's last: the rest, or a boundary read, is). Its statements are those of a
    boundary batch's DELETE, prepared once."""
    params = {**pred.params, "key_after": start, "key_below": end}
    delete = key_delete(pred, after=True, below=True)
    lazy = commits.lazy(more_may_follow=True)
    ran, _ = await _plain_batch(conn, settings, commits, tally, delete, params, lazy)
    return ran


async def run_key_rest(
    conn: AsyncConnection[Any],
    settings: SweepSettings,
    commits: LazyCommits,
    tally: BatchTally,
    pred: Predicate,
    start: object,
    rows: int,
) -> Ran:
    """A sweep's last batch, once the next span would reach past the cutoff or leave less than
    half a span after it: the plain DELETE of every expired row with a key from `start` on
    (`_plain_batch`; at the density the last span met, at most a span and a half), committed
    as the session does: it is the table's last. It deletes nothing when `rows` rows or more
    share the greatest expired key (`key_rest`): the caller then reads the boundary, which
    walks that run. Prepared once, as the spans."""
    params = {**pred.params, "key_after": start, "key_rows": rows}
    ran, _ = await _plain_batch(
        conn,
        settings,
        commits,
        tally,
        key_rest(pred),
        params,
        lazy=False,
        by_index=True,
        flush=flushes_statistics(conn),
    )
    return ran


#: A first batch that takes every expired row by the planner's estimate (`run_key_whole`) is
#: rolled back past this many times the batch target: the estimate was wrong (statistics gone
#: stale), and the sweep goes on in batches that read their boundary. Ten is the least that
#: `statement_timeout` may be (`purge_config.specs`), so the setting itself bounds the others.
WHOLE_LIMIT_TARGETS = 10


def whole_limit_ms(settings: SweepSettings) -> int:
    """The statement_timeout of a `run_key_whole` batch."""
    return min(settings.statement_timeout_ms, WHOLE_LIMIT_TARGETS * settings.batch_target_ms)


class WholeSweep:
    """A keyset sweep whose expired rows, by the planner's estimate, fit in its first batch:
    its inputs, and what its one statement found."""

    def __init__(self, pred: Predicate, rows: int) -> None:
        self.pred, self.rows = pred, rows
        self.top: object | None = None
        """The greatest expired key as the batch began; None when no row was expired."""


async def run_key_whole(
    conn: AsyncConnection[Any],
    settings: SweepSettings,
    commits: LazyCommits,
    tally: BatchTally,
    whole: WholeSweep,
) -> Ran:
    """A sweep's first batch when the planner expects no more expired rows than it may take:
    the rest (`key_rest`) from the first expired key, with no boundary read before it, the
    greatest expired key read in the same round trip (`key_top`), committed as the session
    does, the statistics flushed: it is the table's last, unless it deleted nothing while an
    expired key was there (a batch's worth of rows or more share the greatest key: the caller
    then reads the boundary, which walks that run). Its statement_timeout is
    `whole_limit_ms`: a batch that runs past it is rolled back whole, and the caller goes on
    by boundary reads."""
    limited = replace(settings, statement_timeout_ms=whole_limit_ms(settings))
    params = {**whole.pred.params, "key_rows": whole.rows}
    ran, top = await _plain_batch(
        conn,
        limited,
        commits,
        tally,
        key_rest(whole.pred, after=False),
        params,
        lazy=False,
        by_index=True,
        flush=flushes_statistics(conn),
        read=key_top(whole.pred),
    )
    whole.top = top[0] if top else None
    return ran


async def _plain_batch(
    conn: AsyncConnection[Any],
    settings: SweepSettings,
    commits: LazyCommits,
    tally: BatchTally,
    delete: sql.Composed,
    params: dict[str, object],
    lazy: bool,
    by_index: bool = False,
    flush: bool = False,
    read: sql.Composed | None = None,
) -> tuple[Ran, Any]:
    """One plain, prepared DELETE and the ledger's row in one implicit transaction, committed
    lazily when `lazy`; with `by_index`, the tie walk's planner settings for its transaction
    (`key_rest`'s count of one key's rows goes by the index, as a tie walk's does); with
    `flush`, the session's statistics flushed as it ends. With `read` (a statement of
    `params`), that read is sent first, in the same round trip: its first row comes back
    beside the batch's figures (None without one)."""
    started = time.perf_counter()
    params = {**params, **tally.params}
    async with settled_pipeline(conn):
        await conn.execute(
            *tally.begin(settings, generic=True, lazy=lazy, flush=flush, by_index=by_index),
            prepare=True,
        )
        before = await conn.execute(read, params, prepare=True) if read is not None else None
        cur = await conn.execute(delete, params, prepare=True)
        added = await tally.add(conn, cur)
    ms = (time.perf_counter() - started) * 1000
    removed = max(cur.rowcount, 0)
    commits.committed(lazy, wrote=removed > 0)
    row = await added.fetchone() if added is not None else None
    ran = (removed, removed, int(row[0]) if row else None, ms)
    try:
        found = await before.fetchone() if before is not None else None
    except errors.DataError as err:
        # Loaded after the commit: the batch's rows are gone, and must be counted.
        raise KeyAfterCommit(ran, err) from err
    return ran, found


class KeyAfterCommit(Exception):
    """A batch committed (`ran`, its figures) whose key read beside it held a key psycopg
    could not load (`error`: `-infinity`, a date BC); the caller records the batch, then
    treats `error` as a key met before any batch ran."""

    def __init__(self, ran: Ran, error: errors.DataError) -> None:
        super().__init__(str(error))
        self.ran, self.error = ran, error
