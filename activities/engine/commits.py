"""Lazy batch commits, and the durable points before which nothing of theirs is reported.

A batch whose ledger row is in its own transaction may commit without waiting for its WAL
(`statements.lazy_commit`): a crash of the server that loses that commit loses the batch's
deletes and its count together, so the ledger's count stays exact. Each batch's commit otherwise
waited for its WAL to reach disk, where one DELETE of the same rows waits once (bench/README.md,
issue 20).

What a sweep reports must not be undone by a crash: a lazy batch's heartbeat (its rows into the
worker's `purge_rows_removed` counter, its place for a retry) waits for a durable point, a
commit that waits for the WAL up to it and so for every lazy commit before it. A batch commits
as the session does when the last durable point is DURABLE_EVERY_S old (so heartbeats stay about
a second apart) or when it is known to be the table's last; the sweep's end, or its
cancellation, is a durable point of its own (`statements.durable_point`) when its last batch was
lazy.

A retry resumes from what was reported, so from durable work only: index and keyset batches
start again from the index, and a walk at the page its last heartbeat named, which is a durable
batch's (the walk keeps its own place meanwhile). Pages walked after it are walked again; what
a crash undid there is still expired, and is deleted then. Both count from the ledger.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, NamedTuple

import psycopg
from psycopg import AsyncConnection

from activities.engine.statements import durable_point

#: The longest a sweep's lazy commits wait for a durable point: heartbeats (which report only
#: durable batches) stay this close together, and a server crash undoes at most this much work.
DURABLE_EVERY_S = 0.5
#: What DURABLE_EVERY_S is measured by, read once a batch and once a durable point: a module
#: name, so that a test can count batches instead of seconds (tests/support/pace.py).
clock = time.monotonic


class Done(NamedTuple):
    """A committed batch, as its heartbeat reports it."""

    removed: int
    total: int | None
    """The ledger's total after it, or None (no ledger, or nothing deleted)."""
    ms: float
    page: int


class LazyCommits:
    """Of one table's sweep, on the connection its batches run on: whether the next batch may
    commit lazily, and whether any batch since the last durable point did."""

    def __init__(self, conn: AsyncConnection[Any], ledger: dict[str, object] | None) -> None:
        self.conn = conn
        self.ledger = ledger
        """The ledger's parameters (see LedgerKey.params); lazy commits need them."""
        self.pending = False
        """Whether a batch committed lazily since the last durable point."""
        self._durable_at = clock()
        self._held: list[Done] = []

    def lazy(self, more_may_follow: bool) -> bool:
        """Whether the next batch may commit lazily: with the ledger, not the table's last (as
        far as is known), and inside DURABLE_EVERY_S of the last durable point."""
        return (
            self.ledger is not None
            and more_may_follow
            and clock() - self._durable_at < DURABLE_EVERY_S
        )

    def committed(self, lazily: bool, wrote: bool) -> None:
        """A batch committed, lazily or as the session does, having deleted rows (`wrote`) or
        not. Only a commit that wrote WAL waits for it, so only such a commit as the session does
        is a durable point; a lazy one that deleted nothing leaves nothing to lose."""
        if lazily and wrote:
            self.pending = True
        elif wrote:
            self._durable()

    def hold(self, batch: Done) -> list[Done]:
        """`batch`, just committed (see `committed`): the batches to report now, in order (all
        held so far once a durable point covers them; none while one is still to come)."""
        self._held.append(batch)
        if self.pending:
            return []
        return self._release()

    @contextlib.asynccontextmanager
    async def settled(self, report: Callable[[list[Done]], None]) -> AsyncIterator[None]:
        """The batches run inside end at a durable point, and what it covers is `report`ed:
        when they end, are cancelled or fail. After a failure the connection may be gone, and
        the batches held are then never reported: a retry counts them from the ledger, and a
        server crash may have undone them."""
        try:
            yield
        except BaseException:
            with contextlib.suppress(psycopg.Error):
                await self._settle(report)
            raise
        await self._settle(report)

    async def _settle(self, report: Callable[[list[Done]], None]) -> None:
        if self.pending and self.ledger is not None:
            await self.conn.execute(durable_point(), self.ledger)
        self._durable()
        report(self._release())

    def _release(self) -> list[Done]:
        held, self._held = self._held, []
        return held

    def _durable(self) -> None:
        self.pending = False
        self._durable_at = clock()
