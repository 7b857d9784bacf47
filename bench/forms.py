"""The three ways to delete a dataset's expired rows that the bench puts side by side."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection, sql
from psycopg_pool import AsyncConnectionPool
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment

from activities.inputs import PurgeStep
from activities.registry import PurgeTarget, TargetRegistry
from activities.results import PurgeSweep
from activities.sweep import PurgeActivities
from bench.data import Dataset
from bench.stats import FormRun
from purge_config.names import TableName
from purge_ops.connect import open_pool

#: The peers' batch: `key IN (SELECT key ... LIMIT n)`, as the issue measured it.
KEY_IN_LIMIT = 10_000


@dataclass(frozen=True)
class Table:
    """Where a form deletes: one fresh copy of a dataset."""

    schema: str
    name: str
    data: Dataset
    now_ms: int

    @property
    def ident(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.name)


@dataclass(frozen=True)
class FormContext:
    """What a form may use: an autocommit connection, and the pool a worker would have."""

    conn: AsyncConnection[Any]
    """Autocommit, where the hand-typed forms run. In the bench's cases a session of its own,
    open from the start like the pool's, that made none of the copies: the session that makes
    a copy has the new table's catalog entries already cached, and its DELETE paid about
    0.9 ms less than one in another session (bench/README.md, "How each figure is measured")."""
    pool: AsyncConnectionPool[Any]
    """Its search_path finds the bench schema's `purge_progress`: sweeps count in the ledger."""
    pool_no_ledger: AsyncConnectionPool[Any] | None = None
    """Its search_path finds no `purge_progress`: sweeps count from heartbeats."""
    temporal: TemporalPass | None = None
    """Where a pass through Temporal goes (the `ours_temporal` form)."""
    url: str | None = None
    """The server's URL, its search_path finding the ledger like `pool`'s: the `_fresh` forms
    open a session of their own on it."""
    maker: AsyncConnection[Any] | None = None
    """The session that made the copy, for the form that runs the hand DELETE there
    (`delete_maker`): the floor as the bench measured it before 2026-12-05, printed beside."""


@dataclass(frozen=True)
class TemporalPass:
    """A client of a Temporal dev server, a worker built from a config polling `task_queue`,
    and the workflow input of a pass over the one target the bench's copy is."""

    client: Client
    task_queue: str
    request: dict[str, Any]


FormFn = Callable[[FormContext, Table], Awaitable[FormRun]]


async def single_delete(ctx: FormContext, table: Table) -> FormRun:
    """(a) One `DELETE ... WHERE <expiry predicate>`: fastest in total, one long lock-holder."""
    statement = sql.SQL("DELETE FROM {} WHERE {}").format(table.ident, table.data.predicate())
    started = time.perf_counter()
    cur = await ctx.conn.execute(statement, {"now_ms": table.now_ms})
    seconds = time.perf_counter() - started
    return FormRun(removed=max(cur.rowcount, 0), seconds=seconds, statement_ms=[seconds * 1000])


async def key_in_loop(ctx: FormContext, table: Table) -> FormRun:
    """(c) The peers' loop: `key IN (SELECT key ... LIMIT n)` until a statement deletes nothing.

    The outer WHERE does not repeat the predicate, exactly as the peers write it: a row renewed
    while the statement waits on it still matches `key IN (...)` and is deleted.
    """
    statement = sql.SQL(
        "DELETE FROM {t} WHERE key IN (SELECT key FROM {t} WHERE {pred} LIMIT {n})"
    ).format(t=table.ident, pred=table.data.predicate(), n=sql.Literal(KEY_IN_LIMIT))
    removed, times = 0, []
    started = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        cur = await ctx.conn.execute(statement, {"now_ms": table.now_ms})
        times.append((time.perf_counter() - t0) * 1000)
        if cur.rowcount <= 0:
            break
        removed += cur.rowcount
    seconds = time.perf_counter() - started
    return FormRun(
        removed=removed, seconds=seconds, statement_ms=times, notes={"limit": KEY_IN_LIMIT}
    )


async def ours(ctx: FormContext, table: Table, ledger: bool = True) -> FormRun:
    """(b) This package's sweep through the real activity, as a worker would run it, counting
    in the `purge_progress` ledger (or, `ledger=False`, with no ledger table to be found).

    Per-statement times come from the activity's heartbeats: once sweeps are batched, each batch
    heartbeats one dict with "batch_ms". Before that, the only heartbeat is the target's name and
    the whole sweep counts as one statement.
    """
    name = f"bench_{table.name}"
    pool = ctx.pool if ledger or ctx.pool_no_ledger is None else ctx.pool_no_ledger
    target = table.data.target(pool, name, TableName(table.name, table.schema))
    run = await run_target(target, table.now_ms)
    run.notes["ledger"] = ledger
    return run


async def run_target(target: PurgeTarget, now_ms: int) -> FormRun:
    """The real activity on `target`, through ActivityEnvironment, as one pass of its own (a
    fresh workflow run id, so the ledger, where there is one, counts this run alone)."""
    activities = PurgeActivities(TargetRegistry([target]))
    beats: list[Mapping[str, Any]] = []
    partitions_done = 0.0

    def on_heartbeat(*details: Any) -> None:
        nonlocal partitions_done
        beats.extend(d for d in details if isinstance(d, Mapping))
        if any(isinstance(d, Mapping) and d.get("partition") for d in details):
            partitions_done = time.perf_counter()

    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, workflow_run_id=str(uuid.uuid4()))
    env.on_heartbeat = on_heartbeat
    started = time.perf_counter()
    sweep: PurgeSweep = await env.run(
        activities.purge_target, PurgeStep(name=target.name, now_ms=now_ms)
    )
    seconds = time.perf_counter() - started
    batch_ms = _batch_times(beats)
    last = beats[-1] if beats else {}
    notes: dict[str, object] = {
        # getattr with defaults: these fields arrive with batching and must not be required.
        "strategy": getattr(sweep, "strategy", None) or last.get("strategy"),
        "batches": getattr(sweep, "batches", None) or last.get("batches") or None,
        "p95_batch_ms": getattr(sweep, "p95_batch_ms", None),
        "backlog": getattr(sweep, "backlog", None),
        "activity_seconds": sweep.seconds,
        "per_batch_heartbeats": bool(batch_ms),
        # Catalog checks, planning, EXPLAIN, round trips: the sweep's cost outside its batches.
        "outside_batches_ms": seconds * 1000 - sum(batch_ms) if batch_ms else None,
        # Does the first batch keep to the batch target (15 ms), on a cold cache too?
        "first_batch_ms": batch_ms[0] if batch_ms else None,
        "advice": getattr(sweep, "advice", None) or None,
        "partitions": getattr(sweep, "partitions_dropped", 0)
        + getattr(sweep, "partitions_detached", 0),
        "partition_rows": getattr(sweep, "partition_rows", 0),
        "edge_removed": getattr(sweep, "edge_removed", None),
        # From the start to the heartbeat of the last partition out: setup, every detach, the
        # counts and the drops; the batches at the edge come after.
        "partitions_done_ms": (partitions_done - started) * 1000 if partitions_done else None,
    }
    return FormRun(
        removed=sweep.removed,
        seconds=seconds,
        statement_ms=batch_ms or [seconds * 1000],
        notes=notes,
    )


def _batch_times(beats: list[Mapping[str, Any]]) -> list[float]:
    """One time per batch. A heartbeat that repeats a batch already seen (same table, same batch
    count: a periodic heartbeat between batches may carry the last one's progress) counts once."""
    times: dict[object, float] = {}
    for beat in beats:
        if beat.get("batch_ms") is None or beat.get("partition"):
            continue  # a partition dropped or detached whole is no batch
        key = (beat.get("table"), beat["batches"]) if "batches" in beat else len(times)
        times.setdefault(key, float(beat["batch_ms"]))
    return list(times.values())


async def ours_temporal(ctx: FormContext, table: Table) -> FormRun:
    """(b) This package as a user meets it: a `Purge` pass started by a client and its result
    awaited, run by a worker built from a config (the target is the copy this form runs on).
    The time is the client's, from start to result. Batch times stay on the worker (its
    heartbeats go to the server): the result's batches and p95 are reported, read with defaults
    so that an engine without them still runs."""
    assert ctx.temporal is not None, "the ours_temporal form needs a Temporal dev server"
    started = time.perf_counter()
    report = await ctx.temporal.client.execute_workflow(
        "Purge",
        ctx.temporal.request,
        id=f"bench-{table.name}-{uuid.uuid4().hex[:8]}",
        task_queue=ctx.temporal.task_queue,
    )
    seconds = time.perf_counter() - started
    [sweep] = report["swept"]
    if sweep.get("status", "ok") != "ok":
        raise RuntimeError(f"the pass reported {sweep}")
    activity_seconds = float(sweep.get("seconds") or 0.0)
    notes: dict[str, object] = {
        "strategy": sweep.get("strategy"),
        "batches": sweep.get("batches"),
        "p95_batch_ms": sweep.get("p95_batch_ms"),
        "backlog": sweep.get("backlog"),
        "activity_seconds": activity_seconds,
        # The pass's time outside the activity: Temporal's round trips, the workflow's tasks.
        "temporal_ms": 1000 * (seconds - activity_seconds),
        "lower_bound": sweep.get("lower_bound"),
        "advice": sweep.get("advice") or None,
    }
    return FormRun(
        removed=int(sweep["removed"]), seconds=seconds, statement_ms=[seconds * 1000], notes=notes
    )


async def single_delete_fresh(ctx: FormContext, table: Table) -> FormRun:
    """(a) as a DBA types it in a new session (`psql`, then the DELETE): the connection's
    setup is timed with the statement, as a sweep on a new pool's connection pays it."""
    assert ctx.url is not None, "the _fresh forms need FormContext.url"
    started = time.perf_counter()
    async with await AsyncConnection.connect(ctx.url, autocommit=True) as conn:
        connected = time.perf_counter() - started
        run = await single_delete(dataclasses.replace(ctx, conn=conn), table)
    run.seconds += connected
    run.notes["connect_ms"] = connected * 1000
    return run


async def single_delete_maker(ctx: FormContext, table: Table) -> FormRun:
    """(a) in the session that has just made the copy: its catalog entries already cached
    there. The hand DELETE's time as the bench measured it before 2026-12-05, for comparison."""
    assert ctx.maker is not None, "delete_maker needs FormContext.maker"
    return await single_delete(dataclasses.replace(ctx, conn=ctx.maker), table)


async def ours_fresh(ctx: FormContext, table: Table) -> FormRun:
    """(b) on a pool just opened, as an hourly pass often meets it: psycopg_pool closes a
    connection idle for 10 minutes and replaces every one after an hour (`max_lifetime`), so
    its sweeps plan their prepared reads, and load the catalog's caches, in a new session.
    Opening the pool is timed with the sweep."""
    assert ctx.url is not None, "the _fresh forms need FormContext.url"
    started = time.perf_counter()
    pool = await open_pool(ctx.url)
    try:
        connected = time.perf_counter() - started
        run = await ours(dataclasses.replace(ctx, pool=pool), table)
    finally:
        await pool.close()
    run.seconds += connected
    run.notes["connect_ms"] = connected * 1000
    return run


async def ours_no_ledger(ctx: FormContext, table: Table) -> FormRun:
    """(b) without a `purge_progress` table: what the ledger's upsert costs each batch."""
    return await ours(ctx, table, ledger=False)


#: Report order, and the names `--forms`-like options and the JSON use. A form ending in
#: `_cold` runs on a copy dropped from shared_buffers and from the OS page cache first (see
#: `data.make_cold`), and its ratio is taken against `delete_cold`; one ending in `_fresh` opens
#: its session (or pool) first, timed, and its ratio is taken against `delete_fresh`.
FORMS: dict[str, tuple[str, FormFn]] = {
    "delete": ("(a) single DELETE", single_delete),
    "delete_maker": ("(a) single DELETE, in the session that made the copy", single_delete_maker),
    "ours": ("(b) this package", ours),
    "ours_no_ledger": ("(b) this package, no ledger", ours_no_ledger),
    "ours_temporal": ("(b) this package, through Temporal", ours_temporal),
    "key_in": ("(c) key IN loop", key_in_loop),
    "delete_cold": ("(a) single DELETE, cold", single_delete),
    "ours_cold": ("(b) this package, cold", ours),
    "delete_fresh": ("(a) single DELETE, in a new session", single_delete_fresh),
    "ours_fresh": ("(b) this package, on a new pool", ours_fresh),
}

#: Every form's label in the report: the ones above, and the partitioned case's own.
LABELS: dict[str, str] = {
    **{name: label for name, (label, _) in FORMS.items()},
    "hand": "(h) by hand: DETACH CONCURRENTLY + DROP, edge DELETE",
    "drop": "(b) this package, partitions = drop",
    "drop_temporal": "(b) partitions = drop, through Temporal",
    "sweep": "(c) this package, partitions = delete",
    "whole": "(d) partitions = drop, no edge",
    # The archive case's by hand (bench.archive).
    "hand_archive": "(h) by hand: DELETE ... RETURNING into the archive",
    "hand_locked": "(h2) by hand: LOCK, INSERT ... SELECT, DELETE",
}
