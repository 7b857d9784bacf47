"""An age kept in another table (`age_from`), on the real server: a job goes when its newest
event is old, through the events' foreign key, its events leaving with it by the key's ON DELETE
CASCADE; counted exactly (the job rows, not the cascaded events) in the report and the ledger,
in one batch or many, leaf by leaf for a partitioned table; dry runs and guards count the same
rows; refused at start, in one line and with nothing deleted, when the tables cannot hold the
rule (no key, two keys, a key that does not cascade, a column that is no instant, a wrong unit)
or the config asks for what it cannot do (an archive)."""

from __future__ import annotations

import asyncio
import contextlib
import tomllib
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool
from temporalio.exceptions import ApplicationError

from activities import builtin_kinds as kinds
from activities.engine.rules import NewestRelatedRule
from activities.errors import BadPurgeTarget
from activities.inputs import PurgeStep
from activities.registry import PurgeTarget, TargetRegistry
from activities.results import PurgeSweep
from activities.sweep import PurgeActivities, contract_errors
from purge_config import parse_config
from purge_config.errors import ConfigError
from purge_config.names import TableName
from purge_config.settings import EpochUnit
from purge_ops.connect import open_pool
from tests.support.activity import activity_env
from tests.support.pace import durable_every, fixed_batches, row_locked, until_a_sweep_waits
from tests.support.rows import HOUR, PAST_NOW

NOW = PAST_NOW
DAY = 24 * HOUR

#: procrastinate's shape, reduced: the events' own `id` shares its name with the job's key.
SCHEMA = """
CREATE TABLE jobs (id bigint PRIMARY KEY, status text NOT NULL, queue text);
CREATE TABLE events (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id bigint NOT NULL REFERENCES jobs ON DELETE CASCADE, type text, at {at_type});
"""
INDEX = "CREATE INDEX ON events (job_id, at)"

#: (job id, status, ages in days of its events)
JOBS: list[tuple[int, str, tuple[float, ...]]] = [
    (1, "succeeded", (10, 9)),  # newest event 9 days old: goes
    (2, "succeeded", (10, 1 / 24)),  # an old event, but its newest is an hour old: stays
    (3, "succeeded", ()),  # no event, no age: stays
    (4, "doing", (30,)),  # old, but live: the filter keeps it
    (5, "succeeded", (8, 7.5)),  # newest event 7.5 days old: goes
    (6, "failed", (20,)),  # old, in no state the filter selects: stays
]
GONE = {1, 5}

ENTRY = """
[[targets]]
kind = "expiring"
name = "jobs"
table = "jobs"
age_from = "events"
column = "at"
max_age = "7d"
match = { status = ["succeeded"] }
"""


def make(db: psycopg.Connection[Any], at_type: str = "timestamptz", index: bool = True) -> None:
    db.execute(SCHEMA.format(at_type=at_type))
    if index:
        db.execute(INDEX)


def at_value(at_type: str, days: float) -> str:
    """An event's instant `days` before NOW, as SQL of the column's type."""
    ms = NOW - int(days * DAY)
    if at_type == "bigint":  # epoch seconds
        return str(ms // 1000)
    zone = " AT TIME ZONE 'UTC'" if at_type == "timestamp" else ""
    return f"to_timestamp({ms} / 1000.0){zone}"


def insert(
    db: psycopg.Connection[Any],
    jobs: list[tuple[int, str, tuple[float, ...]]] = JOBS,
    at_type: str = "timestamptz",
) -> None:
    with db.cursor() as cur:
        cur.executemany("INSERT INTO jobs VALUES (%s, %s, 'default')", [j[:2] for j in jobs])
        for job, _, ages in jobs:
            for days in ages:
                at = at_value(at_type, days)
                cur.execute(f"INSERT INTO events (job_id, at) VALUES (%s, {at})", (job,))
    db.execute("ANALYZE jobs; ANALYZE events")


def target(pool: AsyncConnectionPool[Any], text: str = ENTRY) -> PurgeTarget:
    config = parse_config(tomllib.loads(text), env={"PURGE_DATABASE_URL": "postgresql://x@y/z"})
    [spec] = config.targets
    return kinds.build_target(spec, pool)


async def sweep(target: PurgeTarget, dry_run: bool = False) -> tuple[PurgeSweep, Any]:
    """The real activity on `target`: its report, and the pass's run id (its ledger's key)."""
    env = activity_env()
    result: PurgeSweep = await env.run(
        PurgeActivities(TargetRegistry([target])).purge_target,
        PurgeStep(name=target.name, now_ms=NOW, dry_run=dry_run),
    )
    return result, env.info.workflow_run_id


def ids(db: psycopg.Connection[Any], table: str = "jobs", column: str = "id") -> set[int]:
    return {row[0] for row in db.execute(f"SELECT DISTINCT {column} FROM {table}")}


def ledger(db: psycopg.Connection[Any], run_id: str) -> int | None:
    row = db.execute("SELECT removed FROM purge_progress WHERE run_id = %s", (run_id,)).fetchone()
    return None if row is None else int(row[0])


@pytest.mark.parametrize(
    ("at_type", "unit"),
    [("timestamptz", ""), ("timestamp", ""), ("bigint", 'unit = "s"')],
)
async def test_a_job_goes_when_its_newest_event_is_old_and_its_events_go_with_it(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], at_type: str, unit: str
) -> None:
    make(db, at_type)
    insert(db, at_type=at_type)
    jobs = target(pool, ENTRY + unit)

    planned, _ = await sweep(jobs, dry_run=True)
    assert (planned.removed, ids(db)) == (len(GONE), {j[0] for j in JOBS})  # nothing deleted

    result, run_id = await sweep(jobs)

    assert ids(db) == {j[0] for j in JOBS} - GONE
    assert ids(db, "events", "job_id") == {j[0] for j in JOBS if j[2]} - GONE  # cascaded
    # The jobs, not their cascaded events, exactly: in the report and in the ledger.
    assert (result.removed, ledger(db, run_id), result.lower_bound) == (len(GONE), 2, False)
    assert result.strategy == "range"  # no index of jobs serves an age kept in events
    assert result.advice == ""  # events has its (job_id, at) index
    assert result.backlog == 0
    assert result.oldest_expired_age_s in (0, 0.0, None)


@pytest.mark.parametrize(("at_type", "unit"), [("timestamp", "ms"), ("bigint", "s")])
async def test_the_oldest_expired_row_is_dated_by_its_newest_related_row(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], at_type: str, unit: EpochUnit
) -> None:
    # What the report's oldest_expired_age_s reads when a time budget leaves expired rows.
    make(db, at_type)
    insert(db, at_type=at_type)
    rule = NewestRelatedRule(TableName("jobs"), TableName("events"), "at", 7 * DAY, unit)
    async with pool.connection() as conn:
        pred = await rule.bind(conn, NOW)
        cur = await conn.execute(
            sql.SQL("SELECT min({}) FROM jobs WHERE {}").format(pred.expired_at, pred.where),
            pred.params,
        )
        [oldest] = await cur.fetchone() or [None]

    # Without the filter, job 4's newest event, 30 days old, is the oldest: expired 23 days ago.
    assert oldest == pytest.approx(NOW - 23 * DAY, abs=1000)
    assert pred.column is None  # no index of jobs serves it: walked
    assert pred.range_key is None  # no partition leaves whole


def many_jobs(db: psycopg.Connection[Any]) -> int:
    """3,000 jobs, walked in many batches: every fifth live; every job but each third has an
    old event, each seventh a recent one too. Returns how many jobs are expired."""
    make(db)
    db.execute(
        "INSERT INTO jobs SELECT i, CASE WHEN i % 5 = 0 THEN 'doing' ELSE 'succeeded' END, 'q'"
        " FROM generate_series(1, 3000) i"
    )
    db.execute(
        "INSERT INTO events (job_id, at) SELECT i, to_timestamp(%s / 1000.0) - interval '30 days'"
        " FROM generate_series(1, 3000) i WHERE i %% 3 <> 0",
        (NOW,),
    )
    db.execute(
        "INSERT INTO events (job_id, at) SELECT i, to_timestamp(%s / 1000.0) - interval '1 hour'"
        " FROM generate_series(7, 3000, 7) i",
        (NOW,),
    )
    db.execute("VACUUM ANALYZE jobs")
    db.execute("VACUUM ANALYZE events")
    [(expired,)] = db.execute(
        "SELECT count(*) FROM generate_series(1, 3000) i"
        " WHERE i % 5 <> 0 AND i % 3 <> 0 AND i % 7 <> 0"
    ).fetchall()
    return int(expired)


def swept_exactly(db: psycopg.Connection[Any], expired: int) -> None:
    """No expired job is left, every other job is, and no event outlived its job."""
    [(left,)] = db.execute(
        "SELECT count(*) FROM jobs j WHERE status = 'succeeded'"
        " AND (SELECT max(at) FROM events e WHERE e.job_id = j.id)"
        " <= to_timestamp(%s / 1000.0) - interval '7 days'",
        (NOW,),
    ).fetchall()
    assert left == 0
    assert db.execute("SELECT count(*) FROM jobs").fetchone() == (3000 - expired,)
    [(orphans,)] = db.execute(
        "SELECT count(*) FROM events e"
        " WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = e.job_id)"
    ).fetchall()
    assert orphans == 0


#: The sweep waits for the other sessions' locks as long as the test needs, never rolled back
#: by its own lock_timeout (2 s by default) or statement_timeout (10 s, lock waits included)
#: on a slow machine.
PATIENT = ENTRY + 'lock_timeout = "60s"\nstatement_timeout = "600s"\n'


def late_event(url: str, job: int, pid: list[int]) -> str:
    """An event for `job` inserted in a session of its own (its backend's pid put in `pid`):
    "inserted", or the detail of the foreign-key violation it met."""
    with psycopg.connect(url, autocommit=True) as conn:
        pid.append(conn.info.backend_pid)
        try:
            conn.execute(
                f"INSERT INTO events (job_id, at) VALUES (%s, {at_value('timestamptz', 0)})", (job,)
            )
        except psycopg.errors.ForeignKeyViolation as err:
            return err.diag.message_detail or ""
    return "inserted"


async def test_an_event_committed_while_the_batch_waits_for_it_goes_with_its_job(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], schema_url: str
) -> None:
    """docs/sweeping.md, "When a related row arrives mid-batch": an insert of a new event for
    job 1 still open when the batch reaches job 1 makes the batch wait; committed, it does not
    save the job (judged by the events its statement saw when it started), and the cascade
    deletes the new event with it."""
    make(db)
    insert(db)
    with psycopg.connect(schema_url, autocommit=True) as writer:
        writer.execute("BEGIN")
        writer.execute(
            f"INSERT INTO events (job_id, at) VALUES (1, {at_value('timestamptz', 0)})"
        )  # job 1's newest event now: seen at the batch's start, it would have kept job 1
        running = asyncio.ensure_future(sweep(target(pool, PATIENT)))
        await until_a_sweep_waits(db, running, holder=writer)
        writer.execute("COMMIT")
    result, _ = await running

    assert result.removed == len(GONE)
    assert ids(db) == {j[0] for j in JOBS} - GONE
    assert 1 not in ids(db, "events", "job_id")  # the new event too


@contextlib.asynccontextmanager
async def a_late_event_behind_the_batch(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], schema_url: str
) -> AsyncIterator[tuple[asyncio.Future[Any], asyncio.Future[str], int]]:
    """The batch has deleted job 1 and waits at job 5 (another session holds it), and an insert
    of an event for job 1 waits for the batch: (the sweep, the insert's outcome as `late_event`
    says it, the batch's backend pid), while job 5 is held; let go on the way out."""
    make(db)
    insert(db)
    pid: list[int] = []
    with row_locked(schema_url, "jobs", 5, column="id") as holder:
        running = asyncio.ensure_future(sweep(target(pool, PATIENT)))
        await until_a_sweep_waits(db, running, holder=holder)
        late = asyncio.ensure_future(asyncio.to_thread(late_event, schema_url, 1, pid))
        blocking = "SELECT pg_blocking_pids(%s)"
        while not (pid and (sweeper := db.execute(blocking, (pid[0],)).fetchone()) and sweeper[0]):
            assert not late.done(), f"the event did not wait for the batch: {late.result()}"
            await asyncio.sleep(0.01)
        [batch] = sweeper[0]  # the session of the batch that deleted job 1
        yield running, late, batch


async def test_an_event_for_a_job_the_batch_deleted_waits_then_fails_its_key(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], schema_url: str
) -> None:
    """The same section: the batch has deleted job 1 and waits at job 5 (another session
    holds it); an insert of an event for job 1 then waits for the batch, and once the batch
    commits fails with a foreign-key violation."""
    async with a_late_event_behind_the_batch(db, pool, schema_url) as (running, late, _):
        pass  # job 5 let go: the batch commits
    result, _ = await running

    assert (await late).startswith('Key (job_id)=(1) is not present in table "jobs"')
    assert result.removed == len(GONE)
    assert ids(db) == {j[0] for j in JOBS} - GONE


async def test_an_event_for_a_job_the_batch_deleted_is_inserted_once_the_batch_rolls_back(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], schema_url: str
) -> None:
    """The same section: as above, but the batch rolls back (its session ended while the
    insert waits for it): the insert succeeds, job 1 is back with its new event, and the next
    sweep judges job 1 by that event and keeps it."""
    async with a_late_event_behind_the_batch(db, pool, schema_url) as (running, late, batch):
        db.execute("SELECT pg_terminate_backend(%s)", (batch,))
        assert await late == "inserted"
    with pytest.raises(psycopg.OperationalError):
        await running  # the attempt fails (Temporal retries it)

    assert ids(db) == {j[0] for j in JOBS}
    assert 1 in ids(db, "events", "job_id")
    result, _ = await sweep(target(pool, PATIENT))
    assert result.removed == len(GONE - {1})
    assert ids(db) == {j[0] for j in JOBS} - {5}


async def test_many_batches_count_exactly_what_one_would(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    fixed_batches(monkeypatch, pages=2)
    expired = many_jobs(db)

    result, run_id = await sweep(target(pool))

    assert result.batches > 3
    assert (result.removed, ledger(db, run_id)) == (expired, expired)
    swept_exactly(db, expired)


async def test_an_attempt_killed_mid_sweep_is_retried_and_counts_each_job_once(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The retry resumes from the dead attempt's first heartbeat, behind what it had deleted:
    # the ledger, not the heartbeat, says what the pass removed.
    fixed_batches(monkeypatch, pages=2)
    durable_every(monkeypatch, 1)
    expired = many_jobs(db)
    jobs = target(pool)
    first = activity_env()
    beats: list[dict[str, Any]] = []

    def beat(*details: Any) -> None:
        if details and isinstance(details[0], dict) and "batch_ms" in details[0]:
            beats.append(details[0])
            if len(beats) == 3:
                first.cancel()

    first.on_heartbeat = beat
    with pytest.raises(asyncio.CancelledError):
        await first.run(
            PurgeActivities(TargetRegistry([jobs])).purge_target,
            PurgeStep(name="jobs", now_ms=NOW),
        )
    [(gone,)] = db.execute("SELECT 3000 - count(*) FROM jobs").fetchall()
    assert beats[0]["removed"] < gone < expired

    retry = activity_env(
        workflow_run_id=first.info.workflow_run_id, attempt=2, heartbeat_details=[beats[0]]
    )
    result: PurgeSweep = await retry.run(
        PurgeActivities(TargetRegistry([jobs])).purge_target, PurgeStep(name="jobs", now_ms=NOW)
    )

    assert (result.removed, result.lower_bound) == (expired, False)
    assert ledger(db, first.info.workflow_run_id) == expired
    swept_exactly(db, expired)


async def test_a_partitioned_table_is_swept_leaf_by_leaf_with_the_same_rule(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    # Each leaf is swept by its own name: the rule's SQL names no table of the outer statement.
    db.execute(
        "CREATE TABLE jobs (id bigint PRIMARY KEY, status text NOT NULL, queue text)"
        " PARTITION BY RANGE (id);"
        "CREATE TABLE jobs_low PARTITION OF jobs FOR VALUES FROM (0) TO (4);"
        "CREATE TABLE jobs_high PARTITION OF jobs FOR VALUES FROM (4) TO (100);"
        "CREATE TABLE events (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
        " job_id bigint NOT NULL REFERENCES jobs ON DELETE CASCADE, type text, at timestamptz);"
    )
    db.execute(INDEX)
    insert(db)

    result, run_id = await sweep(target(pool))

    assert ids(db) == {j[0] for j in JOBS} - GONE
    assert (result.removed, ledger(db, run_id)) == (len(GONE), len(GONE))


async def test_a_guard_counts_the_same_rows_and_refuses_before_any_delete(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    make(db)
    insert(db)
    guarded = target(pool, ENTRY + "max_rows = 1\n")

    with pytest.raises(ApplicationError, match="would remove 2 rows, more than its max_rows 1"):
        await sweep(guarded)

    assert ids(db) == {j[0] for j in JOBS}


async def test_without_an_index_on_the_key_the_report_names_the_one_to_create(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    make(db, index=False)
    insert(db)

    result, _ = await sweep(target(pool))

    assert result.removed == len(GONE)
    assert 'create one: CREATE INDEX CONCURRENTLY ON "events" ("job_id", "at")' in result.advice


REFUSALS = {
    "no key": (
        "CREATE TABLE jobs (id bigint PRIMARY KEY, status text NOT NULL, queue text);"
        "CREATE TABLE events (job_id bigint NOT NULL, at timestamptz)",
        "age_from: no foreign key from events to jobs",
    ),
    "two keys": (
        SCHEMA.format(at_type="timestamptz")
        + "ALTER TABLE events ADD COLUMN parent_id bigint REFERENCES jobs ON DELETE CASCADE",
        "age_from: 2 foreign keys events -> jobs (events_job_id_fkey, events_parent_id_fkey)",
    ),
    "no cascade": (
        SCHEMA.format(at_type="timestamptz").replace("ON DELETE CASCADE", ""),
        "foreign key events_job_id_fkey (events -> jobs) is not ON DELETE CASCADE: deleting a "
        "row of jobs would fail, or orphan its rows in events",
    ),
    "set null": (
        SCHEMA.format(at_type="timestamptz").replace("NOT NULL REFERENCES", "REFERENCES")
        .replace("CASCADE", "SET NULL"),
        "is not ON DELETE CASCADE",
    ),
    "text column": (
        SCHEMA.format(at_type="text"),
        "column events.at is text, this target takes bigint or integer or timestamp",
    ),
    "no column": (
        SCHEMA.format(at_type="timestamptz").replace(" at ", " happened_at "),
        "table events has no column 'at'",
    ),
    "no table": (
        "CREATE TABLE jobs (id bigint PRIMARY KEY, status text NOT NULL, queue text)",
        "table events does not exist",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", REFUSALS)
async def test_tables_that_cannot_hold_the_rule_are_refused_in_one_line_deleting_nothing(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], case: str
) -> None:
    ddl, message = REFUSALS[case]
    db.execute(ddl)
    db.execute("INSERT INTO jobs VALUES (1, 'succeeded', 'q')")
    # Job 1's one event 30 days old, where its table can hold one: the rule would take job 1.
    column = {"no column": "happened_at", "no table": ""}.get(case, "at")
    if column:
        at = at_value("timestamptz", 30) + ("::text" if case == "text column" else "")
        db.execute(f"INSERT INTO events (job_id, {column}) VALUES (1, {at})")
    jobs = target(pool)

    with pytest.raises(BadPurgeTarget) as dry, contract_errors():
        await jobs.count_expired(NOW)
    with pytest.raises(BadPurgeTarget) as refused, contract_errors():
        await jobs.purge_expired(NOW)

    for error in (dry.value, refused.value):
        assert message in str(error)
        assert "\n" not in str(error)
    assert refused.value.non_retryable
    assert ids(db) == {1}


async def test_the_role_needs_select_on_the_related_table_and_no_delete_there(
    db: psycopg.Connection[Any], schema_url: str, role: str
) -> None:
    # The cascade runs with the key's owner's rights: the sweep's role only reads the ages.
    make(db)
    insert(db)
    db.execute(f'GRANT SELECT, DELETE ON jobs TO "{role}"')
    pool = await open_pool(make_conninfo(schema_url, user=role))
    try:
        with pytest.raises(BadPurgeTarget) as refused, contract_errors():
            await target(pool).purge_expired(NOW)
        assert "age_from: this role may not read events (grant SELECT)" in str(refused.value)
        assert ids(db) == {j[0] for j in JOBS}

        db.execute(f'GRANT SELECT ON events TO "{role}"')
        assert await target(pool).purge_expired(NOW) == len(GONE)
    finally:
        await pool.close()
    assert ids(db) == {j[0] for j in JOBS} - GONE


async def test_an_epoch_column_in_another_unit_is_refused_before_anything_is_deleted(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    make(db, "bigint")
    insert(db, at_type="bigint")  # epoch seconds, read as the default milliseconds

    with pytest.raises(ApplicationError, match=r"table events column at: .* epoch seconds"):
        await sweep(target(pool))

    assert ids(db) == {j[0] for j in JOBS}


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            'archive_table = "jobs_archive"',
            "age_from: with archive_table, the rows of events that each delete cascades to "
            "would be lost, not archived",
        ),
        ('partitions = "drop"', "with age_from a row's age is in another table"),
        ('age_from = "jobs"', "age_from: the table itself (jobs)"),
        ('age_from = "a.b.c"', "age_from: 'a.b.c' is not a table name"),
    ],
    ids=["archive", "partitions", "itself", "bad-name"],
)
def test_the_config_refuses_what_age_from_cannot_do_in_one_line(lines: str, message: str) -> None:
    text = ENTRY.replace('age_from = "events"\n', "") if "age_from" in lines else ENTRY
    with pytest.raises(ConfigError) as refused:
        parse_config(
            tomllib.loads(text + lines + "\n"), env={"PURGE_DATABASE_URL": "postgresql://x@y/z"}
        )
    assert message in str(refused.value)
    assert "[[targets]] #1 (jobs)" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_pattern_fills_age_from_from_the_tables_match() -> None:
    text = ENTRY.replace(
        '"jobs"\nage_from = "events"', '"tenant_*.jobs"\nage_from = "tenant_*.events"'
    )
    config = parse_config(tomllib.loads(text), env={"PURGE_DATABASE_URL": "postgresql://x@y/z"})
    [spec] = config.targets
    matched = spec.matched("jobs@tenant_7")
    assert matched is not None
    assert (str(matched.tables[0]), str(matched.age_from)) == ("tenant_7.jobs", "tenant_7.events")
