"""Partitioned tables: wholly expired range partitions leave whole (dropped, or detached and
kept), the rest is deleted in batches partition by partition, and every count stays exact.

Attempts are the real activity in Temporal's activity environment against real PostgreSQL. The
table is partitioned by day on an epoch-ms column, judged with max_age 3 days at a frozen clock:
three partitions are wholly expired, one straddles the cutoff (one of its rows is expired), the
rest are live.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool
from temporalio.exceptions import ApplicationError

from activities import builtin_kinds as kinds
from activities.engine import detaching, leftover
from activities.engine.ledger import mark_key
from activities.engine.sql_target import SqlTarget
from activities.inputs import PurgeStep
from activities.registry import TargetRegistry
from activities.results import PurgeReport, PurgeSweep
from activities.sweep import PurgeActivities
from purge_config.names import TableName
from purge_config.settings import Guards, PartitionPolicy, SweepSettings
from purge_ops.connect import open_pool
from purge_ops.render import report_table
from tests.conftest import Harness
from tests.support.activity import activity_env
from tests.support.dead_worker import notice_the_dead_worker_sooner
from tests.support.passes import run_pass
from tests.support.procs import clean_env, start_worker, stop, worker_config
from tests.support.rows import HOUR, PAST_NOW, auth_rows
from tests.support.servers import RunningTemporal

NOW = PAST_NOW
DAY = 24 * HOUR
DAY0 = NOW // DAY * DAY
MAX_AGE = 3 * DAY
ROWS_PER_DAY = 10
#: Partitions p_m6 .. p_p1 by day k from DAY0, -6 <= k <= 1: with the cutoff NOW - 3 days,
#: p_m6, p_m5 and p_m4 end by it, p_m3 holds it.
DAYS = range(-6, 2)
EXPIRED_PARTS = ["p_m6", "p_m5", "p_m4"]
EXPIRED_ROWS = 3 * ROWS_PER_DAY + 1  # and the first row of p_m3, at DAY0 - 3 days


def part_name(day: int) -> str:
    return f"p_{'m' if day < 0 else 'p'}{abs(day)}"


def make_events(
    db: psycopg.Connection[Any], default: bool = False, days: range = DAYS, now: int = NOW
) -> int:
    """The events table, its daily partitions and rows (around `now`); returns its rows."""
    day0 = now // DAY * DAY
    db.execute(
        "CREATE TABLE events (id bigint NOT NULL, at_ms bigint NOT NULL, body text,"
        " PRIMARY KEY (id, at_ms)) PARTITION BY RANGE (at_ms)"
    )
    db.execute("CREATE INDEX ON events (at_ms)")
    for day in days:
        lo, hi = day0 + day * DAY, day0 + (day + 1) * DAY
        db.execute(
            f"CREATE TABLE {part_name(day)} PARTITION OF events FOR VALUES FROM ({lo}) TO ({hi})"
        )
    if default:
        db.execute("CREATE TABLE p_default PARTITION OF events DEFAULT")
    db.execute(
        "INSERT INTO events SELECT d * 100 + j, %s + d * %s + j * %s, 'e'"
        " FROM generate_series(%s::bigint, %s) d, generate_series(0::bigint, %s) j",
        (day0, DAY, DAY // ROWS_PER_DAY, days.start, days.stop - 1, ROWS_PER_DAY - 1),
    )
    db.execute("ANALYZE events")
    return len(days) * ROWS_PER_DAY


#: What the warning says when the DEFAULT partition holds rows of the range it proposes.
DEFAULT_HOLDS = "p_default (the DEFAULT partition) already holds rows of that range"


def tomorrow_in_default(db: psycopg.Connection[Any]) -> int:
    """The events table with no partition ahead of NOW and a DEFAULT partition holding a row
    of tomorrow, which no range takes; returns its rows."""
    total = make_events(db, default=True, days=range(-6, 1))
    db.execute("INSERT INTO events VALUES (-1, %s, 'tomorrow')", (DAY0 + DAY + 5,))
    return total + 1


def events(
    pool: AsyncConnectionPool[Any], mode: str = "drop", schema: str = "", **kw: Any
) -> SqlTarget:
    return kinds.expiring(
        pool,
        "events",
        TableName("events"),
        "at_ms",
        MAX_AGE,
        partitions=PartitionPolicy(mode, schema),
        **kw,
    )


def children(db: psycopg.Connection[Any], table: str = "events") -> list[str]:
    rows = db.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = %s::regclass ORDER BY 1",
        (table,),
    ).fetchall()
    return [str(r[0]) for r in rows]


def count(db: psycopg.Connection[Any], table: str = "events") -> int:
    row = db.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(row[0]) if row else 0


def expired_left(db: psycopg.Connection[Any]) -> int:
    row = db.execute("SELECT count(*) FROM events WHERE at_ms <= %s", (NOW - MAX_AGE,)).fetchone()
    return int(row[0]) if row else 0


def pending(db: psycopg.Connection[Any]) -> int:
    """Partitions of the test's own schema left half-detached (pg_inherits is database-wide:
    on a shared server other tests' detaches are in it too)."""
    row = db.execute(
        "SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhdetachpending AND c.relnamespace = current_schema()::regnamespace"
    ).fetchone()
    return int(row[0]) if row else 0


async def sweep(target: SqlTarget, dry_run: bool = False, **info: Any) -> PurgeSweep:
    result: PurgeSweep = await activity_env(**info).run(
        PurgeActivities(TargetRegistry([target])).purge_target,
        PurgeStep(name=target.name, now_ms=NOW, dry_run=dry_run),
    )
    return result


async def test_drop_takes_wholly_expired_partitions_out_and_deletes_only_at_the_edge(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], schema: str
) -> None:
    total = make_events(db)

    result = await sweep(events(pool))

    assert result.removed == EXPIRED_ROWS
    assert (result.partitions_dropped, result.partitions_detached) == (3, 0)
    assert result.partition_names == [f"{schema}.{p}" for p in EXPIRED_PARTS]
    assert (result.partition_rows, result.edge_removed) == (30, 1)
    assert result.strategy.startswith("partitions+")
    assert not result.lower_bound
    assert count(db) == total - EXPIRED_ROWS
    assert expired_left(db) == 0
    assert children(db) == sorted(part_name(d) for d in DAYS if d > -4)
    assert db.execute("SELECT to_regclass('p_m6')").fetchone() == (None,)  # dropped, not kept
    assert pending(db) == 0


def log_sessions(db: psycopg.Connection[Any], schema: str, hold: int | None = None) -> None:
    """Log the session of each DELETE of the edge partition (p_m3) into `deletes`, and of the
    DROP of p_m6 into `drops`; with `hold`, that DROP then waits, inside its transaction, for
    advisory lock `hold` (an event trigger: database-wide, so `unlog_sessions` after)."""
    db.execute("CREATE TABLE deletes (pid int)")
    db.execute("CREATE TABLE drops (pid int)")
    db.execute(
        "CREATE FUNCTION log_delete() RETURNS trigger LANGUAGE plpgsql AS"
        " $$BEGIN INSERT INTO deletes VALUES (pg_backend_pid()); RETURN NULL; END$$"
    )
    db.execute(
        "CREATE TRIGGER log_delete AFTER DELETE ON p_m3"
        " FOR EACH STATEMENT EXECUTE FUNCTION log_delete()"
    )
    wait = f"PERFORM pg_advisory_xact_lock({hold});" if hold is not None else ""
    db.execute(
        "CREATE FUNCTION log_drop() RETURNS event_trigger LANGUAGE plpgsql AS $$BEGIN"
        " IF EXISTS (SELECT 1 FROM pg_event_trigger_dropped_objects() o"
        f" WHERE o.object_type = 'table' AND o.schema_name = '{schema}'"
        " AND o.object_name = 'p_m6') THEN"
        f' INSERT INTO "{schema}".drops VALUES (pg_backend_pid()); {wait}'
        " END IF; END$$"
    )
    db.execute(f'CREATE EVENT TRIGGER "{schema}_drop" ON sql_drop EXECUTE FUNCTION log_drop()')


def unlog_sessions(db: psycopg.Connection[Any], schema: str) -> None:
    db.execute(f'DROP EVENT TRIGGER IF EXISTS "{schema}_drop"')


def sessions(db: psycopg.Connection[Any], table: str) -> set[int]:
    return {int(r[0]) for r in db.execute(f"SELECT pid FROM {table}").fetchall()}


def spare_before_the_detaches_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """The spare connection (`detaching.Beside`) is in hand before the detaches are handed to
    it, on any machine. The sweep asks the pool for it when the detaches start and counts and
    drops on its own connection if none came by the time they end: on a busy machine three
    quick detaches can end before the pool's check of an idle connection (seen: the drop then
    held the table's own connection, and the edge waited behind it). A test of what happens
    beside makes the spare come first; a spare that never comes is `Beside`'s own case."""
    hand = detaching.Beside.hand

    async def hand_once_ready(
        self: detaching.Beside, tables: list[tuple[TableName, str]]
    ) -> asyncio.Task[Any] | None:
        if tables:
            await asyncio.wait_for(self._ready.wait(), timeout=30)
        return await hand(self, tables)

    monkeypatch.setattr(detaching.Beside, "hand", hand_once_ready)


async def edge_swept_while_the_drop_waits(
    db: psycopg.Connection[Any], swept: asyncio.Future[PurgeSweep]
) -> int:
    """Once the edge's DELETE is logged (`log_sessions`) and the DROP of p_m6 waits on the
    advisory lock `db` holds, with `swept` still under way: that DROP's backend. The two come in
    either order (the spare connection counts the partitions before it drops them, and the edge
    can commit first); the held lock keeps the drop's transaction open until the test lets it
    go. Only a drop blocked by `db`'s own backend: on a shared server other tests' drops of
    their p_m6 wait on their own locks at the same time."""
    for _ in range(1500):
        if sessions(db, "deletes"):
            waiting = db.execute(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND wait_event = 'advisory' AND query LIKE 'DROP TABLE%%p_m6%%'"
                " AND %s = ANY(pg_blocking_pids(pid))",
                (db.info.backend_pid,),
            ).fetchall()
            if waiting:
                [(pid,)] = waiting
                return int(pid)
        assert not swept.done(), swept.result()
        await asyncio.sleep(0.02)
    raise AssertionError("the edge was not swept while the drop waited")


async def test_the_edge_is_swept_while_the_detached_partitions_are_counted_and_dropped_beside(
    db: psycopg.Connection[Any],
    pool: AsyncConnectionPool[Any],
    schema: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a second connection in the pool, the detached partitions are counted and dropped
    on it while the table's connection sweeps the edge: here that drop is held, inside its
    transaction, until the edge's DELETE has committed, which it could not if they ran one
    after the other. Once it goes on, every count is exact."""
    total = make_events(db)
    spare_before_the_detaches_end(monkeypatch)
    hold = abs(hash(schema)) % 2**31
    log_sessions(db, schema, hold)
    # Two connections idle in the pool, so a second one is there at once.
    async with pool.connection(), pool.connection():
        pass
    db.execute("SELECT pg_advisory_lock(%s)", (hold,))
    try:
        # The held drop waits under lock_timeout: long enough for any machine's edge.
        patient = SweepSettings(lock_timeout_ms=120_000)
        swept = asyncio.ensure_future(sweep(events(pool, settings=patient)))
        waiting = await edge_swept_while_the_drop_waits(db, swept)
    finally:
        db.execute("SELECT pg_advisory_unlock(%s)", (hold,))
        unlog_sessions(db, schema)
    result = await swept

    assert sessions(db, "drops") == {waiting}
    assert waiting not in sessions(db, "deletes")
    assert result.removed == EXPIRED_ROWS
    assert (result.partitions_dropped, result.partition_rows, result.edge_removed) == (3, 30, 1)
    assert not result.lower_bound
    assert count(db) == total - EXPIRED_ROWS
    assert children(db) == sorted(part_name(d) for d in DAYS if d > -4)
    ledger = db.execute("SELECT sum(removed) FROM purge_progress WHERE target = 'events'")
    assert ledger.fetchone() == (EXPIRED_ROWS,)


async def test_a_drop_beside_lost_after_the_edge_committed_is_counted_once_by_the_retry(
    db: psycopg.Connection[Any],
    pool: AsyncConnectionPool[Any],
    schema: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second connection dies inside the count-and-drop transaction, after the edge's
    batch committed on the table's connection: the attempt fails, the three partitions stay
    detached and marked, the edge's row stays counted. The retry of the same pass drops and
    counts the partitions once: the pass's count is exact."""
    total = make_events(db)
    spare_before_the_detaches_end(monkeypatch)
    hold = abs(hash(schema)) % 2**31
    log_sessions(db, schema, hold)
    async with pool.connection(), pool.connection():
        pass
    run_id = "run-lost-beside"
    target = events(pool, settings=SweepSettings(lock_timeout_ms=120_000))
    db.execute("SELECT pg_advisory_lock(%s)", (hold,))
    try:
        first = asyncio.ensure_future(sweep(target, workflow_run_id=run_id))
        waiting = await edge_swept_while_the_drop_waits(db, first)
        db.execute("SELECT pg_terminate_backend(%s)", (waiting,))
        with pytest.raises(psycopg.OperationalError):
            await first
    finally:
        db.execute("SELECT pg_advisory_unlock(%s)", (hold,))
        unlog_sessions(db, schema)
    assert expired_left(db) == 0  # the edge's row went, and every expired partition is out
    assert {name for name in EXPIRED_PARTS if name in children(db)} == set()
    assert count(db, "p_m6") == ROWS_PER_DAY  # detached, not dropped

    result = await sweep(target, workflow_run_id=run_id, attempt=2)

    assert result.removed == EXPIRED_ROWS
    assert (result.partitions_dropped, result.partition_rows) == (3, 30)
    assert not result.lower_bound
    assert db.execute("SELECT to_regclass('p_m6')").fetchone() == (None,)
    assert count(db) == total - EXPIRED_ROWS
    ledger = db.execute(
        "SELECT removed FROM purge_progress WHERE run_id = %s AND target = 'events'", (run_id,)
    )
    assert ledger.fetchone() == (EXPIRED_ROWS,)


async def test_with_no_second_connection_the_table_s_own_counts_and_drops(
    db: psycopg.Connection[Any], schema_url: str, schema: str
) -> None:
    """A pool of one connection (all in use, as on a busy worker) gives no second one: the
    table's own connection counts and drops the partitions, at once and exactly; the sweep
    never waits for the pool. The pool would keep a request waiting an hour: a sweep that
    waited for it would not end within the minute it is given (only a bound on a hang; it
    ends in well under a second)."""
    total = make_events(db)
    log_sessions(db, schema)
    small = await open_pool(schema_url, max_size=1, wait_seconds=3600)
    try:
        async with asyncio.timeout(60):
            result = await sweep(events(small))
    finally:
        unlog_sessions(db, schema)
        await small.close()

    assert sessions(db, "drops") == sessions(db, "deletes")
    assert len(sessions(db, "drops")) == 1
    assert result.removed == EXPIRED_ROWS
    assert (result.partitions_dropped, result.partition_rows, result.edge_removed) == (3, 30, 1)
    assert count(db) == total - EXPIRED_ROWS


async def test_detach_keeps_each_partition_with_its_rows_in_detached_schema(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], schema: str
) -> None:
    total = make_events(db)
    archive = f"{schema}_archive"
    db.execute(f'CREATE SCHEMA "{archive}"')
    try:
        result = await sweep(events(pool, "detach", archive))

        assert (result.partitions_dropped, result.partitions_detached) == (0, 3)
        assert result.removed == EXPIRED_ROWS
        assert count(db) == total - EXPIRED_ROWS
        for name in EXPIRED_PARTS:
            assert count(db, f'"{archive}".{name}') == ROWS_PER_DAY
            assert db.execute("SELECT to_regclass(%s)", (name,)).fetchone() == (None,)
        assert db.execute(
            "SELECT relispartition FROM pg_class WHERE oid = %s::regclass", (f'"{archive}".p_m6',)
        ).fetchone() == (False,)
    finally:
        db.execute(f'DROP SCHEMA "{archive}" CASCADE')


async def test_dry_run_names_the_partitions_counts_their_rows_and_changes_nothing(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], schema: str
) -> None:
    total = make_events(db)
    before = children(db)

    result = await sweep(events(pool), dry_run=True)

    assert result.removed == EXPIRED_ROWS
    assert result.partitions_dropped == 3
    assert result.partition_names == [f"{schema}.{p}" for p in EXPIRED_PARTS]
    assert (result.partition_rows, result.edge_removed) == (30, 1)
    assert (count(db), children(db)) == (total, before)
    report = PurgeReport(swept=[result], removed=result.removed, now_ms=NOW, dry_run=True)
    text = report_table(report)
    assert f"partitions: events: would drop {schema}.p_m6, {schema}.p_m5, {schema}.p_m4" in text
    assert "1 rows would be deleted at the edge" in text


async def test_delete_mode_sweeps_every_partition_in_batches_and_leaves_them_all(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    total = make_events(db)
    before = children(db)

    result = await sweep(events(pool, "delete"))

    assert result.removed == EXPIRED_ROWS
    assert (result.partitions_dropped, result.partition_rows) == (0, 0)
    assert "partitions" not in result.strategy
    assert (count(db), children(db)) == (total - EXPIRED_ROWS, before)


async def test_a_role_without_ownership_fails_once_naming_the_grant_and_detaches_nothing(
    db: psycopg.Connection[Any], schema_url: str, role: str
) -> None:
    total = make_events(db)
    tables = ", ".join(["events", *(part_name(d) for d in DAYS)])
    db.execute(f'GRANT SELECT, DELETE ON {tables} TO "{role}"')
    db.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON purge_progress TO "{role}"')
    before = children(db)
    pool = await open_pool(make_conninfo(schema_url, user=role))
    try:
        with pytest.raises(ApplicationError) as refused:
            await sweep(events(pool))
    finally:
        await pool.close()

    assert refused.value.type == "BadPurgeTarget"
    assert refused.value.non_retryable
    owner = db.execute("SELECT current_user").fetchone()
    assert owner is not None
    assert f"GRANT {owner[0]} TO {role}" in refused.value.message
    assert "nothing was detached" in refused.value.message
    assert (count(db), children(db)) == (total, before)


@pytest.mark.parametrize("full_default", [False, True])
async def test_delete_mode_works_with_select_and_delete_on_the_parent_alone(
    db: psycopg.Connection[Any], schema_url: str, role: str, full_default: bool
) -> None:
    """Privileges on a partitioned table do not reach its partitions by name: the sweep then
    goes through the parent, and says which grant would let it sweep partition by partition.
    With no partition ahead and a DEFAULT one holding tomorrow's row, the warning's look into
    the DEFAULT partition goes through the parent too."""
    total = tomorrow_in_default(db) if full_default else make_events(db)
    db.execute(f'GRANT SELECT, DELETE ON events TO "{role}"')
    pool = await open_pool(make_conninfo(schema_url, user=role))
    try:
        result = await sweep(events(pool, "delete"))
    finally:
        await pool.close()

    assert result.removed == EXPIRED_ROWS
    assert count(db) == total - EXPIRED_ROWS
    assert "GRANT SELECT, DELETE on each partition" in result.advice
    assert (DEFAULT_HOLDS in result.advice) is full_default


async def test_guards_count_partition_rows_and_refuse_before_the_first_detach(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    total = make_events(db)
    before = children(db)

    with pytest.raises(ApplicationError) as refused:
        await sweep(events(pool, guards=Guards(max_rows=EXPIRED_ROWS - 1)))

    assert refused.value.type == "PurgeGuardRefused"
    assert f"would remove {EXPIRED_ROWS} rows" in refused.value.message
    assert (count(db), children(db)) == (total, before)


async def test_a_default_partition_makes_the_detach_plain_and_the_report_says_so(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    total = make_events(db, default=True)
    db.execute("INSERT INTO events VALUES (1, %s, 'old, in DEFAULT'), (2, %s, 'new')", (0, NOW * 2))

    result = await sweep(events(pool))

    assert result.partitions_dropped == 3
    assert result.removed == EXPIRED_ROWS + 1  # the DEFAULT partition's old row, at the edge
    assert "has a DEFAULT partition" in result.advice
    assert "without blocking" in result.advice
    assert count(db) == total + 2 - EXPIRED_ROWS - 1
    assert pending(db) == 0


async def test_an_interrupted_concurrent_detach_is_finalized_by_the_retry_and_counted_once(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], pg_url: str, schema: str
) -> None:
    """Attempt 1's connection is cut while its DETACH ... CONCURRENTLY waits between its two
    phases (an older snapshot still reads the table): the partition is left half-detached.
    Attempt 2 of the same pass completes it (FINALIZE), drops it and the rest, and counts each
    partition's rows exactly once."""
    total = make_events(db)
    # The detach waits out the reader for as long as the test takes to find it, not 2 s.
    target = events(pool, settings=SweepSettings(lock_timeout_ms=120_000))
    run_id = "run-interrupted"
    beats: list[dict[str, Any]] = []
    first = activity_env(workflow_run_id=run_id)
    first.on_heartbeat = lambda *d: beats.append(d[0])
    with psycopg.connect(pg_url, autocommit=True) as reader:
        reader.execute(f'SET search_path = "{schema}"')
        reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        reader.execute("SELECT count(*) FROM events")  # a snapshot the detach must wait out
        attempt = asyncio.ensure_future(
            first.run(
                PurgeActivities(TargetRegistry([target])).purge_target,
                PurgeStep(name="events", now_ms=NOW),
            )
        )
        backend = await _waiting_detach(db, reader, attempt)
        db.execute("SELECT pg_terminate_backend(%s)", (backend,))
        with pytest.raises(psycopg.OperationalError):
            await attempt
        reader.execute("ROLLBACK")
    half = db.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhdetachpending AND c.relnamespace = current_schema()::regnamespace"
    ).fetchall()
    assert half == [("p_m6",)]  # the oldest goes first

    last = next((b for b in reversed(beats) if "batch_ms" in b), {})
    result = await sweep(target, workflow_run_id=run_id, attempt=2, heartbeat_details=[last])

    assert pending(db) == 0
    assert result.removed == EXPIRED_ROWS
    assert result.partitions_dropped == 3
    assert result.partition_rows == 30
    assert count(db) == total - EXPIRED_ROWS
    assert children(db) == sorted(part_name(d) for d in DAYS if d > -4)


#: How long (seconds) the orphaned detach may take to end once its reader has: only the end of
#: a run where it never does. Its second phase waits out every snapshot older than it in the
#: database (on a shared server, other tests' too), then commits, and its backend exits.
DETACH_ENDS_WITHIN_S = 120.0


async def _detach_done(db: psycopg.Connection[Any], backend: int) -> None:
    """Until `backend` (the orphaned detach's) runs a DETACH no more."""
    deadline = time.monotonic() + DETACH_ENDS_WITHIN_S
    while True:
        row = db.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'ALTER TABLE%%DETACH%%'"
            " AND state = 'active' AND pid = %s",
            (backend,),
        ).fetchone()
        if row == (0,):
            return
        assert time.monotonic() < deadline, (
            f"the orphaned detach did not end within {DETACH_ENDS_WITHIN_S:.0f} s"
        )
        await asyncio.sleep(0.02)


async def _waiting_detach(
    db: psycopg.Connection[Any],
    reader: psycopg.Connection[Any],
    running: asyncio.Future[Any] | None = None,
    tries: int = 1500,
) -> int:
    """The backend of the DETACH ... CONCURRENTLY of a partition in `db`'s schema waiting out
    `reader`'s older snapshot (which the test holds: it waits as long as it takes, under a
    lock_timeout longer than the test). On a shared server another test's detach can wait on
    `reader` too (it waits out every older snapshot in the database), and this test's on
    another test's reader: only the one blocked by `reader` that names this schema's partition
    is this test's. Fails at once if `running` (the sweep) ends first."""
    for _ in range(tries):
        row = db.execute(
            "SELECT pid FROM pg_stat_activity WHERE wait_event = 'virtualxid'"
            " AND query LIKE '%%DETACH PARTITION%%CONCURRENTLY'"
            " AND strpos(query, current_schema()) > 0 AND %s = ANY(pg_blocking_pids(pid))",
            (reader.info.backend_pid,),
        ).fetchone()
        if row:
            return int(row[0])
        if running is not None and running.done():
            raise AssertionError(f"the sweep ended before its detach waited: {running.result()}")
        await asyncio.sleep(0.02)
    raise AssertionError("the detach never waited")


def marked_by_attempt_1(
    db: psycopg.Connection[Any], run_id: str, target: str, partition: TableName
) -> None:
    """The ledger's mark of `partition` that `target`'s attempt 1 in pass `run_id` wrote before
    its detach (workflow id `test-workflow-id`, which the retry's step must give)."""
    oid = db.execute("SELECT %s::regclass::oid::bigint", (str(partition),)).fetchone()
    assert oid is not None
    db.execute(
        "INSERT INTO purge_progress VALUES ('test-workflow-id', %s, %s, %s, 0, 0)",
        (run_id, mark_key(target, int(oid[0]), partition), NOW),
    )


@pytest.mark.parametrize("signed", [False, True], ids=["positive", "negative"])
async def test_an_integer_column_s_expired_partitions_go_whole(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], signed: bool
) -> None:
    """docs/partitions.md names `integer` among the keys it judges: PostgreSQL prints an int4
    bound without quotes (a negative one with them), where a bigint's is quoted. Epoch seconds
    in an `integer` column, one partition wholly expired, one straddling the cutoff, one ahead:
    the first goes whole, the edge's expired row by DELETE, the rest stays."""
    now_s = NOW // 1000
    base = -now_s - 2 * 86_400 if signed else 0  # the oldest partition's bounds below 0 too
    db.execute(
        "CREATE TABLE ticks (id int NOT NULL, at_s integer NOT NULL) PARTITION BY RANGE (at_s)"
    )
    bounds = [(base, now_s - 3_600), (now_s - 3_600, now_s + 3_600), (now_s + 3_600, now_s * 2)]
    for n, (lo, hi) in enumerate(bounds):
        db.execute(f"CREATE TABLE ticks_{n} PARTITION OF ticks FOR VALUES FROM ({lo}) TO ({hi})")
    db.execute(
        "INSERT INTO ticks VALUES (1, %s), (2, %s), (3, %s), (4, %s)",
        (base + 1, now_s - 60, now_s + 60, now_s + 7_200),
    )
    target = kinds.expiring(
        pool, "ticks", TableName("ticks"), "at_s", unit="s", partitions=PartitionPolicy("drop")
    )

    result = await sweep(target)

    assert (result.partitions_dropped, result.partition_rows) == (1, 1)
    assert result.removed == 2  # the old partition's row, and the edge's expired one
    assert children(db, "ticks") == ["ticks_1", "ticks_2"]
    assert [r[0] for r in db.execute("SELECT id FROM ticks ORDER BY id")] == [3, 4]


async def test_a_detach_left_pending_on_a_target_s_second_table_is_finished_there(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], pg_url: str, schema: str
) -> None:
    """x_auth sweeps failures, then lockouts, both partitioned. What attempt 1 did before it
    died, done by hand: the ledger's mark of a lockouts partition, then its DETACH ...
    CONCURRENTLY cut between its two phases. Attempt 2 begins at the first table (no heartbeat
    said the second): the marks it reads are the target's, and this one's partition is still
    attached to lockouts, so it is left to lockouts' own turn, which finishes, counts and drops
    it once; it is not finalized against failures, which PostgreSQL refuses (the target then
    failed, and the next pass left the partition detached for good, as another tool's)."""
    db.execute("DROP TABLE x_auth_failures, x_auth_lockouts")
    db.execute(
        "CREATE TABLE x_auth_failures (key text NOT NULL, at_ms bigint NOT NULL,"
        " expires_at_ms bigint NOT NULL) PARTITION BY RANGE (expires_at_ms)"
    )
    db.execute(  # one partition across the instant: its expired row goes by DELETE
        f"CREATE TABLE failures_all PARTITION OF x_auth_failures FOR VALUES FROM (0) TO ({NOW * 2})"
    )
    db.execute(
        "CREATE TABLE x_auth_lockouts (key text NOT NULL, until_ms bigint NOT NULL)"
        " PARTITION BY RANGE (until_ms)"
    )
    db.execute(
        f"CREATE TABLE lockouts_old PARTITION OF x_auth_lockouts FOR VALUES FROM (0) TO ({NOW})"
    )
    db.execute(
        "CREATE TABLE lockouts_new PARTITION OF x_auth_lockouts"
        f" FOR VALUES FROM ({NOW}) TO ({NOW * 2})"
    )
    auth_rows(db, {"f-old": NOW - HOUR, "f-new": NOW + HOUR}, {"l-old": 1, "l-new": NOW + HOUR})
    run_id = "run-second-table"
    marked_by_attempt_1(db, run_id, "x_auth", TableName("lockouts_old", schema))
    with (
        psycopg.connect(pg_url, autocommit=True) as reader,
        psycopg.connect(pg_url, autocommit=True) as detacher,
    ):
        for conn in (reader, detacher):
            conn.execute(f'SET search_path = "{schema}"')
        reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        reader.execute("SELECT count(*) FROM x_auth_lockouts")  # a snapshot to wait out
        # Named with its schema, as the sweep's own are (`_waiting_detach` finds it by that).
        detach = (
            f'ALTER TABLE "{schema}".x_auth_lockouts DETACH PARTITION "{schema}".lockouts_old'
            " CONCURRENTLY"
        )
        detaching = asyncio.ensure_future(asyncio.to_thread(detacher.execute, detach))
        try:
            backend = await _waiting_detach(db, reader, detaching)
            db.execute("SELECT pg_terminate_backend(%s)", (backend,))
            with pytest.raises(psycopg.OperationalError):
                await detaching
        finally:
            reader.execute("ROLLBACK")  # a detach still waiting (the test failing) ends
            await asyncio.wait([detaching])
    assert pending(db) == 1

    target = kinds.auth(pool, partitions=PartitionPolicy("drop"))
    result = await sweep(target, workflow_id="test-workflow-id", workflow_run_id=run_id, attempt=2)

    assert pending(db) == 0
    assert (result.partitions_dropped, result.partition_rows) == (1, 1)
    assert result.removed == 2  # f-old by DELETE, l-old with its partition
    assert children(db, "x_auth_lockouts") == ["lockouts_new"]
    assert db.execute("SELECT to_regclass('lockouts_old')").fetchone() == (None,)
    assert count(db, "x_auth_failures") == count(db, "x_auth_lockouts") == 1


async def test_a_death_between_the_detach_and_the_drop_is_finished_by_the_retry(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], schema: str
) -> None:
    """What attempt 1 did before it died, done by hand: the ledger's mark, then the whole
    concurrent detach. Attempt 2 finds the partition standalone by its mark, counts it once
    and drops it."""
    total = make_events(db)
    run_id = "run-died-after-detach"
    marked_by_attempt_1(db, run_id, "events", TableName("p_m6", schema))
    db.execute("ALTER TABLE events DETACH PARTITION p_m6 CONCURRENTLY")

    result = await sweep(events(pool), workflow_id="test-workflow-id", workflow_run_id=run_id)

    assert result.removed == EXPIRED_ROWS
    assert result.partition_names == [f"{schema}.{p}" for p in EXPIRED_PARTS]
    assert db.execute("SELECT to_regclass('p_m6')").fetchone() == (None,)
    assert count(db) == total - EXPIRED_ROWS


async def test_a_detach_this_pass_did_not_start_is_completed_and_left_as_a_table(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], pg_url: str, schema: str
) -> None:
    """Someone else's interrupted detach (of a live partition, even) is finalized, so no
    partition stays pending, but never dropped: nothing says its rows were meant to go."""
    make_events(db)
    with psycopg.connect(pg_url, autocommit=True) as holder:
        holder.execute(f'SET search_path = "{schema}"')
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE p_p1 IN ACCESS SHARE MODE")
        db.execute("SET lock_timeout = '200ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            db.execute("ALTER TABLE events DETACH PARTITION p_p1 CONCURRENTLY")
        db.execute("RESET lock_timeout")
        holder.execute("ROLLBACK")
    assert pending(db) == 1

    result = await sweep(events(pool))

    assert pending(db) == 0
    assert count(db, "p_p1") == ROWS_PER_DAY
    assert "completed the interrupted detach of" in result.advice
    assert result.partitions_dropped == 3


@pytest.mark.parametrize(
    ("key", "bounds"),
    [
        ("LIST (region)", ["FOR VALUES IN ('eu')", "FOR VALUES IN ('us')", "DEFAULT"]),
        ("HASH (id)", [f"FOR VALUES WITH (modulus 3, remainder {n})" for n in range(3)]),
        ("RANGE (id)", ["FOR VALUES FROM (MINVALUE) TO (100)",
                        "FOR VALUES FROM (100) TO (MAXVALUE)"]),
    ],
    ids=["list", "hash", "range-on-another-column"],
)  # fmt: skip
async def test_a_table_partitioned_otherwise_is_swept_partition_by_partition(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], key: str, bounds: list[str]
) -> None:
    """No partition can be judged by the expiry column's bounds: each is swept in batches, on
    its own (its own ctid ranges), and the report says `drop` had nothing to take."""
    db.execute(f"CREATE TABLE events (id bigint, region text, at_ms bigint) PARTITION BY {key}")
    for n, bound in enumerate(bounds):
        db.execute(f"CREATE TABLE part_{n} PARTITION OF events {bound}")
    db.execute(
        "INSERT INTO events SELECT i, CASE WHEN i %% 2 = 0 THEN 'eu' ELSE 'us' END,"
        " CASE WHEN i %% 3 = 0 THEN %s ELSE %s END FROM generate_series(1::bigint, 300) i",
        (NOW - MAX_AGE - HOUR, NOW),
    )
    db.execute("ANALYZE events")

    result = await sweep(events(pool))

    assert result.removed == 100
    assert result.partitions_dropped == 0
    assert expired_left(db) == 0
    assert count(db) == 200
    assert f"partitioned by {key}, not by RANGE on at_ms alone" in result.advice


async def test_rate_limit_partitions_never_leave_whole_and_the_report_says_why(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    db.execute("DROP TABLE x_rate_limit")
    db.execute(
        "CREATE TABLE x_rate_limit (key text, tokens float8, capacity float8,"
        " refill_per_ms float8, last_ms bigint) PARTITION BY RANGE (last_ms)"
    )
    db.execute(f"CREATE TABLE rl_old PARTITION OF x_rate_limit FOR VALUES FROM (0) TO ({NOW})")
    db.execute(
        "INSERT INTO x_rate_limit VALUES ('full', 4, 4, 1, %s), ('empty', 0, 4, 1e-12, %s)",
        (NOW - HOUR, NOW - HOUR),
    )
    target = kinds.rate_limit(pool, partitions=PartitionPolicy("drop"))

    result = await sweep(target)

    assert (result.removed, result.partitions_dropped) == (1, 0)
    assert count(db, "rl_old") == 1  # the bucket that is not full again stays
    assert "a rate-limit bucket expires when it is full again" in result.advice


async def test_fewer_than_two_partitions_ahead_warns_naming_the_bound_to_create(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    make_events(db, days=range(-6, 1))  # the last partition holds NOW: none begins after it

    result = await sweep(events(pool, "delete"))

    assert "only 0 partitions begin after this pass's instant" in result.advice
    bound = f"FOR VALUES FROM ('{DAY0 + DAY}') TO ('{DAY0 + 2 * DAY}')"
    assert f"CREATE TABLE ... PARTITION OF events {bound}" in result.advice


async def test_enough_partitions_ahead_warn_of_nothing(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    make_events(db, days=range(-6, 3))

    result = await sweep(events(pool))

    assert "begin after" not in result.advice


async def test_one_partition_ahead_is_counted_in_the_singular(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    make_events(db, days=range(-6, 2))

    result = await sweep(events(pool))

    assert "only 1 partition begins after this pass's instant" in result.advice


async def test_a_last_range_ending_over_a_year_ahead_warns_of_nothing(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    # One partition ahead, but it runs 400 days: no insert fails within a year.
    make_events(db, days=range(-6, 1))
    far = f"FROM ({DAY0 + DAY}) TO ({DAY0 + 400 * DAY})"
    db.execute(f"CREATE TABLE p_far PARTITION OF events FOR VALUES {far}")

    result = await sweep(events(pool))

    assert "begin" not in result.advice
    assert result.removed == EXPIRED_ROWS


@pytest.mark.parametrize("far", [True, False])
async def test_a_timestamp_range_is_judged_against_a_year_ahead_too(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], far: bool
) -> None:
    # The walk's table: one old range and one from the day before the instant to 2100 (or to
    # a week after it).
    end = "'2100-01-01'" if far else f"to_timestamp({NOW} / 1000.0) + interval '7 days'"
    day_before = f"to_timestamp({NOW} / 1000.0) - interval '1 day'"
    db.execute(
        "CREATE TABLE pg1 (id bigint, expires_at timestamptz) PARTITION BY RANGE (expires_at)"
    )
    db.execute(
        f"CREATE TABLE pg1_old PARTITION OF pg1 FOR VALUES FROM ('2000-01-01') TO ({day_before})"
    )
    db.execute(f"CREATE TABLE pg1_new PARTITION OF pg1 FOR VALUES FROM ({day_before}) TO ({end})")
    target = kinds.expiring(
        pool, "pg1", TableName("pg1"), "expires_at", 0, partitions=PartitionPolicy("drop")
    )

    result = await sweep(target)

    assert ("only 0 partitions begin after" in result.advice) is not far


@pytest.mark.parametrize("held", [True, False])
async def test_a_default_partition_holding_the_next_range_says_the_create_waits_for_its_rows(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], held: bool
) -> None:
    if held:
        tomorrow_in_default(db)
    else:
        make_events(db, default=True, days=range(-6, 1))

    result = await sweep(events(pool))

    bound = f"FOR VALUES FROM ('{DAY0 + DAY}') TO ('{DAY0 + 2 * DAY}')"
    assert f"CREATE TABLE ... PARTITION OF events {bound}" in result.advice
    assert (DEFAULT_HOLDS in result.advice) is held
    # What the advice says of PostgreSQL: the CREATE it names fails while the row is there.
    create = f"CREATE TABLE p_p1 PARTITION OF events {bound}"
    if held:
        with pytest.raises(psycopg.errors.CheckViolation), db.transaction():
            db.execute(create)
    else:
        db.execute(create)


@pytest.mark.parametrize("rate_min_rows", [99, 100])
async def test_a_plain_table_losing_a_large_share_is_told_to_partition(
    db: psycopg.Connection[Any],
    pool: AsyncConnectionPool[Any],
    monkeypatch: pytest.MonkeyPatch,
    rate_min_rows: int,
) -> None:
    """Sized by the rate rows arrive at, read from the rows left: only where at least
    RATE_MIN_ROWS are (from a few, after a pass that took most of a table, it is noise)."""
    monkeypatch.setattr("activities.engine.partition_advice.PARTITION_ADVICE_ROWS", 100)
    monkeypatch.setattr("activities.engine.partition_advice.RATE_MIN_ROWS", rate_min_rows)
    db.execute("CREATE TABLE audit (id bigint, at_ms bigint NOT NULL)")
    db.execute("CREATE INDEX ON audit (at_ms)")
    # 400 rows over 4 days of retention (100 a day), the oldest 300 of them expired.
    db.execute(
        "INSERT INTO audit SELECT i, %s + i * %s FROM generate_series(0::bigint, 399) i",
        (NOW - MAX_AGE - 3 * DAY, DAY // 100),
    )
    db.execute("ANALYZE audit")  # the live rows the share is taken of, as the views know them
    target = kinds.expiring(pool, "audit", TableName("audit"), "at_ms", MAX_AGE)

    result = await sweep(target)

    assert result.removed == 301
    assert "audit: this pass removed 301 rows (75% of the table)" in result.advice
    # 99 rows left, over 0.98 of a day
    assert ("about 101 rows a day" in result.advice) == (rate_min_rows <= 99)
    assert ("rows a day" in result.advice) == (rate_min_rows <= 99)
    assert "partition it by RANGE on at_ms" in result.advice
    assert "partitions = 'drop'" in result.advice


async def test_a_pass_through_temporal_reports_the_partitions_in_its_result_and_report(
    harness: Harness,
) -> None:
    total = make_events(harness.db, now=harness.now_ms)
    async with harness.run_worker([events(harness.pool)]):
        result = await run_pass(harness.client, harness.task_queue, {"targets": ["events"]})

    [swept] = result["swept"]
    assert swept["partitions_dropped"] == 3
    assert swept["partition_rows"] == 30
    assert swept["removed"] == swept["partition_rows"] + swept["edge_removed"]
    assert count(harness.db) == total - swept["removed"]
    text = report_table(PurgeReport.from_json(result))
    assert "partitions  their rows  edge rows" in text
    assert f"partitions: events: dropped {harness.schema}.p_m6" in text


PARTITIONED_TARGET = """
[[targets]]
kind = "expiring"
name = "events"
table = "events"
column = "at_ms"
max_age = "3d"
partitions = "drop"
# The first detach waits out the test's reader until the worker is killed, not 2 s.
lock_timeout = "60s"
"""


@pytest.mark.slow
async def test_a_sigkilled_worker_mid_detach_is_replaced_and_every_partition_counted_once(
    tmp_path: Path,
    harness: Harness,
    temporal_server: RunningTemporal,
    pg_url: str,
) -> None:
    """A real worker process is SIGKILLed while its first DETACH ... CONCURRENTLY waits out an
    older reader. Its backend, orphaned, completes the detach once the reader ends: the
    partition is out of the table, not dropped, counted nowhere. A second worker retries the
    target (after the heartbeat timeout), finds the partition by its ledger mark, drops it and
    counts it, then the rest: exact, nothing pending, nothing left behind.

    The workers' sessions keep the server from looking for a gone client mid-statement
    (`client_connection_check_interval = 0` in their URL, which a worker leaves as given): at
    its every 5 s, one look falling between the kill and the reader's end would cancel the
    orphan's detach, where this test needs the moment it completes."""
    total = make_events(harness.db, now=harness.now_ms)
    cutoff = harness.now_ms - MAX_AGE
    expired = int(
        harness.db.execute("SELECT count(*) FROM events WHERE at_ms <= %s", (cutoff,)).fetchone()[0]
    )  # type: ignore[index]
    unchecked = make_conninfo(
        harness.url,
        options=f"-c search_path={harness.schema} -c client_connection_check_interval=0",
    )
    config = worker_config(
        tmp_path / "purge.toml", unchecked, harness.task_queue, PARTITIONED_TARGET
    )
    env = clean_env(TEMPORAL_ADDRESS=temporal_server.address)
    first = start_worker(config, env, tmp_path / "first.log")
    second = None
    try:
        with psycopg.connect(pg_url, autocommit=True) as reader:
            reader.execute(f'SET search_path = "{harness.schema}"')
            reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            reader.execute("SELECT count(*) FROM events")
            handle = await harness.client.start_workflow(
                "Purge",
                {"targets": ["events"]},
                id=f"purge-{uuid.uuid4()}",
                task_queue=harness.task_queue,
            )
            orphan = await _waiting_detach(harness.db, reader, tries=3000)
            os.kill(first.pid, signal.SIGKILL)
            first.wait(10)
            reader.execute("ROLLBACK")
        await notice_the_dead_worker_sooner(harness.client, handle.id)
        await _detach_done(harness.db, orphan)
        # What the dead worker left: the oldest partition out of the table, not dropped.
        assert "p_m6" not in children(harness.db)
        assert harness.db.execute("SELECT to_regclass('p_m6') IS NOT NULL").fetchone() == (True,)
        second = start_worker(config, env, tmp_path / "second.log")
        result = await handle.result()
    finally:
        stop(first)
        if second is not None:
            stop(second)

    [swept] = result["swept"]
    assert swept["removed"] == expired
    assert swept["partitions_dropped"] == 3
    assert swept["partition_rows"] == 3 * ROWS_PER_DAY
    assert not swept["lower_bound"]
    assert count(harness.db) == total - expired
    assert pending(harness.db) == 0
    assert harness.db.execute("SELECT to_regclass('p_m6')").fetchone() == (
        None,
    )  # dropped, not left


async def test_a_target_of_two_tables_is_refused_before_its_first_table_loses_a_row(
    db: psycopg.Connection[Any], schema_url: str, role: str
) -> None:
    """x_auth sweeps failures, then lockouts: a partitioned lockouts table this role does not
    own refuses the target before the failures table is touched."""
    auth_rows(db, {"f-old": NOW - HOUR}, {})
    db.execute("DROP TABLE x_auth_lockouts")
    db.execute(
        "CREATE TABLE x_auth_lockouts (key text, until_ms bigint NOT NULL)"
        " PARTITION BY RANGE (until_ms)"
    )
    db.execute(
        f"CREATE TABLE lockouts_old PARTITION OF x_auth_lockouts FOR VALUES FROM (0) TO ({NOW})"
    )
    db.execute("INSERT INTO x_auth_lockouts VALUES ('l-old', 1)")
    db.execute(
        f'GRANT SELECT, DELETE ON x_auth_failures, x_auth_lockouts, lockouts_old TO "{role}"'
    )
    pool = await open_pool(make_conninfo(schema_url, user=role))
    try:
        with pytest.raises(ApplicationError) as refused:
            await sweep(kinds.auth(pool, partitions=PartitionPolicy("drop")))
    finally:
        await pool.close()

    assert refused.value.type == "BadPurgeTarget"
    assert "x_auth_lockouts" in refused.value.message
    assert count(db, "x_auth_failures") == 1
    assert children(db, "x_auth_lockouts") == ["lockouts_old"]


async def test_the_read_after_a_sweep_gives_up_on_a_partition_ddl_holds(
    db: psycopg.Connection[Any],
    pool: AsyncConnectionPool[Any],
    schema_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The statistics read after a partitioned table's sweep walks its partition tree, which
    takes a lock on every partition: one that DDL holds (here a session's ACCESS EXCLUSIVE,
    taken as the read begins) ends that read within its own timeout, and the sweep reports
    its table's live rows as unknown, rather than wait, its table's lock held, as long as the
    DDL does."""
    total = make_events(db)
    flush_views = leftover.flush_views

    async def as_ddl_begins(conn: psycopg.AsyncConnection[Any], flushed: bool) -> None:
        holder.execute(f"LOCK TABLE {part_name(0)} IN ACCESS EXCLUSIVE MODE")
        await flush_views(conn, flushed)

    monkeypatch.setattr(leftover, "flush_views", as_ddl_begins)
    with psycopg.connect(schema_url) as holder:  # its transaction open until the block ends
        async with asyncio.timeout(60):
            result = await sweep(events(pool, "delete"))

    assert result.removed == EXPIRED_ROWS
    assert result.live_rows_from == "unknown"
    assert result.dead_tuple_share is None
    assert count(db) == total - EXPIRED_ROWS
