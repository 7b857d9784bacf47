"""Arranging rows in the built-in tables and reading back which stayed."""

from __future__ import annotations

from typing import Any

import psycopg

HOUR = 3_600_000
#: Frozen caller clocks far from the database server's real time, one on each side of it: a rule
#: that read the server's clock instead of `now_ms` deletes live rows at the first and leaves
#: expired rows at the second.
PAST_NOW = 1_000_000_000_000  # 2001-09-09T01:46:40Z
FUTURE_NOW = 5_000_000_000_000  # 2128-06-11T08:53:20Z
FROZEN_CLOCKS = [PAST_NOW, FUTURE_NOW]


def keys(db: psycopg.Connection[Any], table: str, column: str = "key") -> set[str]:
    """The values of `column` still in `table`."""
    return {row[0] for row in db.execute(f"SELECT {column} FROM {table}").fetchall()}


def idempotency_rows(db: psycopg.Connection[Any], rows: dict[str, int]) -> None:
    """Keys with their expires_at_ms."""
    with db.cursor() as cur:
        cur.executemany(
            "INSERT INTO x_idempotency (key, response, expires_at_ms) VALUES (%s, '{}', %s)",
            list(rows.items()),
        )


def bucket_rows(
    db: psycopg.Connection[Any], rows: dict[str, tuple[float, float, float, int]]
) -> None:
    """Keys with (tokens, capacity, refill_per_ms, last_ms)."""
    with db.cursor() as cur:
        cur.executemany(
            "INSERT INTO x_rate_limit (key, tokens, capacity, refill_per_ms, last_ms)"
            " VALUES (%s, %s, %s, %s, %s)",
            [(key, *bucket) for key, bucket in rows.items()],
        )


def auth_rows(
    db: psycopg.Connection[Any], failures: dict[str, int], lockouts: dict[str, int]
) -> None:
    """Failures keyed by label with expires_at_ms; lockouts keyed by label with until_ms."""
    with db.cursor() as cur:
        # As bigint: psycopg sends an int that fits in four bytes as int4, and int4 arithmetic
        # overflows within 1000 of -2**31 (hypothesis found -2,147,482,649).
        cur.executemany(
            "INSERT INTO x_auth_failures (key, at_ms, expires_at_ms)"
            " VALUES (%s, %s::bigint - 1000, %s)",
            [(key, expires, expires) for key, expires in failures.items()],
        )
        cur.executemany(
            "INSERT INTO x_auth_lockouts (key, until_ms) VALUES (%s, %s)", list(lockouts.items())
        )


def around(now_ms: int) -> dict[str, int]:
    """Expiry instants on both sides of `now_ms`, labelled by whether they must go."""
    return {
        "gone-1h": now_ms - HOUR,
        "gone-1ms": now_ms - 1,
        "gone-at-now": now_ms,  # inclusive: expiring exactly now is expired
        "kept+1ms": now_ms + 1,
        "kept+1h": now_ms + HOUR,
    }


def keep_labels(labels: dict[str, Any]) -> set[str]:
    """The labels that must stay."""
    return {label for label in labels if label.startswith("kept")}
