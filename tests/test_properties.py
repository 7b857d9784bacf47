"""For every built-in kind, the rows the real SQL deletes are exactly the rows the design calls
expired, at any caller clock the package accepts.

Each oracle below is the design's table ("a row is expired when ...") written out in plain Python;
none calls package code. Rows are drawn around the instant where they turn expired (on it, one
millisecond, one microsecond or one ulp either side) and anywhere their column can hold.

Hypothesis runs every example of a test inside one pytest call, so function-scoped fixtures are
made once per test: the schema (and its connection) is shared by the examples, and each example
empties the tables it uses (DELETE: a TRUNCATE costs more than the rest of an example) before
writing its rows. The tests are async, on pytest-asyncio's
session loop, and every example of a test sweeps through the same pool (one per session time
zone): a new loop and pool per example cost more than the sweep itself.

`HYPOTHESIS_PROFILE=ci` (as `.ci/run` sets it) runs a hundred times the examples.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool

from activities import builtin_kinds as kinds
from activities.clock import EARLIEST_NOW_MS, LATEST_NOW_MS
from activities.errors import BadPurgeTarget
from activities.registry import CountingTarget
from activities.sweep import contract_errors
from purge_config.file import parse_config
from purge_config.values import parse_duration
from tests.conftest import Pools
from tests.support.rows import (
    FUTURE_NOW,
    HOUR,
    PAST_NOW,
    auth_rows,
    bucket_rows,
    idempotency_rows,
    keys,
)

#: The default run's examples: enough to catch a boundary moved by a whole unit, cheap enough for a
#: run every few minutes. CI runs the property files again with HYPOTHESIS_PROFILE=ci (1000).
settings.register_profile(
    "purge-properties",
    max_examples=10,
    # A first example pays for the pool's first connection; timing says nothing here.
    deadline=None,
    # Safe: every example empties (or creates afresh) the tables it uses before writing rows.
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "purge-properties-ci", settings.get_profile("purge-properties"), max_examples=1000
)
PROFILE = settings.get_profile(
    "purge-properties-ci" if os.environ.get("HYPOTHESIS_PROFILE") == "ci" else "purge-properties"
)


def examples(times: int) -> settings:
    """The profile, with `times` its number of examples: cheap properties run more of them."""
    return settings(PROFILE, max_examples=PROFILE.max_examples * times)


DAY = 24 * HOUR
BIGINT_MIN, BIGINT_MAX = -(2**63), 2**63 - 1
INTEGER_MIN, INTEGER_MAX = -(2**31), 2**31 - 1
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: What a Python datetime can hold, in microseconds from the epoch (years 1 to 9999).
MIN_US = (datetime(1, 1, 1, tzinfo=UTC) - EPOCH) // timedelta(microseconds=1)
MAX_US = (datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC) - EPOCH) // timedelta(
    microseconds=1
)
#: The design's max_age units, in milliseconds.
UNIT_MS = {"w": 604_800_000, "d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1_000, "ms": 1}
#: parse_duration refuses an age longer than a century.
CENTURY_MS = 36_525 * 86_400_000
MAX_ROWS = 25

Bucket = tuple[float, float, float, int]
"""(tokens, capacity, refill_per_ms, last_ms), as `bucket_rows` writes them."""
Instant = int | str | None
"""An `expiring` column's value: epoch ms or epoch µs, "infinity", "-infinity", or NULL."""


# The oracles: the design's definitions, nothing more.


def past_expires_at(expires_at_ms: int, now_ms: int) -> bool:
    """x_idempotency and x_auth_failures: `expires_at_ms <= now_ms`."""
    return expires_at_ms <= now_ms


def past_until(until_ms: int, now_ms: int) -> bool:
    """x_auth_lockouts: `until_ms <= now_ms`."""
    return until_ms <= now_ms


def bucket_full(bucket: Bucket, now_ms: int) -> bool:
    """x_rate_limit: `tokens + (now_ms - last_ms) * refill_per_ms >= capacity`, in IEEE doubles
    operation by operation, as a client computes it (and PostgreSQL's float8 does)."""
    tokens, capacity, refill_per_ms, last_ms = bucket
    gained = (float(now_ms) - float(last_ms)) * float(refill_per_ms)
    return float(tokens) + gained >= float(capacity)


def expiring_expired(
    value: Instant, column_type: str, max_age_ms: int, now_ms: int, unit: str = "ms"
) -> bool:
    """`column + max_age <= now`, the column read in its unit; a NULL column makes that
    unknown, which is not expired."""
    if value is None or value == "infinity":
        return False
    if value == "-infinity":
        return True
    assert isinstance(value, int)
    if column_type in ("bigint", "integer") and unit == "s":
        return value * 1000 + max_age_ms <= now_ms
    if column_type in ("bigint", "integer") and unit == "ms":
        return value + max_age_ms <= now_ms
    # Microseconds: the unit us, and a timestamp's resolution.
    return value + max_age_ms * 1000 <= now_ms * 1000


#: The plausible epoch instants in each unit (1973 to the year 5138); "never expires"
#: sentinels (the largest and smallest integers) do not count.
PLAUSIBLE = {"s": (10**8, 10**11), "ms": (10**11, 10**14), "us": (10**14, 10**17)}
SENTINELS = {BIGINT_MIN, BIGINT_MAX, INTEGER_MIN, INTEGER_MAX}


def wrong_unit(values: list[Instant], unit: str = "ms") -> bool:
    """The design's refusal: most of an epoch column's values are not plausible instants in
    its unit (read here from every row: these tables are never analyzed), or any of them is
    one in a coarser unit only (from 1e8 up to its unit's plausible instants: seconds in ms,
    seconds or ms in us), which would read as long expired."""
    low, high = PLAUSIBLE[unit]
    seen = [v for v in values if isinstance(v, int) and v not in SENTINELS]
    coarse = unit != "s" and any(PLAUSIBLE["s"][0] <= v < low for v in seen)
    return coarse or (bool(seen) and 2 * sum(not low <= v <= high for v in seen) > len(seen))


# Strategies.

#: Caller clocks: both ends of the accepted window, the frozen clocks of test_kinds, anywhere.
CLOCKS = st.one_of(
    st.sampled_from([EARLIEST_NOW_MS, LATEST_NOW_MS - 1, PAST_NOW, FUTURE_NOW]),
    st.integers(EARLIEST_NOW_MS, LATEST_NOW_MS - 1),
)


def near(center: int, lo: int, hi: int, unit: int = 1) -> st.SearchStrategy[int]:
    """On `center`, a unit or half a unit either side, within a day of it, or anywhere in
    [lo, hi]; clamped into [lo, hi] (a column's range), which also draws its two ends."""
    day = DAY * unit
    offsets = st.one_of(
        st.sampled_from([0, -1, 1, -unit, unit, -unit // 2, unit // 2]),
        st.integers(-day, day),
    )
    return st.one_of(
        offsets.map(lambda d: min(max(center + d, lo), hi)),
        st.integers(lo, hi),
    )


@st.composite
def clock_and_expiries(
    draw: st.DrawFn, tables: int = 1, lo: int = BIGINT_MIN
) -> tuple[int, list[list[int]]]:
    """`now_ms` and, for each table, expiry instants around it; `now_ms` is often exactly one
    row's instant (so rows sit on it and a millisecond either side)."""
    anchor = draw(CLOCKS)
    instants = [
        draw(st.lists(near(anchor, lo, BIGINT_MAX), max_size=MAX_ROWS)) for _ in range(tables)
    ]
    in_window = [i for rows in instants for i in rows if EARLIEST_NOW_MS <= i < LATEST_NOW_MS]
    return draw(st.sampled_from([anchor, *in_window])), instants


CAPACITIES = st.one_of(
    st.sampled_from([1.0, 4.0, 10.0, 100.0, 1e6]),
    st.floats(min_value=1e-6, max_value=1e12),
)
#: Refill rates inexact in binary (1/3, 0.001), exact ones (1/1024), huge, tiny and subnormal.
#: At most 1e9 a millisecond, with tokens and capacity at most 1e12, so every sum and product stays
#: finite: where IEEE would give infinity, PostgreSQL's float8 raises "value out of range:
#: overflow" and the whole DELETE fails (refill_per_ms 1e300 and a week since last_ms does it).
REFILLS = st.one_of(
    st.sampled_from([1 / 3, 0.001, 0.1, 1 / 1024, 1 / 60_000, 1e6, 1e9, 1e-12, 1e-300, 5e-324]),
    st.floats(min_value=5e-324, max_value=1e9),
)
#: now_ms - last_ms: none, a millisecond, last written after now, a month, anywhere.
ELAPSED = st.one_of(
    st.sampled_from([0, 1, -1]),
    st.integers(-HOUR, 30 * DAY),
    st.integers(-(2**62), 2**62),
)


def ulps(x: float, n: int) -> float:
    """`x` moved `n` representable doubles up (n > 0) or down (n < 0)."""
    for _ in range(abs(n)):
        x = math.nextafter(x, math.inf if n > 0 else -math.inf)
    return x


@st.composite
def bucket_full_near(draw: st.DrawFn, now_ms: int) -> Bucket:
    """A bucket between empty and full that refills to capacity at `now_ms`, give or take 1 ms."""
    capacity, refill = draw(CAPACITIES), draw(REFILLS)
    tokens = draw(st.floats(min_value=0.0, max_value=capacity))
    wait_ms = min((capacity - tokens) / refill, 2.0**62)
    elapsed = math.ceil(wait_ms) + draw(st.integers(-1, 1))
    return tokens, capacity, refill, now_ms - elapsed


@st.composite
def bucket_full_to_the_ulp(draw: st.DrawFn, now_ms: int) -> Bucket:
    """A bucket whose tokens (or capacity) make it full at `now_ms` to the last bit, then
    nudged up to two ulps either way."""
    capacity, refill = draw(CAPACITIES), draw(REFILLS)
    last_ms = now_ms - draw(ELAPSED)
    gained = (float(now_ms) - float(last_ms)) * refill
    nudge = draw(st.integers(-2, 2))
    if draw(st.booleans()):
        return ulps(capacity - gained, nudge), capacity, refill, last_ms
    tokens = draw(st.floats(min_value=0.0, max_value=capacity))
    return tokens, ulps(tokens + gained, nudge), refill, last_ms


@st.composite
def bucket_anywhere(draw: st.DrawFn, now_ms: int) -> Bucket:
    """Any bucket: tokens below empty or above capacity, last_ms anywhere a bigint reaches."""
    capacity, refill = draw(CAPACITIES), draw(REFILLS)
    tokens = draw(st.floats(min_value=-capacity, max_value=2 * capacity))
    last_ms = draw(
        st.one_of(ELAPSED.map(lambda e: now_ms - e), st.integers(BIGINT_MIN, BIGINT_MAX))
    )
    return tokens, capacity, refill, last_ms


@st.composite
def clock_and_buckets(draw: st.DrawFn) -> tuple[int, list[Bucket]]:
    """`now_ms` and buckets around the instant each is full again."""
    now_ms = draw(CLOCKS)
    bucket = st.one_of(
        bucket_full_near(now_ms), bucket_full_to_the_ulp(now_ms), bucket_anywhere(now_ms)
    )
    return now_ms, draw(st.lists(bucket, max_size=MAX_ROWS))


@st.composite
def spelled(draw: st.DrawFn, total_ms: int) -> tuple[str, int]:
    """`total_ms` as a max_age string of random unit parts, largest unit first ("2d0h90m7ms"),
    with the value its parts add up to by the design's units."""
    parts: list[tuple[str, str]] = []
    rest = total_ms
    for unit, size in UNIT_MS.items():
        n = rest // size if unit == "ms" else draw(st.integers(0, rest // size))
        rest -= n * size
        if n or draw(st.booleans()):
            digits = str(n).zfill(draw(st.integers(1, len(str(n)) + 2)))  # "007s" is 7 s
            parts.append((digits, unit))
    if not parts:
        parts.append(("0", draw(st.sampled_from(list(UNIT_MS)))))
    text = "".join(digits + unit for digits, unit in parts)
    return text, sum(int(digits) * UNIT_MS[unit] for digits, unit in parts)


AGES = st.one_of(
    st.sampled_from([0, 1, 1_000, 60_000, HOUR, 90 * 60_000, DAY, 7 * DAY, 30 * DAY, CENTURY_MS]),
    st.integers(0, CENTURY_MS),
)


EXPIRING_TYPES = ["bigint", "integer", "timestamptz", "timestamp"]


@dataclass(frozen=True)
class ExpiringCase:
    """One `expiring` table and the pass that sweeps it."""

    column_type: str
    now_ms: int
    max_age: str
    max_age_ms: int
    """What `max_age` adds up to by the design's units (not by parse_duration)."""
    time_zone: str
    """The sweep's session TimeZone: a timestamp is read as UTC whatever it is."""
    values: list[Instant]
    """Epoch instants in `unit` for bigint and integer, epoch µs for timestamptz and timestamp."""
    unit: str = "ms"
    """An integer column's unit (the target's `unit` key)."""


@st.composite
def expiring_cases(draw: st.DrawFn) -> ExpiringCase:
    """A column type, a clock and an age, and column values around `now - max_age`."""
    column_type = draw(st.sampled_from(EXPIRING_TYPES))
    if column_type == "integer" and draw(st.booleans()):
        # An integer of ms ends in January 1970: aim the age there so rows fall on both sides.
        cutoff_ms = draw(st.integers(INTEGER_MIN, INTEGER_MAX))
        age = draw(st.integers(EARLIEST_NOW_MS - cutoff_ms, CENTURY_MS))
        now_ms = cutoff_ms + age
    else:
        now_ms, age = draw(CLOCKS), draw(AGES)
    max_age, max_age_ms = draw(spelled(age))
    cutoff_ms = now_ms - max_age_ms
    specials: list[Instant] = [None]
    unit = "ms"
    if column_type in ("bigint", "integer"):
        # An integer column of seconds, ms or µs; rows around the cutoff in that unit.
        unit = draw(st.sampled_from(["ms", "s", "us"] if column_type == "bigint" else ["ms", "s"]))
        lo, hi = (BIGINT_MIN, BIGINT_MAX) if column_type == "bigint" else (INTEGER_MIN, INTEGER_MAX)
        center = {"ms": cutoff_ms, "s": cutoff_ms // 1000, "us": cutoff_ms * 1000}[unit]
        scale = {"ms": 1, "s": 1, "us": 1000}[unit]
        value = near(max(lo, min(hi, center)), lo, hi, unit=scale)
    else:
        # A microsecond either side, and half a millisecond: cutoff + 0.5 ms stays, - 0.5 ms goes.
        value = near(cutoff_ms * 1000, MIN_US, MAX_US, unit=1000)
        specials += ["infinity", "-infinity"]
    values: list[Instant] = [
        *draw(st.lists(value, max_size=MAX_ROWS)),
        *draw(st.lists(st.sampled_from(specials), max_size=3)),
    ]
    zone = draw(
        st.sampled_from(["UTC", "Asia/Kathmandu", "America/St_Johns", "Pacific/Kiritimati"])
    )
    return ExpiringCase(column_type, now_ms, max_age, max_age_ms, zone, values, unit)


# Running a target.


@pytest.fixture(autouse=True)
def never_analyzed(db: psycopg.Connection[Any]) -> None:
    """No autovacuum on the built-in tables: an ANALYZE between examples would leave one
    example's statistics for the next, and the unit check reads them when they exist. Each
    example's check then reads its own rows, as the oracle `wrong_unit` does."""
    for table in ("x_idempotency", "x_auth_failures", "x_auth_lockouts", "x_rate_limit"):
        db.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")


@pytest.fixture
def expiring_tables(db: psycopg.Connection[Any]) -> dict[str, str]:
    """An `expiring` table per column type, made once for all of a test's examples (each
    example empties the one it uses): column type -> table name."""
    tables = {column_type: f"expiring_{column_type}" for column_type in EXPIRING_TYPES}
    for column_type, table in tables.items():
        db.execute(
            f"CREATE TABLE {table} (key text PRIMARY KEY, expires_at {column_type})"
            " WITH (autovacuum_enabled = off)"
        )
    return tables


async def sweep(
    pool: AsyncConnectionPool[Any],
    build: Callable[[AsyncConnectionPool[Any]], CountingTarget],
    now_ms: int,
) -> tuple[int, int]:
    """`count_expired(now_ms)`, then `purge_expired(now_ms)`, of the target `build` makes.

    If counting deleted anything, the purge after it would remove fewer rows than expected.
    """
    target = build(pool)
    return await target.count_expired(now_ms), await target.purge_expired(now_ms)


async def refused(
    pool: AsyncConnectionPool[Any],
    build: Callable[[AsyncConnectionPool[Any]], CountingTarget],
    now_ms: int,
) -> None:
    """The target refuses both the count and the purge as BadPurgeTarget."""
    target = build(pool)
    with (
        pytest.raises(BadPurgeTarget, match=r"(do not|some of its values) look like epoch"),
        contract_errors(),
    ):
        await target.count_expired(now_ms)
    with (
        pytest.raises(BadPurgeTarget, match=r"(do not|some of its values) look like epoch"),
        contract_errors(),
    ):
        await target.purge_expired(now_ms)


def with_time_zone(url: str, zone: str) -> str:
    """`url` with the session TimeZone set, keeping the options (search_path) it has."""
    options = conninfo_to_dict(url).get("options", "")
    return make_conninfo(url, options=f"{options} -c TimeZone={zone}".strip())


def as_timestamp(value: Instant, column_type: str) -> object:
    """An `expiring` value as psycopg should send it for `column_type`."""
    if not isinstance(value, int) or column_type in ("bigint", "integer"):
        return value
    at = EPOCH + timedelta(microseconds=value)
    return at if column_type == "timestamptz" else at.replace(tzinfo=None)  # UTC wall time


# The properties.


@examples(2)
@given(case=clock_and_expiries())
async def test_idempotency_deletes_exactly_the_expired_keys(
    db: psycopg.Connection[Any], schema_url: str, pools: Pools, case: tuple[int, list[list[int]]]
) -> None:
    """x_idempotency loses exactly its rows with `expires_at_ms <= now_ms`; count agrees."""
    now_ms, (instants,) = case
    db.execute("DELETE FROM x_idempotency")
    rows = {f"k{i}": at for i, at in enumerate(instants)}
    idempotency_rows(db, rows)
    expired = {key for key, at in rows.items() if past_expires_at(at, now_ms)}
    if wrong_unit(list(rows.values())):
        await refused(await pools(schema_url), kinds.idempotency, now_ms)
        assert keys(db, "x_idempotency") == rows.keys()  # nothing deleted
        return

    counted, removed = await sweep(await pools(schema_url), kinds.idempotency, now_ms)

    assert keys(db, "x_idempotency") == rows.keys() - expired
    assert (counted, removed) == (len(expired), len(expired))


@examples(2)
@given(case=clock_and_expiries(tables=2, lo=BIGINT_MIN + 1000))  # auth_rows writes at = exp - 1s
async def test_auth_deletes_expired_failures_and_lockouts_and_sums_them(
    db: psycopg.Connection[Any], schema_url: str, pools: Pools, case: tuple[int, list[list[int]]]
) -> None:
    """x_auth_failures loses its rows with `expires_at_ms <= now_ms`, x_auth_lockouts those with
    `until_ms <= now_ms`; the count and the removed total are the sum over both."""
    now_ms, (failure_instants, lockout_instants) = case
    db.execute("DELETE FROM x_auth_failures")
    db.execute("DELETE FROM x_auth_lockouts")
    failures = {f"f{i}": at for i, at in enumerate(failure_instants)}
    lockouts = {f"l{i}": at for i, at in enumerate(lockout_instants)}
    auth_rows(db, failures, lockouts)
    expired_failures = {k for k, at in failures.items() if past_expires_at(at, now_ms)}
    expired_lockouts = {k for k, at in lockouts.items() if past_until(at, now_ms)}
    total = len(expired_failures) + len(expired_lockouts)
    if wrong_unit(list(failures.values())) or wrong_unit(list(lockouts.values())):
        await refused(await pools(schema_url), kinds.auth, now_ms)
        # Neither table loses a row: both are checked before the first delete.
        assert keys(db, "x_auth_failures") == failures.keys()
        assert keys(db, "x_auth_lockouts") == lockouts.keys()
        return

    counted, removed = await sweep(await pools(schema_url), kinds.auth, now_ms)

    assert keys(db, "x_auth_failures") == failures.keys() - expired_failures
    assert keys(db, "x_auth_lockouts") == lockouts.keys() - expired_lockouts
    assert (counted, removed) == (total, total)


@examples(4)
@given(case=clock_and_buckets())
async def test_rate_limit_deletes_exactly_the_buckets_full_at_now(
    db: psycopg.Connection[Any], schema_url: str, pools: Pools, case: tuple[int, list[Bucket]]
) -> None:
    """x_rate_limit loses exactly the buckets with
    `tokens + (now_ms - last_ms) * refill_per_ms >= capacity` in float8; count agrees."""
    now_ms, buckets = case
    db.execute("DELETE FROM x_rate_limit")
    rows = {f"b{i}": bucket for i, bucket in enumerate(buckets)}
    bucket_rows(db, rows)
    full = {key for key, bucket in rows.items() if bucket_full(bucket, now_ms)}
    if wrong_unit([bucket[3] for bucket in buckets]):  # last_ms
        await refused(await pools(schema_url), kinds.rate_limit, now_ms)
        assert keys(db, "x_rate_limit") == rows.keys()
        return

    counted, removed = await sweep(await pools(schema_url), kinds.rate_limit, now_ms)

    assert keys(db, "x_rate_limit") == rows.keys() - full
    assert (counted, removed) == (len(full), len(full))


@examples(6)
@given(case=expiring_cases())
async def test_expiring_deletes_exactly_the_rows_past_max_age(
    db: psycopg.Connection[Any],
    schema_url: str,
    pools: Pools,
    expiring_tables: dict[str, str],
    case: ExpiringCase,
) -> None:
    """An `expiring` table (bigint or integer ms, timestamptz, timestamp as UTC) configured with
    a max_age string loses exactly the rows with `column + max_age <= now`; count agrees."""
    table = expiring_tables[case.column_type]
    db.execute(f"DELETE FROM {table}")
    rows = {f"r{i}": value for i, value in enumerate(case.values)}
    with db.cursor() as cur:
        cur.executemany(
            f"INSERT INTO {table} VALUES (%s, %s::{case.column_type})",
            [(key, as_timestamp(value, case.column_type)) for key, value in rows.items()],
        )
    expired = {
        key
        for key, value in rows.items()
        if expiring_expired(value, case.column_type, case.max_age_ms, case.now_ms, case.unit)
    }
    entry = {
        "kind": "expiring",
        "name": "expiring",
        "table": table,
        "column": "expires_at",
        "max_age": case.max_age,
    }
    if case.column_type in ("bigint", "integer"):
        entry["unit"] = case.unit
    (spec,) = parse_config({"targets": [entry]}, env={}).targets

    def build(pool: AsyncConnectionPool[Any]) -> CountingTarget:
        return kinds.expiring(
            pool, spec.name, spec.tables[0], spec.column, spec.max_age_ms, unit=spec.unit
        )

    pool = await pools(with_time_zone(schema_url, case.time_zone))
    if case.column_type in ("bigint", "integer") and wrong_unit(case.values, case.unit):
        await refused(pool, build, case.now_ms)
        assert keys(db, table) == rows.keys()
        return
    counted, removed = await sweep(pool, build, case.now_ms)

    assert keys(db, table) == rows.keys() - expired
    assert (counted, removed) == (len(expired), len(expired))


@examples(10)
@given(age=AGES.flatmap(spelled))
def test_max_age_is_the_sum_of_its_parts(age: tuple[str, int]) -> None:
    """parse_duration of a string of unit parts (ms s m h d w) is the sum of each part's number
    times its unit."""
    text, total_ms = age
    assert parse_duration(text) == total_ms
