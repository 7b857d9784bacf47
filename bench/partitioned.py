"""Case 6, `partitioned`: a table partitioned by day on an epoch-ms column, with 10 days and a
half expired, swept six ways (the forms below) while a writer inserts into today's partition.

The table has `3 x --rows` rows (6,000,000 at the default) in 30 daily partitions, as an
application would index it (primary key on `(id, created_ms)`, `created_ms`, `(user_id,
created_ms)`). The target is `expiring` on `created_ms` with `max_age = 19d`; the partitions'
bounds are placed from the cutoff (`now - 19 days`) so that 10 partitions end before it and the
eleventh holds it in its middle: half of that one's rows are expired.

Forms: (a) one DELETE; (h) by hand, what a careful DBA types: `ALTER TABLE ... DETACH PARTITION
... CONCURRENTLY` of each of the ten expired partitions, one `DROP TABLE` of the ten, then one
`DELETE` of the edge rows through the edge partition itself (issue 20's floor); (b) the activity
with `partitions = "drop"`; (b) the same through Temporal: a `Purge` pass started by a client, run
by an in-process worker built from a config (its instant is the workflow's clock, minutes after the
bench's: its edge holds a few hundred rows more, out of 2,100,000 at the default); (c) the
activity with `partitions = "delete"`; (d) `partitions = "drop"` at an instant half a day earlier,
its cutoff one millisecond before a partition bound, so that 10 whole partitions are expired and
no row at the edge: the partition mechanism alone (its ratios are still taken against (a), which
removes 5% more rows). Ratios are against (a); the notes give each form against (h) too, in time
and in WAL. After each: expired rows left, live rows lost (the table's own and the writer's),
and partitions left half-detached.

What (h) costs on the bench machine (issue 37, by pg_stat_statements, the server's log and
pg_stat_activity sampled during the forms): each concurrent detach mostly 1-3 ms (up to about
15 ms on a loaded machine), waiting on a lock at most for the writer's one insert in flight; no
session of the bench, the pool or the worker holds a transaction open meanwhile. Most of (h)'s
time, as of (b)'s, is the commit of the drops: the partitions' files (about 17 MB each, on disk
since the checkpoint before the form) removed by the file system, 8-18 ms a partition whether
dropped one by one or together.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psycopg import AsyncConnection, sql

from activities import builtin_kinds as kinds
from bench import noise
from bench.cases import Bench, _lsn, _wal_since
from bench.data import DAY_MS, flush_counts
from bench.forms import LABELS, TemporalPass, run_target
from bench.services import (
    TargetEntry,
    config_worker,
    fleet_config,
    temporal_dev_server,
    with_search_path,
)
from bench.stats import FormResult, FormRun, median_of, summarize
from bench.writer import EVENT_IDS, WriterConfig, running_writer
from purge_config.names import TableName
from purge_config.settings import PartitionMode, PartitionPolicy
from purge_ops.connect import open_pool

log = logging.getLogger("bench")

PARTITIONS = 30
MAX_AGE_MS = 19 * DAY_MS
#: The cutoff lies this many days after the first partition begins: 10 whole days expired, and
#: half of the eleventh.
EXPIRED_DAYS = 10.5
FORMS = ("delete", "hand", "drop", "drop_temporal", "sweep", "whole")
#: The partitions of the ten whole expired days, and the edge's (the eleventh).
WHOLE_DAYS = 10


@dataclass(frozen=True)
class Events:
    """The dataset: `rows` rows spread evenly over PARTITIONS daily partitions."""

    rows: int
    now_ms: int

    @property
    def per_day(self) -> int:
        return self.rows // PARTITIONS

    @property
    def cutoff(self) -> int:
        """The greatest expired `created_ms`: `now - max_age`."""
        return self.now_ms - MAX_AGE_MS

    @property
    def start(self) -> int:
        return self.cutoff - int(EXPIRED_DAYS * DAY_MS)

    @property
    def step(self) -> int:
        """Between two rows' `created_ms` (ms): a day's rows, evenly."""
        return DAY_MS // self.per_day

    @property
    def expired(self) -> int:
        """Rows at or before the cutoff: row j is at start + j * step."""
        return (self.cutoff - self.start) // self.step + 1

    def now_for(self, form: str) -> int:
        """The pass's instant of `form`: (d) sweeps half a day earlier, its cutoff just before
        the bound where the eleventh partition begins."""
        if form != "whole":
            return self.now_ms
        return self.start + 10 * DAY_MS - 1 + MAX_AGE_MS

    def expired_for(self, form: str) -> int:
        return self.whole if form == "whole" else self.expired

    def expired_at(self, cutoff: int) -> int:
        """Rows at or before `cutoff` (inside the edge partition)."""
        return (cutoff - self.start) // self.step + 1

    @property
    def whole(self) -> int:
        """Rows in the ten wholly expired partitions: row j is in them when j * step < 10 days."""
        return (WHOLE_DAYS * DAY_MS - 1) // self.step + 1

    @property
    def label(self) -> str:
        return (
            f"{self.per_day * PARTITIONS:,} rows, {PARTITIONS} daily partitions, "
            f"{self.expired:,} expired (10.5 days)"
        )


async def build(conn: AsyncConnection[Any], schema: str, name: str, data: Events) -> None:
    """The partitioned copy: loaded first, indexed after (as a restore would), vacuumed,
    prewarmed."""
    table = sql.Identifier(schema, name)
    await conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id bigint NOT NULL, created_ms bigint NOT NULL, user_id bigint,"
            " body text) PARTITION BY RANGE (created_ms)"
        ).format(table)
    )
    for n in range(PARTITIONS):
        lo = data.start + n * DAY_MS
        await conn.execute(
            sql.SQL(
                "CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})"
                " WITH (autovacuum_enabled = false)"
            ).format(
                sql.Identifier(schema, f"{name}_d{n:02}"),
                table,
                sql.Literal(lo),
                sql.Literal(lo + DAY_MS),
            )
        )
    await conn.execute(
        sql.SQL(
            "INSERT INTO {} SELECT i, {} + i * {}, mod(i, 1000), md5(i::text)"
            " FROM generate_series(0::bigint, {}) i"
        ).format(table, sql.Literal(data.start), sql.Literal(data.step), sql.Literal(data.rows - 1))
    )
    await conn.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (id, created_ms)").format(table))
    await conn.execute(sql.SQL("CREATE INDEX ON {} (created_ms)").format(table))
    await conn.execute(sql.SQL("CREATE INDEX ON {} (user_id, created_ms)").format(table))
    await conn.execute(flush_counts(conn))
    await conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(table))
    await conn.execute(
        sql.SQL(
            "SELECT pg_prewarm(t.relid) FROM pg_partition_tree({rel}::regclass) t WHERE t.isleaf"
            " UNION ALL SELECT pg_prewarm(i.indexrelid) FROM pg_index i"
            " JOIN pg_partition_tree({rel}::regclass) t ON t.relid = i.indrelid WHERE t.isleaf"
        ).format(rel=sql.Literal(f'"{schema}"."{name}"'))
    )


async def run_partitioned(bench: Bench, rows: int, scratch: Path) -> list[FormResult]:
    """Every form `bench.repeat` times, each on a fresh copy, alternating their order."""
    data = Events(rows=rows, now_ms=bench.now_ms)
    # The package's pool with the bench schema first on the path: the sweep then keeps its
    # ledger (purge_progress, in the reference DDL), as a deployment would.
    pool = await open_pool(bench.ledger_url)
    runs: dict[str, list[FormResult]] = {form: [] for form in FORMS}
    try:
        async with (
            temporal_dev_server(scratch) as (client, _),
            _temporal_worker(bench, client) as temporal,
        ):
            await _warm_up(bench, pool, data, temporal)
            for repeat in range(bench.repeat):
                order = FORMS if repeat % 2 == 0 else tuple(reversed(FORMS))
                for form in order:
                    runs[form].append(await _measure(bench, pool, data, form, temporal))
    finally:
        await pool.close()
    bench.all_runs.extend(r for form in FORMS for r in runs[form])
    measured = [median_of(runs[form]) for form in FORMS]
    base = measured[0]
    hand = measured[FORMS.index("hand")]
    for result in measured:
        result.ratio = result.seconds / base.seconds if base.seconds > 0 else None
        result.notes["wal_share_of_delete"] = (
            result.wal_bytes / base.wal_bytes if base.wal_bytes > 0 else None
        )
        result.notes["x_hand"] = result.seconds / hand.seconds if hand.seconds > 0 else None
        result.notes["wal_x_hand"] = (
            result.wal_bytes / hand.wal_bytes if hand.wal_bytes > 0 else None
        )
    return measured


@contextlib.asynccontextmanager
async def _temporal_worker(bench: Bench, client: Any) -> AsyncIterator[TemporalPass]:
    """A worker built from a config naming the copy the `drop_temporal` form runs on, its
    database URL with the bench schema on the path (so it keeps its ledger there)."""
    url = with_search_path(bench.url, bench.schema)
    entry = TargetEntry(
        "events",
        f"{bench.schema}.events_drop_temporal",
        "created_ms",
        max_age="19d",
        partitions="drop",
    )
    config = fleet_config(url, {}, [entry])
    async with config_worker(client, config):
        yield TemporalPass(client, config.task_queue, config.pass_input())


async def _warm_up(bench: Bench, pool: Any, data: Events, temporal: TemporalPass) -> None:
    """One sweep of a small copy first, unmeasured: whichever form runs first would otherwise
    pay for the pool's first connections and psycopg's first statements (~200 ms here); and one
    pass through Temporal, on a small copy under the name its form's copies take."""
    small = Events(rows=PARTITIONS * 10, now_ms=data.now_ms)
    for name, form in (("events_warm_up", "drop"), ("events_drop_temporal", "drop_temporal")):
        await build(bench.conn, bench.schema, name, small)
        try:
            await _form(bench.conn, pool, bench.schema, name, small, form, temporal)
        finally:
            await bench.conn.execute(
                sql.SQL("DROP TABLE {}").format(sql.Identifier(bench.schema, name))
            )
            await _drop_detached(bench.conn, bench.schema, name)


async def _measure(
    bench: Bench, pool: Any, data: Events, form: str, temporal: TemporalPass
) -> FormResult:
    conn = bench.conn
    name = f"events_{form}"
    started = time.perf_counter()
    await build(conn, bench.schema, name, data)
    try:
        if bench.checkpoint:
            await conn.execute("CHECKPOINT")
        log.info("partitioned: copy %s ready in %.1f s", name, time.perf_counter() - started)
        # The machine's speed just before the form (bench.noise), as measure_form takes it.
        probe = noise.probe_ms()
        config = WriterConfig(
            url=bench.url,
            schema=bench.schema,
            table=name,
            kind="events",
            rows=data.rows,
            expired=data.expired,
            layout="ordered",
            now_ms=data.now_ms,
            rate=bench.writer_rate,
            seed=bench.seed,
        )
        async with running_writer(config) as writer:
            lsn = await _lsn(conn)
            await writer.go()
            try:
                run = await _form(conn, pool, bench.schema, name, data, form, temporal)
            finally:
                writer_run = await writer.stop()
            wal_total = await _wal_since(conn, lsn)
        now_ms = run.notes.get("now_ms")
        cutoff = (now_ms if isinstance(now_ms, int) else data.now_for(form)) - MAX_AGE_MS
        left, live, pending = await _after(conn, bench.schema, name, cutoff)
        written = {int(key) for key in writer_run.renewed}
        present = await _present(conn, bench.schema, name, sorted(written))
        # The table's own live rows, and every row the writer inserted, must all be there.
        expired = data.expired_at(cutoff) if form == "drop_temporal" else data.expired_for(form)
        lost = (data.rows - expired + len(written) - live) + (len(written) - present)
        run.notes["pending"] = pending
    finally:
        await conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(bench.schema, name)))
        await _drop_detached(conn, bench.schema, name)
    result = summarize(
        "partitioned",
        data.label,
        form,
        data.rows,
        expired,
        run,
        writer_run,
        left=left,
        lost=lost,
        wal_total=wal_total,
    )
    result.notes["probe_ms"] = round(probe, 2)
    log.info(
        "partitioned: %s removed %d in %.3f s (WAL %.1f MB, writer p99 %.1f ms, lost %d, "
        "pending %d)",
        form,
        result.removed,
        result.seconds,
        result.wal_bytes / 1e6,
        result.writer_p99_ms or 0.0,
        lost,
        pending,
    )
    return result


async def _form(
    conn: AsyncConnection[Any],
    pool: Any,
    schema: str,
    name: str,
    data: Events,
    form: str,
    temporal: TemporalPass,
) -> FormRun:
    if form == "hand":
        return await _by_hand(conn, schema, name, data)
    if form == "drop_temporal":
        return await _through_temporal(temporal, name)
    if form == "delete":
        statement = sql.SQL("DELETE FROM {} WHERE created_ms <= %s").format(
            sql.Identifier(schema, name)
        )
        started = time.perf_counter()
        cur = await conn.execute(statement, (data.cutoff,))
        seconds = time.perf_counter() - started
        return FormRun(max(cur.rowcount, 0), seconds, [seconds * 1000])
    mode: PartitionMode = "delete" if form == "sweep" else "drop"
    target = kinds.expiring(
        pool,
        f"bench_{name}_{uuid.uuid4().hex[:6]}",
        TableName(name, schema),
        "created_ms",
        MAX_AGE_MS,
        partitions=PartitionPolicy(mode),
    )
    return await run_target(target, data.now_for(form))


async def _by_hand(conn: AsyncConnection[Any], schema: str, name: str, data: Events) -> FormRun:
    """What a careful DBA types: each expired partition detached concurrently (two
    transactions, inserts never wait), the ten detached tables dropped in one statement (one
    commit, as the package drops them), then the edge's rows deleted through the edge partition
    itself, in one statement. The rows the drops remove are known from the data (the writer
    inserts into today's partition only), so no count is timed. Each statement is timed apart:
    the detaches, the drop (its commit removes the files) and the edge."""
    parent = sql.Identifier(schema, name)
    parts = [sql.Identifier(schema, f"{name}_d{n:02}") for n in range(WHOLE_DAYS)]
    detach_ms: list[float] = []
    started = time.perf_counter()
    for part in parts:
        t0 = time.perf_counter()
        await conn.execute(
            sql.SQL("ALTER TABLE {} DETACH PARTITION {} CONCURRENTLY").format(parent, part)
        )
        detach_ms.append(1000 * (time.perf_counter() - t0))
    t0 = time.perf_counter()
    await conn.execute(sql.SQL("DROP TABLE {}").format(sql.SQL(", ").join(parts)))
    drop_ms = 1000 * (time.perf_counter() - t0)
    t0 = time.perf_counter()
    cur = await conn.execute(
        sql.SQL("DELETE FROM {} WHERE created_ms <= %s").format(
            sql.Identifier(schema, f"{name}_d{WHOLE_DAYS:02}")
        ),
        (data.cutoff,),
    )
    edge_ms = 1000 * (time.perf_counter() - t0)
    seconds = time.perf_counter() - started
    edge = max(cur.rowcount, 0)
    notes: dict[str, object] = {
        "partitions": WHOLE_DAYS,
        "partition_rows": data.whole,
        "edge_removed": edge,
        "edge_ms": edge_ms,
        "detach_ms": detach_ms,
        "drop_ms": drop_ms,
        "partitions_done_ms": sum(detach_ms) + drop_ms,
    }
    return FormRun(data.whole + edge, seconds, [*detach_ms, drop_ms, edge_ms], notes)


async def _through_temporal(temporal: TemporalPass, name: str) -> FormRun:
    """A `Purge` pass through the dev server over the config's one target, which names this
    copy; timed from the client's start to its result."""
    started = time.perf_counter()
    report = await temporal.client.execute_workflow(
        "Purge",
        temporal.request,
        id=f"bench-{name}-{uuid.uuid4().hex[:8]}",
        task_queue=temporal.task_queue,
    )
    seconds = time.perf_counter() - started
    [sweep] = report["swept"]
    if sweep.get("status", "ok") != "ok":
        raise RuntimeError(f"partitioned: the pass reported {sweep}")
    activity = float(sweep.get("seconds") or 0.0)
    notes: dict[str, object] = {
        "strategy": sweep.get("strategy"),
        "batches": sweep.get("batches"),
        "now_ms": int(report["now_ms"]),
        "activity_seconds": activity,
        "temporal_ms": 1000 * (seconds - activity),
    }
    return FormRun(int(sweep["removed"]), seconds, [seconds * 1000], notes)


def partitioned_lines(results: Sequence[FormResult]) -> list[str]:
    """Issue 37's goals for the partitioned case: the activity and the pass through Temporal
    against the hand-typed floor, and where the floor's own time went."""
    lines: list[str] = []
    by_form = {r.form: r for r in results if r.case == "partitioned"}
    hand = by_form.get("hand")
    if hand is None:
        return lines
    detaches, drop = hand.notes.get("detach_ms"), hand.notes.get("drop_ms")
    if isinstance(detaches, list) and detaches and isinstance(drop, float):
        lines.append(
            f"info    partitioned: (h) by hand: {len(detaches)} detaches {sum(detaches):.0f} ms"
            f" (each {min(detaches):.1f}-{max(detaches):.1f} ms), one DROP of them"
            f" {drop:.0f} ms, edge {hand.notes.get('edge_ms', 0.0):.0f} ms"
        )
    drop_form = by_form.get("drop")
    if drop_form is not None:
        x, wal = drop_form.notes.get("x_hand"), drop_form.notes.get("wal_x_hand")
        if isinstance(x, float):
            lines.append(
                f"{_verdict(x, 1.5)} partitioned: {LABELS['drop']} (the activity) vs (h) by"
                f" hand: {x:.2f}x ({drop_form.seconds:.3f} s against {hand.seconds:.3f} s;"
                " target <= 1.5x)"
            )
        if isinstance(wal, float):
            lines.append(
                f"{_verdict(wal, 1.5)} partitioned: {LABELS['drop']} WAL vs (h) by hand:"
                f" {wal:.2f}x ({drop_form.wal_bytes / 1e6:.1f} MB against"
                f" {hand.wal_bytes / 1e6:.1f} MB; target <= 1.5x)"
            )
    through = by_form.get("drop_temporal")
    if through is not None and hand.seconds > 0:
        activity = through.notes.get("activity_seconds")
        inside = (
            f", the activity inside it {float(activity) / hand.seconds:.2f}x"
            if isinstance(activity, int | float)
            else ""
        )
        lines.append(
            f"info    partitioned: {LABELS['drop_temporal']} vs (h) by hand:"
            f" {through.seconds / hand.seconds:.2f}x end to end{inside}"
        )
    return lines


def _verdict(value: float, limit: float) -> str:
    return f"{'met' if value <= limit else 'NOT met':7}"


async def _after(
    conn: AsyncConnection[Any], schema: str, name: str, cutoff: int
) -> tuple[int, int, int]:
    """(expired rows left, live rows, partitions left half-detached)."""
    cur = await conn.execute(
        sql.SQL(
            "SELECT count(*) FILTER (WHERE created_ms <= %s),"
            " count(*) FILTER (WHERE created_ms > %s) FROM {}"
        ).format(sql.Identifier(schema, name)),
        (cutoff, cutoff),
    )
    row = await cur.fetchone()
    cur = await conn.execute(
        "SELECT count(*) FROM pg_inherits WHERE inhparent = %s::regclass AND inhdetachpending",
        (f'"{schema}"."{name}"',),
    )
    pending = await cur.fetchone()
    assert row is not None
    assert pending is not None
    return int(row[0]), int(row[1]), int(pending[0])


async def _present(conn: AsyncConnection[Any], schema: str, name: str, ids: list[int]) -> int:
    cur = await conn.execute(
        sql.SQL("SELECT count(*) FROM {} WHERE id = ANY(%s) AND id >= %s").format(
            sql.Identifier(schema, name)
        ),
        (ids, EVENT_IDS),
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def _drop_detached(conn: AsyncConnection[Any], schema: str, name: str) -> None:
    """Partitions a form left behind as tables of their own (none, unless it failed)."""
    cur = await conn.execute(
        "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname LIKE %s AND c.relkind IN ('r', 'p')",
        (schema, f"{name}_d%"),
    )
    for (rel,) in await cur.fetchall():
        await conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(schema, rel)))
