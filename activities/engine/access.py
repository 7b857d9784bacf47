"""A target's way into its tables: a pooled connection per table with its faults named, the
rule bound and checked on it, the table's plan, and its advisory lock."""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import replace
from typing import Any, Protocol

import psycopg
from psycopg import AsyncConnection, errors, sql

from activities.engine import catalog
from activities.engine.batch_sql import FLUSH_CALL, local_timeouts
from activities.engine.column_memory import TypesAhead, TypesChanged, assumed_types
from activities.engine.context import ms_left
from activities.engine.errors import BadTable, MissingRights, SweepRefused, first_line
from activities.engine.partition_checks import check_partitions
from activities.engine.partitions import read_layout
from activities.engine.pipelines import settled_pipeline
from activities.engine.planning import TablePlan, planned
from activities.engine.rules import Predicate, Rule, ident, written_column_advice
from activities.engine.table_facts import FactReads, refuse_inheritance, unindexed_children
from activities.engine.units import UnitCheck, check_unit
from purge_config.settings import PartitionPolicy, SweepSettings


class ConnectionSource(Protocol):
    """Where a target's connections come from: a psycopg pool, or a lazily opened one."""

    def connection(self) -> AbstractAsyncContextManager[AsyncConnection[Any]]: ...


class SentAhead(Protocol):
    """Statements another concern sends first in a round trip of the plan's, and in its
    transaction (a ledger's open: `ledger.OpenAhead`); it reads their results itself, after
    the plan."""

    async def send(self, conn: AsyncConnection[Any]) -> None: ...


class TableAccess:
    """The connections and checks every use of a target's tables goes through."""

    def __init__(
        self, pool: ConnectionSource, settings: SweepSettings, partitions: PartitionPolicy
    ) -> None:
        self.pool = pool
        self.settings = settings
        self.partitions = partitions

    async def check(
        self,
        rules: list[Rule],
        now_ms: int,
        sweeping: bool = False,
        deadline: float | None = None,
    ) -> list[str]:
        """Before anything is deleted: each table's epoch columns in their unit; and with
        `partitions` set to drop or detach, refuse a role that could not finish what it starts
        (MissingRights, BadTable). With `sweeping` (a sweep of several tables before its first,
        `check`, a dry run), also what each table's own sweep would refuse only once reached
        (`refuse_table`). The advice: where the setting can do nothing (a plain table,
        another key, a rule that is not one column's comparison), and a write time taken for
        an expiry (`written_column_advice`). With `deadline` (a dry run's), each table's statements
        run under what is left before it as that table's check begins, where that is sooner than
        `statement_timeout`: a table another session locked otherwise held a dry run that long
        past its deadline."""
        advice = []
        for rule in rules:
            written = written_column_advice(rule)
            if written:
                advice.append(written)
            async with self.connection(rule) as conn, conn.transaction():
                await self.set_timeouts(conn, self.statement_ms(deadline))
                pred = await self.bind(conn, rule, now_ms)
                if sweeping:
                    await self.refuse_table(conn, rule, pred)
                if not self.partitions.removes:
                    continue
                layout = await read_layout(conn, pred)
                inert = await check_partitions(conn, pred, layout, self.partitions)
            if inert:
                advice.append(inert)
        return advice

    async def refuse_table(self, conn: AsyncConnection[Any], rule: Rule, pred: Predicate) -> None:
        """What one table's sweep refuses only once it reaches the table, raised with nothing
        deleted: a right its first DELETE would miss (`rights`), inheritance children
        (`refuse_inheritance`), and with `refuse_unindexed_children` a child table whose
        foreign key has no index. For a target of several tables, all asked before the first
        is swept: one refused for its second table must not have swept its first."""
        await self.rights(conn, rule)
        cur = await conn.execute(catalog.table_size(), {"rel": ident(pred.table).as_string(conn)})
        size = await cur.fetchone()
        if size is not None and size[5]:  # inheritance children, as `table_facts` reads them
            await refuse_inheritance(conn, pred)
        if self.settings.refuse_unindexed_children:
            refuse_children(await unindexed_children(conn, pred))

    async def rights(self, conn: AsyncConnection[Any], rule: Rule) -> None:
        """MissingRights unless the role may SELECT and DELETE the rule's table, SELECT a
        related table it reads, and INSERT into its archive: what a sweep meets only at its
        first DELETE (`faults`), found with none run."""
        wanted = [(rule.table, "SELECT"), (rule.table, "DELETE")]
        related = getattr(rule, "related", None)
        if related is not None:
            wanted.append((related, "SELECT"))
        if rule.archive is not None:
            wanted.append((rule.archive, "INSERT"))
        cur = await conn.execute(
            _LACKING,
            ([ident(t).as_string(conn) for t, _ in wanted], [right for _, right in wanted]),
        )
        lacking = await cur.fetchall()
        if lacking:
            role = lacking[0][2]
            said = ", ".join(f"{right} on {table}" for table, right, _ in lacking)
            raise MissingRights(
                f"table {rule.table}: role {role} lacks {said}; the worker's role needs SELECT "
                "and DELETE on each table it sweeps (and INSERT on an archive)"
            )

    async def prepare(
        self,
        conn: AsyncConnection[Any],
        rule: Rule,
        now_ms: int,
        ahead: SentAhead | None = None,
    ) -> tuple[Predicate, TablePlan, bool]:
        """The rule bound to its table, the table's plan for this pass (with the advice its
        unindexed child tables call for, or SweepRefused if they are refused), and whether the
        table's advisory lock was taken with the plan's reads: when no one held it and the
        table has a page (an empty one is not locked: nothing to sweep). Whoever gets True
        must `unlock`; on any exception here the lock is released before it propagates.
        `ahead`: statements sent first, in the plan's first round trip and its transaction
        (an error of theirs raised here, as the plan's own would be).

        Where this worker has read the table's column types through these connection settings
        before, the rule is bound from them at once, and the plan's reads go in the same round
        trip as the types' read (`column_memory`). Where the types then differ, or that round
        trip fails with a psycopg error other than an OperationalError (or a BadTable), it all
        goes again step by step, the types read first: a table changed since the last pass is
        planned, refused or failed as it now is."""
        with assumed_types() as assumed:
            try:
                return await self._prepare(conn, rule, now_ms, ahead, assumed)
            except psycopg.OperationalError:
                # A lock waited for too long, a statement too slow, a connection lost (no column
                # type assumed causes these): the same again step by step would only wait as
                # long again.
                raise
            except (psycopg.Error, BadTable, TypesChanged):
                if not assumed.sent:
                    raise
                # Whatever the error, it may be of the types assumed (a statement built for a
                # column since retyped or dropped): the step by step bind says what it is.
                assumed.forget()
            return await self._prepare(conn, rule, now_ms, ahead, None)

    async def _prepare(
        self,
        conn: AsyncConnection[Any],
        rule: Rule,
        now_ms: int,
        ahead: SentAhead | None,
        assumed: TypesAhead | None,
    ) -> tuple[Predicate, TablePlan, bool]:
        """`prepare` once: with `assumed`, the column types the rule was bound from checked
        once every statement of the round trip is sent, before any answer is used."""
        # One implicit transaction, up to the pipeline's Sync, its timeouts queued with the
        # rule's first read: the unit check and the catalog's reads go in the round trip after
        # the rule's, or in the rule's own where its column types are assumed (most rules:
        # three round trips, where a BEGIN and each read were one).
        # Generic plans: the catalog's reads are prepared, and planning them each time cost
        # more than running them (pg_stats is a view of many joins). EXPLAIN still plans the
        # rule with its values. The lock, if free, is tried last in the catalog's round trip:
        # it never waits, and a session's advisory lock outlives the transaction (also when a
        # statement after it fails), so any exit but a return with True releases it.
        tried = False
        try:
            async with settled_pipeline(conn):
                if ahead is not None:
                    await ahead.send(conn)
                await conn.execute(
                    local_timeouts(generic=True),
                    (self.settings.lock_timeout_ms, self.settings.statement_timeout_ms),
                    prepare=True,
                )
                pred = await rule.bind(conn, now_ms)
                units = [
                    await UnitCheck.send(conn, pred.epoch_table or pred.table, column, unit)
                    for column, unit in pred.epoch_columns
                ]
                reads = await FactReads.send(conn, pred)
                tried = True
                rel = {"rel": ident(pred.table).as_string(conn)}
                taken = await conn.execute(try_lock(), rel, prepare=True)
                if assumed is not None:
                    await assumed.check()
                for check in units:
                    await check.judge(conn)
                facts = await reads.facts(conn)
                if facts.inherited:
                    await refuse_inheritance(conn, pred)
                plan = planned(pred, facts)
                # Only a table a foreign key references has child tables to read (most have
                # none: one catalog read fewer before their first batch).
                children = await unindexed_children(conn, pred) if plan.referenced else ""
            row = await taken.fetchone()
            if self.settings.refuse_unindexed_children:
                refuse_children(children)
        except BaseException:
            if tried:
                await self.unlock(conn)
            raise
        if children:
            advice = " ".join(filter(None, (plan.advice, children)))
            plan = replace(plan, advice=advice, children=children)
        return pred, plan, bool(row and row[0])

    async def bind(self, conn: AsyncConnection[Any], rule: Rule, now_ms: int) -> Predicate:
        """The rule bound to its table, its epoch columns checked for a wrong unit."""
        pred = await rule.bind(conn, now_ms)
        for column, unit in pred.epoch_columns:
            await check_unit(conn, pred.epoch_table or pred.table, column, unit)
        return pred

    async def lock(self, conn: AsyncConnection[Any], pred: Predicate) -> bool:
        """Take this table's advisory lock, waiting up to busy_wait; False if it stayed taken."""
        rel = {"rel": ident(pred.table).as_string(conn)}
        try:
            # One round trip: pipelined up to one Sync, the timeouts and the lock are one implicit
            # transaction. The lock is the session's: it outlives that transaction.
            async with settled_pipeline(conn):
                await conn.execute(
                    local_timeouts(generic=True),
                    (self.settings.busy_wait_ms or 1, self.settings.busy_wait_ms + 1000),
                )
                await conn.execute(lock_table(), rel)
        except errors.LockNotAvailable:
            return False
        return True

    @staticmethod
    async def unlock(conn: AsyncConnection[Any]) -> None:
        """Release the table's lock before the connection goes back to the pool. A connection
        that broke mid-sweep lost its locks with its session (the pool discards it)."""
        with contextlib.suppress(psycopg.Error):
            await conn.execute(unlock_tables())

    def statement_ms(self, deadline: float | None) -> int:
        """`statement_timeout`, or what is left before `deadline` where that is sooner (1 ms once
        it has passed: a statement then is cancelled at once, never run without a limit)."""
        if deadline is None or math.isinf(deadline):
            return self.settings.statement_timeout_ms
        return max(1, min(self.settings.statement_timeout_ms, ms_left(deadline)))

    async def set_timeouts(self, conn: AsyncConnection[Any], statement_timeout_ms: int) -> None:
        """Lock and statement timeouts local to this transaction: they never leak to the pool."""
        await conn.execute(local_timeouts(), (self.settings.lock_timeout_ms, statement_timeout_ms))

    @asynccontextmanager
    async def connection(self, rule: Rule) -> AsyncIterator[AsyncConnection[Any]]:
        """A pooled connection for one table, with its configuration faults made non-retryable."""
        async with self.pool.connection() as conn, self.faults(rule):
            yield conn

    @staticmethod
    @asynccontextmanager
    async def faults(rule: Rule) -> AsyncIterator[None]:
        """The table's configuration faults, raised inside, made non-retryable: what
        `connection` does, for statements on a connection taken from the pool before (one
        that opened the pass's ledger first, whose own faults stay as they are)."""
        try:
            yield
        except (errors.UndefinedTable, errors.UndefinedColumn) as err:
            # The table changed between the catalog check and a statement.
            raise BadTable(f"table {rule.table}: {first_line(err)}") from err
        except errors.UniqueViolation as err:
            if rule.archive is None:
                raise
            # Only the archive's INSERT can raise it; every retry would meet the same row.
            # Not the server's DETAIL: it shows the key's value (a session token, say),
            # which must stay out of the history and the logs.
            raise BadTable(
                f"table {rule.table}: archive {rule.archive} already holds a row with the "
                f"key of one being archived ({first_line(err)}); a key archived before and "
                "written again since? this batch moved nothing"
            ) from err
        except errors.CheckViolation as err:
            if rule.archive is None:
                raise
            # Most often the archive's INSERT: a CHECK of the archive's, or no partition of it
            # for the row; but a referencing table's ON DELETE SET NULL, or a trigger, may meet
            # one too. Every retry would meet the same row. The first line names the relation
            # and the rule; the DETAIL, not said, shows the row.
            raise BadTable(
                f"table {rule.table}: a row of a batch archived to {rule.archive} was refused "
                f"({first_line(err)}); every retry would meet it, and this batch moved nothing"
            ) from err
        except errors.InsufficientPrivilege as err:
            raise MissingRights(
                f"table {rule.table}: {first_line(err)}; the worker's role needs "
                "SELECT and DELETE on it"
            ) from err


def refuse_children(children: str) -> None:
    """SweepRefused when `unindexed_children` named a child table, under
    refuse_unindexed_children: at the table's plan, or for every table of a target before its
    first is swept."""
    if children:
        raise SweepRefused(f"{children}; refuse_unindexed_children is set: nothing deleted")


#: The rights of `wanted` (table, privilege) the session's role lacks, with the role's name.
_LACKING = sql.SQL(
    "SELECT w.t, w.p, current_user::text FROM unnest(%s::text[], %s::text[]) AS w(t, p)"
    " WHERE NOT has_table_privilege(w.t, w.p)"
)


# The advisory lock every sweep of a table takes.


#: The first key of every advisory lock this package takes ('purg'); the second is the table's
#: OID, so two sweeps of one table, from any pass, worker or cluster, take the same lock.
LOCK_SPACE = 0x70757267


#: The OID of the table named by the parameter `%(rel)s`, as SQL.
_REL_OID = sql.SQL("%(rel)s::regclass::oid")


def table_lock_keys(oid: sql.Composable = _REL_OID) -> sql.Composed:
    """The two keys of the advisory lock every sweep of a table takes (`lock_table`,
    `try_lock`, `try_lock_in_transaction`), as SQL arguments: LOCK_SPACE, then the table's OID
    (`oid`, an SQL expression; by default that of the table named by `%(rel)s`) shifted into an
    int4. Another session takes the same lock with them, or reads them (`SELECT {keys}`)."""
    return sql.SQL("{}, ({}::bigint - 2147483648)::int4").format(sql.Literal(LOCK_SPACE), oid)


def lock_table() -> sql.Composed:
    """Take the session's advisory lock on `%(rel)s`, waiting at most the lock_timeout."""
    return sql.SQL("SELECT pg_advisory_lock({})").format(table_lock_keys())


def try_lock() -> sql.Composed:
    """Take the session's advisory lock on `%(rel)s` (the same as `lock_table`'s) if no one
    holds it and the table has a page (as the plan's `pages` counts them from the file size) or
    partitions: one row, true when taken; no row when the table is empty. It never waits."""
    return sql.SQL(
        "SELECT pg_try_advisory_lock({})"
        " FROM pg_class c WHERE c.oid = %(rel)s::regclass"
        " AND (c.relkind = 'p'"
        " OR pg_relation_size(c.oid) >= current_setting('block_size')::int)"
    ).format(table_lock_keys(sql.SQL("c.oid")))


def try_lock_in_transaction(flush: bool = False) -> sql.Composed:
    """Take this table's advisory lock (`%(rel)s`) for the current transaction only, if no one
    holds it (true when taken; it never waits), and set the transaction's lock and statement
    timeouts for the statements after it (`%(lock_ms)s`, `%(statement_ms)s`). The same lock
    as `lock_table`'s: a sweep holding either keeps the other out. `flush` (PostgreSQL 15+):
    the session's statistics flushed as the transaction ends, as a batched sweep's last batch
    does (`batch_sql.local_timeouts(flush=True)`)."""
    return sql.SQL(
        "SELECT pg_try_advisory_xact_lock({}),"
        " set_config('lock_timeout', %(lock_ms)s::text, true),"
        " set_config('statement_timeout', %(statement_ms)s::text, true),"
        " set_config('plan_cache_mode', 'force_generic_plan', true){}"
    ).format(table_lock_keys(), sql.SQL(", " + FLUSH_CALL if flush else ""))


def unlock_tables() -> sql.SQL:
    """Release every advisory lock of this session: the connection goes back to the pool."""
    return sql.SQL("SELECT pg_advisory_unlock_all()")
