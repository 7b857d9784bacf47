"""One table's sweep, once its advisory lock is held: for a partitioned table, first its wholly
expired partitions out whole (`partitions = "drop"` or `"detach"`), then the batched delete of
what is left, partition by partition (a ctid range means something only within one partition),
skipping partitions whose bounds hold no expired row. The partitions taken out are counted and
dropped on a second connection, when the pool has one, while that delete runs; the sweep ends
when both have.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from psycopg import AsyncConnection, errors

from activities.engine.access import ConnectionSource
from activities.engine.batch_sql import local_timeouts
from activities.engine.batching import BatchSweeper, count_left
from activities.engine.context import SweepContext
from activities.engine.detaching import PartitionRemover, Removal
from activities.engine.partition_checks import check_partitions
from activities.engine.partitions import Layout, Leaf, read_layout
from activities.engine.planning import TablePlan, plan_table
from activities.engine.rules import Predicate
from activities.progress import SweepStats


class TableSweeper:
    """Sweeps one table on the connection that holds its advisory lock: what it did in this
    attempt comes back as one `SweepStats` (its `removed` the batches' rows; the partitions
    that left whole, and their rows, beside them; `strategies` starting with `partitions`
    when any did, then each batched strategy used)."""

    def __init__(
        self,
        ctx: SweepContext,
        conn: AsyncConnection[Any],
        beside: ConnectionSource | None = None,
    ) -> None:
        """`beside`: where a second connection may come from, to count and drop detached
        partitions while this one sweeps the rest (`detaching.Beside`); None: all on `conn`."""
        self.ctx = ctx
        self.conn = conn
        self.settings = ctx.settings
        self.policy = ctx.partitions
        self.progress = ctx.progress
        self.remover = PartitionRemover(ctx, conn)
        self.beside = beside
        self.flushed = False
        """Whether the last batch run flushed the session's statistics (`BatchSweeper`)."""

    async def sweep(self, pred: Predicate, plan: TablePlan, check: bool) -> SweepStats:
        """With `check`, first what `check_partitions` says of this table (a target of one
        table is checked here, once its lock is held, before anything is detached)."""
        stats = SweepStats()
        # A plain table (the plan read its kind) has no partitions to read.
        layout = await read_layout(self.conn, pred) if plan.partitioned else None
        if check:
            inert = await check_partitions(self.conn, pred, layout, self.policy)
            if inert:
                stats.advice.append(inert)
        if layout is None or not layout.judged or not self.policy.removes:
            return await self._rest(pred, plan, layout, frozenset(), stats)
        layout, removal = await self._remove(pred, layout, stats)
        try:
            if not stats.complete:
                # Out of time with expired partitions still in: they wait for the next pass.
                stats.backlog, stats.backlog_estimated = await count_left(
                    self.conn, self.settings, pred, plan, 0
                )
                return stats
            # The detached partitions leave the layout now, while they are counted and dropped.
            names = {str(t) for t in removal.tables}
            gone = frozenset(c.oid for c in layout.children if str(c.table) in names)
            return await self._rest(pred, plan, layout, gone, stats)
        finally:
            # Their count and drop, if beside, finished before the sweep reports: what went
            # wrong there fails the sweep like anything on this connection.
            stats.merge(await removal.dropped())

    async def _rest(
        self,
        pred: Predicate,
        plan: TablePlan,
        layout: Layout | None,
        gone: frozenset[int],
        stats: SweepStats,
    ) -> SweepStats:
        """The batched delete of what partitions leaving whole did not take."""
        if layout is not None and layout.next_bound:
            stats.advice.append(_ahead_warning(pred, layout))
        leaves = layout.to_sweep(gone) if layout is not None else []
        if layout is None:
            await self._batches(pred, plan, stats)
        elif leaves and not all(leaf.direct for leaf in leaves):
            # Privileges on a partitioned table do not reach its partitions named directly:
            # sweep through the parent, as one table, and say what would let it do better.
            stats.advice.append(_grant_advice(pred, layout, leaves))
            if self.progress.leaf:
                self.progress.leaf, self.progress.page = 0, 0  # a position in one partition
            await self._batches(pred, replace(plan, partitioned=True), stats)
        else:
            if plan.children:
                stats.advice.append(plan.children)  # the whole table's, which no leaf's plan has
            await self._leaves(pred, plan, leaves, stats)
        return stats

    async def _remove(
        self, pred: Predicate, layout: Layout, stats: SweepStats
    ) -> tuple[Layout, Removal]:
        """Finish what an earlier attempt left, then take out every wholly expired partition:
        the layout, and the removal (its count and drop perhaps still under way beside)."""
        recovered = await self.remover.recover(layout)
        if recovered.partitions or recovered.advice or layout.pending:
            layout = await read_layout(self.conn, pred) or layout
        removal = await self.remover.remove(layout, self.beside)
        stats.merge(recovered.merge(removal.done))
        if recovered.partitions or removal.tables:
            stats.strategies.append("partitions")
        return layout, removal

    async def _leaves(
        self, pred: Predicate, plan: TablePlan, leaves: list[Leaf], stats: SweepStats
    ) -> None:
        """Each leaf on its own, by OID; a resumed attempt skips those an earlier one finished."""
        done = self.progress.leaf
        for leaf in leaves:
            if leaf.oid < done:
                continue
            if leaf.oid != done:
                self.progress.leaf, self.progress.page = leaf.oid, 0
            part = replace(pred, table=leaf.table)
            try:
                leaf_plan = await self._plan(part)
            except errors.UndefinedTable:
                continue  # dropped since the layout was read (by an operator): nothing to sweep
            await self._batches(part, leaf_plan, stats)
            if not stats.complete:
                # The budget ended inside this leaf; count what every leaf still holds.
                stats.backlog, stats.backlog_estimated = await count_left(
                    self.conn, self.settings, pred, plan, stats.removed
                )
                return
            done = leaf.oid

    async def _plan(self, pred: Predicate) -> TablePlan:
        async with self.conn.transaction():
            await self.conn.execute(
                local_timeouts(),
                (self.settings.lock_timeout_ms, self.settings.statement_timeout_ms),
            )
            return await plan_table(self.conn, pred)

    async def _batches(self, pred: Predicate, plan: TablePlan, stats: SweepStats) -> None:
        if self.progress.page and plan.strategy != "range":
            self.progress.page = 0
        sweeper = BatchSweeper(self.ctx, self.conn, plan)
        batches = await sweeper.sweep(pred)
        self.flushed = sweeper.flushed
        stats.strategies.append(plan.strategy)
        if plan.advice:
            stats.advice.append(plan.advice)
        stats.merge(batches)


def _ahead_warning(pred: Predicate, layout: Layout) -> str:
    ahead = sum(c.ahead for c in layout.children if not c.pending)
    begin = "partition begins" if ahead == 1 else "partitions begin"
    warning = (
        f"{pred.table}: only {ahead} {begin} after this pass's instant and the last range ends "
        f"within a year; inserts fail once rows pass it{_default_note(layout)}: create the "
        f"next one, CREATE TABLE ... PARTITION OF {pred.table} FOR VALUES {layout.next_bound}"
    )
    if layout.next_blocked_by is not None:
        warning += (
            f"; {layout.next_blocked_by} (the DEFAULT partition) already holds rows of that "
            "range, and PostgreSQL refuses the CREATE until they leave it: in one transaction, "
            "DETACH it, create the partition, move those rows into it, ATTACH it again as "
            "DEFAULT"
        )
    return warning


def _default_note(layout: Layout) -> str:
    return " (or pile up in the DEFAULT partition)" if layout.has_default else ""


def _grant_advice(pred: Predicate, layout: Layout, leaves: list[Leaf]) -> str:
    missing = [str(leaf.table) for leaf in leaves if not leaf.direct]
    shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    return (
        f"{pred.table}: swept through the parent, every batch planned over all its partitions, "
        f"because role {layout.role} may not SELECT and DELETE {shown} by name (privileges on a "
        "partitioned table do not reach its partitions); GRANT SELECT, DELETE on each partition "
        "to sweep them one by one"
    )
