"""Case 9 `backlog`: a large backlog swept as a user meets it, against one DELETE.

1M expired of 2M rows, interleaved (case 1's data), on a PostgreSQL of its own with PostgreSQL's
default shared_buffers (128 MB, so the 2M-row table, ~400 MB with its indexes, does not fit) and
nothing prewarmed: every form starts with none of its copy in shared_buffers. Forms, each on an
identical fresh copy, in alternating order:

- (a) one DELETE;
- (b) through Temporal: a `Purge` pass started by a client and its result awaited, run by an
  in-process worker built from a config naming the copy (`[[targets]] kind = "idempotency"`);
- (b) the activity alone (ActivityEnvironment), to tell the sweep's cost from Temporal's.

With `--url` the server is used as it is (its shared_buffers reported), in a scratch database.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

from psycopg import AsyncConnection, sql

from bench import server
from bench.cases import Bench, Case, run_case, warm_sessions
from bench.data import DAY_MS, Dataset
from bench.forms import TemporalPass
from bench.services import (
    TargetEntry,
    config_worker,
    embedded_postgres,
    fleet_config,
    scratch_databases,
    temporal_dev_server,
)
from bench.stats import FormResult
from purge_ops.connect import open_pool

log = logging.getLogger("bench")

#: PostgreSQL's own default: the table is larger than the buffers.
DEFAULT_SHARED_BUFFERS = "128MB"
FORMS = ("delete", "ours_temporal", "ours")


def backlog_case(rows: int) -> Case:
    return Case(
        "backlog",
        "idempotency, half expired, interleaved; shared_buffers 128MB, not prewarmed; "
        "through Temporal",
        (Dataset("idempotency", rows, rows // 2, "interleaved", live_after_ms=DAY_MS),),
        FORMS,
    )


@contextlib.asynccontextmanager
async def small_buffers_server(
    bench: Bench, scratch: Path, fsync: bool
) -> AsyncIterator[tuple[str, Path | None]]:
    """(admin URL, data directory or None): a PostgreSQL of its own with the default
    shared_buffers, or, with --url, the bench's server as it is."""
    if bench.data_dir is None:
        yield bench.url, None
        return
    settings = server.embedded_settings(fsync=fsync, shared_buffers=DEFAULT_SHARED_BUFFERS)
    log.info("backlog: starting a PostgreSQL with shared_buffers=%s", DEFAULT_SHARED_BUFFERS)
    async with embedded_postgres(scratch, settings) as postgres:
        yield postgres.url(), postgres.data_dir


@contextlib.asynccontextmanager
async def database_bench(
    bench: Bench, admin_url: str, data_dir: Path | None, tag: str
) -> AsyncIterator[Bench]:
    """A Bench on a scratch database of `admin_url`'s server (reference DDL and ledger in its
    public schema, found by any pool's default search_path), its connections closed and the
    database dropped on the way out."""
    async with (
        await AsyncConnection.connect(admin_url, autocommit=True) as admin,
        scratch_databases(admin, admin_url, 1, tag) as [url],
        await AsyncConnection.connect(url, autocommit=True) as conn,
        # The hand forms' session on this database: bench.hand is the first server's.
        await AsyncConnection.connect(url, autocommit=True) as hand,
    ):
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
        pool = await open_pool(url)
        try:
            yield replace(
                bench,
                url=url,
                schema="public",
                conn=conn,
                hand=hand,
                pool=pool,
                pool_no_ledger=None,
                prewarm=False,
                evict=True,
                data_dir=data_dir,
                all_runs=[],
            )
        finally:
            await pool.close()


async def run_backlog(bench: Bench, scratch: Path, rows: int, fsync: bool) -> list[FormResult]:
    """The case's forms, `bench.repeat` times each, ratios against the one DELETE."""
    case = backlog_case(rows)
    async with (
        small_buffers_server(bench, scratch, fsync) as (admin_url, data_dir),
        database_bench(bench, admin_url, data_dir, "b") as here,
    ):
        settings = await server.server_settings(here.conn)
        log.info("backlog: shared_buffers=%s", settings.get("shared_buffers"))
        data = case.datasets[0]
        # The copy `ours_temporal` runs on, named as run_case names it, is the config's target.
        copy = f"{case.name}_{data.rows}_ours_temporal"
        config = fleet_config(here.url, {}, [TargetEntry("backlog", copy, "", kind="idempotency")])
        async with (
            temporal_dev_server(scratch) as (client, _),
            config_worker(client, config),
        ):
            here.temporal = TemporalPass(client, config.task_queue, config.pass_input())
            await _warm_up(here, here.temporal, copy)
            # This database's hand session and pool are new: warmed as the first server's are.
            await warm_sessions(here)
            results = await run_case(here, case)
        bench.all_runs.extend(here.all_runs)
        for result in results:
            result.notes["shared_buffers"] = settings.get("shared_buffers")
        return results


async def _warm_up(bench: Bench, temporal: TemporalPass, table: str) -> None:
    """One pass before any is measured, over the target's table made empty: a worker that has
    just started pays the workflow sandbox's imports, its first polls and its pool's first
    connection once; a deployed worker has long paid them."""
    ident = sql.Identifier(bench.schema, table)
    await bench.conn.execute(
        sql.SQL("CREATE TABLE {} (LIKE x_idempotency INCLUDING ALL)").format(ident)
    )
    try:
        started = time.perf_counter()
        await temporal.client.execute_workflow(
            "Purge",
            temporal.request,
            id=f"bench-warmup-{uuid.uuid4().hex[:8]}",
            task_queue=temporal.task_queue,
        )
        log.info("backlog: warm-up pass in %.3f s", time.perf_counter() - started)
    finally:
        await bench.conn.execute(sql.SQL("DROP TABLE {}").format(ident))
