"""What a table's sweep reads before its first batch (`TableAccess.prepare`): the rule bound,
its unit checked and the catalog read in one implicit transaction, the catalog's reads prepared
and run by their generic plan (planned once a connection), the planner's estimate still taken
with the rule's values, and nothing of that transaction's settings left on the connection."""

from __future__ import annotations

from typing import Any

import psycopg

from activities import builtin_kinds as kinds
from activities.engine.access import TableAccess
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
