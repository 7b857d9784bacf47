"""The built-in targets: tables with expiry rules, swept through the worker's connection pool."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection, errors, sql
from psycopg_pool import AsyncConnectionPool

from activities.errors import BadPurgeTarget
from activities.tables import Predicate, Rule


@dataclass(frozen=True)
class SweepSettings:
    """Server-side bounds on every statement a sweep runs."""

    lock_timeout_ms: int = 5_000
    """A row lock held longer than this by someone else fails the statement; Temporal retries."""
    statement_timeout_ms: int = 600_000
    """No single statement of a sweep runs longer than this."""


class SqlTarget:
    """A target made of tables, each with the rule that says which of its rows are expired."""

    def __init__(
        self,
        name: str,
        pool: AsyncConnectionPool[Any],
        rules: list[Rule],
        settings: SweepSettings | None = None,
    ) -> None:
        self._name = name
        self._pool = pool
        self.rules = rules
        self.settings = settings or SweepSettings()

    @property
    def name(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"SqlTarget({self._name!r}, tables={[str(r.table) for r in self.rules]})"

    async def purge_expired(self, now_ms: int) -> int:
        """Delete every row the rules call expired at `now_ms`; the sum over the tables."""
        removed = 0
        for rule in self.rules:
            async with self._transaction(rule) as conn:
                pred = await rule.bind(conn, now_ms)
                cur = await conn.execute(_delete(pred), pred.params)
                removed += max(cur.rowcount, 0)
        return removed

    async def count_expired(self, now_ms: int) -> int:
        """How many rows `purge_expired(now_ms)` would delete now, deleting none."""
        counted = 0
        for rule in self.rules:
            async with self._transaction(rule) as conn:
                pred = await rule.bind(conn, now_ms)
                cur = await conn.execute(
                    sql.SQL("SELECT count(*) FROM {} WHERE {}").format(
                        pred.table.ident, pred.where
                    ),
                    pred.params,
                )
                row = await cur.fetchone()
                counted += int(row[0]) if row else 0
        return counted

    @asynccontextmanager
    async def _transaction(self, rule: Rule) -> AsyncIterator[AsyncConnection[Any]]:
        async with self._pool.connection() as conn, conn.transaction():
            # SET LOCAL: the bounds end with this transaction and never leak to the pool.
            await conn.execute(
                sql.SQL("SET LOCAL lock_timeout = {}; SET LOCAL statement_timeout = {}").format(
                    sql.Literal(self.settings.lock_timeout_ms),
                    sql.Literal(self.settings.statement_timeout_ms),
                )
            )
            try:
                yield conn
            except (errors.UndefinedTable, errors.UndefinedColumn) as err:
                # The table changed between the catalog check and the statement.
                raise BadPurgeTarget(f"table {rule.table}: {_first_line(err)}") from err
            except errors.InsufficientPrivilege as err:
                raise BadPurgeTarget(
                    f"table {rule.table}: {_first_line(err)}; the worker's role needs "
                    "SELECT and DELETE on it"
                ) from err


def _delete(pred: Predicate) -> sql.Composed:
    return sql.SQL("DELETE FROM {} WHERE {}").format(pred.table.ident, pred.where)


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
