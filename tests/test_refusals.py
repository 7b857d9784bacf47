"""Refuse before harm: an epoch column in the wrong unit, and foreign keys from unindexed child
tables. Every case runs the real sweep on real PostgreSQL, at caller clocks far from the
server's own, and checks that a refused sweep deleted nothing."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool

from activities import builtin_kinds as kinds
from activities.engine.errors import BadTable
from activities.errors import BadPurgeTarget
from activities.sweep import contract_errors
from purge_config import ConfigError, parse_config
from purge_config.names import TableName
from purge_config.settings import SweepSettings
from tests.conftest import Harness, Pools
from tests.support.passes import failed_pass
from tests.support.rows import FROZEN_CLOCKS, HOUR, keys

BIGINT_MAX = 2**63 - 1


@pytest.fixture(params=FROZEN_CLOCKS, ids=["clock-2001", "clock-2128"])
def now_ms(request: pytest.FixtureRequest) -> int:
    """A caller clock far from the database server's, on either side of it."""
    value: int = request.param
    return value


def events(db: psycopg.Connection[Any], values: dict[str, int], analyze: bool) -> None:
    db.execute("CREATE TABLE events (key text PRIMARY KEY, at bigint NOT NULL)")
    db.execute("CREATE INDEX ON events (at)")
    for key, at in values.items():
        db.execute("INSERT INTO events VALUES (%s, %s)", (key, at))
    if analyze:
        db.execute("ANALYZE events")


def sweep(pool: AsyncConnectionPool[Any], unit: str = "ms", **kw: Any) -> Any:
    return kinds.expiring(pool, "events", TableName("events"), "at", unit=unit, **kw)


async def refusal(pool: AsyncConnectionPool[Any], now_ms: int) -> str:
    """The message the events target (ms) is refused with at `now_ms`."""
    with pytest.raises(BadPurgeTarget) as refused, contract_errors():
        await sweep(pool).purge_expired(now_ms)
    return refused.value.message


@pytest.mark.parametrize("analyze", [True, False], ids=["analyzed", "never-analyzed"])
async def test_a_column_of_seconds_read_as_milliseconds_is_refused_and_nothing_deleted(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], now_ms: int, analyze: bool
) -> None:
    """Read as ms, seconds are all in January 1970: every row would look expired."""
    now_s = now_ms // 1000
    rows = {f"r{i}": now_s + (i - 50) * 3600 for i in range(100)}  # half expired, in seconds
    events(db, rows, analyze)

    message = await refusal(pool, now_ms)

    assert message.startswith(
        "table events column at: its values do not look like epoch milliseconds"
    )
    assert "which reads as a time before 1973); they look like epoch seconds" in message
    assert re.search(r"e\.g\. \d{9,10}\b", message)  # a sample value
    assert 'set unit = "s"' in message
    assert "Nothing was deleted" in message
    assert keys(db, "events") == set(rows)

    # The fix the message names: the cutoff is converted, the column read as it is.
    assert await sweep(pool, unit="s").purge_expired(now_ms) == 51  # r0..r50: at <= now
    assert keys(db, "events") == {f"r{i}" for i in range(51, 100)}


@pytest.mark.parametrize("indexed", [True, False], ids=["indexed", "unindexed"])
async def test_rows_in_seconds_among_milliseconds_are_refused_and_nothing_deleted(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], now_ms: int, indexed: bool
) -> None:
    """A deploy starts writing seconds into a column of milliseconds: a few rows among many,
    each in 1970 read as ms, expiring in 30 days. With an index on the column they are found
    though the planner's statistics predate them (below autovacuum's threshold, they are
    never in its sample); without one, once an ANALYZE has seen them. The sweep, its check and
    its dry run refuse the table until they are stored in ms; then they stay, and the expired
    rows go."""
    db.execute("CREATE TABLE events (key text PRIMARY KEY, at bigint NOT NULL)")
    if indexed:
        db.execute("CREATE INDEX ON events (at)")
    in_ms = {f"r{i}": now_ms + (i - 50) * HOUR for i in range(100)}  # r0..r50 expired
    in_s = {f"s{i}": (now_ms + 30 * 24 * HOUR) // 1000 + i for i in range(3)}
    for key, at in in_ms.items():
        db.execute("INSERT INTO events VALUES (%s, %s)", (key, at))
    db.execute("ANALYZE events")
    for key, at in in_s.items():
        db.execute("INSERT INTO events VALUES (%s, %s)", (key, at))
    if not indexed:
        db.execute("ANALYZE events")
    everything = set(in_ms) | set(in_s)

    message = await refusal(pool, now_ms)
    with pytest.raises(BadTable) as checked:
        await sweep(pool).check(now_ms)
    with pytest.raises(BadTable) as previewed:
        await sweep(pool).preview(now_ms)

    assert message.startswith(
        "table events column at: some of its values look like epoch seconds, not milliseconds "
        f"(e.g. {min(in_s.values())}, which reads as a time before 1973): a sweep would delete "
        "each such row as long expired. Nothing was deleted; store those values in milliseconds"
    )
    assert str(checked.value) == str(previewed.value) == message
    assert keys(db, "events") == everything

    db.execute("UPDATE events SET at = at * 1000 WHERE key LIKE 's%'")
    db.execute("ANALYZE events")
    assert await sweep(pool).purge_expired(now_ms) == 51
    assert keys(db, "events") == everything - {f"r{i}" for i in range(51)}


async def test_small_values_are_no_unit_and_a_column_of_seconds_keeps_a_value_in_ms(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], now_ms: int
) -> None:
    """Below 1e8 a value reads as no instant in any unit (0, -1: "expired now" marks, swept
    as the rest); a value in ms in a column of seconds reads as far ahead, so it is kept, and
    refuses nothing."""
    rows = {f"r{i}": now_ms + (i - 50) * HOUR for i in range(100)}
    rows |= {"zero": 0, "minus-one": -1, "small": 99_999_999}
    events(db, rows, analyze=True)
    assert await sweep(pool).purge_expired(now_ms) == 51 + 3

    db.execute("DROP TABLE events")
    in_s = {f"r{i}": (now_ms + (i - 50) * HOUR) // 1000 for i in range(100)}
    events(db, {**in_s, "in-ms": now_ms - HOUR}, analyze=True)
    assert await sweep(pool, unit="s").purge_expired(now_ms) == 51
    assert "in-ms" in keys(db, "events")


async def test_a_column_of_microseconds_is_refused_and_unit_us_sweeps_it(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], now_ms: int
) -> None:
    """Read as ms, microseconds are thousands of years ahead: nothing would ever go."""
    rows = {f"r{i}": (now_ms + (i - 5) * HOUR) * 1000 for i in range(10)}
    rows["on-the-instant"] = now_ms * 1000
    rows["a-microsecond-after"] = now_ms * 1000 + 1
    events(db, rows, analyze=False)

    with pytest.raises(BadPurgeTarget, match="look like epoch microseconds"), contract_errors():
        await sweep(pool).purge_expired(now_ms)
    assert len(keys(db, "events")) == len(rows)

    assert await sweep(pool, unit="us").purge_expired(now_ms) == 6 + 1
    assert keys(db, "events") == {f"r{i}" for i in range(6, 10)} | {"a-microsecond-after"}


@pytest.mark.parametrize("analyze", [True, False], ids=["analyzed", "never-analyzed"])
async def test_a_column_that_holds_no_instant_in_any_unit_is_refused_as_the_wrong_column(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], now_ms: int, analyze: bool
) -> None:
    """An id or a count read as an instant: no unit fits, so the fix is the column, not a
    unit (the message once said "store epoch milliseconds in it")."""
    rows = {f"r{i}": 100_000 + i for i in range(100)}
    events(db, rows, analyze)

    message = await refusal(pool, now_ms)

    assert message.startswith(
        "table events column at: its values do not look like epoch milliseconds (e.g. 1000"
    )
    assert "nor like an instant in any unit (s, ms, us, ns). Nothing was deleted" in message
    assert "is at the column that says when a row expires?" in message
    assert "store epoch" not in message
    assert "set unit" not in message
    assert keys(db, "events") == set(rows)


async def test_a_misspelt_column_is_refused_naming_the_nearest_one(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], now_ms: int
) -> None:
    events(db, {"r0": now_ms - HOUR}, analyze=False)
    misspelt = kinds.expiring(pool, "events", TableName("events"), "att")

    with pytest.raises(BadPurgeTarget) as refused, contract_errors():
        await misspelt.purge_expired(now_ms)

    assert refused.value.message == "table events has no column 'att' (did you mean 'at'?)"
    assert keys(db, "events") == {"r0"}


async def test_a_rate_limit_target_on_a_table_of_another_shape_names_every_column_it_lacks(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], now_ms: int
) -> None:
    """A user's own bucket table under `kind = "rate_limit"`: one line with all it lacks, not
    one column per try."""
    db.execute(
        "CREATE TABLE buckets (user_id bigint, window_start timestamptz, tokens int,"
        " PRIMARY KEY (user_id, window_start))"
    )
    db.execute("INSERT INTO buckets VALUES (1, now() - interval '2 hours', 3)")

    with pytest.raises(BadPurgeTarget) as refused, contract_errors():
        await kinds.rate_limit(pool, table=TableName("buckets")).purge_expired(now_ms)

    assert refused.value.message == (
        "table buckets has no columns 'capacity', 'refill_per_ms', 'last_ms': a token bucket's "
        "are tokens, capacity, refill_per_ms, last_ms (activities/schema.sql's x_rate_limit)"
    )
    assert db.execute("SELECT count(*) FROM buckets").fetchone() == (1,)


@pytest.mark.parametrize("analyze", [True, False], ids=["analyzed", "never-analyzed"])
async def test_a_few_never_expires_sentinels_do_not_trip_the_check(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], now_ms: int, analyze: bool
) -> None:
    rows = {f"r{i}": now_ms + (i - 10) * HOUR for i in range(20)}
    rows |= {f"never{i}": BIGINT_MAX for i in range(6)}  # "never expires"
    events(db, rows, analyze)

    assert await sweep(pool).purge_expired(now_ms) == 11
    assert {f"never{i}" for i in range(6)} <= keys(db, "events")


async def test_an_empty_table_passes_the_check(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], now_ms: int
) -> None:
    events(db, {}, analyze=True)

    assert await sweep(pool).purge_expired(now_ms) == 0


async def test_a_built_in_kind_with_seconds_fails_at_once_through_temporal(
    harness: Harness,
) -> None:
    """x_idempotency written in seconds by a buggy client: the target fails non-retryably on
    its first attempt, naming the column; the other target of the pass is swept."""
    now_s = harness.now_ms // 1000
    for i in range(10):
        harness.db.execute("INSERT INTO x_idempotency VALUES (%s, null, %s)", (f"k{i}", now_s - i))
    harness.db.execute("INSERT INTO x_auth_lockouts VALUES ('carol', %s)", (harness.now_ms - HOUR,))
    async with harness.run_worker([kinds.idempotency(harness.pool), kinds.auth(harness.pool)]):
        error = await failed_pass(
            harness.client,
            harness.task_queue,
            {"targets": ["x_idempotency", "x_auth"]},
            "purge-units",
        )

    report = error.details[0]
    [failed] = report["failed"]
    assert (failed["name"], failed["type"]) == ("x_idempotency", "BadPurgeTarget")
    assert "column expires_at_ms" in failed["message"]
    assert [(s["name"], s["removed"]) for s in report["swept"]] == [("x_auth", 1)]
    assert len(keys(harness.db, "x_idempotency")) == 10
    history = await harness.client.get_workflow_handle("purge-units").fetch_history()
    attempts = [
        e.activity_task_started_event_attributes.attempt
        for e in history.events
        if e.HasField("activity_task_started_event_attributes")
    ]
    assert attempts == [1, 1]  # refused once, never retried


def parent_and_child(db: psycopg.Connection[Any], now_ms: int, indexed: bool) -> None:
    db.execute("CREATE TABLE parent (id bigint PRIMARY KEY, expires_ms bigint NOT NULL)")
    db.execute(
        "CREATE TABLE child (id bigint PRIMARY KEY,"
        " parent_id bigint REFERENCES parent ON DELETE CASCADE)"
    )
    if indexed:
        db.execute("CREATE INDEX ON child (parent_id)")
    db.execute(
        "INSERT INTO parent SELECT i, %s + (i - 5) * 1000 FROM generate_series(1, 10) i", (now_ms,)
    )
    db.execute("INSERT INTO child SELECT i, i FROM generate_series(1, 10) i")


def parent(pool: AsyncConnectionPool[Any], refuse: bool = False) -> Any:
    settings = SweepSettings(refuse_unindexed_children=refuse)
    return kinds.expiring(pool, "parent", TableName("parent"), "expires_ms", settings=settings)


async def test_an_unindexed_child_table_is_named_with_the_index_that_fixes_it(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], now_ms: int
) -> None:
    parent_and_child(db, now_ms, indexed=False)

    stats = await parent(pool).sweep(now_ms)

    assert stats.removed == 5
    [advice] = [a for a in stats.advice if "child" in a]
    assert "child (parent_id) references it ON DELETE CASCADE with no index" in advice
    assert advice.endswith('CREATE INDEX CONCURRENTLY ON child ("parent_id")')


async def test_an_unindexed_child_of_a_partitioned_table_is_named_when_swept_leaf_by_leaf(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], now_ms: int
) -> None:
    """A partitioned table is swept partition by partition, each with a plan of its own; the
    child table that references the whole table is still named, with the index it needs."""
    db.execute(
        "CREATE TABLE parent (id bigint, expires_ms bigint NOT NULL, PRIMARY KEY (id, expires_ms))"
        " PARTITION BY RANGE (expires_ms)"
    )
    for name, bounds in (
        ("parent_old", f"(0) TO ({now_ms})"),
        ("parent_new", f"({now_ms}) TO (MAXVALUE)"),
    ):
        db.execute(f"CREATE TABLE {name} PARTITION OF parent FOR VALUES FROM {bounds}")
    db.execute(
        "CREATE TABLE child (id bigint PRIMARY KEY, parent_id bigint, parent_ms bigint,"
        " FOREIGN KEY (parent_id, parent_ms) REFERENCES parent ON DELETE CASCADE)"
    )
    db.execute(
        "INSERT INTO parent SELECT i, %s + (i - 5) * 1000 FROM generate_series(1, 10) i", (now_ms,)
    )
    db.execute("INSERT INTO child SELECT id, id, expires_ms FROM parent")

    stats = await parent(pool).sweep(now_ms)

    assert stats.removed == 5
    [advice] = [a for a in stats.advice if "child" in a]
    assert "child (parent_id, parent_ms) references it ON DELETE CASCADE with no index" in advice


async def test_refuse_unindexed_children_fails_before_deleting(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], now_ms: int
) -> None:
    parent_and_child(db, now_ms, indexed=False)

    with (
        pytest.raises(BadPurgeTarget, match="refuse_unindexed_children is set: nothing deleted"),
        contract_errors(),
    ):
        await parent(pool, refuse=True).sweep(now_ms)

    assert len(keys(db, "parent", "id")) == 10


async def test_check_and_a_dry_run_refuse_what_refuse_unindexed_children_would(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], now_ms: int
) -> None:
    """`pg-purge check` and a dry run say what a pass would refuse: under
    refuse_unindexed_children, an unindexed child table too (check said ok and a dry run
    counted its rows, and the first pass refused it)."""
    parent_and_child(db, now_ms, indexed=False)

    for asking in (parent(pool, refuse=True).check, parent(pool, refuse=True).preview):
        with (
            pytest.raises(BadPurgeTarget, match="refuse_unindexed_children is set: nothing del"),
            contract_errors(),
        ):
            await asking(now_ms)
    advice = await parent(pool).check(now_ms)

    # Without the setting, check passes it, saying the cascade, and a dry run counts its rows.
    assert any(a.startswith("parent: child references it ON DELETE CASCADE") for a in advice)
    assert (await parent(pool).preview(now_ms)).removed == 5
    assert len(keys(db, "parent", "id")) == 10


async def test_an_indexed_child_table_draws_no_warning(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], now_ms: int
) -> None:
    parent_and_child(db, now_ms, indexed=True)

    stats = await parent(pool, refuse=True).sweep(now_ms)

    assert stats.removed == 5
    assert not any("child" in a for a in stats.advice)


def test_unit_and_the_refusal_flag_are_checked_in_the_config() -> None:
    entry = {"kind": "expiring", "name": "e", "table": "events", "column": "at"}
    assert parse_config({"targets": [{**entry, "unit": "s"}]}, env={}).targets[0].unit == "s"
    with pytest.raises(ConfigError, match=r"unit: the unit of an integer epoch column"):
        parse_config({"targets": [{**entry, "unit": "seconds"}]}, env={})
    with pytest.raises(ConfigError, match="unknown key"):
        parse_config({"targets": [{"kind": "idempotency", "unit": "s"}]}, env={})
    with pytest.raises(ConfigError, match="refuse_unindexed_children: must be true or false"):
        parse_config({"sweep": {"refuse_unindexed_children": "yes"}}, env={})


async def test_a_walk_of_a_referenced_table_keeps_the_child_tables_indexes(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], now_ms: int
) -> None:
    """A range walk switches index scans off for its own batches, but not when a foreign key
    references the table: the cascades its deletes run on the child must use the child's
    index (without it, each deleted row reads the whole child table)."""
    parent_and_child(db, now_ms, indexed=True)
    db.execute("VACUUM ANALYZE parent")  # half expired: the walk, not the index

    stats = await parent(pool).sweep(now_ms)

    assert (stats.strategy, stats.removed) == ("range", 5)
    db.execute("SELECT pg_stat_clear_snapshot()")
    [scans] = db.execute(
        "SELECT idx_scan FROM pg_stat_user_indexes WHERE relid = 'child'::regclass"
        " AND indexrelname <> 'child_pkey'"  # this schema's child: other tests' schemas stay
    ).fetchone() or [0]
    assert scans >= 5  # one lookup per cascaded delete, through the index


@pytest.mark.parametrize("refusal", ["no DELETE right", "inheritance", "unindexed child"])
async def test_a_target_refused_for_its_second_table_has_not_swept_its_first(
    db: psycopg.Connection[Any],
    pool: AsyncConnectionPool[Any],
    pools: Pools,
    pg_url: str,
    schema: str,
    role: str,
    refusal: str,
) -> None:
    """`auth` sweeps x_auth_failures, then x_auth_lockouts. What the lockouts' own sweep
    would refuse only once it got there (a DELETE right the role lacks, inheritance children,
    a child table with no index under refuse_unindexed_children) is found before the first
    table is swept: the target fails and neither table loses a row."""
    now_ms = 1_800_000_000_000
    for i in range(3):
        db.execute(
            "INSERT INTO x_auth_failures (key, at_ms, expires_at_ms) VALUES (%s, %s, %s)",
            (f"f{i}", now_ms - 2 * HOUR, now_ms - HOUR),
        )
        db.execute("INSERT INTO x_auth_lockouts VALUES (%s, %s)", (f"l{i}", now_ms - HOUR))
    settings = SweepSettings()
    if refusal == "no DELETE right":
        db.execute(f'GRANT SELECT, DELETE ON x_auth_failures TO "{role}"')
        db.execute(f'GRANT SELECT ON x_auth_lockouts TO "{role}"')
        pool = await pools(make_conninfo(pg_url, user=role, options=f"-c search_path={schema}"))
        said = f'role {role} lacks DELETE on "x_auth_lockouts"'
    elif refusal == "inheritance":
        db.execute("CREATE TABLE lockouts_old () INHERITS (x_auth_lockouts)")
        said = "table x_auth_lockouts has inheritance children (lockouts_old)"
    else:
        db.execute("CREATE TABLE holds (id bigint, key text REFERENCES x_auth_lockouts)")
        settings = SweepSettings(refuse_unindexed_children=True)
        said = "refuse_unindexed_children is set: nothing deleted"

    with pytest.raises(BadPurgeTarget) as refused, contract_errors():
        await kinds.auth(pool, settings=settings).sweep(now_ms)

    assert said in refused.value.message
    assert len(keys(db, "x_auth_failures")) == 3
    assert len(keys(db, "x_auth_lockouts")) == 3
