"""What a table's sweep reads before its first batch (`TableAccess.prepare`): the rule bound,
its unit checked and the catalog read in one implicit transaction, the catalog's reads prepared
and run by their generic plan (planned once a connection), the planner's estimate still taken
with the rule's values, and nothing of that transaction's settings left on the connection."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from activities import builtin_kinds as kinds
from activities.engine import rules
from activities.engine.access import TableAccess
from activities.engine.column_memory import assume
from activities.engine.errors import BadTable
from purge_config.names import TableName
from purge_config.settings import PartitionPolicy, SweepSettings
from purge_ops.connect import open_pool
from tests.support.rows import HOUR

NOW = 1_700_000_000_000
#: A word of each of the catalog's reads before a batch, as pg_prepared_statements shows them:
#: the columns, the unit check's statistics, the sizes, the serving index, the foreign keys
#: and the correlation.
CATALOG_READS = (
    "format_type",
    "histogram_bounds",
    "pg_relation_size",
    "indisvalid",
    "pg_constraint",
    "correlation",
)


async def test_a_tables_catalog_reads_are_planned_once_a_connection_and_its_estimate_by_value(
    db: psycopg.Connection[Any], schema_url: str
) -> None:
    db.execute(
        "INSERT INTO x_idempotency (key, response, expires_at_ms)"
        " SELECT 'k' || i, '{}', CASE WHEN i %% 100 = 0 THEN %s ELSE %s END"
        " FROM generate_series(0, 19_999) i",
        (NOW - HOUR, NOW + HOUR),
    )
    db.execute("ANALYZE x_idempotency")
    one = await open_pool(schema_url, max_size=1)  # every read on the connection looked at
    try:
        [rule] = kinds.idempotency(one).rules
        access = TableAccess(one, SweepSettings(), PartitionPolicy())
        async with one.connection() as conn:
            plans = [(await access.prepare(conn, rule, NOW))[1] for _ in range(3)]
            left = await conn.execute(
                "SELECT current_setting('plan_cache_mode'), current_setting('statement_timeout')"
            )
            settings = await left.fetchone()
            cur = await conn.execute(
                "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
            )
            prepared = await cur.fetchall()
    finally:
        await one.close()

    reads = [row for row in prepared if any(name in row[0] for name in CATALOG_READS)]
    # Each prepared once and run three times by one generic plan, never planned with its values.
    assert all(any(name in text for text, _, _ in reads) for name in CATALOG_READS), prepared
    assert all((generic, custom) == (3, 0) for _, generic, custom in reads), reads
    # EXPLAIN is never prepared: its estimate is the planner's for this instant's cutoff (200
    # rows of 20,000), where a generic plan would guess a third of the table.
    assert not [row for row in prepared if row[0].startswith("EXPLAIN")], prepared
    assert all(100 <= plan.expired <= 400 for plan in plans), [p.expired for p in plans]
    assert {plan.strategy for plan in plans} == {"index"}
    # The transaction's settings ended with it: the pool lends the connection as it was.
    assert settings == ("auto", "0")


@pytest.mark.parametrize("since", ["unchanged", "retyped", "dropped"])
async def test_a_workers_next_pass_binds_the_rule_as_the_table_then_is(
    db: psycopg.Connection[Any],
    pg_url: str,
    schema: str,
    monkeypatch: pytest.MonkeyPatch,
    since: str,
) -> None:
    """A worker binds a rule from the column types it read on its last pass through the same
    connection settings, and sends the plan's reads in the round trip that reads them again
    (`column_memory`). Two passes of one worker, the table changed between them: the second
    sweeps as the table then is. `retyped`: the timestamptz column made a timestamp (in UTC),
    in sessions whose TimeZone is New York's: bound from the old type, the cutoff would be
    compared in New York's time, five hours off, and the row expired three hours ago kept.
    `dropped`: the column gone, the pass fails with the step by step bind's error, and deletes
    nothing."""
    db.execute("CREATE TABLE stamped (key text PRIMARY KEY, at timestamptz NOT NULL)")
    db.execute("CREATE INDEX ON stamped (at)")
    add = "INSERT INTO stamped VALUES (%s, to_timestamp(%s / 1000.0))"
    db.execute(add, ("first expired", NOW - 3 * HOUR))
    db.execute(add, ("live", NOW + HOUR))
    url = make_conninfo(pg_url, options=f"-c search_path={schema} -c TimeZone=America/New_York")
    assumed: list[bool] = []

    def noted(*args: Any) -> Any:
        columns = assume(*args)
        assumed.append(columns is not None)
        return columns

    monkeypatch.setattr(rules, "assume", noted)
    pool = await open_pool(url)
    try:
        target = kinds.expiring(pool, "stamped", TableName("stamped", ""), "at", HOUR)
        first = await target.sweep(NOW)
        if since == "retyped":
            db.execute(
                "ALTER TABLE stamped ALTER COLUMN at TYPE timestamp USING at AT TIME ZONE 'UTC'"
            )
            add = "INSERT INTO stamped VALUES (%s, to_timestamp(%s / 1000.0) AT TIME ZONE 'UTC')"
        if since == "dropped":
            db.execute("ALTER TABLE stamped DROP COLUMN at")
        else:
            for key, at in [("expired", NOW - 3 * HOUR), ("young", NOW - HOUR // 2)]:
                db.execute(add, (key, at))
        first_assumed, assumed[:] = list(assumed), []
        if since == "dropped":
            with pytest.raises(BadTable, match="has no column 'at'"):
                await target.sweep(NOW)
        else:
            second = await target.sweep(NOW)
            assert second.removed == 1
    finally:
        await pool.close()

    assert (first.removed, first_assumed) == (1, [False])
    assert assumed[0]  # the second pass bound the rule from what the first read
    kept = {row[0] for row in db.execute("SELECT key FROM stamped")}
    assert kept == ({"live"} if since == "dropped" else {"live", "young"})
