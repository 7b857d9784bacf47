"""One table's sweep, once its advisory lock is held: for a partitioned table, first its wholly
expired partitions out whole (`partitions = "drop"` or `"detach"`), then the batched delete of
what is left, partition by partition (a ctid range means something only within one partition),
skipping partitions whose bounds hold no expired row.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from psycopg import AsyncConnection, errors

from activities.engine.batching import BatchSweeper, TableSweep, count_left
from activities.engine.detaching import PartitionRemover, Removal
from activities.engine.partitions import Layout, read_layout
from activities.engine.planning import TablePlan, plan_table
from activities.engine.rights import check_partitions
from activities.engine.rules import Predicate
from activities.engine.statements import local_bounds
from activities.progress import OnBatch, Progress
from purge_config.settings import PartitionPolicy, SweepSettings


@dataclass
class TableOutcome:
    """What one table's sweep did in this attempt."""

    sweep: TableSweep
    """The batched delete over every partition swept (or the plain table)."""
    strategies: list[str] = field(default_factory=list)
    """`partitions` when any partition left whole, then each batched strategy used."""
    removal: Removal = field(default_factory=Removal)
    advice: list[str] = field(default_factory=list)


class TableSweeper:
    """Sweeps one table on the connection that holds its advisory lock."""

    def __init__(
        self,
        conn: AsyncConnection[Any],
        settings: SweepSettings,
        policy: PartitionPolicy,
        progress: Progress,
        on_batch: OnBatch,
        deadline: float,
        target: str,
        ledger: dict[str, object] | None,
    ) -> None:
        self.conn = conn
        self.settings = settings
        self.policy = policy
        self.progress = progress
        self.on_batch = on_batch
        self.deadline = deadline
        self.ledger = ledger
        self.remover = PartitionRemover(
            conn, settings, policy, progress, on_batch, deadline, target, ledger
        )

    async def sweep(self, pred: Predicate, plan: TablePlan, check: bool) -> TableOutcome:
        """With `check`, first what `check_partitions` says of this table (a target of one
        table is checked here, once its lock is held, before anything is detached)."""
        outcome = TableOutcome(TableSweep(plan=plan))
        layout = await read_layout(self.conn, pred)
        if check:
            inert = await check_partitions(self.conn, pred, layout, self.policy)
            if inert:
                outcome.advice.append(inert)
        gone: frozenset[int] = frozenset()
        if layout is not None and layout.judged and self.policy.removes:
            layout, gone = await self._remove(pred, layout, outcome)
            if not outcome.removal.complete:
                # Out of time with expired partitions still in: they wait for the next pass.
                outcome.sweep.complete = False
                outcome.sweep.backlog = await count_left(self.conn, self.settings, pred, plan, 0)
                return outcome
        if layout is not None and layout.next_bound:
            outcome.advice.append(_ahead_warning(pred, layout))
        leaves = layout.to_sweep(gone) if layout is not None else []
        if layout is None:
            await self._batches(pred, plan, outcome)
        elif leaves and not all(leaf.direct for leaf in leaves):
            # Privileges on a partitioned table do not reach its partitions named directly:
            # sweep through the parent, as one table, and say what would let it do better.
            outcome.advice.append(_grant_advice(pred, layout, leaves))
            if self.progress.leaf:
                self.progress.leaf, self.progress.page = 0, 0  # a position in one partition
            await self._batches(pred, replace(plan, partitioned=True), outcome)
        else:
            await self._leaves(pred, leaves, outcome)
        return outcome

    async def _remove(
        self, pred: Predicate, layout: Layout, outcome: TableOutcome
    ) -> tuple[Layout, frozenset[int]]:
        """Finish what an earlier attempt left, then take out every wholly expired partition:
        the layout, and the OIDs of the children now gone from it."""
        recovered = await self.remover.recover(layout)
        if recovered.names or recovered.notes or layout.pending:
            layout = await read_layout(self.conn, pred) or layout
        removal = await self.remover.remove(layout)
        removal.names[:0] = recovered.names
        removal.rows += recovered.rows
        removal.notes[:0] = recovered.notes
        outcome.removal = removal
        outcome.advice += removal.notes
        if removal.names:
            outcome.strategies.append("partitions")
        gone = frozenset(c.oid for c in layout.children if str(c.table) in set(removal.names))
        return layout, gone

    async def _leaves(self, pred: Predicate, leaves: list[Any], outcome: TableOutcome) -> None:
        """Each leaf on its own, by OID; a resumed attempt skips those an earlier one finished."""
        done = self.progress.leaf
        for leaf in leaves:
            if leaf.oid < done:
                continue
            if leaf.oid != done:
                self.progress.leaf, self.progress.page = leaf.oid, 0
            part = replace(pred, table=leaf.table)
            try:
                plan = await self._plan(part)
            except errors.UndefinedTable:
                continue  # dropped since the layout was read (by an operator): nothing to sweep
            await self._batches(part, plan, outcome)
            if not outcome.sweep.complete:
                # The budget ended inside this leaf; count what every leaf still holds.
                outcome.sweep.backlog = await count_left(
                    self.conn, self.settings, pred, outcome.sweep.plan, outcome.sweep.removed
                )
                return
            done = leaf.oid

    async def _plan(self, pred: Predicate) -> TablePlan:
        async with self.conn.transaction():
            await self.conn.execute(
                local_bounds(), (self.settings.lock_timeout_ms, self.settings.statement_timeout_ms)
            )
            return await plan_table(self.conn, pred)

    async def _batches(self, pred: Predicate, plan: TablePlan, outcome: TableOutcome) -> None:
        if self.progress.page and plan.strategy != "range":
            self.progress.page = 0
        sweeper = BatchSweeper(
            self.conn, self.settings, self.progress, self.on_batch, self.deadline, self.ledger
        )
        table = await sweeper.sweep(pred, plan)
        total = outcome.sweep
        total.removed += table.removed
        total.batch_ms += table.batch_ms
        total.complete = table.complete
        total.backlog = table.backlog
        total.paused_s += table.paused_s
        total.reason = total.reason or table.reason
        total.warnings += [w for w in table.warnings if w not in total.warnings]
        outcome.strategies.append(plan.strategy)
        if plan.advice:
            outcome.advice.append(plan.advice)


def _ahead_warning(pred: Predicate, layout: Layout) -> str:
    ahead = sum(c.ahead for c in layout.children if not c.pending)
    return (
        f"{pred.table}: only {ahead} partition{'s' if ahead != 1 else ''} begin after this "
        f"pass's instant; inserts fail once rows pass the last range{_default_note(layout)}: "
        f"create the next one, CREATE TABLE ... PARTITION OF {pred.table} FOR VALUES "
        f"{layout.next_bound}"
    )


def _default_note(layout: Layout) -> str:
    return " (or pile up in the DEFAULT partition)" if layout.has_default else ""


def _grant_advice(pred: Predicate, layout: Layout, leaves: list[Any]) -> str:
    missing = [str(leaf.table) for leaf in leaves if not leaf.direct]
    shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    return (
        f"{pred.table}: swept through the parent, every batch planned over all its partitions, "
        f"because role {layout.role} may not SELECT and DELETE {shown} by name (privileges on a "
        "partitioned table do not reach its partitions); GRANT SELECT, DELETE on each partition "
        "to sweep them one by one"
    )
