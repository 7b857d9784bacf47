"""The plan a sweep's batch ran, read back on the sweep's own connection."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import AsyncConnection, sql

from activities.engine import batch_sql
from activities.engine.catalog import plan_nodes


async def batch_plan_nodes(
    conn: AsyncConnection[Any], like: str, args: Sequence[object] | None = None
) -> set[str]:
    """The node types of the cached generic plan of the one prepared statement on `conn` whose
    text is LIKE `like` and that ran by a generic plan, executed with `args` (a NULL for each
    parameter without them).

    The cached plan itself: with plan_cache_mode forced, a setting's change does not plan it
    again. In a transaction that set what an index batch sets (`tie_walk`, as `by_index`):
    where the cached plan was thrown out meanwhile (on a server shared with other tests, their
    catalog changes can reset every session's caches), it is planned again as a batch would
    plan it, not under this session's defaults."""
    cur = await conn.execute(
        "SELECT name, cardinality(parameter_types) FROM pg_prepared_statements"
        " WHERE statement LIKE %s AND generic_plans > 0",
        (like,),
    )
    [(name, params)] = await cur.fetchall()
    values = [sql.Literal(a) for a in args] if args is not None else [sql.NULL] * params
    await conn.execute("SET plan_cache_mode = force_generic_plan")
    async with conn.transaction():
        await conn.execute(batch_sql.tie_walk())
        cur = await conn.execute(
            sql.SQL("EXPLAIN (FORMAT JSON) EXECUTE {}({})").format(
                sql.Identifier(name), sql.SQL(", ").join(values)
            )
        )
        row = await cur.fetchone()
    assert row is not None
    return {node["Node Type"] for node in plan_nodes(row[0][0]["Plan"])}
