"""Tables of many rows in every built-in kind, and the oracle of exactly which rows must stay.

Rows are measured against the real clock (a pass reads `workflow.now()`), so none sits near the
edge: an expired row expired hours ago, a live row stays live for days. No row changes state while
a test runs, whatever the faults cost in time. Keys say what a row is (`e...` expired, `l...`
live) only so a probe can watch a sweep's progress cheaply; the oracle is the sets kept here.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from activities.schema import reference_ddl
from tests.support.rows import HOUR

DAY = 24 * HOUR
#: An expired row expired at least this long before the real clock; a live row stays live at
#: least this long after it.
MARGIN_EXPIRED = 6 * HOUR
MARGIN_LIVE = 3 * DAY
SESSION_MAX_AGE = "7d"
SESSION_MAX_AGE_MS = 7 * DAY

#: The pass, in order: every built-in kind, and an `expiring` table (timestamptz with a max_age).
TARGET_NAMES = ["x_idempotency", "x_rate_limit", "x_auth", "sessions"]


def targets_toml(**sweep: str) -> str:
    """The `[sweep]` bounds and the `[[targets]]` of the pass, as a config file's tail."""
    bounds = "".join(f"{key} = {value!r}\n" for key, value in sweep.items())
    return f"""
[sweep]
{bounds}
[[targets]]
kind = "idempotency"

[[targets]]
kind = "rate_limit"

[[targets]]
kind = "auth"

[[targets]]
kind = "expiring"
name = "sessions"
table = "sessions"
column = "created_at"
max_age = "{SESSION_MAX_AGE}"
"""


@dataclass(frozen=True)
class Table:
    """One table of the pass and the share of its rows that are expired."""

    name: str
    target: str
    expired_share: float
    """A large share is walked page by page, a small one (at most a fifth) goes through the
    index on the expiry column: both ways are swept under faults."""


TABLES = (
    Table("x_idempotency", "x_idempotency", 0.5),
    Table("x_rate_limit", "x_rate_limit", 0.5),  # no index serves the bucket arithmetic: walked
    Table("x_auth_failures", "x_auth", 0.1),
    Table("x_auth_lockouts", "x_auth", 0.4),
    Table("sessions", "sessions", 0.1),
)
TABLE = {table.name: table for table in TABLES}


def tables_of(target: str) -> list[str]:
    """The tables a target sweeps, in the order it sweeps them."""
    return [t.name for t in TABLES if t.target == target]


@dataclass
class Oracle:
    """Exactly which rows each table must hold after a pass run at any instant of the test."""

    now_ms: int
    """The real clock when the rows were written."""
    live: dict[str, set[str]]
    expired: dict[str, set[str]]
    canaries: dict[str, set[str]] = field(default_factory=dict)
    """Expired rows written after their target completed: a pass that ran the target again
    would delete them, so they must stay until the next pass."""

    @property
    def rows(self) -> int:
        """Every row the oracle decides the fate of."""
        sets = (*self.live.values(), *self.expired.values(), *self.canaries.values())
        return sum(len(keys) for keys in sets)

    def expired_of(self, target: str) -> int:
        """How many expired rows `target`'s tables were filled with."""
        return sum(len(self.expired[table]) for table in tables_of(target))


def create_tables(db: psycopg.Connection[Any], builtins: bool = True) -> None:
    """The built-in tables (the reference DDL, unless there already) and `sessions`, in the
    connection's search_path."""
    if builtins:
        db.execute(reference_ddl())
    db.execute("CREATE TABLE sessions (key text PRIMARY KEY, created_at timestamptz NOT NULL)")
    db.execute("CREATE INDEX ON sessions (created_at)")


def fill(db: psycopg.Connection[Any], rows: int, rng: random.Random) -> Oracle:
    """Empty every table, then write `rows` rows into each, expired ones interleaved at random
    among live ones; statistics fresh, so each table gets the strategy its share calls for."""
    now_ms = _real_now_ms()
    live: dict[str, set[str]] = {}
    expired: dict[str, set[str]] = {}
    for table in TABLES:
        db.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(table.name)))
        labels = [rng.random() < table.expired_share for _ in range(rows)]
        keys = [f"{'e' if gone else 'l'}{i}" for i, gone in enumerate(labels)]
        expired[table.name] = {k for k, gone in zip(keys, labels, strict=True) if gone}
        live[table.name] = set(keys) - expired[table.name]
        _copy(db, table.name, _rows(table.name, keys, labels, now_ms, rng))
    for table in TABLES:
        db.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(table.name)))
    return Oracle(now_ms=now_ms, live=live, expired=expired)


def add_canary(db: psycopg.Connection[Any], oracle: Oracle, target: str, label: str) -> None:
    """Write an expired row into each table of `target`, which has completed: it must stay.
    All or none, and once, however often a lost connection makes the caller try again."""
    key = f"canary-{label}"
    rng = random.Random(label)
    with db.transaction():
        for table in tables_of(target):
            there = sql.SQL("SELECT 1 FROM {} WHERE key = %s").format(sql.Identifier(table))
            if not db.execute(there, (key,)).fetchone():
                _copy(db, table, _rows(table, [key], [True], oracle.now_ms, rng))
    for table in tables_of(target):
        oracle.canaries.setdefault(table, set()).add(key)


def check(db: psycopg.Connection[Any], oracle: Oracle) -> int:
    """Assert every table holds exactly its live rows and canaries; the number of rows checked."""
    for table in TABLES:
        left = {
            r[0]
            for r in db.execute(sql.SQL("SELECT key FROM {}").format(sql.Identifier(table.name)))
        }
        lost = oracle.live[table.name] - left
        kept = oracle.expired[table.name] & left
        canaries = oracle.canaries.get(table.name, set())
        assert not lost, f"{table.name}: {len(lost)} live rows deleted, e.g. {sorted(lost)[:5]}"
        assert not kept, f"{table.name}: {len(kept)} expired rows left, e.g. {sorted(kept)[:5]}"
        assert canaries <= left, (
            f"{table.name}: canaries {sorted(canaries - left)} written after its target completed"
            " were deleted: the target ran again"
        )
        assert left == oracle.live[table.name] | canaries, f"{table.name}: rows nobody wrote"
    return oracle.rows


def _real_now_ms() -> int:
    return int(datetime.now(UTC).timestamp() * 1000)


def _copy(db: psycopg.Connection[Any], table: str, rows: Iterator[tuple[Any, ...]]) -> None:
    columns = COLUMNS[table]
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, columns))
    )
    with db.cursor() as cur, cur.copy(statement) as copy:
        for row in rows:
            copy.write_row(row)


COLUMNS = {
    "x_idempotency": ("key", "response", "expires_at_ms"),
    "x_rate_limit": ("key", "tokens", "capacity", "refill_per_ms", "last_ms"),
    "x_auth_failures": ("key", "at_ms", "expires_at_ms"),
    "x_auth_lockouts": ("key", "until_ms"),
    "sessions": ("key", "created_at"),
}


def _rows(
    table: str, keys: list[str], labels: list[bool], now_ms: int, rng: random.Random
) -> Iterator[tuple[Any, ...]]:
    """Each key's row: an expired one's instant hours to weeks in the past, a live one's days
    to weeks ahead (a bucket: full long ago, or spent now and refilling for weeks)."""
    for key, gone in zip(keys, labels, strict=True):
        ago = MARGIN_EXPIRED + rng.randrange(30 * DAY)
        ahead = MARGIN_LIVE + rng.randrange(30 * DAY)
        if table == "x_idempotency":
            yield key, '{"status": 200}', now_ms - ago if gone else now_ms + ahead
        elif table == "x_rate_limit":
            capacity = float(rng.randint(1, 100))
            if gone:  # a token a second for hours: full whatever it held
                yield key, rng.uniform(0, capacity), capacity, 0.001, now_ms - ago
            else:  # at most capacity - 1 tokens, one more per 1e9 ms (11.6 days): not full
                yield key, rng.uniform(0, capacity - 1), capacity, 1e-9, now_ms
        elif table == "x_auth_failures":
            expires = now_ms - ago if gone else now_ms + ahead
            yield key, expires - 15 * 60_000, expires
        elif table == "x_auth_lockouts":
            yield key, now_ms - ago if gone else now_ms + ahead
        else:  # sessions: expired once created_at + 7d <= now
            young = rng.randrange(SESSION_MAX_AGE_MS - MARGIN_LIVE)  # created up to 4 days ago
            created_ms = now_ms - SESSION_MAX_AGE_MS - ago if gone else now_ms - young
            yield key, datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=created_ms)
