"""Column types a worker remembers between passes, so that a table's plan goes in the round trip
that reads them (`TableAccess.prepare`; why: docs/decisions/round-trips.md).

A rule is bound from its table's column types (`rules.column_types`). Inside `assumed_types()`,
a table whose types this worker read before, through the same connection settings, is bound
from what they were then, at once: the read is sent all the same, and `TypesAhead.check`
compares it with them once the round trip's statements are sent, before anything bound from
them is used. Where they differ, or that round trip fails with a psycopg error or a `BadTable`
(but for a lock waited for too long, a statement too slow or a connection lost:
`psycopg.OperationalError`), the caller binds again step by step (the read first), and the
memory takes what it then reads. Only reads inside `assumed_types()` are kept: a bind
elsewhere (a small table's one statement, a dry run) would fill the memory with tables it never
assumes, and, past KEPT of them, empty it of the ones it does.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from psycopg import AsyncConnection, AsyncCursor

from activities.engine.sessions import session_key

#: (column, its SQL type, the table's relkind) for each column, as `catalog.column_types` reads
#: them.
Columns = tuple[tuple[str, str, str], ...]

#: A table's columns as this worker last read them, by connection settings and table name.
_READ: dict[tuple[object, ...], Columns] = {}
#: Tables kept at most; past it the memory starts again (a worker over many tenants' tables).
KEPT = 10_000

_AHEAD: ContextVar[TypesAhead | None] = ContextVar("purge_types_ahead", default=None)


class TypesChanged(Exception):
    """A table's columns are not what this worker remembered: bind again, step by step."""


class TypesAhead:
    """The column reads sent while a rule was bound from remembered types (`assume`), to be
    checked before anything bound from them is used."""

    def __init__(self) -> None:
        self.sent: list[tuple[AsyncCursor[Any], tuple[object, ...]]] = []
        self.assuming = True
        """False once `forget` ran: the binds after it read first (and are kept)."""

    async def check(self) -> None:
        """TypesChanged (the memory of those tables dropped) unless every read found what was
        remembered. Fetching the reads waits for the round trip that carries them."""
        for cur, key in self.sent:
            if _columns(await cur.fetchall()) != _READ.get(key):
                self.forget()
                raise TypesChanged(f"columns of {key[-1]} changed since the last pass")

    def forget(self) -> None:
        """Drop the memory of the tables assumed, and assume nothing more here: the next bind
        reads them first."""
        self.assuming = False
        for _, key in self.sent:
            _READ.pop(key, None)


@contextmanager
def assumed_types() -> Iterator[TypesAhead]:
    """Inside: a table's remembered columns are assumed (`assume`) until the `TypesAhead`
    yielded forgets them, and every read is kept (`remember`); the reads to check, in it."""
    ahead = TypesAhead()
    token = _AHEAD.set(ahead)
    try:
        yield ahead
    finally:
        _AHEAD.reset(token)


def assume(conn: AsyncConnection[Any], qualified: str, cur: AsyncCursor[Any]) -> Columns | None:
    """Inside `assumed_types()`, the columns remembered for the table `qualified` through
    `conn`'s settings, its read (`cur`, sent) noted to be checked; otherwise None: fetch it."""
    ahead = _AHEAD.get()
    if ahead is None or not ahead.assuming:
        return None
    key = (*session_key(conn), qualified)
    columns = _READ.get(key)
    if columns is not None:
        ahead.sent.append((cur, key))
    return columns


def remember(conn: AsyncConnection[Any], qualified: str, rows: list[Any]) -> Columns:
    """The columns read (`rows`), kept for the next bind of `qualified` through `conn`'s
    settings when read inside `assumed_types()`."""
    columns = _columns(rows)
    if _AHEAD.get() is None:
        return columns
    if len(_READ) >= KEPT:
        _READ.clear()
    _READ[(*session_key(conn), qualified)] = columns
    return columns


def partitioned(conn: AsyncConnection[Any], qualified: str) -> bool | None:
    """Whether the table `qualified` is partitioned, as this worker last read its columns
    through `conn`'s settings; None when it has not kept them."""
    columns = _READ.get((*session_key(conn), qualified))
    return columns[0][2] == "p" if columns else None


def _columns(rows: list[Any]) -> Columns:
    return tuple((str(name), str(kind), str(relkind)) for name, kind, relkind in rows)
