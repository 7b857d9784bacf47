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

The count and the drop go on a second connection from the target's pool when one comes while
the detaches run (`Beside`): the table's own connection then sweeps the edge partition while
they run, rather than after (the drop is the longest step: 66-73 ms for ten 17 MB partitions
by hand, bench case 6). The transaction is the same one; a partition detached stays counted and
dropped once.

PostgreSQL refuses `CONCURRENTLY` while the table has a DEFAULT partition: then the detach is
plain (ACCESS EXCLUSIVE on the table, for as long as the count takes), in the same transaction
as the count, the drop and the ledger, under the same short lock_timeout, tried a few times.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from psycopg import AsyncConnection, errors, sql

from activities.engine.access import ConnectionSource
from activities.engine.batch_sql import local_timeouts
from activities.engine.context import SweepContext
from activities.engine.ledger import add_partitions, count_partition, mark_key, marked
from activities.engine.partitions import Layout
from activities.engine.pipelines import settled_pipeline
from activities.engine.rules import ident
from activities.progress import SweepStats
from purge_config.names import TableName

#: A plain detach (a DEFAULT partition forbids CONCURRENTLY) waits at most lock_timeout for
#: its ACCESS EXCLUSIVE lock; it is tried this many times, PLAIN_PAUSE_S times the try's number
#: apart (0.5 s, then 1 s), before the attempt fails and Temporal retries it.
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
        children = {child.oid for child in layout.children}
        async with self._session():
            for key, _, finished in await self._marks():
                if finished:
                    continue
                oid = marked(key)[0]
                cur = await self.conn.execute(relation_state(), {"oid": oid})
                row = await cur.fetchone()
                parent, pending = (row[2], bool(row[3])) if row else (None, False)
                if parent is not None and oid not in children:
                    # The marks are the target's: one of its other tables' partitions, still
                    # under that table, is finished in that table's own turn (PostgreSQL
                    # refuses to finalize it against this one).
                    continue
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
            await self.finish(ours, done)
        return done

    async def remove(self, layout: Layout, beside: ConnectionSource | None = None) -> Removal:
        """Detach every wholly expired partition (oldest first, by OID), then drop or move them
        all, counted, in one transaction: on a connection from `beside` when it gave one while
        the detaches ran (the removal's `dropping`, to be awaited), else on this one. With a
        DEFAULT partition (no CONCURRENTLY), each is detached plainly, counted and dropped in
        a transaction of its own, on this connection, until the budget ends."""
        out = Removal()
        done = out.done
        chosen = [(c.table, mark_key(self.ctx.target, c.oid, c.table)) for c in layout.expired]
        if not chosen:
            return out
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
                out.tables.append(table)
            return out
        if self.ledger is not None:
            # Every mark durable before the first detach, in one commit: a mark whose detach
            # never started is simply dropped by the next attempt's recover().
            await self.ledger.mark(self.conn, [key for _, key in chosen])
        # Asked for now, so that a connection the pool must open is opened while the detaches run.
        spare = Beside(beside, self.ctx) if beside is not None else None
        detached: list[tuple[TableName, str]] = []
        try:
            async with self._session():
                for table, key in chosen:
                    if self.ctx.out_of_time():
                        done.complete = False
                        break
                    await self.conn.execute(detach(layout.table, table, "CONCURRENTLY"))
                    detached.append((table, key))
        except BaseException:
            # Whatever stopped the detaches, those already out are dropped and counted now.
            handed = await self._hand_or_finish(spare, detached, done)
            if handed is not None:
                await handed
            raise
        out.tables = [table for table, _ in detached]
        out.dropping = await self._hand_or_finish(spare, detached, done)
        return out

    async def _hand_or_finish(
        self, spare: Beside | None, detached: list[tuple[TableName, str]], done: SweepStats
    ) -> asyncio.Task[SweepStats] | None:
        """`detached` handed to `spare` (the task counting and dropping them there), or, when
        it has no connection, counted and dropped on this one (None)."""
        handed = await spare.hand(detached) if spare is not None else None
        if handed is None and detached and not self.conn.broken:
            await self.finish(detached, done)
        return handed

    async def _plain(self, parent: TableName, table: TableName, key: str, done: SweepStats) -> None:
        for attempt in range(1, PLAIN_TRIES + 1):
            try:
                await self.finish([(table, key)], done, detach_from=parent)
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

    async def finish(
        self,
        tables: list[tuple[TableName, str]],
        done: SweepStats,
        detach_from: TableName | None = None,
    ) -> None:
        """Count, drop or move, and record in the ledger every one of `tables` (detached, with
        their marks): one transaction (pipelined: psycopg syncs after its BEGIN, its body and
        its COMMIT), so each count is added exactly once.
        With `detach_from`, a plain detach comes first in the same transaction."""
        counted = []
        total = None
        async with settled_pipeline(self.conn), self.conn.transaction():
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
            if self.ledger is not None:
                total = await self.conn.execute(
                    *add_partitions(self.ledger, [key for _, key in tables])
                )
        progress = self.ctx.progress
        if total is not None:
            row = await total.fetchone()
            # The ledger's total counts every batch committed before this transaction too
            # (the edge's, beside it, perhaps after it: the larger total is the later one).
            progress.removed = max(progress.removed, int(row[0]) if row else 0)
        for (table, _), cur in zip(tables, counted, strict=True):
            row = await cur.fetchone()
            rows = int(row[0]) if row else 0
            done.partitions.append(str(table))
            done.partition_rows += rows
            if total is None:
                progress.removed += rows
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


@dataclass
class Removal:
    """What `PartitionRemover.remove` did: `done` so far, the partitions it detached (`tables`)
    and, when their count and drop run on a connection beside the table's, that task."""

    done: SweepStats = field(default_factory=SweepStats)
    tables: list[TableName] = field(default_factory=list)
    dropping: asyncio.Task[SweepStats] | None = None

    async def dropped(self) -> SweepStats:
        """What the count and drop beside did, once finished (their failure raised here; empty
        when they ran on the table's connection, in `done`)."""
        if self.dropping is None:
            return SweepStats()
        task, self.dropping = self.dropping, None
        return await task


class Beside:
    """A connection asked of `source` when the detaches start, which counts and drops the
    partitions they detached if it came by the time they ended; if not, the request is
    withdrawn and the table's own connection does it (a pool that is all in use is never
    waited for)."""

    def __init__(self, source: ConnectionSource, ctx: SweepContext) -> None:
        self.ctx = ctx
        self._source = source
        self._ready = asyncio.Event()
        self._handed: asyncio.Future[list[tuple[TableName, str]]] = (
            asyncio.get_running_loop().create_future()
        )
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> SweepStats:
        async with self._source.connection() as conn:
            self._ready.set()
            tables = await self._handed
            done = SweepStats()
            if tables:
                await PartitionRemover(self.ctx, conn).finish(tables, done)
            return done

    async def hand(self, tables: list[tuple[TableName, str]]) -> asyncio.Task[SweepStats] | None:
        """The task counting and dropping `tables` beside, or None when no connection came (or
        there is nothing to hand): then they are the caller's to finish."""
        if tables and self._ready.is_set() and not self._task.done():
            self._handed.set_result(tables)
            return self._task
        # Nothing for it: a connection that comes after all goes straight back. Cancelling the
        # request alone is not enough: the pool may hand a connection over in the same step
        # and not raise the cancellation (seen: the task then waited here for ever).
        self._handed.set_result([])
        self._task.cancel()
        # Its connection back to the pool (or its request withdrawn) before going on; waited
        # for, not awaited, so that a cancellation of this sweep is never taken for the
        # request's. A request that failed (the pool could not connect) changes nothing: the
        # table's own connection finishes.
        await asyncio.wait([self._task])
        if not self._task.cancelled():
            self._task.exception()  # retrieved, so that asyncio does not log it as lost
        return None


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
