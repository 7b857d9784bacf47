"""Demo data for `dev` mode: expired and live rows in every built-in kind and one `expiring` table,
and, after a pass, which rows stayed and why."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg import AsyncConnection

from activities.engine.batch_sql import flush_statistics, flushes_statistics
from activities.schema import reference_ddl
from purge_config.file import PurgeConfig, parse_config
from purge_ops.render import human_duration, table

MINUTE = 60_000
HOUR = 60 * MINUTE

DEMO_TABLE_DDL = """
CREATE TABLE demo_sessions (
  id         text PRIMARY KEY,
  user_name  text NOT NULL,
  expires_at timestamptz NOT NULL
);
CREATE INDEX ON demo_sessions (expires_at);
"""


def demo_config(database_url: str, task_queue: str = "purge") -> PurgeConfig:
    """Every built-in kind, plus `demo_sessions` as an `expiring` target over a timestamptz."""
    return parse_config(
        {
            "database_url": database_url,
            "task_queue": task_queue,
            "targets": [
                {"kind": "idempotency"},
                {"kind": "rate_limit"},
                {"kind": "auth"},
                {
                    "kind": "expiring",
                    "name": "demo_sessions",
                    "table": "demo_sessions",
                    "column": "expires_at",
                },
            ],
        },
        env={},
    )


async def create_demo(conn: AsyncConnection[Any], now_ms: int) -> None:
    """Create the tables and write rows around `now_ms`: some expired, some live, each labelled."""
    await conn.execute(reference_ddl())
    await conn.execute(DEMO_TABLE_DDL)
    now = datetime.fromtimestamp(now_ms / 1000, tz=UTC)
    async with conn.cursor() as cur:
        await cur.executemany(
            "INSERT INTO x_idempotency (key, response, expires_at_ms) VALUES (%s, %s, %s)",
            [
                ("order-1001", '{"status": 201}', now_ms - 2 * HOUR),
                ("order-1002", '{"status": 201}', now_ms - MINUTE),
                ("order-1003", '{"status": 409}', now_ms + 23 * HOUR),
            ],
        )
        await cur.executemany(
            "INSERT INTO x_rate_limit (key, tokens, capacity, refill_per_ms, last_ms)"
            " VALUES (%s, %s, %s, %s, %s)",
            [
                # 1 token a second, last used an hour ago: long full again.
                ("ip:203.0.113.7", 0.0, 4.0, 1 / 1000, now_ms - HOUR),
                # 1 token a minute, emptied 30 s ago: holds half a token.
                ("ip:198.51.100.2", 0.0, 4.0, 1 / MINUTE, now_ms - 30_000),
                # Nearly full, but not quite.
                ("user:42", 3.0, 4.0, 1 / HOUR, now_ms - 20 * MINUTE),
            ],
        )
        await cur.executemany(
            "INSERT INTO x_auth_failures (key, at_ms, expires_at_ms) VALUES (%s, %s, %s)",
            [
                ("alice", now_ms - 3 * HOUR, now_ms - 2 * HOUR),
                ("alice", now_ms - 90 * MINUTE, now_ms - 30 * MINUTE),
                ("bob", now_ms - 5 * MINUTE, now_ms + 55 * MINUTE),
            ],
        )
        await cur.executemany(
            "INSERT INTO x_auth_lockouts (key, until_ms) VALUES (%s, %s)",
            [("carol", now_ms - 10 * MINUTE), ("dave", now_ms + 15 * MINUTE)],
        )
        await cur.executemany(
            "INSERT INTO demo_sessions (id, user_name, expires_at) VALUES (%s, %s, %s)",
            [
                ("s-1", "alice", now - timedelta(days=1)),
                ("s-2", "bob", now - timedelta(seconds=5)),
                ("s-3", "carol", now + timedelta(days=7)),
            ],
        )
    if flushes_statistics(conn):
        # The rows' counts in the statistics views before this returns: the pass's report
        # reads its live rows there, and a session closed at once flushes only as it exits.
        await conn.execute(flush_statistics())


async def rows_that_stayed(conn: AsyncConnection[Any], now_ms: int) -> str:
    """Every row left in the demo tables with the reason it is live at `now_ms`."""
    rows: list[list[object]] = []

    async def each(query: str) -> list[tuple[Any, ...]]:
        cur = await conn.execute(query)
        return await cur.fetchall()

    for key, expires in await each("SELECT key, expires_at_ms FROM x_idempotency ORDER BY key"):
        rows.append(["x_idempotency", key, f"expires in {human_duration(expires - now_ms)}"])
    for key, tokens, capacity, refill, last in await each(
        "SELECT key, tokens, capacity, refill_per_ms, last_ms FROM x_rate_limit ORDER BY key"
    ):
        held = min(capacity, tokens + (now_ms - last) * refill)
        full_in = (capacity - held) / refill
        rows.append(
            [
                "x_rate_limit",
                key,
                f"holds {held:.2f} of {capacity:g} tokens, full again in {human_duration(full_in)}"
                " (deleting it now would reset its limit)",
            ]
        )
    for key, expires in await each("SELECT key, expires_at_ms FROM x_auth_failures ORDER BY id"):
        rows.append(
            ["x_auth_failures", key, f"failure counts for {human_duration(expires - now_ms)}"]
        )
    for key, until in await each("SELECT key, until_ms FROM x_auth_lockouts ORDER BY key"):
        rows.append(
            ["x_auth_lockouts", key, f"locked out for {human_duration(until - now_ms)} more"]
        )
    for sid, user, expires in await each(
        "SELECT id, user_name, expires_at FROM demo_sessions ORDER BY id"
    ):
        left = expires.timestamp() * 1000 - now_ms
        rows.append(["demo_sessions", f"{sid} ({user})", f"expires in {human_duration(left)}"])
    return table(["table", "row", "why it stayed"], rows)
