"""The built-in targets: tables with expiry rules, swept in batches through the worker's pool."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import replace
from typing import Any, Protocol

import psycopg
from psycopg import AsyncConnection, errors

from activities.engine.context import SweepContext, ignore_batch
from activities.engine.detaching import marked_done
from activities.engine.partitions import read_layout
from activities.engine.planning import TablePlan, plan_table, unindexed_children
from activities.engine.rights import check_partitions
from activities.engine.rules import Predicate, Rule, ident
from activities.engine.statements import (
    count_expired,
    count_expired_and_all,
    count_rows,
    local_bounds,
    lock_table,
    unlock_tables,
)
from activities.engine.tables import TableSweeper
from activities.engine.units import check_unit
from activities.engine.upkeep import (
    analyze_after,
    leftover,
    open_ledger,
    partition_advice,
    vacuum_advice,
)
from activities.errors import BadPurgeTarget
from activities.progress import LedgerKey, OnBatch, Progress, SweepStats
from purge_config.settings import Guards, PartitionPolicy, SweepSettings


class ConnectionSource(Protocol):
    """Where a target's connections come from: a psycopg pool, or a lazily opened one."""

    def connection(self) -> AbstractAsyncContextManager[AsyncConnection[Any]]: ...


class SqlTarget:
    """A target made of tables, each with the rule that says which of its rows are expired."""

    def __init__(
        self,
        name: str,
        pool: ConnectionSource,
        rules: list[Rule],
        settings: SweepSettings | None = None,
        guards: Guards | None = None,
        partitions: PartitionPolicy | None = None,
    ) -> None:
        self._name = name
        self._pool = pool
        self.rules = rules
        self.settings = settings or SweepSettings()
        self.guards = guards or Guards()
        self.partitions = partitions or PartitionPolicy()

    @property
    def name(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"SqlTarget({self._name!r}, tables={[str(r.table) for r in self.rules]})"

    async def purge_expired(self, now_ms: int) -> int:
        """Delete every row the rules call expired at `now_ms` (within the time budget)."""
        return (await self.sweep(now_ms)).removed

    async def sweep(
        self,
        now_ms: int,
        resume: Progress | None = None,
        on_batch: OnBatch | None = None,
        ledger: LedgerKey | None = None,
        budget_ms: int | None = None,
    ) -> SweepStats:
        """Sweep every table in batches, starting where `resume` (a previous attempt's last
        heartbeat) says; `on_batch` is called with the progress after every batch. The sweep
        ends at its time budget, or at `budget_ms` (what is left of the pass's) if sooner.

        Each table is swept under an advisory lock on it, so no two sweeps of one table run at
        once, from whatever pass; a table another sweep holds for longer than `busy_wait` ends
        the sweep with `busy` set.

        With `ledger`, every batch also adds its count to `purge_progress` in its own
        transaction, and the count starts from what the ledger holds: exact, whatever an earlier
        attempt's worker did before it died. Without the table, counts come from `resume`.
        """
        progress = resume or Progress()
        stats = SweepStats()
        if ledger is not None:
            async with self._pool.connection() as conn:
                counted = await open_ledger(conn, ledger, self.settings)
            if counted is not None:
                progress.removed, stats.ledger, stats.ledger_start = counted, True, counted
        budget = min(self.settings.time_budget_ms, budget_ms or self.settings.time_budget_ms)
        ctx = SweepContext(
            target=self._name,
            now_ms=now_ms,
            settings=self.settings,
            partitions=self.partitions,
            progress=progress,
            on_batch=on_batch or ignore_batch,
            deadline=SweepContext.deadline_in(budget),
            ledger=ledger.params() if stats.ledger and ledger else None,
        )
        # One table checks itself once locked; several are all checked before the first delete:
        # a target refused for its second table (a column in the wrong unit, rights its
        # partitions need) must not have swept its first.
        several = len(self.rules) > 1
        if several:
            await self._check_tables(now_ms, stats, self.rules[progress.table :])
        for index, rule in enumerate(self.rules):
            if index < progress.table:
                continue  # finished by an earlier attempt
            if index > progress.table:
                progress.table, progress.page, progress.leaf = index, 0, 0
            async with self._connection(rule) as conn:
                pred, plan = await self._prepare(conn, rule, now_ms)
                if plan.pages == 0 and not plan.partitioned:
                    # Not a page (pg_relation_size is exact): nothing to delete, so nothing to
                    # lock, walk or read after. Most of a fleet's tables on most passes.
                    stats.merge(
                        SweepStats(
                            strategies=[plan.strategy], advice=[plan.advice] if plan.advice else []
                        )
                    )
                    continue
                if not await self._lock(conn, pred):
                    stats.busy = (
                        f"another sweep held {rule.table} for longer than "
                        f"{self.settings.busy_wait_ms} ms; the next pass sweeps it"
                    )
                    break
                try:
                    table = await TableSweeper(ctx, conn).sweep(pred, plan, check=not several)
                    stats.merge(await self._after(conn, pred, plan, table, now_ms))
                finally:
                    await _unlock(conn)
            stats.merge(table)
            if not table.complete:
                break  # out of time: the tables after this one wait for the next pass
        stats.removed = progress.removed
        # With an archive on every table, every row removed was archived: the ledger's exact
        # count says both. Otherwise the archived tables' share comes from the heartbeats.
        archives_all = all(rule.archive is not None for rule in self.rules)
        stats.archived = progress.removed if archives_all else progress.archived
        await self._partitions_gone(progress, stats, ctx.ledger)
        return stats

    async def _check_tables(self, now_ms: int, stats: SweepStats, rules: list[Rule]) -> None:
        """Before anything is deleted: each table's epoch columns in their unit; and with
        `partitions` set to drop or detach, refuse a role that could not finish what it starts
        (BadPurgeTarget), and say where the setting can do nothing (a plain table, another key,
        a rule that is not one column's comparison)."""
        for rule in rules:
            async with self._connection(rule) as conn, conn.transaction():
                await self._bound(conn, self.settings.statement_timeout_ms)
                pred = await self._bind(conn, rule, now_ms)
                if not self.partitions.removes:
                    continue
                layout = await read_layout(conn, pred)
                inert = await check_partitions(conn, pred, layout, self.partitions)
            if inert:
                stats.advice.append(inert)

    async def _partitions_gone(
        self, progress: Progress, stats: SweepStats, ledger: dict[str, object] | None
    ) -> None:
        """The partitions this pass took out, by every attempt: from the ledger's marks when
        there is one (exact), else from the heartbeats this attempt resumed from."""
        if not self.partitions.removes:
            return
        names, rows = progress.partition_names, progress.partition_rows
        if ledger is not None:
            async with self._pool.connection() as conn:
                names, rows = await marked_done(conn, ledger)
        stats.partitions, stats.partition_rows = list(names), rows
        if names:
            stats.partition_action = "dropped" if self.partitions.mode == "drop" else "detached"

    async def _after(
        self,
        conn: AsyncConnection[Any],
        pred: Predicate,
        plan: TablePlan,
        table: SweepStats,
        now_ms: int,
    ) -> SweepStats:
        """What the table's sweep left, the advice it calls for and, if set, its ANALYZE."""
        left = await leftover(conn, pred, now_ms, table.complete)
        after = SweepStats(
            oldest_expired_age_ms=left.oldest_age_ms, live_rows=left.live, dead_rows=left.dead
        )
        if self.settings.analyze_after:
            analyzed, warning = await analyze_after(
                conn, pred, table.removed, left, self.settings.statement_timeout_ms
            )
            after.analyzed = analyzed
            after.advice += [warning] if warning else []
        for advice in (
            vacuum_advice(pred, table.removed, left),
            await partition_advice(conn, pred, plan, table.removed, left),
        ):
            if advice:
                after.advice.append(advice)
        return after

    async def count_expired(self, now_ms: int) -> int:
        """How many rows `purge_expired(now_ms)` would delete now, deleting none."""
        return (await self.measure(now_ms, total=False))[0]

    async def measure(self, now_ms: int, total: bool = True) -> tuple[int, int]:
        """(expired rows, all rows) over the target's tables, counted exactly in one read of
        each table; all rows is 0 unless asked for."""
        expired = everything = 0
        for rule in self.rules:
            async with self._connection(rule) as conn, conn.transaction():
                # A count reads what a whole sweep would: give it the sweep's time budget.
                await self._bound(conn, self.settings.time_budget_ms)
                pred = await self._bind(conn, rule, now_ms)
                query = count_expired_and_all(pred) if total else count_expired(pred)
                cur = await conn.execute(query, pred.params)
                row = await cur.fetchone()
                if row:
                    expired += int(row[0])
                    everything += int(row[1]) if total else 0
        return expired, everything

    async def preview(self, now_ms: int) -> SweepStats:
        """What a sweep at `now_ms` would remove, changing nothing: every expired row (those of
        whole partitions included), and the partitions that would leave whole, with their rows.
        """
        stats = SweepStats()
        await self._check_tables(now_ms, stats, self.rules)
        for rule in self.rules:
            async with self._connection(rule) as conn, conn.transaction():
                await self._bound(conn, self.settings.time_budget_ms)
                pred = await self._bind(conn, rule, now_ms)
                cur = await conn.execute(count_expired(pred), pred.params)
                row = await cur.fetchone()
                stats.removed += int(row[0]) if row else 0
                layout = await read_layout(conn, pred) if self.partitions.removes else None
                for child in layout.expired if layout is not None and layout.judged else []:
                    cur = await conn.execute(count_rows(child.table))
                    row = await cur.fetchone()
                    stats.partitions.append(str(child.table))
                    stats.partition_rows += int(row[0]) if row else 0
        if stats.partitions:
            stats.partition_action = "dropped" if self.partitions.mode == "drop" else "detached"
        return stats

    async def _prepare(
        self, conn: AsyncConnection[Any], rule: Rule, now_ms: int
    ) -> tuple[Predicate, TablePlan]:
        async with conn.transaction():
            await self._bound(conn, self.settings.statement_timeout_ms)
            pred = await self._bind(conn, rule, now_ms)
            plan = await plan_table(conn, pred)
            children = await unindexed_children(conn, pred)
        if children and self.settings.refuse_unindexed_children:
            raise BadPurgeTarget(f"{children}; refuse_unindexed_children is set: nothing deleted")
        if children:
            plan = replace(plan, advice=" ".join(filter(None, (plan.advice, children))))
        return pred, plan

    async def _bind(self, conn: AsyncConnection[Any], rule: Rule, now_ms: int) -> Predicate:
        """The rule bound to its table, its epoch columns checked for a wrong unit."""
        pred = await rule.bind(conn, now_ms)
        for column, unit in pred.epoch_columns:
            await check_unit(conn, pred.table, column, unit)
        return pred

    async def _lock(self, conn: AsyncConnection[Any], pred: Predicate) -> bool:
        """Take this table's advisory lock, waiting up to busy_wait; False if it stayed taken."""
        rel = {"rel": ident(pred.table).as_string(conn)}
        try:
            # One round trip: pipelined up to one Sync, the bound and the lock are one implicit
            # transaction. The lock is the session's: it outlives that transaction.
            async with conn.pipeline():
                await conn.execute(
                    local_bounds(),
                    (self.settings.busy_wait_ms or 1, self.settings.busy_wait_ms + 1000),
                )
                await conn.execute(lock_table(), rel)
        except errors.LockNotAvailable:
            return False
        return True

    async def _bound(self, conn: AsyncConnection[Any], statement_timeout_ms: int) -> None:
        # Local to this transaction: the bounds never leak to the pool.
        await conn.execute(local_bounds(), (self.settings.lock_timeout_ms, statement_timeout_ms))

    @asynccontextmanager
    async def _connection(self, rule: Rule) -> AsyncIterator[AsyncConnection[Any]]:
        """A pooled connection for one table, with its configuration faults made non-retryable."""
        async with self._pool.connection() as conn:
            try:
                yield conn
            except (errors.UndefinedTable, errors.UndefinedColumn) as err:
                # The table changed between the catalog check and a statement.
                raise BadPurgeTarget(f"table {rule.table}: {_first_line(err)}") from err
            except errors.UniqueViolation as err:
                if rule.archive is None:
                    raise
                # Only the archive's INSERT can raise it; every retry would meet the same row.
                # Not the server's DETAIL: it shows the key's value (a session token, say),
                # which must stay out of the history and the logs.
                raise BadPurgeTarget(
                    f"table {rule.table}: archive {rule.archive} already holds a row with the "
                    f"key of one being archived ({_first_line(err)}); a key archived before and "
                    "written again since? nothing moved"
                ) from err
            except errors.InsufficientPrivilege as err:
                raise BadPurgeTarget(
                    f"table {rule.table}: {_first_line(err)}; the worker's role needs "
                    "SELECT and DELETE on it"
                ) from err


async def _unlock(conn: AsyncConnection[Any]) -> None:
    """Release the table's lock before the connection goes back to the pool. A connection
    that broke mid-sweep lost its locks with its session (the pool discards it)."""
    with contextlib.suppress(psycopg.Error):
        await conn.execute(unlock_tables())


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
