"""An application's own target, written the way the README's worked example shows.

The application builds its store (here, a pool) when it starts, which may be after the purge
worker started; the factory hands the worker whatever exists when a step asks.
"""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool


class TmpUploads:
    """Upload slots nobody finished: expired once `expires_at_ms <= now_ms`."""

    name = "tmp_uploads"

    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self.pool = pool

    async def purge_expired(self, now_ms: int) -> int:
        async with self.pool.connection() as conn:
            cur = await conn.execute("DELETE FROM tmp_uploads WHERE expires_at_ms <= %s", (now_ms,))
            return cur.rowcount

    async def count_expired(self, now_ms: int) -> int:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM tmp_uploads WHERE expires_at_ms <= %s", (now_ms,)
            )
            row = await cur.fetchone()
            return int(row[0]) if row else 0


_built: list[TmpUploads] = []
calls = 0


def start_app(pool: AsyncConnectionPool[Any]) -> None:
    """What the application does at its own start."""
    _built[:] = [TmpUploads(pool)]


def stop_app() -> None:
    _built.clear()


def targets() -> list[TmpUploads]:
    """The factory named in the config: `factory = "tests.support.apptargets:targets"`."""
    global calls
    calls += 1
    return list(_built)
