"""The pool's check before it lends a connection (`purge_ops.connect.check_unless_quiet`): a
connection the server ended while it sat idle is replaced before a sweep uses it; a quiet one
is lent with no round trip of its own."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from activities import builtin_kinds as kinds
from activities.inputs import PurgeStep
from activities.registry import TargetRegistry
from activities.results import PurgeSweep
from activities.sweep import PurgeActivities
from tests.support.activity import activity_env
from tests.support.rows import HOUR, PAST_NOW, idempotency_rows

NOW = PAST_NOW


async def idle_backend(pool: AsyncConnectionPool[Any]) -> int:
    """The backend of the pool's one connection, back in the pool, idle."""
    async with pool.connection() as conn:
        await conn.execute("SELECT 'lent before'")
        return conn.info.backend_pid


def gone(db: psycopg.Connection[Any], pid: int) -> bool:
    return db.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone() == (0,)


async def test_a_connection_the_server_ended_while_idle_is_replaced_before_a_sweep_uses_it(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    """The server ends the pool's idle connection (pg_terminate_backend: as a restart or
    idle_session_timeout would): its last message and its close make the socket readable, the
    check's round trip finds it dead, and the sweep runs on a new connection, ok."""
    idempotency_rows(db, {f"old-{i}": NOW - HOUR for i in range(10)})
    pid = await idle_backend(pool)
    db.execute("SELECT pg_terminate_backend(%s)", (pid,))
    while not gone(db, pid):
        await asyncio.sleep(0.01)

    activities = PurgeActivities(TargetRegistry([kinds.idempotency(pool)]))
    done: PurgeSweep = await activity_env().run(
        activities.purge_target, PurgeStep(name="x_idempotency", now_ms=NOW)
    )

    assert (done.status, done.removed) == ("ok", 10)


async def test_a_quiet_connection_is_lent_with_no_round_trip_of_its_own(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    """Nothing came from the server since the connection went idle: it is lent as it is, and
    its backend's last statement is still the one before (the check's empty query would have
    replaced it)."""
    pid = await idle_backend(pool)
    async with pool.connection() as conn:
        assert conn.info.backend_pid == pid
        last = db.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    assert last == ("SELECT 'lent before'",)
