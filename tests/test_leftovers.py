"""What a sweep leaves and what it cost, where an operator reads it: the result entry, the
report table, `report --json`, and the gauges and counters an alert fires on."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool
from temporalio.client import Client

import worker
from activities import builtin_kinds as kinds
from activities import sweep as sweep_module
from activities.engine import batching, partition_advice
from activities.engine import leftover as leftover_module
from activities.inputs import PurgeStep
from activities.registry import TargetRegistry
from activities.results import PurgeReport, PurgeSweep
from activities.sweep import PurgeActivities
from purge_config import parse_config
from purge_config.settings import SweepSettings
from purge_ops.connect import connect_temporal, open_pool
from purge_ops.passes import PassSummary, passes_table
from purge_ops.ports import free_ports
from purge_ops.render import report_table
from purge_ops.runner import new_worker
from tests.conftest import Harness
from tests.support.activity import activity_env
from tests.support.pace import (
    HandClock,
    budget_clock,
    cut_short_at,
    fixed_batches,
    unhurried_whole_batch,
)
from tests.support.passes import listed, run_pass
from tests.support.procs import worker_config
from tests.support.rows import HOUR, PAST_NOW
from tests.support.servers import RunningTemporal
from tests.test_fleet import hold_table_lock

NOW = PAST_NOW


def fill(db: psycopg.Connection[Any], table: str, rows: int, expired_every: int, now: int) -> int:
    db.execute(
        f"INSERT INTO {table} (key, expires_at_ms)"
        " SELECT 'k' || i, CASE WHEN i %% %s = 0 THEN %s ELSE %s END"
        " FROM generate_series(0, %s - 1) i",
        (expired_every, now - HOUR, now + HOUR, rows),
    )
    db.execute(f"VACUUM ANALYZE {table}")
    return len(range(0, rows, expired_every))


def sweep_of(pool: AsyncConnectionPool[Any], **settings: Any) -> Any:
    [spec] = parse_config({"sweep": settings, "targets": [{"kind": "idempotency"}]}, env={}).targets
    activities = PurgeActivities(TargetRegistry([kinds.idempotency(pool, settings=spec.settings)]))
    return activity_env().run(activities.purge_target, PurgeStep(name="x_idempotency", now_ms=NOW))


async def test_a_large_share_removed_gets_vacuum_advice_and_the_dead_share(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], caplog: pytest.LogCaptureFixture
) -> None:
    expired = fill(db, "x_idempotency", 10_000, 2, NOW)

    with caplog.at_level(logging.WARNING):
        result: PurgeSweep = await sweep_of(pool)

    assert result.removed == expired
    # Half the tuples are now dead, as the statistics views count them once flushed.
    assert result.dead_tuple_share is not None
    assert 0.4 <= result.dead_tuple_share <= 0.6, result.dead_tuple_share
    assert result.oldest_expired_age_s == 0  # a finished sweep leaves none
    assert "removed 5,000 rows (50% of the table)" in result.advice
    assert "VACUUM (ANALYZE) x_idempotency" in result.advice
    # Half the table a pass: the defaults (0.2 for VACUUM, 0.1 for ANALYZE) already run after
    # each, so no setting is advised (0.2 for ANALYZE would have run it less often).
    assert "scale_factor" not in result.advice
    assert result.advice.endswith(
        "(at this rate autovacuum's default settings already run after every pass)"
    )
    assert any("VACUUM (ANALYZE)" in r.getMessage() for r in caplog.records)
    assert not result.analyzed


async def test_a_share_the_defaults_would_not_keep_up_with_gets_the_factor_that_would(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    """A seventh of the table a pass (1,429 rows of 10,000; 8,571 live left): half of that share
    of the live rows, 0.08, under both defaults."""
    expired = fill(db, "x_idempotency", 10_000, 7, NOW)

    result: PurgeSweep = await sweep_of(pool)

    assert result.removed == expired == 1_429
    assert result.advice.endswith(
        "keep up at this rate with ALTER TABLE x_idempotency SET "
        "(autovacuum_vacuum_scale_factor = 0.08, autovacuum_analyze_scale_factor = 0.08)"
    ), result.advice


async def test_a_small_share_gets_no_advice(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    """5% of the table, 2,000 rows: past ADVICE_MIN_ROWS, so only the share keeps the advice
    out."""
    assert fill(db, "x_idempotency", 40_000, 20, NOW) == 2_000  # 5%

    result: PurgeSweep = await sweep_of(pool, analyze_after=True)

    assert "VACUUM" not in result.advice
    assert not result.analyzed  # under a tenth of the table: statistics still good


def last_analyzed(db: psycopg.Connection[Any]) -> Any:
    db.execute("SELECT pg_stat_clear_snapshot()")
    row = db.execute(
        "SELECT last_analyze FROM pg_stat_all_tables WHERE relid = 'x_idempotency'::regclass"
    ).fetchone()
    return row[0] if row else None


async def test_analyze_after_refreshes_the_statistics_of_a_table_it_removed_much_of(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    fill(db, "x_idempotency", 10_000, 2, NOW)
    before = last_analyzed(db)

    result: PurgeSweep = await sweep_of(pool, analyze_after=True)

    assert result.analyzed
    after = last_analyzed(db)
    assert after is not None
    assert before is None or after > before
    reltuples = db.execute(
        "SELECT reltuples FROM pg_class WHERE oid = 'x_idempotency'::regclass"
    ).fetchone()
    assert reltuples == (5_000,)  # the planner now knows what is left


async def test_analyze_after_without_the_privilege_warns_once_and_sweeps(
    db: psycopg.Connection[Any], schema_url: str, role: str
) -> None:
    fill(db, "x_idempotency", 10_000, 2, NOW)
    db.execute(f'GRANT SELECT, DELETE ON x_idempotency TO "{role}"')
    before = last_analyzed(db)
    pool = await open_pool(make_conninfo(schema_url, user=role))
    try:
        result: PurgeSweep = await sweep_of(pool, analyze_after=True)
    finally:
        await pool.close()

    assert result.removed == 5_000
    assert not result.analyzed
    assert result.advice.count("may not ANALYZE") == 1
    assert "GRANT MAINTAIN ON x_idempotency" in result.advice
    assert last_analyzed(db) == before


def test_the_report_table_marks_a_short_count_and_says_why() -> None:
    report = PurgeReport(
        swept=[
            PurgeSweep(name="a", removed=7, batches=2, strategy="index", lower_bound=True,
                       backlog=3, oldest_expired_age_s=5400.0, dead_tuple_share=0.25),
            PurgeSweep(name="b", removed=4, batches=1),
        ],
        removed=11,
        now_ms=NOW,
    )  # fmt: skip

    text = report_table(report)

    assert re.search(r"^a\s+>=7\s.*\s3\s+1 h 30 min\s+25%\s+out of time$", text, re.M), text
    assert re.search(r"^b\s+4\s", text, re.M)
    assert re.search(r"^total\s+>=11$", text, re.M)
    assert "lower bound" in text.splitlines()[-1]

    summary = PassSummary("purge-1", datetime.now(UTC), 1.0, "completed", report)
    summary.removed = {"a": ">=7", "b": "4"}
    listing = passes_table([summary], ["a", "b"])
    assert re.search(r"^a\s+>=7\s+\S+\s+3\s+1 h 30 min\s+25%\s+lower bound$", listing, re.M)
    assert "lower bound: a worker died" in listing


@pytest.fixture
def main_env(monkeypatch: pytest.MonkeyPatch, temporal_server: RunningTemporal) -> Iterator[None]:
    """`worker.main` in this process against the test's Temporal, its logging undone after."""
    monkeypatch.setenv("TEMPORAL_ADDRESS", temporal_server.address)
    handlers, level = logging.getLogger().handlers[:], logging.getLogger().level
    yield
    logging.getLogger().handlers[:] = handlers
    logging.getLogger().setLevel(level)


async def test_report_json_and_the_last_sweep_of_each_target(
    tmp_path: Any,
    harness: Harness,
    main_env: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fill(harness.db, "x_idempotency", 100, 4, harness.now_ms)
    async with harness.run_worker([kinds.idempotency(harness.pool), kinds.auth(harness.pool)]):
        await run_pass(harness.client, harness.task_queue, {"targets": ["x_idempotency", "x_auth"]})
    config = worker_config(
        tmp_path / "purge.toml",
        harness.url,
        harness.task_queue,
        '[[targets]]\nkind = "idempotency"\n\n[[targets]]\nkind = "auth"\n',
    )
    await listed(harness.client, f'TaskQueue = "{harness.task_queue}"')  # what `report` reads

    status = await asyncio.to_thread(worker.main, ["report", "--config", str(config), "--json"])
    out = capsys.readouterr().out
    status_table = await asyncio.to_thread(worker.main, ["report", "--config", str(config)])
    listing = capsys.readouterr().out

    assert (status, status_table) == (0, 0)
    [one] = json.loads(out)
    assert one["status"] == "completed"
    idem, auth = one["report"]["swept"]
    assert (idem["name"], idem["removed"], idem["lower_bound"]) == ("x_idempotency", 25, False)
    assert {"oldest_expired_age_s", "dead_tuple_share", "backlog", "analyzed"} <= set(idem)
    assert auth["removed"] == 0
    assert re.search(r"^x_idempotency\s+25\s+\w+\s+0\s+0\s+\d+%\s+exact$", listing, re.M), listing


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
        text = page.read().decode()
    return {
        f"{m.group(1)}{{{m.group(2)}}}": float(m.group(3))
        for m in re.finditer(r'^(purge_\w+)\{[^}]*target="([^"]+)"[^}]*\} (\S+)$', text, re.M)
    }


async def pass_out_of_time_at_k0(
    harness: Harness, client: Client, request: dict[str, Any], clock: HandClock
) -> dict[str, Any]:
    """The result of a pass of `request` whose x_idempotency sweep runs out of time once its
    first batch, held at row k0, commits (`cut_short_at`)."""
    return await cut_short_at(
        harness.db,
        harness.url,
        "x_idempotency",
        "k0",
        clock,
        lambda: run_pass(client, harness.task_queue, request),
    )


@pytest.mark.waits
async def test_gauges_after_a_pass_that_ran_out_of_budget_and_a_failure_counter(
    temporal_server: RunningTemporal,
    harness: Harness,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The config's smallest budget (1s), spent while the sweep's first batch waits on a row:
    the pass ends with a backlog, and the gauges say how many rows are left and how long the
    oldest has waited at the sweep's end (here ten minutes after the pass's instant, as a
    sweep that ran to its time budget: the alert rules add only the time since that end); a
    target that fails counts once in purge_target_failures."""
    expired = fill(harness.db, "x_idempotency", 20_000, 10, harness.now_ms)
    clock = budget_clock(monkeypatch)
    monkeypatch.setattr(sweep_module, "_wall_s", lambda: time.time() + 600)
    [spec] = parse_config(
        {"sweep": {"time_budget": "1s"}, "targets": [{"kind": "idempotency"}]}, env={}
    ).targets
    [port] = free_ports(1)
    metered = await connect_temporal(temporal_server.address, metrics=f"127.0.0.1:{port}")
    registry = TargetRegistry([kinds.idempotency(harness.pool, settings=spec.settings)])
    request = {"targets": ["x_idempotency", "nowhere"]}
    async with new_worker(metered, registry, harness.task_queue):
        with pytest.raises(Exception, match="failed"):
            await pass_out_of_time_at_k0(harness, metered, request, clock)
    metrics = scrape(port)

    left = harness.db.execute(
        "SELECT count(*) FROM x_idempotency WHERE expires_at_ms <= %s", (harness.now_ms,)
    )
    backlog = int(left.fetchone()[0])  # type: ignore[index]
    assert 0 < backlog < expired
    assert metrics["purge_backlog_rows{x_idempotency}"] == backlog
    # Rows written an hour before the pass's instant, the sweep ended ten minutes after it.
    age = metrics["purge_oldest_expired_age_seconds{x_idempotency}"]
    assert 3_600 + 600 <= age <= 3_600 + 600 + 120, age
    assert metrics["purge_rows_removed{x_idempotency}"] == expired - backlog
    assert metrics["purge_target_failures{nowhere}"] == 1
    # Served from the target's first pass on, at 0 until it fails (for the alert rules).
    assert metrics["purge_target_failures{x_idempotency}"] == 0


@pytest.mark.waits
async def test_a_busy_sweep_leaves_the_backlog_gauges_as_the_last_sweep_set_them(
    temporal_server: RunningTemporal, harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep that finds its table held by another sweep measured nothing: it must not set
    the backlog to 0 and the oldest expired row's age to 0, clearing an alert that fires on
    what the last real sweep left."""
    expired = fill(harness.db, "x_idempotency", 20_000, 10, harness.now_ms)  # by index
    [port] = free_ports(1)
    metered = await connect_temporal(temporal_server.address, metrics=f"127.0.0.1:{port}")
    patient = SweepSettings(busy_wait_ms=200)
    registry = TargetRegistry([kinds.idempotency(harness.pool, settings=patient)])
    clock = budget_clock(monkeypatch)
    request = {"targets": ["x_idempotency"], "max_concurrent": 1, "budget_ms": 60_000}
    async with new_worker(metered, registry, harness.task_queue):
        # Cut short by the pass's budget at its first batch, so it leaves a backlog the gauges
        # report.
        [cut_short] = (await pass_out_of_time_at_k0(harness, metered, request, clock))["swept"]
        after_sweep = scrape(port)
        with psycopg.connect(harness.url, autocommit=True) as other:
            hold_table_lock(other, "x_idempotency")
            [busy] = (await run_pass(metered, harness.task_queue, request))["swept"]
        after_busy = scrape(port)

    assert 0 < cut_short["backlog"] < expired, cut_short
    assert busy["status"] == "busy"
    gauges = (
        "purge_backlog_rows{x_idempotency}",
        "purge_oldest_expired_age_seconds{x_idempotency}",
    )
    assert after_sweep[gauges[0]] == cut_short["backlog"]
    assert after_sweep[gauges[1]] >= 3_600  # rows expired an hour before the pass's instant
    assert [after_busy[g] for g in gauges] == [after_sweep[g] for g in gauges]


async def test_analyze_after_behind_a_held_lock_warns_and_sweeps(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], schema_url: str
) -> None:
    """A session holds SHARE UPDATE EXCLUSIVE on the table for the whole sweep (as a manual
    VACUUM or an anti-wraparound autovacuum would): the batches do not conflict with it, the
    ANALYZE after them does. The sweep ends ok with its rows counted, not analyzed, and says
    why, once; it does not fail after its rows are gone."""
    fill(db, "x_idempotency", 10_000, 2, NOW)
    with psycopg.connect(schema_url) as holder:
        holder.execute("LOCK TABLE x_idempotency IN SHARE UPDATE EXCLUSIVE MODE")
        result: PurgeSweep = await sweep_of(pool, analyze_after=True)

    assert (result.status, result.removed) == ("ok", 5_000)
    assert not result.analyzed
    assert result.advice.count("not analyzed") == 1


async def test_analyze_after_that_runs_past_statement_timeout_warns_and_sweeps(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    """ANALYZE made slow for certain: an expression index whose function, replaced once the
    index is built, sleeps 10 ms on each row ANALYZE samples (the sweep's DELETEs never call
    it): 50 s for the 5,000 rows left. ANALYZE runs past a statement_timeout of a second and is
    cancelled; the sweep ends ok with its rows counted, not analyzed, and says why, once. (A
    second, not less: the sweep's own reads and batches run under it too, and must not meet it
    on a slow machine.)"""
    fill(db, "x_idempotency", 10_000, 2, NOW)
    db.execute("CREATE FUNCTION slow_key(k text) RETURNS text IMMUTABLE LANGUAGE sql AS 'SELECT k'")
    db.execute("CREATE INDEX ON x_idempotency (slow_key(key))")
    db.execute(
        "CREATE OR REPLACE FUNCTION slow_key(k text) RETURNS text IMMUTABLE LANGUAGE plpgsql "
        "AS $$ BEGIN PERFORM pg_sleep(0.01); RETURN k; END $$"
    )
    result: PurgeSweep = await sweep_of(
        pool, analyze_after=True, batch_target="10ms", statement_timeout="1s"
    )

    assert (result.status, result.removed) == ("ok", 5_000)
    assert not result.analyzed
    assert result.advice.count("not analyzed") == 1
    assert (
        "x_idempotency: not analyzed after the sweep: ANALYZE ran past statement_timeout "
        "(1000 ms); statistics left as they were"
    ) in result.advice


@pytest.mark.parametrize("ends", ["cut short", "emptied", "large share"])
async def test_reads_after_a_sweep_behind_a_table_held_by_ddl_fall_back_and_the_sweep_stands(
    db: psycopg.Connection[Any],
    pool: AsyncConnectionPool[Any],
    schema_url: str,
    monkeypatch: pytest.MonkeyPatch,
    ends: str,
) -> None:
    """Another session takes ACCESS EXCLUSIVE on the table (DDL, a VACUUM FULL) right after the
    sweep's last batch commits. Each read the sweep's end makes of the table waits for it and
    gives up at its lock timeout: the sweep ends with its rows counted exactly, and each read
    falls back (it never fails a sweep whose rows are gone, whose retry would remove nothing):
    - `cut short`, out of time with expired rows left, under a lock_timeout shorter than the
      count's own limit: the backlog is the plan's estimate, the oldest row's age unknown;
    - `emptied`: the views say no row is left, and the read of one row that would confirm it
      gives up: the live rows are not taken as 0;
    - `large share`: the partition advice comes without the rows-a-day its read would add."""
    monkeypatch.setattr(leftover_module, "READ_TIMEOUT_MS", 400)
    monkeypatch.setattr(partition_advice, "PARTITION_ADVICE_ROWS", 100)
    expired = {"cut short": (2_000, 10), "emptied": (300, 1), "large share": (600, 2)}
    rows, every = expired[ends]
    removable = fill(db, "x_idempotency", rows, every, NOW)
    # Cut short: 200 rows share one key, more than a batch (and than three first batches, which
    # the first batch would take at once): walked, 50 a batch.
    batch = 50 if ends == "cut short" else 1_000
    fixed_batches(monkeypatch, rows=batch)
    # A budget no machine spends on its own; `cut short` spends it by hand after its first batch.
    settings = SweepSettings(time_budget_ms=60_000, lock_timeout_ms=100)
    clock = budget_clock(monkeypatch)
    holder = psycopg.connect(schema_url)  # not autocommit: its lock stays until it commits
    holder.execute("SET lock_timeout = '5s'")  # a hook inside a batch would fail, not hang

    def hold_after_the_first_batch(progress: Any) -> None:
        if progress.batches == 1:  # committed; for all but `cut short`, the last
            holder.execute("LOCK TABLE x_idempotency IN ACCESS EXCLUSIVE MODE")
            if ends == "cut short":
                clock.spend(3_600)

    try:
        stats = await kinds.idempotency(pool, settings=settings).sweep(
            NOW, on_batch=hold_after_the_first_batch
        )
    finally:
        holder.close()

    left = db.execute(
        "SELECT count(*) FROM x_idempotency WHERE expires_at_ms <= %s", (NOW,)
    ).fetchone()
    if ends == "cut short":
        assert (stats.removed, stats.complete) == (batch, False)
        assert left == (removable - batch,)
        assert stats.backlog_estimated is True
        assert stats.oldest_expired_age_ms is None
    else:
        assert (stats.removed, stats.complete, left) == (removable, True, (0,))
    if ends == "emptied":
        assert stats.live_from != "stats"  # a read that gave up is not an empty table
    if ends == "large share":
        [advice] = [line for line in stats.advice if "partition it by RANGE" in line]
        assert "rows a day" not in advice


@pytest.mark.parametrize(
    ("expired", "first", "last"),
    [
        (3_000, "run_key_batch", "run_key_rest"),
        (300, "run_key_whole", "run_key_whole"),
        (300, "run_key_batch", "run_key_batch"),
    ],
    ids=["the rest", "a first batch that took every row", "a batch that read its boundary"],
)
async def test_the_views_count_every_row_a_sweep_removed_with_no_flush_after_its_last_batch(
    db: psycopg.Connection[Any],
    pool: AsyncConnectionPool[Any],
    monkeypatch: pytest.MonkeyPatch,
    expired: int,
    first: str,
    last: str,
) -> None:
    """A keyset sweep's last batch asks for the session's statistics to be flushed as it
    commits: the rest (3,000 expired rows, batches of 500), a first batch that takes every
    expired row (300, as the planner expects), or a batch whose boundary read found fewer than
    a batch left (300, where the planner expected more than three first batches). The read of
    what the sweep left then sends no flush of its own, and the live and dead tuples it reports
    still count every row the sweep removed, the last batch's too (read in the same second as
    the batches, before PostgreSQL would flush them itself)."""
    db.execute(
        "INSERT INTO x_idempotency (key, expires_at_ms)"
        " SELECT 'k' || i, %s + i FROM generate_series(0, 9999) i",
        (NOW - expired + 1,),
    )  # in expiry order: `expired` of them (up to NOW), the first in the heap
    db.execute("VACUUM ANALYZE x_idempotency")
    fixed_batches(monkeypatch, rows=500)
    unhurried_whole_batch(monkeypatch)
    if first == "run_key_batch" and last == "run_key_batch":
        monkeypatch.setattr(batching, "fits_first_batch", lambda plan, rows: False)
    kinds_run: list[str] = []
    for name in ("run_key_batch", "run_key_span", "run_key_rest", "run_key_whole"):
        monkeypatch.setattr(batching, name, counted(kinds_run, name, getattr(batching, name)))
    flushes: list[str] = []
    monkeypatch.setattr(
        leftover_module,
        "flush_statistics",
        counted(flushes, "flush", leftover_module.flush_statistics, wait=False),
    )

    stats = await kinds.idempotency(pool).sweep(NOW)

    assert stats.removed == expired
    assert (kinds_run[0], kinds_run[-1]) == (first, last), kinds_run
    assert flushes == []  # the read after the sweep sent no flush of its own
    assert (stats.live_rows, stats.dead_rows, stats.live_from) == (
        10_000 - expired,
        expired,
        "stats",
    )


def counted(ran: list[str], name: str, run: Any, wait: bool = True) -> Any:
    """`run` (a coroutine function, or a plain one without `wait`), noting `name` in `ran`
    each time it is called."""

    async def noted(*args: Any, **kwargs: Any) -> Any:
        ran.append(name)
        return await run(*args, **kwargs)

    def noted_now(*args: Any, **kwargs: Any) -> Any:
        ran.append(name)
        return run(*args, **kwargs)

    return noted if wait else noted_now
