"""Taking a table's wholly expired partitions out of it: detached, counted, then dropped or
moved to `detached_schema`.

A partition is detached with `DETACH PARTITION ... CONCURRENTLY`, which takes only SHARE UPDATE
EXCLUSIVE on the table (writers go on) and runs as two transactions of its own, outside any
transaction block. Its rows are then counted and it is dropped (or moved) in one transaction
that also adds the count to the ledger (`purge_progress`), so the count is exact and recorded
once, whatever dies. Before the detach starts, a mark in the ledger names the partition: a
retry after a death between the detach's two phases finds it half-detached and completes it
(`FINALIZE`), and after a death between the detach and the drop finds it standalone and drops
it, counted once.

PostgreSQL refuses `CONCURRENTLY` while the table has a DEFAULT partition: then the detach is
plain (ACCESS EXCLUSIVE on the table, for as long as the count takes), in the same transaction
as the count, the drop and the ledger, under the same short lock_timeout, tried a few times.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from psycopg import AsyncConnection, errors, sql

from activities.engine.batch_sql import local_timeouts
from activities.engine.context import SweepContext
from activities.engine.ledger import count_partition, mark_key, marked
from activities.engine.partitions import Layout
from activities.engine.rules import ident
from activities.progress import SweepStats
from purge_config.names import TableName

#: A plain detach (a DEFAULT partition forbids CONCURRENTLY) waits at most lock_timeout for
#: its ACCESS EXCLUSIVE lock; it is tried this many times, this far apart, before the attempt
#: fails and Temporal retries it.
PLAIN_TRIES = 3
PLAIN_PAUSE_S = 0.5


class PartitionRemover:
    """Takes one table's wholly expired partitions out, on the connection that holds the
    table's advisory lock (never inside a transaction between statements).

    What each step did comes back as `SweepStats`: the partitions out (`partitions`, their
    `partition_rows`), what the report must say (`advice`: a plain detach, a detach finalized
    that this pass did not start), and `complete` False when the time budget ended it before
    every expired partition was out."""

    def __init__(self, ctx: SweepContext, conn: AsyncConnection[Any]) -> None:
        self.ctx = ctx
        self.conn = conn
        self.settings = ctx.settings
        self.policy = ctx.partitions
        self.ledger = ctx.ledger

    async def recover(self, layout: Layout) -> SweepStats:
        """Finish what an earlier attempt of this pass left under way (its marks), then every
        detach left half-done on the table, whoever started it: none stays pending."""
        done = SweepStats()
        ours: list[tuple[TableName, str]] = []
        async with self._session():
            for key, _, finished in await self._marks():
                if finished:
                    continue
                cur = await self.conn.execute(relation_state(), {"oid": marked(key)[0]})
                row = await cur.fetchone()
                parent, pending = (row[2], bool(row[3])) if row else (None, False)
                if row is None or (parent is not None and not pending):
                    # Gone (never ours to finish), or its detach never started: the mark goes,
                    # and the partition, if still expired, is judged again with the others.
                    await self._unmark(key)
                    continue
                table = TableName(row[1], row[0])
                if parent is not None:
                    await self.conn.execute(detach(layout.table, table, "FINALIZE"))
                ours.append((table, key))
            mine = {t for t, _ in ours}
            for child in layout.pending:
                if child.table in mine:
                    continue
                # Not started by this pass (another tool's, or ours without a ledger to say
                # so): completed, never dropped, since nothing says its rows were meant to go.
                await self.conn.execute(detach(layout.table, child.table, "FINALIZE"))
                done.advice.append(
                    f"{layout.table}: completed the interrupted detach of {child.table} (DETACH "
                    "PARTITION ... FINALIZE), which this pass had not started; it is now a table "
                    "of its own, left as it is"
                )
        if ours:
            await self._finish(ours, done)
        return done

    async def remove(self, layout: Layout) -> SweepStats:
        """Detach every wholly expired partition (oldest first, by OID), then drop or move them
        all, counted, in one transaction."""
        done = SweepStats()
        chosen = [(c.table, mark_key(self.ctx.target, c.oid, c.table)) for c in layout.expired]
        if not chosen:
            return done
        if layout.has_default:
            done.advice.append(
                f"{layout.table} has a DEFAULT partition, so PostgreSQL refuses DETACH ... "
                "CONCURRENTLY: its expired partitions were detached plainly, each holding ACCESS "
                f"EXCLUSIVE on {layout.table} (waiting at most lock_timeout "
                f"{self.settings.lock_timeout_ms} ms) while its rows were counted; move the "
                "DEFAULT partition's rows into ranges and drop it to detach without blocking"
            )
            for table, key in chosen:
                if self.ctx.out_of_time():
                    done.complete = False
                    break
                await self._plain(layout.table, table, key, done)
            return done
        if self.ledger is not None:
            # Every mark durable before the first detach, in one commit: a mark whose detach
            # never started is simply dropped by the next attempt's recover().
            await self.ledger.mark(self.conn, [key for _, key in chosen])
        detached: list[tuple[TableName, str]] = []
        try:
            async with self._session():
                for table, key in chosen:
                    if self.ctx.out_of_time():
                        done.complete = False
                        break
                    await self.conn.execute(detach(layout.table, table, "CONCURRENTLY"))
                    detached.append((table, key))
        finally:
            if detached and not self.conn.broken:
                # Whatever stopped the detaches, those already out are dropped and counted now.
                await self._finish(detached, done)
        return done

    async def _plain(self, parent: TableName, table: TableName, key: str, done: SweepStats) -> None:
        for attempt in range(1, PLAIN_TRIES + 1):
            try:
                await self._finish([(table, key)], done, detach_from=parent)
                return
            except errors.LockNotAvailable:
                if attempt == PLAIN_TRIES:
                    raise  # Temporal retries the target; nothing was detached
                await asyncio.sleep(PLAIN_PAUSE_S * attempt)

    @asynccontextmanager
    async def _session(self) -> AsyncIterator[None]:
        """Lock and statement timeouts for this session, for the concurrent detaches and their
        FINALIZE (which run outside any transaction block), reset before the connection is used
        for anything else."""
        await self.conn.execute(
            session_timeouts(), (self.settings.lock_timeout_ms, self.settings.statement_timeout_ms)
        )
        try:
            yield
        finally:
            if not self.conn.broken:  # a broken one leaves the pool with its session
                await self.conn.execute(session_reset())

    async def _finish(
        self,
        tables: list[tuple[TableName, str]],
        done: SweepStats,
        detach_from: TableName | None = None,
    ) -> None:
        """Count, drop or move, and record in the ledger every one of `tables` (detached, with
        their marks): one transaction, one round trip, so each count is added exactly once.
        With `detach_from`, a plain detach comes first in the same transaction."""
        counted = []
        async with self.conn.pipeline(), self.conn.transaction():
            # The counts read whole partitions: give them the sweep's time budget.
            await self.conn.execute(
                local_timeouts(), (self.settings.lock_timeout_ms, self.settings.time_budget_ms)
            )
            for table, key in tables:
                if detach_from is not None:
                    await self.conn.execute(detach(detach_from, table, ""))
                cur = await self.conn.execute(*count_partition(table, self.ledger, key))
                counted.append(cur)
                if self.policy.mode == "drop":
                    await self.conn.execute(drop_table(table))
                elif table.schema != self.policy.detached_schema:
                    await self.conn.execute(move_table(table, self.policy.detached_schema))
        progress = self.ctx.progress
        for (table, _), cur in zip(tables, counted, strict=True):
            row = await cur.fetchone()
            rows = int(row[0]) if row else 0
            total = int(row[1]) if row and row[1] is not None else None
            done.partitions.append(str(table))
            done.partition_rows += rows
            progress.removed = total if total is not None else progress.removed + rows
            progress.partition_rows += rows
            progress.partition_names.append(str(table))
            progress.batch_removed = rows
            progress.partition = str(table)
            self.ctx.on_batch(progress)
        progress.partition = ""

    async def _marks(self) -> list[tuple[str, int, int]]:
        return await self.ledger.marks(self.conn) if self.ledger is not None else []

    async def _unmark(self, key: str) -> None:
        if self.ledger is not None:
            await self.ledger.unmark(self.conn, key)


# Taking a partition out: session timeouts for what runs outside a transaction block, the DDL,
# and the state of a partition an earlier attempt marked.


def session_timeouts() -> sql.SQL:
    """Lock and statement timeouts (ms) for this session, not a transaction: a `DETACH ...
    CONCURRENTLY` runs outside any transaction block. Undone by `session_reset`."""
    return sql.SQL(
        "SELECT set_config('lock_timeout', %s::text, false),"
        " set_config('statement_timeout', %s::text, false)"
    )


def session_reset() -> sql.SQL:
    """The server's own timeouts again, before the connection goes back to the pool."""
    return sql.SQL("RESET lock_timeout; RESET statement_timeout")


def detach(parent: TableName, child: TableName, how: str) -> sql.Composed:
    """`ALTER TABLE parent DETACH PARTITION child` and `how`: `CONCURRENTLY` (two transactions
    of its own, SHARE UPDATE EXCLUSIVE on the parent), `FINALIZE` (completes one that was
    interrupted between them), or `` (plain, ACCESS EXCLUSIVE, inside a transaction)."""
    suffix = {"CONCURRENTLY": " CONCURRENTLY", "FINALIZE": " FINALIZE", "": ""}[how]
    return sql.SQL("ALTER TABLE {} DETACH PARTITION {}" + suffix).format(
        ident(parent), ident(child)
    )


def drop_table(table: TableName) -> sql.Composed:
    return sql.SQL("DROP TABLE {}").format(ident(table))


def move_table(table: TableName, schema: str) -> sql.Composed:
    return sql.SQL("ALTER TABLE {} SET SCHEMA {}").format(ident(table), sql.Identifier(schema))


def relation_state() -> sql.SQL:
    """One row for the relation of OID `%(oid)s`, none if it is gone: schema, name, the OID of
    the table it is a partition of (NULL when standalone), and whether half-detached."""
    return sql.SQL(
        "SELECT n.nspname::text, c.relname::text, i.inhparent::bigint, i.inhdetachpending"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " LEFT JOIN pg_inherits i ON i.inhrelid = c.oid WHERE c.oid = %(oid)s::bigint::oid"
    )
