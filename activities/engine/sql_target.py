"""The built-in targets: tables with expiry rules, swept in batches through the worker's pool.

`SqlTarget` is the front: what the activity asks of a target. Behind it, `TableAccess` is the
way into each table, `TargetSweeper` (`target_tables`) one run of its tables, table by table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from psycopg import AsyncConnection, sql

from activities.engine import catalog
from activities.engine.access import ConnectionSource, TableAccess
from activities.engine.batch_sql import count_expired
from activities.engine.context import (
    SweepContext,
    ignore_batch,
    ms_left,
    never,
    partition_action,
)
from activities.engine.ledger import Ledger
from activities.engine.partitions import read_layout
from activities.engine.planning import planned
from activities.engine.rules import Predicate, Rule, ident, table_names
from activities.engine.small_tables import SmallTables
from activities.engine.table_facts import read_table_facts, refuse_inheritance
from activities.engine.target_tables import TargetSweeper
from activities.progress import LedgerKey, OnBatch, Progress, SweepStats
from purge_config.names import TableName
from purge_config.settings import Guards, PartitionPolicy, SweepSettings

__all__ = ["ConnectionSource", "SqlTarget"]


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
        small_tables: bool = False,
    ) -> None:
        self._name = name
        self._pool = pool
        self.rules = rules
        self.settings = settings or SweepSettings()
        self.guards = guards or Guards()
        self.partitions = partitions or PartitionPolicy()
        self._access = TableAccess(pool, self.settings, self.partitions)
        self._small = SmallTables() if small_tables else None
        """With `small_tables`, a table the catalog shows small is swept in one statement
        (`activities.engine.small_tables`): a pattern's matches, swept by thousands."""

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
        stop: Callable[[], bool] | None = None,
    ) -> SweepStats:
        """Sweep every table in batches, starting where `resume` (a previous attempt's last
        heartbeat) says; `on_batch` is called with the progress after every batch. The sweep
        ends at its time budget, or at `budget_ms` (what is left of the pass's) if sooner, or
        between batches once `stop()` says so, as at its budget (`complete` False).

        Each table is swept under an advisory lock on it, so no two sweeps of one table run at
        once, from whatever pass; a table another sweep holds for longer than `busy_wait` ends
        the sweep with `busy` set.

        With `ledger`, every batch also adds its count to `purge_progress` in its own
        transaction, and the count starts from what the ledger holds: exact, whatever an earlier
        attempt's worker did before it died. Without the table, counts come from `resume`.
        """
        ctx = SweepContext(
            target=self._name,
            now_ms=now_ms,
            settings=self.settings,
            partitions=self.partitions,
            progress=resume or Progress(),
            on_batch=on_batch or ignore_batch,
            deadline=self.deadline(budget_ms),
            ledger=Ledger(ledger) if ledger is not None else None,
            stopping=stop or never,
        )
        return await TargetSweeper(self._access, self.rules, self._small).sweep(ctx)

    def tables_listed(self) -> list[str]:
        """Its tables, in the order it sweeps them, as its config names them."""
        return table_names(self.rules)

    def deadline(self, budget_ms: int | None = None) -> float:
        """When a step of this target begun now must end: its own time budget from now, or
        `budget_ms` (what is left of the pass's) where that is sooner. A guarded sweep's counts
        and the sweep, or a dry run's counts, end by one such deadline: counted apart, each
        could take the whole budget, and the step run past the activity's start-to-close."""
        own = self.settings.time_budget_ms
        return SweepContext.deadline_in(own if budget_ms is None else min(own, budget_ms))

    async def check(self, now_ms: int) -> list[str]:
        """What a pass at `now_ms` would refuse before its first delete (BadTable,
        MissingRights), found with nothing deleted or counted: each table bound to its rule
        (columns, their types, epoch units), the rights to take partitions out where
        `partitions` does, and the role's rights on each table (`TableAccess.rights`). The
        advice a pass would give of them, its plan's (a missing index) included, the tables
        whose rows go with theirs by cascade, and the triggers and rules that may keep a row
        the sweep deletes (`_plan_checks`)."""
        # As a sweep of several tables checks them before its first: what each table's own
        # sweep refuses once reached (rights, inheritance, refuse_unindexed_children).
        advice = await self._access.check(self.rules, now_ms, sweeping=True)
        for rule in self.rules:
            # Its rights were asked above (`refuse_table`).
            async with self._access.connection(rule) as conn, conn.transaction():
                await self._access.set_timeouts(conn, self.settings.statement_timeout_ms)
                advice += await _plan_checks(conn, await self._access.bind(conn, rule, now_ms))
        return advice

    async def count_expired(self, now_ms: int) -> int:
        """How many rows `purge_expired(now_ms)` would delete now, deleting none."""
        return (await self.measure(now_ms, total=False))[0]

    async def measure(
        self, now_ms: int, total: bool = True, *, deadline: float | None = None
    ) -> tuple[int, int]:
        """(expired rows, all rows) over the target's tables, counted exactly in one read of
        each table, every read ending by `deadline` (`self.deadline()`, its time budget from
        now, if None); all rows is 0 unless asked for."""
        deadline = self.deadline() if deadline is None else deadline
        expired = everything = 0
        for rule in self.rules:
            async with self._access.connection(rule) as conn, conn.transaction():
                # A count reads what a whole sweep would: it gets what is left of the budget.
                await self._access.set_timeouts(conn, max(1, ms_left(deadline)))
                pred = await self._access.bind(conn, rule, now_ms)
                query = count_expired_and_all(pred) if total else count_expired(pred)
                cur = await conn.execute(query, pred.params)
                row = await cur.fetchone()
                if row:
                    expired += int(row[0])
                    everything += int(row[1]) if total else 0
        return expired, everything

    async def preview(self, now_ms: int, *, deadline: float | None = None) -> SweepStats:
        """What a sweep at `now_ms` would remove, changing nothing: every expired row (those of
        whole partitions included), and the partitions that would leave whole, with their rows.
        Refused as the sweep would be, before anything is counted: a table its rule does not
        fit, and what each table's sweep refuses once reached (`TableAccess.refuse_table`: a
        role without the rights the sweep needs, which a sweep meets only at its first DELETE,
        so a count alone would promise rows a sweep cannot remove; inheritance children; an
        unindexed child table under `refuse_unindexed_children`), as `check` does. Each
        table's count ends by `deadline` (as `measure`'s).
        """
        deadline = self.deadline() if deadline is None else deadline
        checked = await self._access.check(self.rules, now_ms, sweeping=True, deadline=deadline)
        stats = SweepStats(advice=checked)
        for rule in self.rules:
            async with self._access.connection(rule) as conn, conn.transaction():
                await self._access.set_timeouts(conn, max(1, ms_left(deadline)))
                pred = await self._access.bind(conn, rule, now_ms)
                stats.advice += await _plan_checks(conn, pred)
                cur = await conn.execute(count_expired(pred), pred.params)
                row = await cur.fetchone()
                expired = int(row[0]) if row else 0
                stats.removed += expired
                if expired and not await _any_kept(conn, pred):
                    # Most often a rule misread (a write time taken for an expiry, an age in
                    # the wrong unit): say it before the sweep that would empty the table.
                    every = f"every one of its {expired} rows" if expired > 1 else "its one row"
                    stats.advice.append(
                        f"{rule.table}: {every} would go; no row is kept at this instant"
                    )
                layout = await read_layout(conn, pred) if self.partitions.removes else None
                for child in layout.expired if layout is not None and layout.judged else []:
                    cur = await conn.execute(count_rows(child.table))
                    row = await cur.fetchone()
                    stats.partitions.append(str(child.table))
                    stats.partition_rows += int(row[0]) if row else 0
        if stats.partitions:
            stats.partition_action = partition_action(self.partitions)
        return stats


# A dry run's and the guards' reads.


def count_expired_and_all(pred: Predicate) -> sql.Composed:
    """One row, (expired rows, all rows), in one read of the table: for the guards."""
    return sql.SQL("SELECT count(*) FILTER (WHERE {}), count(*) FROM {}").format(
        pred.where, ident(pred.table)
    )


async def _plan_checks(conn: AsyncConnection[Any], pred: Predicate) -> list[str]:
    """What the sweep's plan of the table finds, for `check` and a dry run to say before the
    first sweep walks the table: its refusal of a table with inheritance children (raised, as
    the sweep would), its advice (an index to create, a rule no index can serve), and the
    tables whose rows go by cascade; and an unqualified name that another schema of the
    search_path also holds."""
    facts = await read_table_facts(conn, pred)
    if facts.inherited:
        await refuse_inheritance(conn, pred)
    plan = planned(pred, facts)
    advice = [plan.advice] if plan.advice else []
    if plan.referenced:
        advice += await _cascade_advice(conn, pred)
    advice += await _veto_advice(conn, pred.table)
    if pred.table.schema is None:
        advice += await _shadow_advice(conn, pred.table)
    return advice


async def _shadow_advice(conn: AsyncConnection[Any], table: TableName) -> list[str]:
    """Where an unqualified name is found in more than one schema of the role's search_path:
    which one the sweep takes. The worker's role decides it (its search_path, `"$user"` first
    by default), which need not be the application's."""
    cur = await conn.execute(catalog.schemas_holding(), {"name": table.table})
    schemas = [str(row[0]) for row in await cur.fetchall()]
    if len(schemas) < 2:
        return []
    others = ", ".join(f"{schema}.{table.table}" for schema in schemas[1:])
    return [
        f"{table}: this role's search_path takes {schemas[0]}.{table.table}, not {others}; "
        f'name the schema (table = "{schemas[0]}.{table.table}") to say which'
    ]


async def _veto_advice(conn: AsyncConnection[Any], table: TableName) -> list[str]:
    """The triggers and rules that may keep a row the sweep's DELETE names: the sweep counts
    what went (its command tag), `check` and a dry run what expired, so the two differ by the
    rows they keep, and those rows stay expired pass after pass."""
    cur = await conn.execute(catalog.delete_vetoes(), {"rel": ident(table).as_string(conn)})
    found = [(str(kind), str(name)) for kind, name in await cur.fetchall()]
    if not found:
        return []
    named = ", ".join(
        f"BEFORE DELETE trigger {name}"
        if kind == "trigger"
        else f"rule {name} (ON DELETE DO INSTEAD)"
        for kind, name in found
    )
    return [
        f"{table}: its {named} may keep rows the sweep deletes: a dry run counts them, the "
        "sweep's count does not, and they stay expired pass after pass"
    ]


async def _cascade_advice(conn: AsyncConnection[Any], pred: Predicate) -> list[str]:
    """The tables whose rows go with this one's (ON DELETE CASCADE), which no count of the
    sweep's includes; an `age_from` rule's related table is its own, and expected."""
    own = ident(pred.epoch_table).as_string(conn) if pred.epoch_table else None
    names = {"rel": ident(pred.table).as_string(conn), "own": own}
    cur = await conn.execute(catalog.cascading_children(), names)
    children = [str(row[0]) for row in await cur.fetchall()]
    if not children:
        return []
    return [
        f"{pred.table}: {', '.join(children)} reference{'s' if len(children) == 1 else ''} it "
        "ON DELETE CASCADE: their rows that point at a removed row go with it, in no count"
    ]


async def _any_kept(conn: AsyncConnection[Any], pred: Predicate) -> bool:
    """Whether any row of the table stays (a NULL age stays too): read only once some expire,
    and it stops at the first row kept."""
    query = sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE NOT coalesce({}, false))").format(
        ident(pred.table), pred.where
    )
    cur = await conn.execute(query, pred.params)
    row = await cur.fetchone()
    return bool(row and row[0])


def count_rows(table: TableName) -> sql.Composed:
    """Every row of a partition: what its drop or move would remove (for a dry run)."""
    return sql.SQL("SELECT count(*) FROM {}").format(ident(table))
