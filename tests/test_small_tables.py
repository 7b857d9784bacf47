"""A pattern's small tables, each swept in one transaction (activities.engine.small_tables): the
statements the server receives for one, counted from its own log, and every property of the
batched sweep kept: exact counts in the ledger through retries, live rows untouched, the
refusals' one line with nothing deleted, a held table left busy, a table larger than a batch
finished in batches, the advice of a referenced table and the day's partition advice."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool
from temporalio.exceptions import ApplicationError

import activities.sweep
from activities import builtin_kinds as kinds
from activities.builtin_kinds import build_registry
from activities.engine.access import lock_table
from activities.engine.rules import ExpiryRule, FullBucketRule, NewestRelatedRule
from activities.engine.small_tables import _no_coarse_value, rule_column
from activities.inputs import PurgeStep
from activities.registry import TargetRegistry
from activities.results import PurgeSweep
from activities.sweep import PurgeActivities
from purge_config.file import parse_config
from purge_config.filters import RowFilter
from purge_config.names import TableName
from purge_dev.servers import EmbeddedPostgres
from purge_ops.connect import open_pool
from tests.support.activity import activity_env
from tests.support.pace import until_a_sweep_waits
from tests.support.rows import FROZEN_CLOCKS
from tests.support.tenants import HOUR_MS, counts, create_tenants, tenant_prefix, tenant_schemas

#: What the server receives for one small table (issue 37's goal: at most 8): the lock tried
#: with the timeouts, the table's facts, the unit check's sample, the rule's column types, the
#: probe of the column's index for a value in a coarser unit, and the one statement; and the
#: pool's check, when the server has said something on the connection since it went idle
#: (`purge_ops.connect.check_unless_quiet`: 6 statements in bench case 11). The batched sweep
#: sent 25.
STATEMENTS = 7


def registry(pool: AsyncConnectionPool[Any], prefix: str, **extra: Any) -> TargetRegistry:
    config = parse_config(
        {
            "targets": [
                {
                    "kind": "expiring",
                    "name": "sessions",
                    "table": f"{prefix}_*.sessions",
                    "column": "expires_at",
                    **extra,
                }
            ]
        }
    )
    return build_registry(config, pool)


def match(prefix: str, i: int) -> str:
    return f"sessions@{prefix}_{i:04d}"


def table(prefix: str, i: int) -> sql.Identifier:
    return sql.Identifier(f"{prefix}_{i:04d}", "sessions")


async def sweep(
    targets: TargetRegistry, name: str, now_ms: int, **info: Any
) -> tuple[PurgeSweep, list[dict[str, Any]]]:
    """One step through the activity, and its heartbeats."""
    env = activity_env(**info)
    beats: list[dict[str, Any]] = []
    env.on_heartbeat = lambda *details: beats.append(details[0])
    swept = await env.run(PurgeActivities(targets).purge_target, PurgeStep(name, now_ms))
    return swept, beats


def ledger(db: psycopg.Connection[Any], name: str) -> list[int]:
    return [
        r[0] for r in db.execute("SELECT removed FROM purge_progress WHERE target = %s", (name,))
    ]


@pytest.fixture(autouse=True)
def no_background_beats(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep's background heartbeat (every HEARTBEAT_EVERY_S, its first after that interval
    on a first attempt) kept out of these tests' lists of beats, which hold a batch's and a clean
    exit's: on a machine slow enough to take the interval to reach the statement a test waits
    on, one would join them."""
    monkeypatch.setattr(activities.sweep, "HEARTBEAT_EVERY_S", 3600.0)


@pytest.fixture
async def logged_pool(
    pg_server: EmbeddedPostgres | None, pg_url: str, schema: str
) -> AsyncIterator[AsyncConnectionPool[Any]]:
    """A worker's pool whose connections have the server log every statement they send."""
    if pg_server is None:
        pytest.skip("counts statements from the log of the tests' own server")
    options = f"-c search_path={schema} -c log_statement=all"
    opened = await open_pool(make_conninfo(pg_url, options=options))
    try:
        yield opened
    finally:
        await opened.close()


#: A statement's line in the server's log: a simple query, or an extended one's execute.
_STATEMENT = re.compile(r" LOG:  (?:statement|execute [^:]*): (.*)")


async def logged_until_a_marker(server: EmbeddedPostgres, url: str, offset: int) -> list[str]:
    """The lines of `server`'s log from `offset` up to a marker statement sent after them from
    a session of its own: once its line is there, so is every line logged before it was sent
    (each statement is logged as the server receives it, before its reply), however long the
    server takes to write them. (A bound only to fail rather than hang: the line is written
    before the marker's reply, and found at the first read.)"""
    marker = f"marker {uuid.uuid4().hex}"
    options = "-c log_statement=all"
    with psycopg.connect(make_conninfo(url, options=options), autocommit=True) as conn:
        conn.execute(sql.SQL("SELECT {}").format(sql.Literal(marker)))
    for _ in range(6_000):
        with server.log_path.open("rb") as log:
            log.seek(offset)
            lines = log.read().decode(errors="replace").splitlines()
        for i, line in enumerate(lines):
            if marker in line:
                return lines[:i]
        await asyncio.sleep(0.01)
    raise AssertionError(f"the server never logged {marker!r}")


async def test_a_small_timestamp_table_over_a_local_time_zone_is_said_as_a_listed_one_is(
    db: psycopg.Connection[Any], pg_url: str, schema: str, real_now: int
) -> None:
    """A pattern's small table whose `timestamp` column is read as UTC over a connection whose
    TimeZone is not UTC: its one-statement sweep says by how much local times would be off, as
    the batched sweep and a dry run do."""
    prefix = tenant_prefix()
    options = f"-c search_path={schema} -c TimeZone=America/Los_Angeles"
    local = await open_pool(make_conninfo(pg_url, options=options))
    with tenant_schemas(pg_url, prefix) as conn:
        tenant = sql.Identifier(f"{prefix}_0001")
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(tenant))
        conn.execute(
            sql.SQL("CREATE TABLE {}.sessions (id bigint, expires_at timestamp NOT NULL)").format(
                tenant
            )
        )
        conn.execute(
            sql.SQL("INSERT INTO {}.sessions VALUES (1, '2000-01-01'), (2, '2999-01-01')").format(
                tenant
            )
        )
        try:
            swept, _ = await sweep(registry(local, prefix), match(prefix, 1), real_now)
        finally:
            await local.close()

    assert (swept.removed, swept.strategy) == (1, "single")
    said = "`expires_at` is timestamp without time zone, read as UTC, but this connection's "
    assert said + "TimeZone is America/Los_Angeles" in swept.advice
    assert "read up to 8 h off" in swept.advice


async def test_a_small_table_costs_seven_statements_as_the_server_counts_them(
    pg_server: EmbeddedPostgres,
    logged_pool: AsyncConnectionPool[Any],
    db: psycopg.Connection[Any],
    pg_url: str,
    real_now: int,
) -> None:
    """The second table of a pass (the first cleared the ledger of old passes): every statement
    the server received, the pool's check included when it is made, from its log; the expired
    rows gone, the live rows kept, the count in the ledger."""
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(1, 3), real_now)
        targets = registry(logged_pool, prefix)
        run_id = "a-pass"
        await sweep(targets, match(prefix, 1), real_now, workflow_run_id=run_id)
        offset = pg_server.log_path.stat().st_size

        swept, beats = await sweep(targets, match(prefix, 2), real_now, workflow_run_id=run_id)

        lines = await logged_until_a_marker(pg_server, pg_url, offset)
        sent = [m[1][:90] for m in map(_STATEMENT.search, lines) if m]
        assert sent, "the server logged none of the sweep's statements"
        assert len(sent) <= STATEMENTS, "\n".join(sent)
        assert (swept.removed, swept.strategy, swept.lower_bound) == (2, "single", False)
        assert counts(conn, prefix, real_now, range(1, 3)) == {
            f"{prefix}_0001": (0, 2),
            f"{prefix}_0002": (0, 2),
        }
        assert ledger(db, match(prefix, 2)) == [2]
        # Nothing was left, so the result follows at once: no heartbeat, no call to Temporal.
        assert beats == []


async def test_a_retry_whose_attempt_was_lost_counts_from_the_ledger(
    pool: AsyncConnectionPool[Any], db: psycopg.Connection[Any], pg_url: str, real_now: int
) -> None:
    """An attempt that deleted and committed, then died before anything reached Temporal: the
    retry deletes nothing more and reports what the ledger holds, exact."""
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(3, 4), real_now)
        targets = registry(pool, prefix)
        first, _ = await sweep(targets, match(prefix, 3), real_now, workflow_run_id="lost")

        retry, _ = await sweep(
            targets, match(prefix, 3), real_now, workflow_run_id="lost", attempt=2
        )

        assert (first.removed, first.strategy) == (3, "single")
        assert (retry.removed, retry.strategy, retry.lower_bound) == (3, "single", False)
        assert ledger(db, match(prefix, 3)) == [3]
        assert counts(conn, prefix, real_now, range(3, 4)) == {f"{prefix}_0003": (0, 2)}


async def test_analyze_after_leaves_the_views_counting_the_rows_left(
    db: psycopg.Connection[Any], schema_url: str, pg_url: str, real_now: int
) -> None:
    """`analyze_after` on a small table whose statement removed 3 of its 23 rows: the views
    count the 20 rows left and the 3 dead. A session flushes its counts at most once a second:
    unless its statement asks for the flush as it commits, the counts of its DELETE, made
    within that second of the session's earlier reads, wait until after the ANALYZE, and are
    taken off ANALYZE's count again (the views then said 17 rows live)."""
    prefix = tenant_prefix()
    one_session = await open_pool(schema_url, max_size=1)
    try:
        with tenant_schemas(pg_url, prefix) as conn:
            create_tenants(conn, prefix, range(3, 4), real_now, live=20)
            targets = registry(one_session, prefix, analyze_after=True)

            swept, _ = await sweep(targets, match(prefix, 3), real_now)

            async with one_session.connection() as session:
                await session.execute("SELECT pg_stat_force_next_flush()")  # before its reply
            db.execute("SELECT pg_stat_clear_snapshot()")
            views = db.execute(
                "SELECT n_live_tup, n_dead_tup FROM pg_stat_all_tables WHERE relid = %s::regclass",
                (sql.Identifier(f"{prefix}_0003", "sessions").as_string(db),),
            ).fetchone()
    finally:
        await one_session.close()

    assert (swept.removed, swept.strategy, swept.analyzed) == (3, "single", True)
    assert views == (20, 3)


@pytest.mark.parametrize("now_ms", FROZEN_CLOCKS, ids=["past", "future"])
async def test_old_passes_rows_go_from_the_ledger_and_the_shares(
    pool: AsyncConnectionPool[Any], db: psycopg.Connection[Any], pg_url: str, now_ms: int
) -> None:
    """As the batched sweep's ledger does, once a pass: judged by the pass's clock, years from
    the server's (a cutoff by the server's clock would take every row of the past pass's, and
    none of the future's)."""
    week, day = 7 * 24 * HOUR_MS, 24 * HOUR_MS
    db.execute(
        "INSERT INTO purge_progress VALUES ('w', 'old', 't', %s, 5, 1),"
        " ('w', 'kept', 't', %s, 5, 1)",
        (now_ms - week - HOUR_MS, now_ms - week + HOUR_MS),
    )
    db.execute(
        "INSERT INTO purge_shares VALUES ('t', 'old', %s, 1, 1), ('t', 'kept', %s, 1, 1)",
        (now_ms - day, now_ms - day + HOUR_MS),
    )
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(1, 2), now_ms)

        swept, _ = await sweep(registry(pool, prefix), match(prefix, 1), now_ms)

    assert swept.strategy == "single"
    assert [r[0] for r in db.execute("SELECT run_id FROM purge_progress WHERE target = 't'")] == [
        "kept"
    ]
    assert [r[0] for r in db.execute("SELECT table_name FROM purge_shares WHERE target = 't'")] == [
        "kept"
    ]


async def refused_alike(pool: AsyncConnectionPool[Any], prefix: str, now_ms: int) -> str:
    """The refusal of tenant 0's table by the one-statement sweep, which the batched sweep
    refuses with the same line (both BadPurgeTarget)."""
    batched = kinds.expiring(pool, "batched", TableName("sessions", f"{prefix}_0000"), "expires_at")
    with pytest.raises(ApplicationError) as small:
        await sweep(registry(pool, prefix), match(prefix, 0), now_ms)
    with pytest.raises(ApplicationError) as refused:
        await sweep(TargetRegistry([batched]), "batched", now_ms)
    assert (small.value.type, refused.value.type) == ("BadPurgeTarget", "BadPurgeTarget")
    assert str(small.value) == str(refused.value)
    return str(small.value)


@pytest.mark.parametrize("analyzed", [False, True])
async def test_a_column_in_seconds_is_refused_as_the_batched_sweep_refuses_it(
    pool: AsyncConnectionPool[Any], pg_url: str, real_now: int, analyzed: bool
) -> None:
    """Epoch seconds where the target says milliseconds: every row would read as 1970. The
    same one line as the batched sweep's (from the statistics, or without them a sample), and
    nothing deleted."""
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(1), real_now)
        seconds = real_now // 1000
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (expires_at) SELECT %s + g FROM generate_series(1, 50) g"
            ).format(table(prefix, 0)),
            (seconds,),
        )
        if analyzed:
            conn.execute(sql.SQL("ANALYZE {}").format(table(prefix, 0)))
        refusal = await refused_alike(pool, prefix, real_now)

        assert "do not look like epoch milliseconds" in refusal
        assert "\n" not in refusal
        [(rows,)] = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table(prefix, 0)))
        assert rows == 52


@pytest.mark.parametrize(
    "live",
    [10, 300],
    ids=["among-the-first-values", "past-the-first-values"],
)
async def test_a_row_in_seconds_written_since_the_statistics_is_refused_in_one_statement(
    pool: AsyncConnectionPool[Any], pg_url: str, real_now: int, live: int
) -> None:
    """One row in seconds among rows in ms, written after the table was analyzed, so the
    statistics cannot show it. Among a dozen, the small table's first values (read every pass)
    show it; past the first 200, only the column's index holds it, which the one-statement
    sweep probes as the batched sweep does (it deleted the row as expired in 1970). The same
    one line either way, and nothing deleted."""
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(1), real_now, live=live)
        conn.execute(sql.SQL("ANALYZE {}").format(table(prefix, 0)))
        conn.execute(
            sql.SQL("INSERT INTO {} (expires_at) VALUES (%s)").format(table(prefix, 0)),
            ((real_now + 30 * 24 * HOUR_MS) // 1000,),
        )
        refusal = await refused_alike(pool, prefix, real_now)

        assert "some of its values look like epoch seconds, not milliseconds" in refusal
        [(rows,)] = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table(prefix, 0)))
        assert rows == live + 1  # tenant 0 has no expired row; the one in seconds stayed


def test_the_probe_that_ends_a_small_tables_statement_says_why_in_the_servers_log(
    db: psycopg.Connection[Any],
) -> None:
    """The one-statement sweep ends its transaction where the column's index holds a value in a
    coarser unit (the batched sweep then refuses the table). The server logs that statement's
    error every pass until the row is fixed: it names the table, the column and the value, not
    a bare `division by zero` a DBA would chase. Without such a value it returns nothing, and
    without an index it reads nothing, the value notwithstanding."""
    db.execute("CREATE TABLE probed (id bigint PRIMARY KEY, at_ms bigint NOT NULL)")
    db.execute("INSERT INTO probed SELECT i, 1700000000000 + i FROM generate_series(1, 50) i")
    db.execute("INSERT INTO probed VALUES (0, 1700000000)")  # seconds, in a column of ms
    [(rel,)] = db.execute("SELECT 'probed'::regclass::text")
    params = {"rel": rel, "column": "at_ms"}
    probe = _no_coarse_value(sql.Identifier("probed"), "at_ms", (10**8, 10**11))

    assert db.execute(probe, params).fetchall() == []  # no index leads with the column
    db.execute("CREATE INDEX ON probed (at_ms)")
    with pytest.raises(psycopg.errors.InvalidTextRepresentation) as refused:
        db.execute(probe, params)
    said = str(refused.value)
    assert f"pg-purge: {rel} column at_ms holds 1700000000, an instant before 1973" in said
    db.execute("DELETE FROM probed WHERE id = 0")
    assert db.execute(probe, params).fetchall() == []


async def test_a_table_another_sweep_holds_is_left_busy_after_busy_wait(
    pool: AsyncConnectionPool[Any], pg_url: str, real_now: int
) -> None:
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn, psycopg.connect(pg_url, autocommit=True) as other:
        create_tenants(conn, prefix, range(1, 2), real_now)
        other.execute(lock_table(), {"rel": table(prefix, 1).as_string(other)})

        swept, _ = await sweep(
            registry(pool, prefix, busy_wait="100ms"), match(prefix, 1), real_now
        )

        assert (swept.status, swept.removed) == ("busy", 0)
        assert counts(conn, prefix, real_now, range(1, 2)) == {f"{prefix}_0001": (1, 2)}


async def test_more_than_a_batch_is_finished_in_batches_and_counted_once(
    pool: AsyncConnectionPool[Any], db: psycopg.Connection[Any], pg_url: str, real_now: int
) -> None:
    """A small table holding more expired rows than one statement takes (500): the batched
    sweep goes on after it, and the ledger and the report count each row once."""
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(1), real_now)
        conn.execute(
            sql.SQL("INSERT INTO {} (expires_at) SELECT %s FROM generate_series(1, 700)").format(
                table(prefix, 0)
            ),
            (real_now - HOUR_MS,),
        )

        swept, beats = await sweep(registry(pool, prefix), match(prefix, 0), real_now)

        assert swept.removed == 700
        assert swept.strategy.startswith("single+")
        assert ledger(db, match(prefix, 0)) == [700]
        assert beats[0]["batch_removed"] == 500
        assert counts(conn, prefix, real_now, range(1)) == {f"{prefix}_0000": (0, 2)}


async def test_a_large_table_is_swept_in_batches_as_before(
    pool: AsyncConnectionPool[Any], pg_url: str, real_now: int
) -> None:
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(3, 4), real_now)
        conn.execute(
            sql.SQL("INSERT INTO {} (expires_at) SELECT %s FROM generate_series(1, 20000)").format(
                table(prefix, 3)
            ),
            (real_now + HOUR_MS,),
        )
        targets = registry(pool, prefix)

        swept, _ = await sweep(targets, match(prefix, 3), real_now)

        assert (swept.removed, swept.strategy) == (3, "index")
        assert counts(conn, prefix, real_now, range(3, 4)) == {f"{prefix}_0003": (0, 20002)}


async def test_a_referenced_table_keeps_the_advice_its_unindexed_children_call_for(
    pool: AsyncConnectionPool[Any], pg_url: str, real_now: int
) -> None:
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(1, 2), real_now)
        conn.execute(
            sql.SQL(
                "CREATE TABLE {}.notes (session_id bigint REFERENCES {} ON DELETE CASCADE)"
            ).format(sql.Identifier(f"{prefix}_0001"), table(prefix, 1))
        )

        swept, _ = await sweep(registry(pool, prefix), match(prefix, 1), real_now)

        assert swept.removed == 1
        assert swept.strategy != "single"
        assert "notes (session_id) references it ON DELETE CASCADE" in swept.advice


async def test_the_day_of_passes_is_recorded_and_its_partition_advice_given(
    pool: AsyncConnectionPool[Any], db: psycopg.Connection[Any], pg_url: str, real_now: int
) -> None:
    """The one statement records the pass in `purge_shares` (its rows and the live rows it
    left, exactly) and reads the day back: two earlier passes that removed 60,000 rows each
    and this one make a day of large shares, told to partition as the batched sweep tells it."""
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(1, 2), real_now)
        name, table_name = match(prefix, 1), str(TableName("sessions", f"{prefix}_0001"))
        for hours in (2, 1):
            db.execute(
                "INSERT INTO purge_shares VALUES (%s, %s, %s, 60000, 1000)",
                (name, table_name, real_now - hours * HOUR_MS),
            )

        swept, _ = await sweep(registry(pool, prefix), match(prefix, 1), real_now)

        assert swept.strategy == "single"
        assert "partition it by RANGE on expires_at" in swept.advice
        recorded = db.execute(
            "SELECT removed, live FROM purge_shares WHERE target = %s AND now_ms = %s",
            (name, real_now),
        ).fetchall()
        assert recorded == [(1, 2)]


async def test_a_cancelled_sweep_finishes_its_statement_and_reports_it_first(
    pool: AsyncConnectionPool[Any], db: psycopg.Connection[Any], pg_url: str, real_now: int
) -> None:
    """Cancelled while its DELETE waits for a row an application holds: the statement still
    commits once the row is let go, and its heartbeat says so before the cancellation goes on,
    so the count stays exact."""
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn, psycopg.connect(pg_url) as holder:
        create_tenants(conn, prefix, range(2, 3), real_now)
        holder.execute(
            sql.SQL("SELECT 1 FROM {} WHERE expires_at <= %s FOR UPDATE").format(table(prefix, 2)),
            (real_now,),
        )
        env = activity_env()
        beats: list[dict[str, Any]] = []
        env.on_heartbeat = lambda *details: beats.append(details[0])
        targets = registry(pool, prefix, lock_timeout="30s")
        running = asyncio.ensure_future(
            env.run(PurgeActivities(targets).purge_target, PurgeStep(match(prefix, 2), real_now))
        )
        # However long the sweep takes to get there: it fails fast if it ended instead.
        async with asyncio.timeout(60):
            await until_a_sweep_waits(db, running, holder)
        env.cancel()
        await asyncio.sleep(0.2)
        holder.rollback()

        with pytest.raises(asyncio.CancelledError):
            await running

        # The attempt's clean exit, its count complete: the statement's own heartbeat is not
        # sent (it left nothing), and the exit carries its rows.
        assert [(b["batch_removed"], b["removed"], b["clean_exit"]) for b in beats] == [
            (2, 2, True),
        ]
        assert ledger(db, match(prefix, 2)) == [2]
        assert counts(conn, prefix, real_now, range(2, 3)) == {f"{prefix}_0002": (0, 2)}


def test_only_a_rule_that_binds_from_its_columns_alone_is_swept_in_one_statement() -> None:
    """A filter's values, an archive's shape, an age kept in another table: each is read to
    bind, and the batched sweep reads and checks them."""
    t = TableName("sessions", "t")
    assert rule_column(ExpiryRule(t, "expires_at", unit="s")) == ("expires_at", "s")
    assert rule_column(FullBucketRule(t)) == ("last_ms", "ms")
    assert rule_column(ExpiryRule(t, "expires_at", row_filter=RowFilter(null=("x",)))) is None
    assert rule_column(ExpiryRule(t, "expires_at", archive=TableName("a", "t"))) is None
    assert rule_column(FullBucketRule(t, archive=TableName("a", "t"))) is None
    assert rule_column(NewestRelatedRule(t, TableName("events", "t"), "at")) is None
