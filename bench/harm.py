"""What the refusals and the pacing of "refuse or pace before harm" cost and save, side by side.

    python -m bench.harm                  # both cases, 3 runs each, the median shown
    python -m bench.harm --rows 200000    # a smaller run

- `wal-paced`: `x_idempotency`, `--rows` rows, half expired, interleaved (the `interleaved` case of
  bench.run). The package's sweep unpaced, then with `max_wal_rate` set to half the rate the
  unpaced sweep wrote WAL at, each on a fresh copy: the paced one should take about twice as long
  and hold the rate.
- `children`: a parent of `--rows`/50 rows, half expired, and a child table referencing every
  expired parent and half of the live ones `ON DELETE CASCADE`; the sweep of the parent with
  the child's foreign key column unindexed, then indexed: the cost the unindexed-children warning
  names.

An embedded PostgreSQL 18 with fsync and full_page_writes on (as in production), on disk in the
system's temporary directory (`bench.services.scratch_dir`), started and stopped here. The
sweep is the package's `SqlTarget.sweep` (the activity's engine, no Temporal).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from activities import builtin_kinds as kinds
from activities.schema import reference_ddl
from bench.data import flush_counts
from bench.services import scratch_dir
from purge_config.names import TableName
from purge_config.settings import SweepSettings
from purge_dev.servers import EmbeddedPostgres
from purge_ops.connect import open_pool

NOW = 1_000_000_000_000
HOUR = 3_600_000


def wal(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    return int(row[0]) if row else 0


def fill_idempotency(conn: psycopg.Connection[Any], rows: int) -> None:
    conn.execute("DROP TABLE IF EXISTS x_idempotency")
    conn.execute(
        "CREATE TABLE x_idempotency (key text PRIMARY KEY, response jsonb,"
        " expires_at_ms bigint NOT NULL) WITH (autovacuum_enabled = off)"
    )
    conn.execute("CREATE INDEX ON x_idempotency (expires_at_ms)")
    conn.execute(
        "INSERT INTO x_idempotency SELECT 'k' || i, '{\"status\": 200}',"
        " CASE WHEN i %% 2 = 0 THEN %s ELSE %s END FROM generate_series(1, %s) i",
        (NOW - HOUR, NOW + HOUR, rows),
    )
    conn.execute(flush_counts(conn))
    conn.execute("VACUUM ANALYZE x_idempotency")
    conn.execute("CHECKPOINT")


async def timed_sweep(
    pool: AsyncConnectionPool[Any], conn: psycopg.Connection[Any], target: Any
) -> dict[str, float]:
    before, started = wal(conn), time.perf_counter()
    stats = await target.sweep(NOW)
    seconds = time.perf_counter() - started
    written = wal(conn) - before
    return {
        "seconds": seconds,
        "wal_mb": written / 1024**2,
        "mb_per_s": written / 1024**2 / seconds,
        "removed": stats.removed,
        "batches": stats.batches,
        "paused_s": stats.paused_s,
    }


async def wal_paced(url: str, rows: int, repeat: int) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    pool = await open_pool(url)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            for _ in range(repeat):
                fill_idempotency(conn, rows)
                free = await timed_sweep(pool, conn, kinds.idempotency(pool))
                cap = int(free["mb_per_s"] / 2 * 1024**2)
                fill_idempotency(conn, rows)
                paced_target = kinds.idempotency(pool, settings=SweepSettings(max_wal_rate=cap))
                paced = await timed_sweep(pool, conn, paced_target)
                runs.append({"unpaced": free, "paced": paced, "cap_mb_per_s": cap / 1024**2})
    finally:
        await pool.close()
    ratios = [r["paced"]["seconds"] / r["unpaced"]["seconds"] for r in runs]
    held = [r["paced"]["mb_per_s"] / r["cap_mb_per_s"] for r in runs]
    return {
        "runs": runs,
        "time_ratio": statistics.median(ratios),
        "rate_vs_cap": statistics.median(held),
    }


def fill_parent(conn: psycopg.Connection[Any], parents: int, indexed: bool) -> None:
    conn.execute("DROP TABLE IF EXISTS child, parent")
    conn.execute("CREATE TABLE parent (id bigint PRIMARY KEY, expires_ms bigint NOT NULL)")
    conn.execute("CREATE INDEX ON parent (expires_ms)")
    conn.execute(
        "CREATE TABLE child (id bigint PRIMARY KEY,"
        " parent_id bigint REFERENCES parent ON DELETE CASCADE)"
    )
    conn.execute(
        "INSERT INTO parent SELECT i, CASE WHEN i %% 2 = 0 THEN %s ELSE %s END"
        " FROM generate_series(1, %s) i",
        (NOW - HOUR, NOW + HOUR, parents),
    )
    # Every expired parent has a child (each delete cascades), and so does half of the live
    # ones (a quarter of all parents).
    conn.execute(
        "INSERT INTO child SELECT i, i FROM generate_series(1, %s) i"
        " WHERE i %% 2 = 0 OR i %% 4 = 1",
        (parents,),
    )
    if indexed:
        conn.execute("CREATE INDEX ON child (parent_id)")
    conn.execute(flush_counts(conn))
    conn.execute("VACUUM ANALYZE parent")
    conn.execute("VACUUM ANALYZE child")


async def children(url: str, rows: int, repeat: int) -> dict[str, Any]:
    parents = max(rows // 50, 1000)
    runs: list[dict[str, Any]] = []
    pool = await open_pool(url)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            for _ in range(repeat):
                run: dict[str, Any] = {}
                for indexed in (False, True):
                    fill_parent(conn, parents, indexed)
                    target = kinds.expiring(
                        pool, "parent", TableName("parent"), "expires_ms",
                        settings=SweepSettings(statement_timeout_ms=600_000),
                    )  # fmt: skip
                    outcome = await timed_sweep(pool, conn, target)
                    run["indexed" if indexed else "unindexed"] = outcome
                runs.append(run)
    finally:
        await pool.close()
    ratio = statistics.median(r["unindexed"]["seconds"] / r["indexed"]["seconds"] for r in runs)
    return {"parents": parents, "runs": runs, "unindexed_vs_indexed": ratio}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    # On disk, as the rest of the bench: the WAL-rate case measures writes (the tests' own
    # scratch directory is /dev/shm where there is one).
    with scratch_dir("purge-bench-harm-") as base:
        server = EmbeddedPostgres(base, settings={"fsync": "on", "full_page_writes": "on"})
        server.start()
        try:
            with psycopg.connect(server.url(), autocommit=True) as conn:
                conn.execute(reference_ddl())
            return {
                "rows": args.rows,
                "wal_paced": await wal_paced(server.url(), args.rows, args.repeat),
                "children": await children(server.url(), args.rows, args.repeat),
            }
        finally:
            server.remove()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write every run as JSON")
    args = parser.parse_args()
    outcome = asyncio.run(main_async(args))
    paced, kids = outcome["wal_paced"], outcome["children"]
    median = statistics.median
    print(f"wal-paced ({args.rows:,} rows, half expired, median of {args.repeat}):")
    print(
        f"  unpaced {median(r['unpaced']['seconds'] for r in paced['runs']):.2f} s at "
        f"{median(r['unpaced']['mb_per_s'] for r in paced['runs']):.1f} MB/s of WAL; capped at "
        f"half: {paced['time_ratio']:.2f}x the time, {paced['rate_vs_cap']:.2f}x the cap"
    )
    print(f"children (parent of {kids['parents']:,} rows, every expired one with a child):")
    print(
        f"  unindexed {median(r['unindexed']['seconds'] for r in kids['runs']):.2f} s, indexed "
        f"{median(r['indexed']['seconds'] for r in kids['runs']):.3f} s: "
        f"{kids['unindexed_vs_indexed']:.0f}x"
    )
    if args.json:
        args.json.write_text(json.dumps(outcome, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
