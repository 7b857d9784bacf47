"""Schema-per-tenant databases for the pattern tests: many `PREFIX_NNNN.sessions` tables."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from activities.builtin_kinds import build_registry
from activities.engine.batch_sql import flush_statistics, flushes_statistics
from activities.registry import TargetRegistry
from purge_config.file import parse_config
from tests.support.arranging import arranging
from tests.support.gate import HeldGate

HOUR_MS = 3_600_000


def tenant_prefix() -> str:
    """A schema prefix no other test uses."""
    return f"tn{uuid.uuid4().hex[:8]}"


def expired_of(i: int) -> int:
    """How many expired rows tenant `i` is given: 0 to 3, so the counts differ by table."""
    return i % 4


def create_tenants(
    conn: psycopg.Connection[Any],
    prefix: str,
    tenants: range,
    now_ms: int,
    live: int = 2,
    column: str = "expires_at",
) -> None:
    """Tenants `PREFIX_NNNN` with a `sessions` table each: `expired_of(i)` rows expired an hour
    before `now_ms`, `live` rows expiring an hour after it. One round trip for them all, their
    counts in the statistics views before it returns (PostgreSQL 15+)."""
    statements = [
        sql.SQL(
            "CREATE SCHEMA {s}; "
            "CREATE TABLE {s}.sessions (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
            "{c} bigint NOT NULL); "
            "CREATE INDEX ON {s}.sessions ({c}); "
            "INSERT INTO {s}.sessions ({c}) SELECT {old} FROM generate_series(1, {expired}) "
            "UNION ALL SELECT {new} FROM generate_series(1, {live});"
        ).format(
            s=sql.Identifier(f"{prefix}_{i:04d}"),
            c=sql.Identifier(column),
            old=sql.Literal(now_ms - HOUR_MS),
            new=sql.Literal(now_ms + HOUR_MS),
            expired=sql.Literal(expired_of(i)),
            live=sql.Literal(live),
        )
        for i in tenants
    ]
    # The inserts' counts reach the statistics views as the session goes idle, not up to ten
    # seconds later, after a sweep's ANALYZE has counted the rows itself.
    if flushes_statistics(conn):
        statements.append(flush_statistics() + sql.SQL(";"))
    conn.execute(sql.SQL("\n").join(statements))


def counts(
    conn: psycopg.Connection[Any], prefix: str, now_ms: int, tenants: range | None = None
) -> dict[str, tuple[int, int]]:
    """Per tenant schema (every one, or those of `tenants`): (expired rows left, live rows
    left)."""
    found: dict[str, tuple[int, int]] = {}
    schemas = conn.execute(
        "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s ORDER BY 1", (prefix + "\\_%",)
    ).fetchall()
    if tenants is not None:
        schemas = [(f"{prefix}_{i:04d}",) for i in tenants]
    for (schema,) in schemas:
        row = conn.execute(
            sql.SQL(
                "SELECT count(*) FILTER (WHERE expires_at <= %s), "
                "count(*) FILTER (WHERE expires_at > %s) FROM {}.sessions"
            ).format(sql.Identifier(schema)),
            (now_ms, now_ms),
        ).fetchone()
        assert row is not None
        found[schema] = (row[0], row[1])
    return found


def drop_tenants(conn: psycopg.Connection[Any], prefix: str) -> None:
    for (schema,) in conn.execute(
        "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (prefix + "\\_%",)
    ).fetchall():
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


@contextmanager
def tenant_schemas(url: str, prefix: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection for arranging tenants; every `PREFIX_*` schema dropped after."""
    with arranging(url) as conn:
        try:
            yield conn
        finally:
            drop_tenants(conn, prefix)


def gated_tenants(prefix: str, pool: AsyncConnectionPool[Any]) -> tuple[HeldGate, TargetRegistry]:
    """A held `gate` target and the pattern `sessions` over `PREFIX_*.sessions`: a pass of
    `{"targets": ["gate", "sessions"], "patterns": ["sessions"]}` is held at the gate with
    the tenants matched, behind it in its child."""
    config = parse_config(
        {
            "targets": [
                {"kind": "python", "factory": "tests.support.gate:targets"},
                {
                    "kind": "expiring",
                    "name": "sessions",
                    "table": f"{prefix}_*.sessions",
                    "column": "expires_at",
                },
            ]
        }
    )
    gate = HeldGate()
    return gate, TargetRegistry([gate], patterns=build_registry(config, pool).patterns)
