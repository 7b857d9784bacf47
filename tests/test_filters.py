"""Row filters on the real server: several targets on one table, each with its own filter and
age, delete exactly the rows both select; values are parameters the server reads as the
column's type (boolean, integer, text, enum), refused before anything is deleted when they
cannot be one; dry runs and guards count with the filter; the plan check finds, or advises,
the index that serves the filter."""

from __future__ import annotations

import tomllib
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from activities import builtin_kinds as kinds
from activities.engine.planning import plan_table
from activities.engine.sql_target import SqlTarget
from activities.errors import BadPurgeTarget
from activities.sweep import contract_errors
from purge_config import parse_config
from purge_config.filters import RowFilter
from purge_config.names import TableName
from purge_config.settings import PartitionPolicy
from tests.support.rows import HOUR, PAST_NOW, keys
from tests.test_partitions import MAX_AGE as EVENTS_MAX_AGE
from tests.test_partitions import NOW as EVENTS_NOW
from tests.test_partitions import make_events

NOW = PAST_NOW
DAY = 24 * HOUR
JOBS = TableName("jobs")


def make_jobs(db: psycopg.Connection[Any]) -> None:
    """A job table with a column of every kind a filter compares."""
    db.execute("CREATE TYPE job_state AS ENUM ('new', 'completed', 'cancelled', 'failed')")
    db.execute(
        "CREATE TABLE jobs (key text PRIMARY KEY, state job_state NOT NULL, queue text,"
        " priority integer, urgent boolean, processed_at bigint, finished_at bigint NOT NULL)"
    )


#: (key, state, queue, priority, urgent, processed_at, age in days at NOW)
ROWS = [
    ("done-2d", "completed", "mail", 1, False, 1, 2),
    ("done-12h", "completed", "mail", 1, False, 1, 0.5),
    ("cancelled-3d", "cancelled", "sms", 2, True, None, 3),
    ("failed-40d-mail", "failed", "mail", 1, False, None, 40),
    ("failed-40d-sms-processed", "failed", "sms", 1, False, 5, 40),
    ("failed-40d-push", "failed", "push", 1, False, None, 40),
    ("failed-10d-sms", "failed", "sms", 3, True, None, 10),
    ("new-90d", "new", "mail", 1, False, None, 90),
]


def insert(db: psycopg.Connection[Any], rows: list[tuple[Any, ...]]) -> None:
    with db.cursor() as cur:
        cur.executemany(
            "INSERT INTO jobs VALUES (%s, %s, %s, %s, %s, %s, %s)",
            [(*row[:6], NOW - int(row[6] * DAY)) for row in rows],
        )


def targets(pool: AsyncConnectionPool[Any], text: str) -> list[SqlTarget]:
    """The `expiring` targets a config's `[[targets]]` describe."""
    config = parse_config(tomllib.loads(text), env={"PURGE_DATABASE_URL": "postgresql://x@y/z"})
    built = [kinds.build_target(spec, pool) for spec in config.targets]
    assert all(isinstance(t, SqlTarget) for t in built)
    return built  # type: ignore[return-value]


def entry(name: str, max_age: str, *lines: str) -> str:
    """An `expiring` target on jobs.finished_at with `lines` (its filter) added."""
    return (
        f'[[targets]]\nkind = "expiring"\nname = "{name}"\ntable = "jobs"\n'
        f'column = "finished_at"\nmax_age = "{max_age}"\n' + "".join(f"{x}\n" for x in lines)
    )


README_JOBS = """
[[targets]]
kind = "expiring"
name = "jobs_done"
table = "jobs"
column = "finished_at"
max_age = "1d"
match = { state = ["completed", "cancelled"] }

[[targets]]
kind = "expiring"
name = "jobs_failed"
table = "jobs"
column = "finished_at"
max_age = "30d"
match = { state = "failed", queue = ["mail", "sms"] }
match_null = ["processed_at"]
"""


async def test_targets_on_one_table_delete_what_their_own_filter_and_age_select(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    """The README's two job targets: completed and cancelled jobs go after a day, failed ones
    of the mail and sms queues not yet processed after 30 days; nothing else is touched."""
    make_jobs(db)
    insert(db, ROWS)
    done, failed = targets(pool, README_JOBS)

    counted = (await done.count_expired(NOW), await failed.count_expired(NOW))
    removed = (await done.purge_expired(NOW), await failed.purge_expired(NOW))

    assert counted == removed == (2, 1)
    assert keys(db, "jobs") == {
        "done-12h",  # completed, but only 12 hours ago
        "failed-40d-sms-processed",  # processed_at is set
        "failed-40d-push",  # another queue
        "failed-10d-sms",  # failed, but only 10 days ago
        "new-90d",  # in no target's states
    }


@pytest.mark.parametrize(
    ("match", "gone"),
    [
        ("match = { urgent = true }", {"cancelled-3d", "failed-10d-sms"}),
        ("match = { priority = [2, 3] }", {"cancelled-3d", "failed-10d-sms"}),
        ("match = { queue = 'sms', urgent = false }", {"failed-40d-sms-processed"}),
        ("match_not_null = ['processed_at']", {"done-2d", "failed-40d-sms-processed"}),
        ("match_null = ['processed_at', 'urgent']", set()),
    ],
    ids=["boolean", "integer-list", "text-and-boolean", "not-null", "null"],
)
async def test_each_column_type_filters_by_value(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], match: str, gone: set[str]
) -> None:
    """With a max_age of 1d every row but done-12h is old enough: the filter alone decides
    which of them go."""
    make_jobs(db)
    insert(db, ROWS)
    [target] = targets(pool, entry("jobs_some", "1d", match))

    removed = await target.purge_expired(NOW)

    assert removed == len(gone)
    assert keys(db, "jobs") == {row[0] for row in ROWS} - gone


@pytest.mark.parametrize(
    ("match", "message"),
    [
        ("match = { state = 'finished' }", 'invalid input value for enum job_state: "finished"'),
        ("match = { state = 1 }", "1 cannot be a value of column state, which is job_state"),
        ("match = { priority = 99999999999 }", 'value "99999999999" is out of range'),
        (
            "match = { priority = '1' }",
            "'1' cannot be a value of column priority, which is integer",
        ),
        ("match = { priority = 1.5 }", "1.5 cannot be a value of column priority"),
        (
            "match = { urgent = 'yes' }",
            "'yes' cannot be a value of column urgent, which is boolean",
        ),
        ("match = { queue = true }", "true cannot be a value of column queue, which is text"),
        ("match = { finished_at = 2026-01-01 }", "cannot be a value of column finished_at"),
        ("match = { owner = 'x' }", "table jobs has no column 'owner'"),
        ("match_null = ['owner']", "table jobs has no column 'owner'"),
    ],
    ids=[
        "enum-label",
        "int-for-enum",
        "int-out-of-range",
        "string-for-int",
        "float-for-int",
        "string-for-bool",
        "bool-for-text",
        "date-for-bigint",
        "no-column",
        "no-null-column",
    ],
)
async def test_a_value_its_column_cannot_hold_fails_the_target_before_deleting(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], match: str, message: str
) -> None:
    make_jobs(db)
    insert(db, ROWS)
    [target] = targets(pool, entry("jobs_bad", "1d", match))

    with (
        pytest.raises(BadPurgeTarget, match=r"nothing was deleted|has no column") as dry,
        contract_errors(),
    ):
        await target.count_expired(NOW)
    with pytest.raises(BadPurgeTarget) as refused, contract_errors():
        await target.purge_expired(NOW)

    assert message in str(dry.value)
    assert message in str(refused.value)
    assert refused.value.non_retryable
    assert keys(db, "jobs") == {row[0] for row in ROWS}


async def test_guards_count_with_the_filter(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    make_jobs(db)
    insert(db, ROWS)
    done, failed = targets(pool, README_JOBS)

    assert await done.measure(NOW) == (2, len(ROWS))
    assert await failed.measure(NOW) == (1, len(ROWS))


def fill_jobs(db: psycopg.Connection[Any], rows: int, pad: int = 0) -> None:
    """`rows` jobs cycling through the four states, one finished every 6 minutes back from
    NOW (20,000 rows reach 83 days back: with a 60d age 5,600 are old enough, with 80d 800, a
    quarter of them of each state); `pad` bytes in the queue column make each row wider."""
    db.execute(
        "INSERT INTO jobs (key, state, queue, priority, urgent, finished_at)"
        " SELECT 'j' || i, (enum_range(NULL::job_state))[1 + i %% 4],"
        " CASE WHEN %s > 0 THEN repeat('q', %s) ELSE 'mail' END, i %% 5, i %% 2 = 0,"
        " %s - i::bigint * 60000 * 6 FROM generate_series(1, %s) i",
        (pad, pad, NOW, rows),
    )
    db.execute("VACUUM ANALYZE jobs")


async def plan_of(pool: AsyncConnectionPool[Any], target: SqlTarget) -> Any:
    [rule] = target.rules
    async with pool.connection() as conn, conn.transaction():
        return await plan_table(conn, await rule.bind(conn, NOW))


async def test_index_batches_walk_the_composite_index_that_serves_the_filter(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    """With (state, finished_at), a filter on state (one value or several) selecting fewer
    rows than half the table's pages is swept by index, the batches ordered by the index's
    keys; without that index, the table is walked."""
    make_jobs(db)
    fill_jobs(db, 20_000, pad=400)  # about 1,200 pages; 800 rows past 80d, 200 of each state
    db.execute("CREATE INDEX jobs_finished ON jobs (finished_at)")
    done, failed = targets(
        pool,
        entry("jobs_done", "80d", 'match = { state = ["completed", "cancelled"] }')
        + entry("jobs_failed", "80d", "match = { state = 'failed' }"),
    )
    # On the expiry column alone, each batch would step over every old row of the other states.
    assert (await plan_of(pool, failed)).strategy == "range"

    db.execute("CREATE INDEX jobs_state_finished ON jobs (state, finished_at)")
    db.execute("ANALYZE jobs")
    plans = [await plan_of(pool, done), await plan_of(pool, failed)]
    expected = [await done.count_expired(NOW), await failed.count_expired(NOW)]
    swept = [await done.sweep(NOW), await failed.sweep(NOW)]

    assert [(p.strategy, p.order) for p in plans] == [("index", ("state", "finished_at"))] * 2
    assert all(p.index and p.index.endswith("jobs_state_finished") for p in plans)
    assert [s.strategy for s in swept] == ["index", "index"]
    assert [s.removed for s in swept] == expected
    assert all(n > 0 for n in expected)
    left = db.execute(
        "SELECT count(*) FROM jobs WHERE state <> 'new' AND finished_at <= %s", (NOW - 80 * DAY,)
    ).fetchone()
    assert left == (0,)


async def test_a_partial_index_on_the_expiry_column_serves_the_filter_it_implies(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    make_jobs(db)
    fill_jobs(db, 20_000, pad=400)
    db.execute(
        "CREATE INDEX jobs_done_finished ON jobs (finished_at)"
        " WHERE state IN ('completed', 'cancelled')"
    )
    db.execute("CREATE INDEX jobs_other ON jobs (finished_at) WHERE state = 'new'")
    db.execute("ANALYZE jobs")
    done, failed = targets(
        pool,
        entry("jobs_done", "80d", 'match = { state = ["completed", "cancelled"] }')
        + entry("jobs_failed", "80d", "match = { state = 'failed' }"),
    )

    plan = await plan_of(pool, done)
    swept = await done.sweep(NOW)

    assert (plan.strategy, plan.order) == ("index", ())
    assert plan.index is not None
    assert plan.index.endswith("jobs_done_finished")
    assert swept.strategy == "index"
    assert swept.removed > 0
    # The partial index of another state serves no filter it does not imply.
    assert (await plan_of(pool, failed)).index is None


async def test_a_serving_index_is_walked_past_when_the_filter_selects_many_rows_a_page(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    """Index batches visit a page for each row they delete; a walk reads each page once. With
    more selected rows than half the pages, the table is walked even though an index serves."""
    make_jobs(db)
    fill_jobs(db, 20_000)  # about 150 pages; 1,400 failed rows past 60d
    db.execute("CREATE INDEX ON jobs (state, finished_at)")
    db.execute("ANALYZE jobs")
    [failed] = targets(pool, entry("jobs_failed", "60d", "match = { state = 'failed' }"))

    plan = await plan_of(pool, failed)
    swept = await failed.sweep(NOW)

    assert plan.index is not None
    assert plan.expired > plan.pages / 2
    assert (plan.strategy, swept.strategy) == ("range", "range")
    assert swept.removed == 1_400
    assert plan.advice == ""  # an index that serves: nothing to create


async def test_the_plan_check_advises_the_index_that_serves_the_filter(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    """A large table (over 8 MB) whose filtered rule selects a small share, sparse enough for
    index batches to pay, and no index serves both the filter and the age: the advice names the
    composite index and the partial one."""
    make_jobs(db)
    fill_jobs(db, 40_000, pad=200)  # about 1,300 pages; 400 failed rows past 160d
    db.execute("CREATE INDEX ON jobs (finished_at)")
    db.execute("ANALYZE jobs")
    [target] = targets(
        pool,
        entry(
            "jobs_failed", "160d", 'match = { state = "failed" }', 'match_null = ["processed_at"]'
        ),
    )

    plan = await plan_of(pool, target)

    assert plan.strategy == "range"
    assert 'CREATE INDEX CONCURRENTLY ON "jobs" ("state", "finished_at")' in plan.advice
    assert (
        'CREATE INDEX CONCURRENTLY ON "jobs" ("finished_at") WHERE "state" = \'failed\''
        ' AND "processed_at" IS NULL'
    ) in plan.advice
    assert "match the filter" in plan.advice

    # Over twice the rows selected (more than half a row a page): no index would be used.
    [dense] = targets(pool, entry("jobs_dense", "140d", 'match = { state = "failed" }'))
    plan = await plan_of(pool, dense)
    assert plan.expired > plan.pages / 2
    assert (plan.strategy, plan.advice) == ("range", "")


async def test_a_filter_given_in_code_works_the_same(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    make_jobs(db)
    insert(db, ROWS)
    target = kinds.expiring(
        pool,
        "jobs_new",
        JOBS,
        "finished_at",
        30 * DAY,
        row_filter=RowFilter(match=(("state", ("new",)),)),
    )

    assert await target.purge_expired(NOW) == 1
    assert "new-90d" not in keys(db, "jobs")


async def test_partitions_never_leave_whole_under_a_filter_and_the_advice_says_why(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    """A partition's bounds say nothing of a filter: a target built in code with
    `partitions = "drop"` and a filter (a config refuses the pair) drops no partition, deletes
    only the rows its filter selects, in batches, and its advice names the filter."""
    total = make_events(db)
    db.execute("UPDATE events SET body = 'keep' WHERE mod(id, 2) = 0")
    kept = {r[0] for r in db.execute("SELECT id FROM events WHERE body = 'keep'")}
    partitions = {r[0] for r in db.execute("SELECT relid FROM pg_partition_tree('events')")}
    target = kinds.expiring(
        pool,
        "events",
        TableName("events"),
        "at_ms",
        EVENTS_MAX_AGE,
        partitions=PartitionPolicy("drop"),
        row_filter=RowFilter(match=(("body", ("e",)),)),
    )

    stats = await target.sweep(EVENTS_NOW)

    left = {r[0] for r in db.execute("SELECT id FROM events")}
    assert kept <= left
    assert stats.removed == total - len(left) > 0
    assert stats.partitions == []
    assert {r[0] for r in db.execute("SELECT relid FROM pg_partition_tree('events')")} == partitions
    assert any("has no effect: the target has a row filter" in a for a in stats.advice)
