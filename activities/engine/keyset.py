"""Keyset batches: each finds where the next n expired rows end in the expiry index, then
deletes that key range as one plain DELETE counted by its command tag.

The next batch starts at the key this one stopped below, so no batch steps over the index
entries of rows earlier batches deleted. A run of equal keys longer than a batch is taken by
ctid, a batch at a time. Used where `planning.keyset_batches` holds; see `batching.BatchSweeper`.
"""

from __future__ import annotations

import time
from typing import Any

from psycopg import AsyncConnection, sql

from activities.engine.batch_sql import (
    key_boundary,
    key_delete,
    tie_delete,
    tie_walk,
)
from activities.engine.ledger import BatchTally, LazyCommits, lazy_commit
from activities.engine.rules import Predicate
from purge_config.settings import SweepSettings

#: (rows found, rows deleted, the ledger's total or None, ms) of one batch.
Ran = tuple[int, int, int | None, float]


class KeyBatch:
    """One keyset batch's inputs, and the statement its boundary calls for."""

    def __init__(self, pred: Predicate, rows: int, after: object | None) -> None:
        self.pred, self.rows, self.after = pred, rows, after
        self.next_after: object | None = after
        self.tie = False
        """Whether the last `delete` was a `tie_delete`: it wants `tie_walk` before it."""

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
    `commits` allows it, else as the session does."""
    started = time.perf_counter()
    params = {**keyed.pred.params, **tally.params}
    async with conn.pipeline():
        # Its statements prepared at once, planned once for all batches (local_timeouts).
        await conn.execute(*tally.begin(settings, generic=True))
        boundary = await conn.execute(
            key_boundary(keyed.pred, keyed.after is not None),
            {**params, "key_after": keyed.after, "key_skip": keyed.rows - 1},
            prepare=True,
        )
        least, last = await boundary.fetchone() or (None, None)
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
