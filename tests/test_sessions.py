"""A worker's pools keep a database session from one hourly pass to the next.

psycopg_pool retires a connection past its lifetime when it is given back, and opens another.
At its default lifetime (an hour) every pass of an hourly schedule went on a session opened
after the pass before, and paid again for what a warm one keeps (`SESSION_LIFETIME_S`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg_pool.base
import psycopg_pool.pool_async
import pytest
from psycopg import AsyncConnection

from purge_ops.connect import lazy_pools, open_pool
from tests.support.pace import HandClock

HOUR_S = 3600.0

#: How a sweep borrows a connection, and how many sessions its pool has opened so far.
Pool = tuple[Callable[[], AbstractAsyncContextManager[AsyncConnection[Any]]], Callable[[], int]]


def pool_clock(monkeypatch: pytest.MonkeyPatch) -> HandClock:
    """psycopg_pool's monotonic clock, moved on by hand: an hour passes in no time."""
    clock = HandClock()
    for module in (psycopg_pool.base, psycopg_pool.pool_async):
        monkeypatch.setattr(module, "monotonic", clock.monotonic)
    return clock


@pytest.fixture(params=["open_pool", "lazy_pools"])
async def pool(request: pytest.FixtureRequest, pg_url: str) -> AsyncIterator[Pool]:
    """The config's database pool, or a `[databases.NAME]` one."""
    if request.param == "open_pool":
        opened = await open_pool(pg_url)
        try:
            yield opened.connection, lambda: opened.get_stats()["connections_num"]
        finally:
            await opened.close()
    else:
        [lazy] = lazy_pools({"db": pg_url}).values()
        try:
            # Its pool opens as a sweep first asks for it (which may open two sessions).
            yield lazy.connection, lambda: lazy._pool.get_stats()["connections_num"]
        finally:
            await lazy.close()


async def test_hourly_passes_open_no_session_after_the_first(
    pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four passes an hour apart: at an hour's lifetime, the second gave its session back past
    its lifetime and the third went on a new one."""
    borrow, opened = pool
    clock = pool_clock(monkeypatch)
    after_first = None
    for _ in range(4):
        async with borrow() as conn:
            await conn.execute("SELECT 1")
        after_first = after_first or opened()
        assert opened() == after_first
        clock.spend(HOUR_S + 60)
