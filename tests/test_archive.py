"""Archive before delete, on the real server: each batch inserts into the archive exactly the rows
its DELETE removed, in one statement; the archive's shape and the role's grant are checked before
anything moves; a dry run moves nothing; a sweep cancelled between batches and resumed leaves
every row in exactly one of the two tables; every built-in kind takes an archive."""

from __future__ import annotations

import asyncio
import dataclasses
import tomllib
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool
from temporalio.testing import ActivityEnvironment

from activities import builtin_kinds as kinds
from activities.errors import BadPurgeTarget
from activities.inputs import PurgeStep
from activities.registry import TargetRegistry
from activities.results import PurgeReport, PurgeSweep
from activities.sweep import PurgeActivities, contract_errors
from purge_config import parse_config
from purge_config.names import TableName
from purge_config.settings import SweepSettings
from purge_ops.connect import open_pool
from purge_ops.render import report_table
from tests.support.activity import activity_env
from tests.support.pace import durable_every, fixed_batches
from tests.support.rows import HOUR, PAST_NOW, auth_rows, bucket_rows, idempotency_rows, keys

NOW = PAST_NOW
AUDIT = TableName("audit_log")
#: Batches of about a millisecond: many of them, so a cancellation falls between two.
TINY = SweepSettings(batch_target_ms=1)


@pytest.fixture
def arc(db: psycopg.Connection[Any], schema: str) -> Iterator[str]:
    """A schema for the test's archive tables (the test's own schema holds the sources)."""
    name = f"{schema}_archive"
    db.execute(f"CREATE SCHEMA {name}")
    yield name
    db.execute(f"DROP SCHEMA {name} CASCADE")


#: The archive of audit_log: every column, and an `archived_at` it fills itself.
ARCHIVE_DDL = (
    "CREATE TABLE {arc}.audit_log (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    " actor text NOT NULL, body jsonb, amount numeric(12, 2), created_at bigint NOT NULL,"
    " size integer, archived_at timestamptz NOT NULL DEFAULT now())"
)


def make_audit(db: psycopg.Connection[Any], arc: str, archive: str | None = ARCHIVE_DDL) -> None:
    """audit_log (an identity column, json, a stored generated column) and, unless `archive`
    is None, the archive table that statement makes in the schema `arc`."""
    db.execute(
        "CREATE TABLE audit_log (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
        " actor text NOT NULL, body jsonb, amount numeric(12, 2), created_at bigint NOT NULL,"
        " size integer GENERATED ALWAYS AS (length(actor)) STORED)"
    )
    db.execute("CREATE INDEX ON audit_log (created_at)")
    if archive is not None:
        db.execute(archive.format(arc=arc))


def fill_audit(db: psycopg.Connection[Any], rows: int, expired_every: int) -> int:
    """`rows` audit rows, every `expired_every`-th older than the 1h max_age; how many are."""
    db.execute(
        "INSERT INTO audit_log (actor, body, amount, created_at)"
        " SELECT 'user' || i, jsonb_build_object('i', i, 'tags', jsonb_build_array(i, 'x')),"
        " i / 100.0, CASE WHEN i %% %s = 0 THEN %s ELSE %s END FROM generate_series(1, %s) i",
        (expired_every, NOW - 2 * HOUR, NOW, rows),
    )
    db.execute("VACUUM ANALYZE audit_log")
    return rows // expired_every


COLUMNS = "id, actor, body, amount, created_at, size"


def rows_of(db: psycopg.Connection[Any], table: str) -> list[tuple[Any, ...]]:
    """Every row's common columns, as text (byte for byte what the server holds), in the
    order of the ids' text (as `sorted` orders these tuples)."""
    return [
        tuple(row)
        for row in db.execute(
            f"SELECT {', '.join(f'{c}::text' for c in COLUMNS.split(', '))} FROM {table}"
            " ORDER BY id"
        )
    ]


def audit(pool: AsyncConnectionPool[Any], arc: str, settings: SweepSettings | None = None) -> Any:
    """audit_log's rows older than an hour, moved to `arc`.audit_log."""
    archive = TableName("audit_log", arc)
    return kinds.expiring(
        pool, "audit", AUDIT, "created_at", HOUR, settings=settings, archive=archive
    )


@pytest.mark.parametrize("share", [5, 2], ids=["index", "range"])
async def test_expired_rows_move_to_the_archive_byte_for_byte(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], arc: str, share: int
) -> None:
    """Every expired row is in the archive exactly once, with every column as it was (the
    identity value kept, the generated column's value copied); the live rows stay; the
    report's `archived` is `removed`. Both batch shapes: by index, and the range walk."""
    make_audit(db, arc)
    expired = fill_audit(db, 20_000, expired_every=share)
    before = rows_of(db, "audit_log")
    env = activity_env()
    activities = PurgeActivities(TargetRegistry([audit(pool, arc)]))

    sweep: PurgeSweep = await env.run(activities.purge_target, PurgeStep(name="audit", now_ms=NOW))

    moved, stayed = rows_of(db, f"{arc}.audit_log"), rows_of(db, "audit_log")
    assert sweep.strategy == ("index" if share == 5 else "range")
    assert sweep.removed == sweep.archived == expired == len(moved)
    assert sorted(moved + stayed) == before
    assert {int(r[0]) % share for r in moved} == {0}
    assert {int(r[0]) % share for r in stayed} == set(range(1, share))
    assert db.execute(
        f"SELECT count(*) FROM {arc}.audit_log WHERE archived_at IS NULL"
    ).fetchone() == (0,)


async def test_a_dry_run_counts_and_moves_nothing(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], arc: str
) -> None:
    make_audit(db, arc)
    expired = fill_audit(db, 1_000, expired_every=4)
    activities = PurgeActivities(TargetRegistry([audit(pool, arc)]))

    sweep: PurgeSweep = await activity_env().run(
        activities.purge_target, PurgeStep(name="audit", now_ms=NOW, dry_run=True)
    )

    assert (sweep.removed, sweep.archived) == (expired, 0)
    assert db.execute(f"SELECT count(*) FROM {arc}.audit_log").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM audit_log").fetchone() == (1_000,)


A = "CREATE TABLE {arc}.audit_log"
MISFITS = {
    "missing": (None, "archive table ARC.audit_log of audit_log does not exist"),
    "no-column": (
        f"{A} (id bigint, actor text, body jsonb, amount numeric(12, 2), created_at bigint)",
        "archive ARC.audit_log has no column 'size' (integer) of audit_log",
    ),
    "other-type": (
        f"{A} (id bigint, actor text, body json, amount numeric(12, 2), created_at bigint,"
        " size integer)",
        "column 'body' is jsonb in audit_log but json in archive ARC.audit_log",
    ),
    "other-typmod": (
        f"{A} (id bigint, actor text, body jsonb, amount numeric(10, 2), created_at bigint,"
        " size integer)",
        "column 'amount' is numeric(12,2) in audit_log but numeric(10,2)",
    ),
    "extra-not-null": (
        f"{A} (id bigint, actor text, body jsonb, amount numeric(12, 2), created_at bigint,"
        " size integer, reason text NOT NULL)",
        "column 'reason' of archive ARC.audit_log is NOT NULL with no default",
    ),
    "extra-nullable-column-fits": (
        f"{A} (id bigint, actor text, body jsonb, amount numeric(12, 2), created_at bigint,"
        " size integer, x int, CHECK (true))",
        None,
    ),
    "a-view": (
        "CREATE VIEW {arc}.audit_log AS SELECT * FROM audit_log",
        "archive ARC.audit_log of audit_log is not a table",
    ),
}


async def test_a_misspelt_archive_gets_the_nearest_name_before_the_table_to_create(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], arc: str
) -> None:
    """`archive_table = "ARC.audit_logs"` beside ARC.audit_log: the refusal names the table
    most likely meant before the CREATE TABLE it offers (as the docs make one: identity
    included), and nothing moves."""
    make_audit(db, arc)
    fill_audit(db, 100, expired_every=2)
    misspelt = TableName("audit_logs", arc)
    target = kinds.expiring(pool, "audit", AUDIT, "created_at", HOUR, archive=misspelt)

    with pytest.raises(BadPurgeTarget) as refused, contract_errors():
        await target.purge_expired(NOW)

    assert refused.value.message == (
        f"archive table {arc}.audit_logs of audit_log does not exist (looked for "
        f'"{arc}"."audit_logs") (did you mean \'{arc}.audit_log\'?); the sweep never creates '
        f'it: create it, e.g. CREATE TABLE "{arc}"."audit_logs" (LIKE "audit_log" INCLUDING '
        "IDENTITY); nothing was deleted"
    )
    assert db.execute("SELECT count(*) FROM audit_log").fetchone() == (100,)


@pytest.mark.parametrize(("ddl", "message"), MISFITS.values(), ids=MISFITS.keys())
async def test_an_archive_that_does_not_fit_fails_the_target_before_anything_moves(
    db: psycopg.Connection[Any],
    pool: AsyncConnectionPool[Any],
    arc: str,
    ddl: str | None,
    message: str | None,
) -> None:
    """Every column of the source must be in the archive with the same type, and every other
    archive column must fill itself; otherwise BadPurgeTarget names the column, non-retryable,
    for a dry run as for a sweep, and no row moves."""
    make_audit(db, arc, archive=ddl)
    message = message and message.replace("ARC", arc)
    fill_audit(db, 100, expired_every=2)
    before = rows_of(db, "audit_log")
    if message is None:  # an extra nullable column fits: a control
        assert await audit(pool, arc).purge_expired(NOW) == 50
        return

    with pytest.raises(BadPurgeTarget) as dry, contract_errors():
        await audit(pool, arc).count_expired(NOW)
    with pytest.raises(BadPurgeTarget) as refused, contract_errors():
        await audit(pool, arc).purge_expired(NOW)

    assert message in str(dry.value)
    assert message in str(refused.value)
    assert refused.value.non_retryable
    assert rows_of(db, "audit_log") == before


async def test_a_table_a_foreign_key_cascades_from_is_not_archived(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], arc: str
) -> None:
    """A cascade deletes the rows that point at a moved row, which the move's RETURNING never
    names, so they would be copied nowhere: a sweep (and a dry run) with an archive refuses the
    table, naming the referencing table, and nothing moves. A key that sets NULL instead keeps
    the rows that pointed: that table is archived."""
    make_audit(db, arc)
    fill_audit(db, 100, expired_every=2)
    db.execute(
        "CREATE TABLE attachments (audit_id bigint REFERENCES audit_log ON DELETE CASCADE,"
        " name text)"
    )
    db.execute("INSERT INTO attachments SELECT id, 'a' || id FROM audit_log")
    before = rows_of(db, "audit_log")

    with pytest.raises(BadPurgeTarget) as dry, contract_errors():
        await audit(pool, arc).count_expired(NOW)
    with pytest.raises(BadPurgeTarget) as refused, contract_errors():
        await audit(pool, arc).purge_expired(NOW)

    for error in (dry, refused):
        assert error.value.message.startswith(
            f"archive {arc}.audit_log of audit_log: attachments references audit_log ON "
            "DELETE CASCADE, so their rows that point at a moved row would be deleted with it"
        )
        assert error.value.message.endswith("nothing was deleted")
    assert refused.value.non_retryable
    assert rows_of(db, "audit_log") == before
    assert db.execute("SELECT count(*) FROM attachments").fetchone() == (100,)
    assert rows_of(db, f"{arc}.audit_log") == []

    db.execute("DROP TABLE attachments")
    db.execute("CREATE TABLE notes (audit_id bigint REFERENCES audit_log ON DELETE SET NULL)")
    assert await audit(pool, arc).purge_expired(NOW) == 50


async def test_an_archive_in_the_tables_own_partition_tree_is_refused(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    """An archive that is a partition of the swept table: each row moved there was swept again
    from that partition (still expired), moved onto itself and counted again, batch after
    batch, until the time budget ran out. Refused, naming the tree, for a dry run as for a
    sweep, before anything moves."""
    db.execute(
        "CREATE TABLE events (id bigint, at bigint NOT NULL) PARTITION BY RANGE (at);"
        f" CREATE TABLE events_old PARTITION OF events FOR VALUES FROM (MINVALUE) TO ({NOW});"
        f" CREATE TABLE events_new PARTITION OF events FOR VALUES FROM ({NOW}) TO (MAXVALUE);"
        f" INSERT INTO events SELECT i, {NOW} - 2 * {HOUR} + i FROM generate_series(1, 10) i;"
        f" INSERT INTO events SELECT i, {NOW} + i FROM generate_series(11, 20) i"
    )
    target = kinds.expiring(
        pool, "events", TableName("events"), "at", HOUR, archive=TableName("events_old")
    )

    for asking in (target.count_expired, target.purge_expired):
        with pytest.raises(BadPurgeTarget) as refused, contract_errors():
            await asking(NOW)
        message = refused.value.message
        assert message.startswith("archive events_old of events"), message
        assert "is in the same partition tree as it" in message, message
        assert refused.value.non_retryable
    assert db.execute("SELECT count(*) FROM events").fetchone() == (20,)


async def test_a_row_the_archive_already_holds_fails_the_target_at_once_moving_nothing(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], arc: str
) -> None:
    """An archive's unique key already taken by a row being archived (one archived before, and
    its key written again since) fails every attempt alike: BadPurgeTarget, non-retryable,
    naming both tables, and no row leaves either."""
    make_audit(db, arc)
    fill_audit(db, 100, expired_every=2)
    db.execute(
        f"INSERT INTO {arc}.audit_log ({COLUMNS}) OVERRIDING SYSTEM VALUE"
        " SELECT id, actor, body, amount, created_at, size FROM audit_log WHERE id = 2"
    )
    before, archived = rows_of(db, "audit_log"), rows_of(db, f"{arc}.audit_log")

    with pytest.raises(BadPurgeTarget) as refused, contract_errors():
        await audit(pool, arc).purge_expired(NOW)

    assert refused.value.non_retryable
    assert f"archive {arc}.audit_log already holds" in str(refused.value)
    assert "(id)=(2)" not in str(refused.value)  # a key's value may be a secret
    assert rows_of(db, "audit_log") == before
    assert rows_of(db, f"{arc}.audit_log") == archived


@pytest.mark.parametrize(
    "refusal",
    [
        "ALTER TABLE {arc}.audit_log ADD CONSTRAINT small CHECK (amount < 0.5)",
        # A partitioned archive whose one partition takes only ids below 50.
        "DROP TABLE {arc}.audit_log; CREATE TABLE {arc}.audit_log (id bigint NOT NULL,"
        " actor text NOT NULL, body jsonb, amount numeric(12, 2), created_at bigint NOT NULL,"
        " size integer) PARTITION BY RANGE (id); CREATE TABLE {arc}.audit_log_low PARTITION OF"
        " {arc}.audit_log FOR VALUES FROM (0) TO (50)",
    ],
    ids=["check", "no-partition"],
)
async def test_a_row_the_archive_refuses_fails_the_target_at_once_moving_nothing(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], arc: str, refusal: str
) -> None:
    """A row the archive's own rules refuse (a CHECK of its own; no partition of it for the
    row): every attempt would meet it, so the target fails at once, BadPurgeTarget,
    non-retryable, naming the archive and its rule but not the row, and the batch moves
    nothing."""
    make_audit(db, arc)
    db.execute(refusal.format(arc=arc))
    fill_audit(db, 100, expired_every=2)
    before = rows_of(db, "audit_log")

    with pytest.raises(BadPurgeTarget) as refused, contract_errors():
        await audit(pool, arc).purge_expired(NOW)

    assert refused.value.non_retryable
    message = str(refused.value)
    assert f"a row of a batch archived to {arc}.audit_log was refused" in message, message
    assert "user" not in message  # the DETAIL, which shows the row, is not said
    assert rows_of(db, "audit_log") == before


async def test_an_archive_column_generated_there_but_not_here_is_refused(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], arc: str
) -> None:
    make_audit(
        db,
        arc,
        f"{A} (id bigint, actor text, body jsonb, amount numeric(12, 2), created_at bigint,"
        " size integer GENERATED ALWAYS AS (0) STORED)",
    )
    db.execute("ALTER TABLE audit_log DROP COLUMN size")
    db.execute("ALTER TABLE audit_log ADD COLUMN size integer")
    fill_audit(db, 10, expired_every=2)

    with (
        pytest.raises(BadPurgeTarget, match=rf"'size' of archive {arc}\.audit_log is generated"),
        contract_errors(),
    ):
        await audit(pool, arc).purge_expired(NOW)
    assert db.execute("SELECT count(*) FROM audit_log").fetchone() == (10,)


async def test_a_role_that_may_not_insert_into_the_archive_is_refused_naming_the_grant(
    db: psycopg.Connection[Any], schema_url: str, arc: str, role: str
) -> None:
    make_audit(db, arc)
    fill_audit(db, 100, expired_every=2)
    db.execute(f'GRANT SELECT, DELETE ON audit_log TO "{role}"')
    db.execute(f'GRANT USAGE ON SCHEMA {arc} TO "{role}"')
    url = make_conninfo(schema_url, user=role)
    pool = await open_pool(url)
    try:
        with pytest.raises(BadPurgeTarget) as refused, contract_errors():
            await audit(pool, arc).purge_expired(NOW)
        message = str(refused.value)
        assert f'GRANT INSERT ON "{arc}"."audit_log" TO "{role}"' in message
        assert db.execute("SELECT count(*) FROM audit_log").fetchone() == (100,)

        db.execute(f'REVOKE USAGE ON SCHEMA {arc} FROM "{role}"')
        with pytest.raises(BadPurgeTarget, match=f"USAGE on schema {arc}"), contract_errors():
            await audit(pool, arc).purge_expired(NOW)

        db.execute(f'GRANT USAGE ON SCHEMA {arc} TO "{role}"')
        db.execute(f'GRANT INSERT ON {arc}.audit_log TO "{role}"')
        assert await audit(pool, arc).purge_expired(NOW) == 50
    finally:
        await pool.close()
    assert db.execute(f"SELECT count(*) FROM {arc}.audit_log").fetchone() == (50,)


async def test_a_cancelled_sweep_resumed_leaves_every_row_in_exactly_one_table(
    db: psycopg.Connection[Any],
    pool: AsyncConnectionPool[Any],
    arc: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An attempt cancelled after a few batches (it finishes the one in flight) and a second
    attempt resuming from its heartbeat: afterwards source and archive hold every original row
    exactly once, and the count is exact."""
    fixed_batches(monkeypatch)  # 8 pages a batch: the table is dozens of them
    durable_every(monkeypatch, 2)
    make_audit(db, arc)
    expired = fill_audit(db, 40_000, expired_every=2)
    before = rows_of(db, "audit_log")
    activities = PurgeActivities(TargetRegistry([audit(pool, arc, TINY)]))
    step = PurgeStep(name="audit", now_ms=NOW)
    first = activity_env()
    beats: list[dict[str, Any]] = []

    def beat(*details: Any) -> None:
        if details and isinstance(details[0], dict) and "batch_ms" in details[0]:
            beats.append(details[0])
            if len(beats) == 4:
                first.cancel()

    first.on_heartbeat = beat
    with pytest.raises(asyncio.CancelledError):
        await first.run(activities.purge_target, step)
    midway = rows_of(db, f"{arc}.audit_log")
    assert 0 < len(midway) < expired
    assert sorted(midway + rows_of(db, "audit_log")) == before

    second = ActivityEnvironment()
    second.info = dataclasses.replace(first.info, attempt=2, heartbeat_details=[beats[-1]])
    sweep: PurgeSweep = await second.run(activities.purge_target, step)

    moved = rows_of(db, f"{arc}.audit_log")
    assert sorted(moved + rows_of(db, "audit_log")) == before
    assert len({r[0] for r in moved}) == len(moved) == expired
    assert sweep.removed == sweep.archived == expired


async def test_every_built_in_kind_takes_an_archive(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], arc: str
) -> None:
    """idempotency and rate_limit take `archive_table`, auth `failures_archive_table` and
    `lockouts_archive_table`: x_auth_failures' id is GENERATED ALWAYS AS IDENTITY, its value
    kept in an archive whose id is one too."""
    for table in ("x_idempotency", "x_rate_limit", "x_auth_failures", "x_auth_lockouts"):
        db.execute(f"CREATE TABLE {arc}.{table} (LIKE {table} INCLUDING IDENTITY)")
    idempotency_rows(db, {"i-old": NOW - HOUR, "i-new": NOW + HOUR})
    bucket_rows(db, {"b-full": (0.0, 4.0, 1.0, NOW - HOUR), "b-empty": (0.0, 4.0, 1e-9, NOW)})
    auth_rows(db, {"f-old": NOW - HOUR, "f-new": NOW + HOUR}, {"l-old": NOW - 1, "l-new": NOW + 1})
    failure_ids = dict(db.execute("SELECT key, id FROM x_auth_failures").fetchall())
    raw = tomllib.loads(
        f"""
[[targets]]
kind = "idempotency"
archive_table = "{arc}.x_idempotency"
[[targets]]
kind = "rate_limit"
archive_table = "{arc}.x_rate_limit"
[[targets]]
kind = "auth"
failures_archive_table = "{arc}.x_auth_failures"
lockouts_archive_table = "{arc}.x_auth_lockouts"
"""
    )
    config = parse_config(raw, env={"PURGE_DATABASE_URL": "postgresql://x@y/z"})
    registry = kinds.build_registry(config, pool)

    removed = {
        name: await registry.resolve(name).purge_expired(NOW)
        for name in ("x_idempotency", "x_rate_limit", "x_auth")
    }

    assert removed == {"x_idempotency": 1, "x_rate_limit": 1, "x_auth": 2}
    assert keys(db, f"{arc}.x_idempotency") == {"i-old"}
    assert keys(db, f"{arc}.x_rate_limit") == {"b-full"}
    assert keys(db, f"{arc}.x_auth_lockouts") == {"l-old"}
    assert dict(db.execute(f"SELECT key, id FROM {arc}.x_auth_failures").fetchall()) == {
        "f-old": failure_ids["f-old"]
    }
    assert keys(db, "x_auth_failures") == {"f-new"}


async def test_auth_with_one_archive_counts_what_that_table_moved(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], arc: str
) -> None:
    db.execute(f"CREATE TABLE {arc}.lockouts (LIKE x_auth_lockouts)")
    auth_rows(db, {"f1": NOW - HOUR, "f2": NOW - HOUR}, {"l1": NOW - 1, "l2": NOW + 1})
    target = kinds.auth(pool, lockouts_archive=TableName("lockouts", arc))

    stats = await target.sweep(NOW)

    assert (stats.removed, stats.archived) == (3, 1)
    assert keys(db, f"{arc}.lockouts") == {"l1"}


def test_the_report_shows_what_was_archived_only_when_something_was() -> None:
    plain = PurgeReport(swept=[PurgeSweep(name="sessions", removed=4, batches=1)], removed=4)
    archived = PurgeReport(
        swept=[
            PurgeSweep(name="audit", removed=7, batches=2, archived=7),
            PurgeSweep(name="sessions", removed=4, batches=1),
        ],
        removed=11,
    )

    assert "archived" not in report_table(plain)
    lines = report_table(archived).splitlines()
    assert lines[1].split()[:4] == ["target", "removed", "archived", "seconds"]
    assert lines[3].split()[:3] == ["audit", "7", "7"]
    assert lines[4].split()[:3] == ["sessions", "4", "0"]
    assert lines[5].split() == ["total", "11", "7"]
