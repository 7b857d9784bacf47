"""The Temporal dev server and worker a case's `ours_temporal` form runs its pass on: a worker
built from the config a user would write for the copy that form sweeps (and its archive, where
the case has one), warmed by one unmeasured pass first."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

from psycopg import sql

from bench.cases import Bench
from bench.data import Dataset
from bench.forms import FormContext, Table, TemporalPass, ours_temporal
from bench.services import (
    TargetEntry,
    config_worker,
    fleet_config,
    temporal_dev_server,
    with_search_path,
)

log = logging.getLogger("bench")


@contextlib.asynccontextmanager
async def case_worker(
    bench: Bench, scratch: Path, copy: str, reference: str, archive: str = ""
) -> AsyncIterator[TemporalPass]:
    """A Temporal dev server and a worker built from a config naming the copy `ours_temporal`
    runs on (shaped as `reference`, an idempotency table) and, given `archive`, that table as
    its archive (the bench schema on its URL's path, so it keeps its ledger there), after one
    unmeasured pass over them made empty: a worker that has just started pays its first polls,
    the sandbox's imports and its pool's first connections once, as a deployed one long has."""
    url = with_search_path(bench.url, bench.schema)
    table = f"{bench.schema}.{copy}"
    into = f"{bench.schema}.{archive}" if archive else ""
    entry = TargetEntry("ours", table, "", kind="idempotency", archive=into)
    config = fleet_config(url, {}, [entry])
    async with temporal_dev_server(scratch) as (client, _), config_worker(client, config):
        temporal = TemporalPass(client, config.task_queue, config.pass_input())
        # The copy with its keys and indexes, an archive a plain heap: as the forms make them.
        made = [(sql.Identifier(bench.schema, copy), "ALL")]
        if archive:
            made.append((sql.Identifier(bench.schema, archive), "DEFAULTS"))
        for ident, including in made:
            await bench.conn.execute(
                sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING {})").format(
                    ident, sql.Identifier(bench.schema, reference), sql.SQL(including)
                )
            )
        try:
            started = time.perf_counter()
            await ours_temporal(
                FormContext(bench.conn, bench.pool, temporal=temporal),
                Table(
                    bench.schema, copy, Dataset("idempotency", 0, 0, "interleaved"), bench.now_ms
                ),
            )
            log.info("%s: warm-up pass in %.3f s", copy, time.perf_counter() - started)
        finally:
            for ident, _ in made:
                await bench.conn.execute(sql.SQL("DROP TABLE {}").format(ident))
        yield temporal
