"""The factory of docs/own-targets.md, as printed there (a test runs it under a worker built
from a config, as `pg-purge run` builds one): its module builds its own pool at the first call
and hands the same targets back after."""

from __future__ import annotations

import os
from typing import Any

from psycopg_pool import AsyncConnectionPool


class TmpUploads:
    name = "tmp_uploads"

    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self.pool = pool  # a psycopg_pool.AsyncConnectionPool

    async def purge_expired(self, now_ms: int) -> int:
        await self.pool.open()  # at its first use, in the worker's event loop; then does nothing
        async with self.pool.connection() as conn:
            cur = await conn.execute("DELETE FROM tmp_uploads WHERE expires_at_ms <= %s", (now_ms,))
            return cur.rowcount

    async def count_expired(self, now_ms: int) -> int:  # optional: enables dry runs
        await self.pool.open()
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM tmp_uploads WHERE expires_at_ms <= %s", (now_ms,)
            )
            row = await cur.fetchone()
            return int(row[0]) if row else 0


_built: list[TmpUploads] = []


def targets() -> list[TmpUploads]:  # factory = "myapp.purge:targets"
    # Called for every step: built once. The worker's own pool is not handed to a factory.
    if not _built:
        _built.append(TmpUploads(AsyncConnectionPool(os.environ["APP_DATABASE_URL"], open=False)))
    return _built
