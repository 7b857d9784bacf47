"""Case 10 `fleet`: four databases' backlogs swept in one pass, against the same four sweeps as
four passes started together, and four DELETEs started together.

Four databases on one PostgreSQL of its own (PostgreSQL's default shared_buffers, as case 9
`backlog`), each with case 1's data (1M expired of 2M rows, interleaved). One config names a
target per database (`database_url` the first, `[databases.dbN]` the others) with `[pass]
max_concurrent = 4, max_per_database = 1`; an in-process worker built from it; passes started by
a client and their results awaited. Each measurement runs on fresh copies, with none of them in
shared_buffers, a concurrent writer (bench/writer.py) on every database being swept:

- fleet: one pass over all four;
- 4 passes: four `Purge` passes started together, each over one database's target (what four
  independent schedules would do);
- DELETE x4: one plain DELETE on each database, started together, each on its own connection.

The figures (issue 20) are the fleet pass against the four passes (goal: at most 1.1x) and
against the four DELETEs (goal: below 1x), in the same run, and each writer's p99 during the
fleet pass. CPU seconds per process say what the 2 cores did. (Issue 11's figure, the fleet
against the slowest database alone, cannot reach 1.3x on 2 cores and is no longer measured.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from psycopg import AsyncConnection, sql

from bench import data as tables
from bench.backlog import small_buffers_server
from bench.cases import Bench
from bench.cpu import CpuMeter, postmaster_pid
from bench.data import DAY_MS, Dataset
from bench.services import (
    TargetEntry,
    config_worker,
    fleet_config,
    scratch_databases,
    temporal_dev_server,
)
from bench.stats import WriterRun, percentile
from bench.writer import WriterConfig, running_writer
from purge_config import PurgeConfig

log = logging.getLogger("bench")

DATABASES = 4
FLEET, PASSES, DELETES = "fleet", "4 passes", "DELETE x4"
FORMS = (FLEET, PASSES, DELETES)
TABLE = "fleet_copy"
TEMPLATE = "fleet_template"


@dataclass
class FleetRun:
    """One measured pass."""

    form: str
    """One of FORMS."""
    seconds: float
    removed: int
    left: int
    lost: int
    writer_p99_ms: dict[int, float | None]
    """Each swept database's writer: its p99 statement time during the pass."""
    writer_ops: dict[int, int]
    activity_seconds: dict[int, float]
    """Each target's sweep as its activity reported it."""
    cpu: dict[str, float] = field(default_factory=dict)


@dataclass
class FleetResult:
    databases: int
    rows: int
    expired: int
    shared_buffers: str | None
    runs: list[FleetRun] = field(default_factory=list)

    def median(self, form: str) -> float:
        seconds = [r.seconds for r in self.runs if r.form == form]
        return statistics.median(seconds) if seconds else 0.0

    def ratio(self, form: str, base: str) -> float | None:
        """`form`'s median against `base`'s."""
        under = self.median(base)
        return self.median(form) / under if under else None

    @property
    def ratios(self) -> dict[str, float | None]:
        """Issue 20's two figures, and the four passes against the four DELETEs."""
        return {
            "fleet / 4 passes": self.ratio(FLEET, PASSES),
            "fleet / DELETE x4": self.ratio(FLEET, DELETES),
            "4 passes / DELETE x4": self.ratio(PASSES, DELETES),
        }

    def median_run(self, form: str) -> FleetRun | None:
        runs = sorted((r for r in self.runs if r.form == form), key=lambda r: r.seconds)
        return runs[(len(runs) - 1) // 2] if runs else None

    def worst_writer_p99(self, form: str) -> dict[int, float | None]:
        """Each database's writer p99 during `form`, the worst over its repeats."""
        worst: dict[int, float | None] = {}
        for run in (r for r in self.runs if r.form == form):
            for n, p99 in run.writer_p99_ms.items():
                if p99 is not None and (worst.get(n) is None or p99 > (worst[n] or 0.0)):
                    worst[n] = p99
                worst.setdefault(n, None)
        return worst


@dataclass
class _Shard:
    n: int
    bench: Bench
    name: str
    """The target's name."""


async def run_fleet(bench: Bench, scratch: Path, rows: int, fsync: bool) -> FleetResult:
    data = Dataset("idempotency", rows, rows // 2, "interleaved", live_after_ms=DAY_MS)
    async with (
        small_buffers_server(bench, scratch, fsync) as (admin_url, data_dir),
        await AsyncConnection.connect(admin_url, autocommit=True) as admin,
        scratch_databases(admin, admin_url, DATABASES, "f") as urls,
        _shards(bench, urls, data_dir) as shards,
    ):
        cur = await admin.execute("SELECT current_setting('shared_buffers')")
        row = await cur.fetchone()
        result = FleetResult(DATABASES, data.rows, data.expired, str(row[0]) if row else None)
        for shard in shards:
            started = time.perf_counter()
            await tables.build_template(shard.bench.conn, "public", TEMPLATE, data, bench.now_ms)
            log.info("fleet: db%d template in %.1f s", shard.n, time.perf_counter() - started)
        config = _config(urls)
        async with (
            temporal_dev_server(scratch) as (client, temporal_pid),
            config_worker(client, config),
        ):
            meter = CpuMeter()
            for name, pid in (("temporal", temporal_pid), ("postgres", postmaster_pid(data_dir))):
                if pid is not None:
                    meter.pids[name] = pid
            await _pass(client, config, [], bench.now_ms)  # warm-up: the worker's first pass
            for repeat in range(bench.repeat):
                for form in FORMS if repeat % 2 == 0 else tuple(reversed(FORMS)):
                    run = await _measure(client, config, shards, data, meter, form)
                    result.runs.append(run)
                    log.info(
                        "fleet: %s in %.3f s (writer p99 %s)",
                        run.form,
                        run.seconds,
                        ", ".join(f"db{n} {p:.1f} ms" for n, p in run.writer_p99_ms.items() if p),
                    )
        return result


@contextlib.asynccontextmanager
async def _shards(
    bench: Bench, urls: list[str], data_dir: Path | None
) -> AsyncIterator[list[_Shard]]:
    """A Bench on each database (public schema, its ledger found by default), closed after."""
    async with contextlib.AsyncExitStack() as stack:
        shards = []
        for n, url in enumerate(urls):
            conn = await stack.enter_async_context(
                await AsyncConnection.connect(url, autocommit=True)
            )
            here = replace(
                bench, url=url, schema="public", conn=conn, hand=None, prewarm=False,
                evict=True, data_dir=data_dir, all_runs=[],
            )  # fmt: skip
            shards.append(_Shard(n, here, f"fleet@db{n}"))
        yield shards


def _config(urls: list[str]) -> PurgeConfig:
    """As a user writes it: the first database the default one, the others named."""
    return fleet_config(
        urls[0],
        {f"db{n}": url for n, url in enumerate(urls) if n},
        [
            TargetEntry(
                f"fleet@db{n}", TABLE, "", database=f"db{n}" if n else "", kind="idempotency"
            )
            for n in range(len(urls))
        ],
        max_concurrent=DATABASES,
        max_per_database=1,
    )


async def _pass(client: Any, config: PurgeConfig, names: list[str], now_ms: int) -> dict[str, Any]:
    request = config.pass_input(names)
    report: dict[str, Any] = await client.execute_workflow(
        "Purge", request, id=f"bench-fleet-{uuid.uuid4().hex[:8]}", task_queue=config.task_queue
    )
    return report


async def _measure(
    client: Any,
    config: PurgeConfig,
    shards: list[_Shard],
    data: Dataset,
    meter: CpuMeter,
    form: str,
) -> FleetRun:
    """Fresh copies on the swept databases, settled as every bench copy is, then `form`: one
    pass over their targets, a pass over each started together, or one DELETE on each started
    together (what the server itself does with that much work); beside a writer on each."""
    for shard in shards:
        conn = shard.bench.conn
        await tables.make_copy(conn, "public", TEMPLATE, TABLE, data, prewarm=False)
        await conn.execute("TRUNCATE purge_progress")
    # One checkpoint for the server (it is server-wide), then none of the copies cached.
    await shards[0].bench.conn.execute("CHECKPOINT")
    for shard in shards:
        await tables.make_cold(shard.bench.conn, "public", TABLE, None)
    try:
        async with contextlib.AsyncExitStack() as stack:
            writers = [
                await stack.enter_async_context(running_writer(_writer_config(s, data)))
                for s in shards
            ]
            await asyncio.gather(*(w.go() for w in writers))
            # A DBA's DELETEs run in sessions already open, as a pass's sweeps do (the worker's
            # pools): their connections are made before the clock starts.
            sessions = (
                [
                    await stack.enter_async_context(
                        await AsyncConnection.connect(s.bench.url, autocommit=True)
                    )
                    for s in shards
                ]
                if form == DELETES
                else []
            )
            cpu = meter.snapshot()
            started = time.perf_counter()
            try:
                if form == DELETES:
                    report = await _deletes(shards, sessions, data)
                elif form == PASSES:
                    reports = await asyncio.gather(
                        *(_pass(client, config, [s.name], 0) for s in shards)
                    )
                    report = {"swept": [sweep for r in reports for sweep in r["swept"]]}
                else:
                    report = await _pass(client, config, [s.name for s in shards], 0)
            finally:
                seconds = time.perf_counter() - started
                spent = meter.since(cpu)
                # All stopped at once: stopped one after another, a later database's writer
                # would go on timing uncontended upserts after the pass, thinning its p99.
                runs: list[WriterRun] = list(await asyncio.gather(*(w.stop() for w in writers)))
        swept = {s["name"]: s for s in report["swept"]}
        left = lost = removed = 0
        for shard, writer in zip(shards, runs, strict=True):
            sweep = swept[shard.name]
            if sweep.get("status", "ok") != "ok":
                raise RuntimeError(f"{shard.name}: {sweep}")
            removed += int(sweep["removed"])
            conn = shard.bench.conn
            left += await tables.count_expired(conn, "public", TABLE, data, shard.bench.now_ms)
            lost += await tables.count_missing(conn, "public", TABLE, writer.renewed)
        return FleetRun(
            form=form,
            seconds=seconds,
            removed=removed,
            left=left,
            lost=lost,
            writer_p99_ms={
                s.n: percentile(w.latencies_ms, 0.99) for s, w in zip(shards, runs, strict=True)
            },
            writer_ops={s.n: len(w.latencies_ms) for s, w in zip(shards, runs, strict=True)},
            activity_seconds={s.n: float(swept[s.name].get("seconds") or 0) for s in shards},
            cpu=spent,
        )
    finally:
        for shard in shards:
            await tables.drop_table(shard.bench.conn, "public", TABLE)


async def _deletes(
    shards: list[_Shard], sessions: list[AsyncConnection[Any]], data: Dataset
) -> dict[str, Any]:
    """One DELETE of the expired rows on each database at once, each in its own open session
    (`sessions`, one a shard), reported as a pass reports its targets."""

    async def one(shard: _Shard, conn: AsyncConnection[Any]) -> dict[str, Any]:
        started = time.perf_counter()
        cur = await conn.execute(
            sql.SQL("DELETE FROM {} WHERE {}").format(sql.Identifier(TABLE), data.predicate()),
            {"now_ms": shard.bench.now_ms},
        )
        seconds = time.perf_counter() - started
        return {"name": shard.name, "removed": cur.rowcount, "seconds": seconds}

    together = (one(s, c) for s, c in zip(shards, sessions, strict=True))
    return {"swept": list(await asyncio.gather(*together))}


def _writer_config(shard: _Shard, data: Dataset) -> WriterConfig:
    return WriterConfig(
        url=shard.bench.url,
        schema="public",
        table=TABLE,
        kind=data.kind,
        rows=data.rows,
        expired=data.expired,
        layout=data.layout,
        now_ms=shard.bench.now_ms,
        rate=shard.bench.writer_rate,
        seed=shard.bench.seed + shard.n,
    )


def fleet_table(result: FleetResult) -> str:
    """The medians per form, the writers and the CPU each process spent."""
    from bench.report import render_table  # the report imports this module's types

    header = (
        ("pass", "<"),
        ("runs s", "<"),
        ("median s", ">"),
        ("x 4 passes", ">"),
        ("x DELETE x4", ">"),
        ("activities s (median run)", "<"),
        ("writer p99 ms (worst run)", "<"),
        ("writer ops (median run)", "<"),
        ("CPU s: bench, temporal, postgres (median run)", "<"),
        ("left", ">"),
        ("renewed lost", ">"),
    )
    rows = []
    for form in FORMS:
        runs = [r for r in result.runs if r.form == form]
        middle = result.median_run(form)
        if middle is None:
            continue
        median = result.median(form)
        passes, deletes = result.ratio(form, PASSES), result.ratio(form, DELETES)
        rows.append(
            [
                form,
                ", ".join(f"{r.seconds:.3f}" for r in runs),
                f"{median:.3f}",
                "-" if passes is None else f"{passes:.2f}",
                "-" if deletes is None else f"{deletes:.2f}",
                ", ".join(f"db{n} {s:.3f}" for n, s in middle.activity_seconds.items()),
                ", ".join(
                    f"db{n} {'-' if p is None else f'{p:.1f}'}"
                    for n, p in result.worst_writer_p99(form).items()
                ),
                ", ".join(f"db{n} {o}" for n, o in middle.writer_ops.items()),
                ", ".join(
                    f"{middle.cpu[k]:.2f}" if k in middle.cpu else "-"
                    for k in ("bench", "temporal", "postgres")
                ),
                str(max(r.left for r in runs)),
                str(sum(r.lost for r in runs)),
            ]
        )
    return render_table(header, rows)


def fleet_targets(result: FleetResult) -> list[str]:
    """Issue 20's goals for the fleet pass."""
    lines = []
    passes, deletes = result.ratio(FLEET, PASSES), result.ratio(FLEET, DELETES)
    if passes is not None:
        verdict = "met" if passes <= 1.1 else "NOT met"
        lines.append(
            f"{verdict:7} fleet: one pass over {result.databases} databases vs {result.databases}"
            f" passes started together: {passes:.2f}x (target <= 1.1x)"
        )
    if deletes is not None:
        verdict = "met" if deletes < 1 else "NOT met"
        lines.append(
            f"{verdict:7} fleet: one pass over {result.databases} databases vs {result.databases}"
            f" DELETEs started together: {deletes:.2f}x (target < 1x)"
        )
    both = result.ratio(PASSES, DELETES)
    if both is not None:
        lines.append(
            f"info    fleet: {result.databases} passes vs {result.databases} DELETEs, both"
            f" started together: {both:.2f}x"
        )
    for n, p99 in result.worst_writer_p99("fleet").items():
        if p99 is not None:
            verdict = "met" if p99 <= 10 else "NOT met"
            lines.append(
                f"{verdict:7} fleet: db{n} writer p99 during the pass: {p99:.2f} ms (<= 10 ms)"
            )
    return lines
