"""Each built-in kind deletes exactly the rows expired at the caller's `now_ms`, on a real server.

Every test runs at two frozen caller clocks, one decades before the server's real time and one a
century after: a predicate that compared against the server's `now()` would delete live rows at
the first and leave expired rows at the second, and these tests would fail.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool

from activities import builtin_kinds as kinds
from activities.engine.leftover import oldest_expired
from purge_config.names import TableName
from purge_config.values import parse_duration
from tests.support.rows import (
    FROZEN_CLOCKS,
    HOUR,
    around,
    auth_rows,
    bucket_rows,
    idempotency_rows,
    keep_labels,
    keys,
)

pytestmark = pytest.mark.parametrize("now_ms", FROZEN_CLOCKS, ids=["clock-2001", "clock-2128"])

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def instant(ms: int) -> datetime:
    return EPOCH + timedelta(milliseconds=ms)


async def test_idempotency_removes_keys_expired_at_now_inclusive(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], now_ms: int
) -> None:
    rows = around(now_ms)
    idempotency_rows(db, rows)

    removed = await kinds.idempotency(pool).purge_expired(now_ms)

    assert keys(db, "x_idempotency") == keep_labels(rows)
    assert removed == len(rows) - len(keep_labels(rows))


async def test_rate_limit_removes_only_buckets_full_again_at_now(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], now_ms: int
) -> None:
    per_ms = 1 / 1024  # exact in binary, so "full at exactly now" is exactly 4.0
    buckets = {
        # The regression: emptied at the caller's frozen clock. Against the server's clock it
        # would look full for decades; deleting it would hand the client a free reset.
        "kept-empty-at-now": (0.0, 4.0, per_ms, now_ms),
        "kept-one-ms-short": (0.0, 4.0, per_ms, now_ms - 4095),
        "kept-half": (2.0, 4.0, per_ms, now_ms - 1024),
        "kept-written-after-now": (3.9, 4.0, per_ms, now_ms + 1000),
        "gone-full-exactly-now": (0.0, 4.0, per_ms, now_ms - 4096),
        "gone-full-long-ago": (1.0, 4.0, per_ms, now_ms - HOUR),
        "gone-written-full": (4.0, 4.0, per_ms, now_ms),
    }
    bucket_rows(db, buckets)

    removed = await kinds.rate_limit(pool).purge_expired(now_ms)

    assert keys(db, "x_rate_limit") == keep_labels(buckets)
    assert removed == 3


async def test_rate_limit_survives_buckets_whose_arithmetic_overflows_float8(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], now_ms: int
) -> None:
    """PostgreSQL raises on a float8 overflow: one absurd bucket must not fail the table's sweep
    (found by the property tests); it is judged exactly instead."""
    buckets = {
        "gone-refill-1e300": (0.0, 4.0, 1e300, now_ms - 7 * 24 * HOUR),
        "gone-huge-and-full": (1.7e308, 1.7e308, 1e308, now_ms - 1),
        "kept-huge-capacity": (0.0, 1.7e308, 1.0, now_ms - HOUR),
        "gone-ordinary": (4.0, 4.0, 0.001, now_ms),
        "kept-ordinary": (0.0, 4.0, 0.001, now_ms),
    }
    await counted_and_swept(db, pool, now_ms, buckets, 3)


async def test_rate_limit_keeps_a_bucket_holding_nan_or_an_infinity(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], now_ms: int
) -> None:
    """PostgreSQL's numeric ranks NaN above every number: a bucket holding NaN (or an infinite
    refill, whose 0 * Infinity is NaN there) went to the exact branch and read as full, where
    a client's IEEE arithmetic never calls NaN full. Deleting it would reset its limit: kept,
    as any bucket holding NaN or an infinity is, beside an ordinary full one."""
    buckets = {
        "kept-nan-tokens": (float("nan"), 4.0, 0.001, now_ms - HOUR),
        "kept-nan-refill": (0.0, 4.0, float("nan"), now_ms - HOUR),
        "kept-nan-capacity": (0.0, float("nan"), 0.001, now_ms - HOUR),
        "kept-infinite-refill-now": (0.0, 4.0, float("inf"), now_ms),
        "kept-infinite-tokens": (float("inf"), 4.0, 0.001, now_ms - HOUR),
        "gone-ordinary": (4.0, 4.0, 0.001, now_ms),
    }
    await counted_and_swept(db, pool, now_ms, buckets, 1)


async def test_the_oldest_full_bucket_left_is_read_whatever_its_refill(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], now_ms: int
) -> None:
    """What a sweep cut short reads of the buckets it left: when the oldest became full. A full
    bucket that refills at 0 a ms divided by zero there, and the read failed; it has been full
    since its last_ms. (The reference table refuses a refill of 0; an application's may not.)"""
    db.execute("ALTER TABLE x_rate_limit DROP CONSTRAINT x_rate_limit_refill_per_ms_check")
    bucket_rows(
        db,
        {
            "gone-full-no-refill": (4.0, 4.0, 0.0, now_ms - 3 * HOUR),
            "gone-refilled": (0.0, 4.0, 0.001, now_ms - 2 * HOUR),
        },
    )
    [rule] = kinds.rate_limit(pool).rules
    async with pool.connection() as conn:
        pred = await rule.bind(conn, now_ms)
        cur = await conn.execute(oldest_expired(pred), pred.params)
        row = await cur.fetchone()

    assert row == (now_ms - 3 * HOUR,)


async def counted_and_swept(
    db: psycopg.Connection[Any],
    pool: AsyncConnectionPool[Any],
    now_ms: int,
    buckets: dict[str, tuple[float, float, float, int]],
    gone: int,
) -> None:
    """`buckets` written, then a dry run's count and a sweep each say `gone`, and the buckets
    kept are those labelled so."""
    bucket_rows(db, buckets)
    target = kinds.rate_limit(pool)

    assert await target.count_expired(now_ms) == gone
    assert await target.purge_expired(now_ms) == gone
    assert keys(db, "x_rate_limit") == keep_labels(buckets)


async def test_auth_sweeps_failures_and_lockouts_as_one_target(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], now_ms: int
) -> None:
    failures = around(now_ms)
    lockouts = {f"{label}-lock": at for label, at in around(now_ms).items()}
    auth_rows(db, failures, lockouts)

    removed = await kinds.auth(pool).purge_expired(now_ms)

    assert keys(db, "x_auth_failures") == keep_labels(failures)
    assert keys(db, "x_auth_lockouts") == keep_labels(lockouts)
    assert removed == 6  # three from each table, summed


@pytest.mark.parametrize("column_type", ["bigint", "timestamptz", "timestamp"])
async def test_expiring_compares_each_column_type_with_now(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], now_ms: int, column_type: str
) -> None:
    db.execute(f"CREATE TABLE sessions (key text PRIMARY KEY, expires_at {column_type})")
    rows = around(now_ms)
    for label, at in rows.items():
        value: object = at if column_type == "bigint" else instant(at)
        if column_type == "timestamp":
            value = instant(at).replace(tzinfo=None)  # stored as UTC wall time
        db.execute("INSERT INTO sessions VALUES (%s, %s)", (label, value))

    target = kinds.expiring(pool, "sessions", TableName("sessions"), "expires_at")
    removed = await target.purge_expired(now_ms)

    assert keys(db, "sessions") == keep_labels(rows)
    assert removed == 3


@pytest.mark.parametrize("column_type", ["timestamptz", "timestamp"])
async def test_expiring_timestamps_ignore_the_session_time_zone(
    db: psycopg.Connection[Any], schema_url: str, now_ms: int, column_type: str
) -> None:
    """A `timestamp` is read as UTC and a `timestamptz` as the instant it is, whatever the
    connection's TimeZone: here +05:45, so a local-time reading would be off by hours."""
    db.execute(f"CREATE TABLE sessions (key text PRIMARY KEY, expires_at {column_type})")
    rows = {"gone-1min": now_ms - 60_000, "kept+1min": now_ms + 60_000}
    for label, at in rows.items():
        value = instant(at) if column_type == "timestamptz" else instant(at).replace(tzinfo=None)
        db.execute("INSERT INTO sessions VALUES (%s, %s)", (label, value))

    options = conninfo_to_dict(schema_url)["options"]
    url = make_conninfo(schema_url, options=f"{options} -c TimeZone=Asia/Kathmandu")
    async with AsyncConnectionPool(url, open=False, kwargs={"autocommit": True}) as nepal:
        await nepal.open()
        target = kinds.expiring(nepal, "sessions", TableName("sessions"), "expires_at")
        assert await target.purge_expired(now_ms) == 1

    assert keys(db, "sessions") == {"kept+1min"}


async def test_expiring_max_age_counts_from_the_age_column(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], now_ms: int
) -> None:
    db.execute("CREATE TABLE audit (key text PRIMARY KEY, created_at timestamptz NOT NULL)")
    age = parse_duration("1h30m")
    rows = {
        "gone-older": now_ms - age - 1,
        "gone-exactly-max-age": now_ms - age,  # created_at + max_age == now: expired
        "kept-younger-by-1ms": now_ms - age + 1,
        "kept-new": now_ms,
    }
    for label, at in rows.items():
        db.execute("INSERT INTO audit VALUES (%s, %s)", (label, instant(at)))

    target = kinds.expiring(pool, "audit", TableName("audit"), "created_at", max_age_ms=age)

    assert await target.purge_expired(now_ms) == 2
    assert keys(db, "audit") == keep_labels(rows)


@pytest.mark.parametrize("slack_ms", [0, 999], ids=["on-the-second", "within-the-second"])
async def test_expiring_integer_column_of_seconds_with_max_age(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], now_ms: int, slack_ms: int
) -> None:
    """An `integer` column of epoch seconds (unit = "s"), whatever the caller's clock: the
    cutoff is converted, never the column, and is exact at the boundary (a cutoff inside a
    second reaches back to that second, not past it)."""
    db.execute("CREATE TABLE ticks (key text PRIMARY KEY, at_s integer NOT NULL)")
    max_age_ms = now_ms - 1_000_000_000_000 - slack_ms  # cutoff = 1e12 ms (+ slack) = 1e9 s
    rows = {"gone-before": 999_999_999, "gone-at-cutoff": 1_000_000_000, "kept": 1_000_000_001}
    for label, at in rows.items():
        db.execute("INSERT INTO ticks VALUES (%s, %s)", (label, at))

    target = kinds.expiring(
        pool, "ticks", TableName("ticks"), "at_s", max_age_ms=max_age_ms, unit="s"
    )

    assert await target.purge_expired(now_ms) == 2
    assert keys(db, "ticks") == {"kept"}


async def test_expiring_names_are_quoted_exactly_and_schema_qualified(
    pg_url: str, now_ms: int
) -> None:
    """`app.Sessions` finds the mixed-case table in schema `app`, even off the search_path."""
    app = f"App_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_url, autocommit=True) as db:
        db.execute(f'CREATE SCHEMA "{app}"')
        try:
            db.execute(f'CREATE TABLE "{app}"."Sessions" ("Expires" bigint, key text)')
            db.execute(
                f'INSERT INTO "{app}"."Sessions" VALUES (%s, %s), (%s, %s)',
                (now_ms - 1, "gone", now_ms + 1, "kept"),
            )
            async with AsyncConnectionPool(pg_url, open=False, kwargs={"autocommit": True}) as p:
                await p.open()
                table = TableName.parse(f"{app}.Sessions")
                target = kinds.expiring(p, "s", table, "Expires")
                assert await target.purge_expired(now_ms) == 1
            assert keys(db, f'"{app}"."Sessions"') == {"kept"}
        finally:
            db.execute(f'DROP SCHEMA "{app}" CASCADE')


async def test_count_expired_counts_what_purge_removes_and_deletes_nothing(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], now_ms: int
) -> None:
    idempotency_rows(db, around(now_ms))
    auth_rows(db, around(now_ms), {"lock-gone": now_ms - 5, "lock-kept": now_ms + 5})
    bucket_rows(db, {"full": (4.0, 4.0, 0.001, now_ms), "empty": (0.0, 4.0, 0.001, now_ms)})
    targets = [kinds.idempotency(pool), kinds.auth(pool), kinds.rate_limit(pool)]

    counted = [await t.count_expired(now_ms) for t in targets]
    assert counted == [3, 4, 1]
    assert len(keys(db, "x_idempotency")) == 5  # nothing deleted by counting
    assert [await t.purge_expired(now_ms) for t in targets] == counted
