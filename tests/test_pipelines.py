"""`settled_pipeline`: a statement that fails in a pipeline leaves the connection fit for the
next one, and its own error reaches the caller, however late the server's last results come
(tests.support.late_results makes them late on any machine)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import errors, pq

from activities.engine.pipelines import settled_pipeline
from tests.support.late_results import results_late
from tests.support.pace import row_locked

HELD = "SELECT k FROM held WHERE k = 1 FOR UPDATE"
"""Waits on the row the test holds: under a 10 ms statement_timeout, always cancelled."""


@pytest.fixture
def held(db: psycopg.Connection[Any], schema_url: str) -> Iterator[None]:
    """A row another session holds locked until the test ends."""
    db.execute("CREATE TABLE held (k int PRIMARY KEY)")
    db.execute("INSERT INTO held VALUES (1)")
    with row_locked(schema_url, "held", 1, column="k"):
        yield


@pytest.fixture
async def conn(schema_url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A connection as the pool makes them (autocommit)."""
    async with await psycopg.AsyncConnection.connect(schema_url, autocommit=True) as opened:
        yield opened


async def cancelled_in_pipeline(conn: psycopg.AsyncConnection[Any]) -> None:
    """A batch's shape: its timeout, a prepared statement that waits past it, one after, their
    results read at the pipeline's exit."""
    async with settled_pipeline(conn):
        await conn.execute("SELECT set_config('statement_timeout', '10', true)", prepare=True)
        await conn.execute(HELD, prepare=True)
        await conn.execute("SELECT 2", prepare=True)


async def prepared(conn: psycopg.AsyncConnection[Any]) -> int:
    cur = await conn.execute("SELECT count(*) FROM pg_prepared_statements")
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def test_a_cancelled_statement_whose_rest_comes_late_is_raised_and_the_connection_settled(
    held: None,
    conn: psycopg.AsyncConnection[Any],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    late = results_late(monkeypatch)
    for attempt in range(2):  # a second failure on the same connection settles as the first
        with pytest.raises(errors.QueryCanceled):
            await cancelled_in_pipeline(conn)
        assert late.late == attempt + 1  # the moment happened
        assert conn.pgconn.pipeline_status == pq.PipelineStatus.OFF
        assert conn.pgconn.transaction_status == pq.TransactionStatus.IDLE
    assert "a failed pipeline was left owing results" in caplog.text

    # The statements prepared in the failed pipelines run again, prepared as before, and a
    # pipeline on the connection reads its own results.
    monkeypatch.undo()
    async with settled_pipeline(conn):
        again = await conn.execute("SELECT 2", prepare=True)
        tx = await conn.execute("SELECT set_config('statement_timeout', '10', true)", prepare=True)
    assert await again.fetchone() == (2,)
    assert await tx.fetchone() == ("10ms",)
    assert await prepared(conn) == 2
