"""A target's tables swept in turn: table after table, each under its advisory lock, from where
the progress says, until done, out of time, or at a table another sweep holds. One call is one
run of the target (an activity attempt, for the caller; the engine knows no Temporal)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from psycopg import AsyncConnection

from activities.engine.access import TableAccess, unlock_tables
from activities.engine.context import SweepContext, partition_action
from activities.engine.ledger import LEDGER_GONE, Opened
from activities.engine.leftover import (
    Leftover,
    analyze_after,
    flush_views,
    judged,
    leftover,
    vacuum_advice,
)
from activities.engine.partition_advice import (
    SharePass,
    pass_advice,
    record_share,
    record_share_with_tuples,
    remembered_advice,
)
from activities.engine.planning import TablePlan
from activities.engine.rules import Predicate, Rule, table_names, written_column_advice
from activities.engine.small_tables import SMALL_PAGES, SmallSweep, SmallTables, sweep_small
from activities.engine.tables import TableSweeper
from activities.progress import SweepStats


class TargetSweeper:
    """Sweeps a target's tables, in order, through its `TableAccess`; with `small`, a target
    of one small table in one statement first (`small_tables`)."""

    def __init__(
        self, access: TableAccess, rules: list[Rule], small: SmallTables | None = None
    ) -> None:
        self.access = access
        self.rules = rules
        self.settings = access.settings
        self.partitions = access.partitions
        self.small = small
        self.names = table_names(rules)
        """The tables as heartbeated, for a retry to tell whether it resumes on the same list
        (`Progress.start_over_unless_on`, asked where the activity resumes)."""

    async def sweep(self, ctx: SweepContext) -> SweepStats:
        """What this attempt did; its `removed` (and `archived`, and the partitions) count
        every attempt of the pass, as the ledger (or the progress) holds them."""
        small = await self._small(ctx)
        if small is not None and not small.more:
            stats = small.stats
            stats.ledger, stats.ledger_start = small.ledger, small.ledger_start
            await self._totals(ctx, stats)
            return stats
        progress = ctx.progress
        # A target of one table opens the ledger on that table's own connection, with its plan
        # (`_prepare`): one pool checkout fewer, and, on a worker that has opened it before, no
        # round trip of its own. Several tables open it on a connection of its own, before the
        # first table's.
        several = len(self.rules) > 1
        alone = not several and not progress.table
        stats = SweepStats()
        if not alone:
            ctx, stats = await self._open_ledger(ctx)
            self._resumed(small, stats)
        # One table checks itself once locked; several are all checked before the first delete:
        # a target refused for its second table (a column in the wrong unit, rights its
        # partitions or its DELETE need, inheritance children, an unindexed child table with
        # refuse_unindexed_children) must not have swept its first.
        if several:
            stats.advice += await self.access.check(
                self.rules[progress.table :], ctx.now_ms, sweeping=True
            )
        for index, rule in enumerate(self.rules):
            if index < progress.table:
                continue  # finished by an earlier attempt
            if index > progress.table:
                progress.table, progress.page, progress.leaf = index, 0, 0
            progress.tables = self.names
            async with self.access.pool.connection() as conn:
                ctx, opened, table = await self._table(ctx, rule, not several, conn, alone)
            if opened is not None:
                stats = opened
                self._resumed(small, stats)
            stats.merge(table)
            if table.busy or not table.complete:
                break  # held by another sweep, or out of time: the rest wait for the next pass
        await self._totals(ctx, stats)
        return stats

    @staticmethod
    def _resumed(small: SmallSweep | None, stats: SweepStats) -> None:
        """After the ledger is open: what the one statement of `_small` did, when it found a
        batch's worth and the batched sweep goes on (the ledger's count before this attempt
        is what it was before that statement)."""
        if small is not None:
            stats.ledger_start = small.ledger_start if stats.ledger else 0
            stats.merge(small.stats)

    async def _small(self, ctx: SweepContext) -> SmallSweep | None:
        """A target of one table, small, swept in one statement (`small_tables`); None when the
        target, its settings or where an earlier attempt stopped call for the batched sweep
        (pacing waits between batches, partitions may leave whole), or the table is not small."""
        progress, settings = ctx.progress, self.settings
        if (
            self.small is None
            or len(self.rules) != 1
            or self.partitions.removes
            or settings.max_replica_lag_ms is not None
            or settings.max_wal_rate
            or progress.page
            or progress.leaf
        ):
            return None
        return await sweep_small(self.access, self.rules[0], ctx, self.small)

    async def _table(
        self,
        ctx: SweepContext,
        rule: Rule,
        check: bool,
        conn: AsyncConnection[Any],
        open_ledger: bool = False,
    ) -> tuple[SweepContext, SweepStats | None, SweepStats]:
        """One table swept on `conn` under its advisory lock, with what it left (`busy` set,
        and nothing swept, when another sweep held the lock for longer than busy_wait). With
        `open_ledger`, the pass's ledger is opened on `conn` first (`_prepare`): the context
        and the ledger's figures (`_open_ledger`'s) come back beside the table's."""
        ctx, opened, prepared = await self._prepare(ctx, rule, conn, open_ledger)
        async with self.access.faults(rule):
            return ctx, opened, await self._swept(ctx, rule, check, conn, *prepared)

    async def _prepare(
        self, ctx: SweepContext, rule: Rule, conn: AsyncConnection[Any], open_ledger: bool
    ) -> tuple[SweepContext, SweepStats | None, tuple[Predicate, TablePlan, bool]]:
        """The table's plan (`TableAccess.prepare`, its faults the table's: `faults`), after
        the pass's ledger opened on `conn` when `open_ledger` (its faults its own). Where this
        worker has opened the ledger through these settings before, its open rides in the
        plan's first round trip (`Ledger.ahead`); if it fails there (the ledger, or the table,
        dropped or out of reach since), both go again step by step, each with its own faults."""
        ledger = ctx.ledger if open_ledger else None
        ahead = ledger.ahead(conn, self.settings) if ledger is not None else None
        if ahead is not None:
            async with self.access.faults(rule):
                try:
                    prepared = await self.access.prepare(conn, rule, ctx.now_ms, ahead)
                except LEDGER_GONE:
                    # The ledger's, or the table's own (it is raised again below, as its own).
                    ahead.forget()
                    prepared = None
            if prepared is not None:
                try:
                    # None when the tables changed since (the check said so): opened step by
                    # step then, the plan and the lock kept.
                    found = await ahead.opened()
                    ctx, opened = await self._open_ledger(ctx, conn, found)
                except BaseException:
                    if prepared[2]:
                        await self.access.unlock(conn)
                    raise
                return ctx, opened, prepared
        stats = None
        if open_ledger:
            ctx, stats = await self._open_ledger(ctx, conn)
        async with self.access.faults(rule):
            return ctx, stats, await self.access.prepare(conn, rule, ctx.now_ms)

    async def _swept(
        self,
        ctx: SweepContext,
        rule: Rule,
        check: bool,
        conn: AsyncConnection[Any],
        pred: Predicate,
        plan: TablePlan,
        locked: bool,
    ) -> SweepStats:
        """`_table` once the table is planned (and, if `locked`, its lock held: released here
        on every way out but the share record's, which releases it itself)."""
        unlocked = False
        try:
            if self.small is not None:
                small = plan.pages <= SMALL_PAGES and not plan.partitioned and not plan.referenced
                self.small.saw(rule.table, small)
            if plan.pages == 0 and not plan.partitioned:
                return _nothing_to_sweep(plan)
            if not locked:
                # Held by another sweep (or grown from empty since): wait up to busy_wait.
                if not await self.access.lock(conn, pred):
                    return SweepStats(busy=_held(rule, self.settings.busy_wait_ms))
                locked = True
            sweeper = TableSweeper(ctx, conn, beside=self.access.pool)
            table = await sweeper.sweep(pred, plan, check=check)
            after, unlocked = await self._after(conn, pred, plan, table, ctx, sweeper.flushed)
        finally:
            if locked and not unlocked:
                await self.access.unlock(conn)
        return after.merge(table)

    async def _open_ledger(
        self,
        ctx: SweepContext,
        conn: AsyncConnection[Any] | None = None,
        opened: Opened | None = None,
    ) -> tuple[SweepContext, SweepStats]:
        """With a ledger key, the count so far from `purge_progress` (exact, whatever an earlier
        attempt's worker did before it died), read on `conn` or else on a connection of its
        own (or, `opened`, read already); without the table, the context without the key
        (counts come from the progress resumed)."""
        if ctx.ledger is None:
            return ctx, SweepStats()
        if opened is None and conn is not None:
            opened = await ctx.ledger.open(conn, self.settings)
        elif opened is None:
            async with self.access.pool.connection() as own:
                opened = await ctx.ledger.open(own, self.settings)
        ctx = replace(ctx, remember=opened.shares)
        if opened.counted is None:
            return replace(ctx, ledger=None), SweepStats()
        ctx.progress.removed = opened.counted
        return ctx, SweepStats(ledger=True, ledger_start=opened.counted)

    async def _totals(self, ctx: SweepContext, stats: SweepStats) -> None:
        """The counts of every attempt of the pass, from the progress (or the ledger)."""
        progress = ctx.progress
        stats.removed = progress.removed
        # With an archive on every table, every row removed was archived: the ledger's exact
        # count says both. Otherwise the archived tables' share comes from the heartbeats.
        archives_all = all(rule.archive is not None for rule in self.rules)
        stats.archived = progress.removed if archives_all else progress.archived
        await self._partitions_gone(ctx, stats)
        # Every pass of a rule that reads a write time as an expiry says so first (one of
        # several tables said it already, from its check), whichever way its table was swept.
        written = [w for w in map(written_column_advice, self.rules) if w]
        stats.advice[:0] = [w for w in written if w not in stats.advice]

    async def _after(
        self,
        conn: AsyncConnection[Any],
        pred: Predicate,
        plan: TablePlan,
        table: SweepStats,
        ctx: SweepContext,
        flushed: bool,
    ) -> tuple[SweepStats, bool]:
        """What the table's sweep left, the advice it calls for and, if set, its ANALYZE; and
        whether the table's lock was released with the day's record of its share, the last
        statement (one round trip fewer than an unlock of its own). `flushed`: the sweep's
        last batch flushed the session's statistics."""
        left: Leftover | None = None
        passes: list[SharePass] | None = None  # the day's, once recorded
        unlocked = False
        if self._records_with_tuples(pred, plan, table, ctx):
            await flush_views(conn, flushed)
            flushed = True
            quick = await record_share_with_tuples(
                conn, ctx.target, pred, ctx.now_ms, table.removed, then=unlock_tables()
            )
            if quick is None:
                # Not made (as `record_share` gives up): the advice waits, the views are read
                # on their own, and the unlock follows the sweep.
                passes = []
            else:
                unlocked, passes = True, quick.passes
                left = await judged(conn, pred, 0, table.removed, quick.tuples)
        if left is None:
            left = await leftover(conn, pred, ctx.now_ms, table.complete, table.removed, flushed)
        after = SweepStats(
            oldest_expired_age_ms=left.oldest_age_ms,
            live_rows=left.live,
            dead_rows=left.dead,
            live_from=left.live_from,
        )
        if self.settings.analyze_after:
            analyzed, warning = await analyze_after(
                conn, pred, table.removed, left, self.settings.statement_timeout_ms
            )
            after.analyzed = analyzed
            after.advice += [warning] if warning else []
        partition = await pass_advice(conn, pred, plan, table.removed, left)
        # A day's passes remember what each removed of the table: never a share no one knows.
        remember = ctx.remember and left.live_from != "unknown"
        if not partition and remember and pred.range_key and not plan.partitioned:
            # One pass's evidence said nothing: the day's passes may.
            if passes is None:
                passes, ran = await record_share(
                    conn,
                    ctx.target,
                    str(pred.table),
                    ctx.now_ms,
                    table.removed,
                    left.live,
                    then=None if unlocked else unlock_tables(),
                )
                unlocked = unlocked or ran
            column = pred.range_key.column
            partition = remembered_advice(ctx.target, str(pred.table), column, passes)
        for advice in (vacuum_advice(pred, table.removed, left), partition):
            if advice:
                after.advice.append(advice)
        return after, unlocked

    def _records_with_tuples(
        self, pred: Predicate, plan: TablePlan, table: SweepStats, ctx: SweepContext
    ) -> bool:
        """Whether the views' read of what the sweep left, the day's share record and the unlock
        go in one round trip (`record_share_with_tuples`): the sweep finished (no oldest expired
        row to look for), nothing runs between the read and the record (no ANALYZE), and the
        record is kept for the table. A pass that one pass's advice tells to partition is not
        recorded, there as step by step; its advice reads the table after the unlock."""
        return (
            table.complete
            and not self.settings.analyze_after
            and ctx.remember
            and pred.range_key is not None
            and not plan.partitioned
        )

    async def _partitions_gone(self, ctx: SweepContext, stats: SweepStats) -> None:
        """The partitions this pass took out, by every attempt: from the ledger's marks when
        there is one (exact), else from the heartbeats this attempt resumed from."""
        if not self.partitions.removes:
            return
        names, rows = ctx.progress.partition_names, ctx.progress.partition_rows
        if ctx.ledger is not None:
            async with self.access.pool.connection() as conn:
                names, rows = await ctx.ledger.marked_done(conn)
        stats.partitions, stats.partition_rows = list(names), rows
        if names:
            stats.partition_action = partition_action(self.partitions)


def _nothing_to_sweep(plan: TablePlan) -> SweepStats:
    # Not a page (pg_relation_size is exact): nothing to delete, so nothing to lock, walk or
    # read after. Most of a fleet's tables on most passes.
    return SweepStats(strategies=[plan.strategy], advice=[plan.advice] if plan.advice else [])


def _held(rule: Rule, busy_wait_ms: int) -> str:
    return (
        f"another sweep held {rule.table} for longer than {busy_wait_ms} ms; "
        "the next pass sweeps it"
    )
