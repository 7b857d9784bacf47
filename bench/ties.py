"""A run of rows sharing one expiry, longer than a batch: the sweep against one DELETE by hand.

A bulk import given one TTL, or rows stamped to the second, leaves many rows with one expiry.
Keyset batches cannot split such a run by key range, so they take it n rows at a time by ctid
(`activities.engine.batch_sql.tie_delete`), each batch's rows read from the expiry index in
order (`tie_walk`). Left to the planner, that read went by the statistics' guess at how many
rows share a value, and could not stop at n.

The table: `--rows` wide rows (a 900-byte response each, few a page) sharing one expired
instant, then `--rows // 4` live rows, each a later instant. Three states of its statistics,
each on a fresh copy:

- never analyzed: the table right after its load, before autovacuum comes by;
- analyzed: after `VACUUM ANALYZE`;
- stale: analyzed while the table held a few distinct expiries, then loaded (a planner's
  statistics between two of autovacuum's passes; the shape of the CI run that found this).

For each state, on a copy of its own: one `DELETE` of the expired rows typed by hand (the
floor), then the activity (the real one, through ActivityEnvironment, `batch_target = 15ms`).
The table is evicted from shared_buffers and a checkpoint taken before each, on a server with
PostgreSQL's defaults for what the bench tunes (`bench.steady.DEFAULT_SETTINGS`, fsync on).

    python -m bench.ties                        # 400,000 rows of one instant
    python -m bench.ties --rows 1000000 --repeat 3
    python -m bench.ties --states never         # one state

Compare a commit before `tie_walk` by running this file from an export of the other tree
(`PYTHONPATH=<export> python <export>/bench/ties.py` with this file copied there).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time
from pathlib import Path
from typing import Any, cast

import psycopg
from psycopg import AsyncConnection

from activities import builtin_kinds as kinds
from activities.schema import reference_ddl
from bench import data as tables
from bench.forms import run_target
from bench.services import embedded_postgres, scratch_dir
from bench.steady import DEFAULT_SETTINGS
from purge_config.settings import SweepSettings
from purge_ops.connect import open_pool

NOW_MS = 1_700_000_000_000
TABLE = "x_idempotency"
STATES = ("never", "analyzed", "stale")
#: The reference table's columns and indexes, kept to make each fresh copy from.
SHAPE = "ties_shape"


async def load(conn: AsyncConnection[Any], rows: int, state: str) -> None:
    """A fresh table in `state`: `rows` expired rows of one instant, then live ones."""
    # A new table each time: a TRUNCATEd one keeps its statistics.
    await conn.execute(f"DROP TABLE {TABLE}")
    await conn.execute(f"CREATE TABLE {TABLE} (LIKE {SHAPE} INCLUDING ALL)")
    await conn.execute(f"ALTER TABLE {TABLE} SET (autovacuum_enabled = off)")
    await conn.execute(f"ALTER TABLE {TABLE} ALTER COLUMN response SET STORAGE EXTERNAL")
    if state == "stale":
        await conn.execute(
            f"INSERT INTO {TABLE} (key, expires_at_ms)"
            " SELECT 'old' || i, %s + (i %% 2) * 7200000 FROM generate_series(1, 10000) i",
            (NOW_MS - 3_600_000,),
        )
        await conn.execute(tables.flush_counts(conn))
        await conn.execute(f"ANALYZE {TABLE}")
        await conn.execute(f"TRUNCATE {TABLE}")
    await conn.execute(
        f"INSERT INTO {TABLE} (key, response, expires_at_ms)"
        " SELECT 'k' || i, jsonb_build_object('body', repeat('x', 900)),"
        " CASE WHEN i <= %(rows)s THEN %(now)s - 3600000 ELSE %(now)s + i END"
        " FROM generate_series(1, %(rows)s + %(rows)s / 4) i",
        {"rows": rows, "now": NOW_MS},
    )
    if state == "analyzed":
        await conn.execute(tables.flush_counts(conn))
        await conn.execute(f"VACUUM ANALYZE {TABLE}")


async def cold(conn: AsyncConnection[Any], data_dir: Path) -> None:
    await conn.execute("CHECKPOINT")
    await tables.make_cold(conn, "public", TABLE, data_dir)


async def by_hand(conn: AsyncConnection[Any]) -> tuple[float, int]:
    started = time.perf_counter()
    cur = await conn.execute(f"DELETE FROM {TABLE} WHERE expires_at_ms <= %s", (NOW_MS,))
    return time.perf_counter() - started, cur.rowcount


async def run(args: argparse.Namespace, scratch: Path) -> None:
    server_settings = {**DEFAULT_SETTINGS, "fsync": "on"}
    async with embedded_postgres(scratch, server_settings) as server:
        conn = await psycopg.AsyncConnection.connect(server.url(), autocommit=True)
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_buffercache")
        await conn.execute(reference_ddl())
        await conn.execute(f"CREATE TABLE {SHAPE} (LIKE {TABLE} INCLUDING ALL)")
        pool = await open_pool(server.url())
        sweep = SweepSettings(batch_target_ms=args.batch_target_ms)
        print(f"{args.rows:,} expired rows of one instant, {args.rows // 4:,} live after")
        print(f"{'state':<10} {'DELETE (s)':>11} {'activity (s)':>13} {'x DELETE':>9} batches")
        try:
            for state in args.states:
                hand, ours, batches = [], [], []
                for _ in range(args.repeat):
                    await load(conn, args.rows, state)
                    await cold(conn, server.data_dir)
                    took, removed = await by_hand(conn)
                    assert removed == args.rows, removed
                    hand.append(took)
                    await load(conn, args.rows, state)
                    await cold(conn, server.data_dir)
                    target = kinds.idempotency(pool, settings=sweep)
                    started = time.perf_counter()
                    swept = await run_target(target, NOW_MS)
                    ours.append(time.perf_counter() - started)
                    assert swept.removed == args.rows, swept.removed
                    batches.append(cast(int, swept.notes["batches"]))
                h, o = statistics.median(hand), statistics.median(ours)
                print(
                    f"{state:<10} {h:>11.2f} {o:>13.2f} {o / h:>8.2f}x"
                    f" {statistics.median(batches):.0f}"
                )
        finally:
            await pool.close()
            await conn.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000, help="expired rows of one instant")
    parser.add_argument("--repeat", type=int, default=1, help="rounds per form; medians shown")
    parser.add_argument("--batch-target-ms", type=int, default=15)
    parser.add_argument("--states", nargs="+", choices=STATES, default=list(STATES))
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)  # the sweep's advice to vacuum and partition, every round
    with scratch_dir("purge-ties-") as scratch:
        asyncio.run(run(args, scratch))


if __name__ == "__main__":
    main()
