"""A rule misread empties a table: a write time (`created_at`) taken for an expiry because the
entry has no `max_age`, or a `timestamp` column of local times read as UTC. `check`, a dry run
and every sweep say so under the target; a dry run that would remove every row of a table says
that too, before the sweep that would, and names the tables whose rows would go by cascade."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool

from activities import builtin_kinds as kinds
from activities.engine.rules import ExpiryRule, NewestRelatedRule, written_column_advice
from activities.inputs import PurgeStep
from activities.registry import TargetRegistry
from activities.sweep import PurgeActivities
from purge_config.names import TableName
from tests.conftest import Pools
from tests.support.activity import activity_env
from tests.support.procs import Done, clean_env, run_main, worker_config
from tests.support.rows import HOUR

NOW = 1_800_000_000_000
T = TableName("page_views")


@pytest.mark.parametrize(
    ("column", "max_age_ms", "said"),
    [
        ("created_at", 0, True),
        ("insertedAt", 0, True),
        ("date_created", 0, True),
        ("updated", 0, True),
        ("timestamp", 0, True),
        ("created_at", 30 * 24 * HOUR, False),  # an age: the column is a write time, rightly
        ("expires_at", 0, False),
        ("created_expires_at", 0, False),  # an expiry after all
        ("valid_until", 0, False),
        ("expire_date", 0, False),
        ("creator_id", 0, False),  # not the word
    ],
)
def test_a_write_time_is_said_only_where_no_max_age_makes_it_an_expiry(
    column: str, max_age_ms: int, said: bool
) -> None:
    advice = written_column_advice(ExpiryRule(T, column, max_age_ms))
    assert (advice is not None) == said
    related = written_column_advice(NewestRelatedRule(T, TableName("events"), column, max_age_ms))
    assert (related is not None) == said


def views(db: psycopg.Connection[Any], live: int = 0, null: int = 0) -> None:
    """Ten page views written before NOW, `live` written after it, `null` with no time."""
    db.execute("CREATE TABLE page_views (id bigint PRIMARY KEY, created_at bigint)")
    db.execute(
        "INSERT INTO page_views SELECT g, %s - g * %s FROM generate_series(1, 10) g",
        (NOW, HOUR),
    )
    db.execute(
        "INSERT INTO page_views SELECT 100 + g, %s + g * %s FROM generate_series(1, %s) g",
        (NOW, HOUR, live),
    )
    db.execute("INSERT INTO page_views SELECT 200 + g, NULL FROM generate_series(1, %s) g", (null,))


async def dry_run(pool: AsyncConnectionPool[Any], max_age_ms: int = 0) -> str:
    target = kinds.expiring(pool, "views", T, "created_at", max_age_ms)
    activities = PurgeActivities(TargetRegistry([target]))
    result = await activity_env().run(
        activities.purge_target, PurgeStep(name="views", now_ms=NOW, dry_run=True)
    )
    return result.advice


EVERY_ROW = "page_views: every one of its 10 rows would go; no row is kept at this instant"
#: The advice on `created_at` with no `max_age`, as a user reads it (the tests below compare
#: with `written_column_advice`, so this pins that).
WRITTEN = (
    "page_views: `created_at` reads as when a row was written, but with no `max_age` it is "
    "taken as when the row expires, so every row written before the pass goes; give the entry "
    'a `max_age` (`"30d"`), or leave it if the column holds the expiry'
)


def test_the_write_time_advice_says_what_goes_and_the_remedy() -> None:
    assert written_column_advice(ExpiryRule(T, "created_at")) == WRITTEN


async def test_a_dry_run_that_would_empty_the_table_says_so_and_deletes_nothing(
    pool: AsyncConnectionPool[Any], db: psycopg.Connection[Any]
) -> None:
    views(db)

    advice = await dry_run(pool)

    assert advice == f"{written_column_advice(ExpiryRule(T, 'created_at'))} | {EVERY_ROW}"
    row = db.execute("SELECT count(*) FROM page_views").fetchone()
    assert row == (10,)


@pytest.mark.parametrize(("live", "null"), [(1, 0), (0, 1)])
async def test_a_dry_run_says_nothing_of_every_row_where_one_stays(
    pool: AsyncConnectionPool[Any], db: psycopg.Connection[Any], live: int, null: int
) -> None:
    """A row written after the instant stays, and so does one with no time (NULL never
    expires): the table is not emptied."""
    views(db, live=live, null=null)
    assert EVERY_ROW not in await dry_run(pool)


async def test_an_entry_with_max_age_gets_neither_advice(
    pool: AsyncConnectionPool[Any], db: psycopg.Connection[Any]
) -> None:
    views(db)
    assert await dry_run(pool, max_age_ms=5 * HOUR) == ""


async def check(path: Path) -> Done:
    env = clean_env(TEMPORAL_ADDRESS="127.0.0.1:1")
    return await asyncio.to_thread(run_main, "check", "--config", str(path), env=env)


async def test_check_says_it_under_the_target_and_a_sweep_reports_it(
    tmp_path: Path, schema_url: str, pool: AsyncConnectionPool[Any], db: psycopg.Connection[Any]
) -> None:
    """The entry a new user writes by hand for a table of page views: `check` passes it (the
    column may hold an expiry after all) with the advice under it, and the sweep that then
    removes every row says it in its result too, pass after pass."""
    views(db, live=2)
    entry = (
        '[[targets]]\nkind = "expiring"\nname = "views"\ntable = "page_views"\n'
        'column = "created_at"\n'
    )
    path = worker_config(tmp_path / "purge.toml", schema_url, "purge", entry)
    advice = written_column_advice(ExpiryRule(T, "created_at"))

    done = await check(path)

    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["ok      views (1 table)", f"        advice: {advice}"]
    target = kinds.expiring(pool, "views", T, "created_at")
    activities = PurgeActivities(TargetRegistry([target]))
    swept = await activity_env().run(activities.purge_target, PurgeStep(name="views", now_ms=NOW))
    assert (swept.removed, swept.advice) == (10, advice)


@pytest.mark.parametrize(
    ("zone", "hours"),
    [("America/Los_Angeles", "8"), ("Europe/London", "1"), ("UTC", None), ("Etc/GMT", None)],
)
async def test_a_timestamp_column_read_as_utc_over_a_local_time_zone_is_said(
    pg_url: str, schema: str, db: psycopg.Connection[Any], pools: Pools, zone: str, hours: str
) -> None:
    """A `timestamp` column's values are read as UTC; over a connection whose TimeZone is not
    UTC (where `DEFAULT now()` writes local times), a dry run says by how much they may be off
    and how to say they are UTC, and the sweep says it too. A zone UTC's all year says
    nothing."""
    db.execute("CREATE TABLE tokens (id bigint, expires_at timestamp NOT NULL)")
    db.execute("INSERT INTO tokens VALUES (1, '2027-01-01 00:00'), (2, '2028-01-01 00:00')")
    url = make_conninfo(pg_url, options=f"-c search_path={schema} -c TimeZone={zone}")
    target = kinds.expiring(await pools(url), "tokens", TableName("tokens"), "expires_at")
    activities = PurgeActivities(TargetRegistry([target]))

    dry = await activity_env().run(
        activities.purge_target, PurgeStep(name="tokens", now_ms=NOW, dry_run=True)
    )

    if hours is None:
        assert dry.advice == ""
    else:
        assert dry.advice == (
            "tokens: `expires_at` is timestamp without time zone, read as UTC, but this "
            f"connection's TimeZone is {zone}: if its values are local times (DEFAULT now(), "
            f"Django with USE_TZ = False) they are read up to {hours} h off, and west of UTC "
            f"live rows go early; lengthen `max_age` by {hours}h, or, if they are UTC, connect "
            "with TimeZone UTC (options=-c TimeZone=UTC in the URL) to say so"
        )
    assert dry.removed == 1
    swept = await activity_env().run(activities.purge_target, PurgeStep(name="tokens", now_ms=NOW))
    assert (swept.removed, swept.advice) == (1, dry.advice)


async def test_rows_that_go_by_cascade_are_said_by_a_dry_run(
    pool: AsyncConnectionPool[Any], db: psycopg.Connection[Any]
) -> None:
    """Another table's rows that reference the target's ON DELETE CASCADE go with its rows, in
    no count: a dry run says which tables (indexed or not); a NO ACTION or SET NULL key is no
    such table, and an `age_from` rule's related table is its own."""
    db.execute("CREATE TABLE sess (id bigint PRIMARY KEY, expires_ms bigint NOT NULL)")
    db.execute(
        "CREATE TABLE orders (id bigint, sess bigint REFERENCES sess ON DELETE CASCADE,"
        " at_ms bigint)"
    )
    db.execute("CREATE INDEX ON orders (sess)")
    db.execute("CREATE TABLE audits (id bigint, sess bigint REFERENCES sess ON DELETE SET NULL)")
    db.execute("CREATE TABLE notes (id bigint, sess bigint REFERENCES sess)")  # NO ACTION
    db.execute(
        "INSERT INTO sess SELECT g, %s + (g - 5) * %s FROM generate_series(1, 10) g", (NOW, HOUR)
    )
    db.execute("INSERT INTO orders SELECT g, g FROM generate_series(1, 10) g")
    target = kinds.expiring(pool, "sess", TableName("sess"), "expires_ms")
    related = kinds.expiring(
        pool, "by_orders", TableName("sess"), "at_ms", age_from=TableName("orders")
    )
    activities = PurgeActivities(TargetRegistry([target, related]))

    dry = await activity_env().run(
        activities.purge_target, PurgeStep(name="sess", now_ms=NOW, dry_run=True)
    )
    own = await activity_env().run(
        activities.purge_target, PurgeStep(name="by_orders", now_ms=NOW, dry_run=True)
    )

    assert dry.advice == (
        "sess: orders references it ON DELETE CASCADE: their rows that point at a removed row "
        "go with it, in no count"
    )
    assert "CASCADE" not in own.advice
    assert db.execute("SELECT count(*) FROM orders").fetchone() == (10,)


async def test_a_name_two_schemas_of_the_search_path_hold_is_said(
    pg_url: str, schema: str, db: psycopg.Connection[Any], pools: Pools
) -> None:
    """`table = "tokens"` where the worker role's search_path finds a tokens table in two
    schemas (by default a schema named like the role comes first): `check` and a dry run say
    which one the sweep takes, and that one alone is swept. A name with its schema, or one
    that only one schema holds, says nothing."""
    first = f"{schema}_first"
    db.execute(f"CREATE SCHEMA {first}")
    try:
        for where in (first, schema):
            db.execute(f"CREATE TABLE {where}.tokens (id bigint, expires_ms bigint)")
            db.execute(
                f"INSERT INTO {where}.tokens VALUES (1, %s), (2, %s), (3, %s)",
                (NOW - HOUR, NOW, NOW + HOUR),
            )
        db.execute(f"CREATE TABLE {schema}.alone (id bigint, expires_ms bigint)")
        url = make_conninfo(pg_url, options=f"-c search_path={first},{schema}")
        pool = await pools(url)
        said = (
            f"tokens: this role's search_path takes {first}.tokens, not {schema}.tokens; "
            f'name the schema (table = "{first}.tokens") to say which'
        )

        def target(table: TableName) -> Any:
            return kinds.expiring(pool, "tokens", table, "expires_ms")

        async def run(table: TableName, dry_run: bool) -> Any:
            activities = PurgeActivities(TargetRegistry([target(table)]))
            step = PurgeStep(name="tokens", now_ms=NOW, dry_run=dry_run)
            return await activity_env().run(activities.purge_target, step)

        assert await target(TableName("tokens")).check(NOW) == [said]
        assert (await run(TableName("tokens"), dry_run=True)).advice == said
        assert await target(TableName("tokens", schema)).check(NOW) == []
        assert await target(TableName("alone")).check(NOW) == []
        assert (await run(TableName("tokens"), dry_run=False)).removed == 2
        remaining = {
            where: db.execute(f"SELECT count(*) FROM {where}.tokens").fetchone()
            for where in (first, schema)
        }
        assert remaining == {first: (1,), schema: (3,)}
    finally:
        db.execute(f"DROP SCHEMA {first} CASCADE")


async def test_triggers_and_rules_that_may_keep_a_deleted_row_are_said(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    """A BEFORE DELETE trigger that keeps some rows (returns NULL), and a soft-delete rule (ON
    DELETE DO INSTEAD UPDATE): `check` and a dry run name them, since the dry run counts the
    rows they keep and the sweep, exact, does not. An AFTER DELETE trigger (an audit) and a
    disabled trigger keep nothing and say nothing."""
    db.execute("CREATE TABLE held (id bigint PRIMARY KEY, expires_ms bigint, pinned bool)")
    db.execute(
        "INSERT INTO held SELECT g, %s + (g - 6) * %s, g <= 2 FROM generate_series(1, 10) g",
        (NOW, HOUR),
    )
    db.execute(
        "CREATE FUNCTION keep_pinned() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN IF OLD.pinned THEN RETURN NULL; END IF; RETURN OLD; END $$"
    )
    db.execute(
        "CREATE FUNCTION noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN OLD; END $$"
    )
    db.execute(
        "CREATE TRIGGER keep BEFORE DELETE ON held FOR EACH ROW EXECUTE FUNCTION keep_pinned()"
    )
    db.execute("CREATE TRIGGER audit AFTER DELETE ON held FOR EACH ROW EXECUTE FUNCTION noop()")
    db.execute("CREATE TABLE soft (id bigint PRIMARY KEY, expires_ms bigint, gone bool)")
    db.execute(
        "INSERT INTO soft SELECT g, %s + (g - 6) * %s, false FROM generate_series(1, 10) g",
        (NOW, HOUR),
    )
    db.execute(
        "CREATE RULE soft_delete AS ON DELETE TO soft"
        " DO INSTEAD UPDATE soft SET gone = true WHERE id = OLD.id"
    )
    db.execute("CREATE TABLE quiet (id bigint PRIMARY KEY, expires_ms bigint)")
    db.execute(
        "CREATE TRIGGER off BEFORE DELETE ON quiet FOR EACH ROW EXECUTE FUNCTION keep_pinned()"
    )
    db.execute("ALTER TABLE quiet DISABLE TRIGGER off")
    db.execute("CREATE TRIGGER audit AFTER DELETE ON quiet FOR EACH ROW EXECUTE FUNCTION noop()")

    def target(table: str) -> Any:
        return kinds.expiring(pool, table, TableName(table), "expires_ms")

    async def run(table: str, dry_run: bool) -> Any:
        activities = PurgeActivities(TargetRegistry([target(table)]))
        step = PurgeStep(name=table, now_ms=NOW, dry_run=dry_run)
        return await activity_env().run(activities.purge_target, step)

    held = (
        "held: its BEFORE DELETE trigger keep may keep rows the sweep deletes: a dry run counts "
        "them, the sweep's count does not, and they stay expired pass after pass"
    )
    soft = (
        "soft: its rule soft_delete (ON DELETE DO INSTEAD) may keep rows the sweep deletes: a "
        "dry run counts them, the sweep's count does not, and they stay expired pass after pass"
    )
    assert await target("held").check(NOW) == [held]
    assert await target("soft").check(NOW) == [soft]
    assert await target("quiet").check(NOW) == []
    dry = await run("held", dry_run=True)
    assert (dry.removed, dry.advice) == (6, held)
    swept = await run("held", dry_run=False)
    assert swept.removed == 4  # the two pinned rows kept by the trigger, and not counted
    assert db.execute(
        "SELECT id FROM held WHERE expires_ms <= %s ORDER BY id", (NOW,)
    ).fetchall() == [(1,), (2,)]
    # The rule turns the sweep's DELETE into its UPDATE: nothing goes, nothing is counted.
    assert (await run("soft", dry_run=False)).removed == 0
    assert db.execute("SELECT count(*) FILTER (WHERE gone), count(*) FROM soft").fetchone() == (
        6,
        10,
    )
