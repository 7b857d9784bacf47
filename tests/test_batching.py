"""Batched deletes on the real server: the strategy each table gets, batches resized towards their
target, a retried attempt resuming from its heartbeat, the time budget, cancellation between
batches, renewed rows never deleted, and the advice to create a missing index."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import random
import re
import threading
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import psycopg
import pytest
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.testing import ActivityEnvironment

from activities import builtin_kinds as kinds
from activities.engine import batching
from activities.inputs import PurgeStep
from activities.registry import TargetRegistry
from activities.results import PurgeReport, PurgeSweep
from activities.sweep import PurgeActivities
from purge_config import parse_config
from purge_config.names import TableName
from purge_config.settings import SweepSettings
from purge_ops.connect import open_pool
from purge_ops.render import ESTIMATED_BACKLOG_NOTE, report_table
from tests.support.activity import activity_env
from tests.support.late_results import results_late
from tests.support.pace import (
    budget_clock,
    cut_short_at,
    durable_every,
    durations_as_measured,
    fixed_batches,
    unhurried_whole_batch,
    until_a_sweep_waits,
)
from tests.support.plans import batch_plan_nodes
from tests.support.rows import HOUR, PAST_NOW, keys

NOW = PAST_NOW
#: Batches of about a millisecond: many batches from a small table, so that resuming,
#: cancelling and renewing all happen between batches, not around one.
TINY = SweepSettings(batch_target_ms=1)


def fill_idempotency(db: psycopg.Connection[Any], rows: int, expired_every: int) -> int:
    """`rows` keys k0.., every `expired_every`-th expired (interleaved); returns how many."""
    db.execute(
        "INSERT INTO x_idempotency (key, response, expires_at_ms)"
        " SELECT 'k' || i, '{\"status\": 200}', CASE WHEN i %% %s = 0 THEN %s ELSE %s END"
        " FROM generate_series(0, %s - 1) i",
        (expired_every, NOW - HOUR, NOW + HOUR, rows),
    )
    return len(range(0, rows, expired_every))


def analyze(db: psycopg.Connection[Any], table: str) -> None:
    db.execute(f"VACUUM ANALYZE {table}")


def expired_left(db: psycopg.Connection[Any]) -> int:
    """x_idempotency's rows still expired at NOW."""
    row = db.execute("SELECT count(*) FROM x_idempotency WHERE expires_at_ms <= %s", (NOW,))
    return int(row.fetchone()[0])  # type: ignore[index]


async def test_small_indexed_share_goes_by_index_and_large_share_walks(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    fill_idempotency(db, 20_000, expired_every=100)  # 1%
    analyze(db, "x_idempotency")
    small = await kinds.idempotency(pool).sweep(NOW)

    db.execute("UPDATE x_idempotency SET expires_at_ms = %s WHERE random() < 0.5", (NOW - 1,))
    analyze(db, "x_idempotency")
    live = keys(db, "x_idempotency") - {
        r[0] for r in db.execute("SELECT key FROM x_idempotency WHERE expires_at_ms <= %s", (NOW,))
    }
    large = await kinds.idempotency(pool).sweep(NOW)

    db.execute("CREATE TABLE plain (key text, expires_at_ms bigint)")  # no index at all
    db.execute("INSERT INTO plain SELECT 'p' || i, %s FROM generate_series(1, 50) i", (NOW - 1,))
    unindexed = await kinds.expiring(pool, "plain", TableName("plain"), "expires_at_ms").sweep(NOW)

    assert (small.strategy, small.removed) == ("index", 200)
    assert large.strategy == "range"
    assert large.removed > 5_000
    assert (unindexed.strategy, unindexed.removed) == ("range", 50)
    assert keys(db, "x_idempotency") == live


class Enough(Exception):
    """Raised from a sweep's on_batch to stop it once a test has seen the batches it needs."""


async def first_walk_batches(pool: AsyncConnectionPool[Any], settings: SweepSettings) -> list[int]:
    """The pages of a walk's first two batches of x_idempotency, the sweep stopped after them."""
    ends: list[int] = []

    def on_batch(progress: Any) -> None:
        ends.append(progress.page)
        if len(ends) == 2:
            raise Enough

    with pytest.raises(Enough):
        await kinds.idempotency(pool, settings=settings).sweep(NOW, on_batch=on_batch)
    return [end - start for start, end in itertools.pairwise([0, *ends])]


async def test_a_batch_quicker_than_its_target_grows_the_next_and_a_slower_one_shrinks_it(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sizing by duration, in the direction of the target: under a 10 s target (far longer than
    any batch takes) the second batch of a walk is larger than the first; when every DELETE
    takes 60 ms or more (a statement trigger sleeps) against a 1 ms target, it is smaller. The
    direction of a resize, not a count of batches: how many a table takes is the machine's.
    Durations as measured under any PURGE_TEST_PACE: scaled fifty times, a slow machine's first
    batch could pass the 10 s target, and a 60 ms sleep come within twice the 1 ms one."""
    durations_as_measured(monkeypatch)
    durable_every(monkeypatch, 1)  # every batch reported as it commits
    fill_idempotency(db, 40_000, expired_every=2)
    analyze(db, "x_idempotency")
    grown = await first_walk_batches(pool, SweepSettings(batch_target_ms=10_000))
    db.execute(
        "CREATE FUNCTION slow_statement() RETURNS trigger LANGUAGE plpgsql AS"
        " $$BEGIN PERFORM pg_sleep(0.06); RETURN NULL; END$$"
    )
    db.execute(
        "CREATE TRIGGER slow AFTER DELETE ON x_idempotency"
        " FOR EACH STATEMENT EXECUTE FUNCTION slow_statement()"
    )
    shrunk = await first_walk_batches(pool, SweepSettings(batch_target_ms=1))

    assert grown[1] > grown[0], grown
    assert shrunk[1] < shrunk[0], shrunk


async def test_an_index_sweep_of_rows_in_expiry_order_starts_with_a_large_first_batch(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows in expiry order (a fixed TTL's table) lie together, so the first index batch takes
    as many as fill a bounded number of heap pages: 3,000 expired of 30,000 go in one batch.
    The same rows in no order get the small first batch (each may be on a page of its own)."""

    def fill(order: str) -> None:
        db.execute("TRUNCATE x_idempotency")
        db.execute(
            "INSERT INTO x_idempotency (key, response, expires_at_ms)"
            " SELECT 'k' || i, '{}', %s + i * 100 FROM generate_series(0, 29_999) i"
            f" ORDER BY {order}",
            (NOW - 3_000 * 100 + 1,),  # k0..k2999 expired
        )
        analyze(db, "x_idempotency")

    unhurried_whole_batch(monkeypatch)
    fill("i")
    ordered = await kinds.idempotency(pool).sweep(NOW)
    fill("random()")
    scattered = await kinds.idempotency(pool).sweep(NOW)

    assert ordered.strategy == scattered.strategy == "index"
    assert ordered.removed == scattered.removed == 3_000
    assert ordered.batches == 1  # from 500 rows it would have taken 3 (500, 2,000, the rest)
    assert scattered.batches >= 2


async def test_keyset_batches_split_a_run_of_equal_keys_and_keep_every_live_row(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Index batches go by key ranges of the expiry column; a run of equal keys longer than a
    batch cannot be split by a range, so it goes a batch at a time by ctid. 6,000 rows share
    the cutoff instant itself (expired: expiry is inclusive), 2,000 lie before it and 2,000
    after: every expired row goes, no live one, and no batch takes more rows than it asked
    for (a batch deleting every row of the run at once would take 6,000)."""
    fixed_batches(monkeypatch, rows=500)  # a batch grown past 6,000 rows takes the run whole
    db.execute(
        "INSERT INTO x_idempotency (key, response, expires_at_ms)"
        " SELECT 'k' || i, '{}', CASE WHEN i < 2000 THEN %s - 2000 + i"
        " WHEN i < 8000 THEN %s ELSE %s + i END FROM generate_series(0, 9999) i",
        (NOW, NOW, NOW),
    )
    # A share below a fifth, so the index serves (the plan's choice, asserted below).
    db.execute(
        "INSERT INTO x_idempotency (key, response, expires_at_ms)"
        " SELECT 'live' || i, '{}', %s + 1 + i FROM generate_series(0, 49999) i",
        (NOW,),
    )
    analyze(db, "x_idempotency")
    batches: list[tuple[int, int]] = []
    target = kinds.idempotency(pool, settings=SweepSettings(batch_target_ms=1))
    stats = await target.sweep(NOW, on_batch=lambda p: batches.append((p.batch_removed, p.batches)))

    assert (stats.strategy, stats.removed) == ("index", 8_000)
    assert db.execute(
        "SELECT count(*) FROM x_idempotency WHERE expires_at_ms <= %s", (NOW,)
    ).fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM x_idempotency").fetchone() == (52_000,)
    assert stats.batches == len(batches) >= 8_000 // 500
    assert max(removed for removed, _ in batches) == 500


@pytest.mark.parametrize("analyzed", [False, True], ids=["never-analyzed", "analyzed"])
async def test_a_run_of_one_key_longer_than_a_batch_is_read_from_the_index_in_order(
    db: psycopg.Connection[Any], schema_url: str, analyzed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every row of a 10,000-row run shares one expiry: the tie batches take them by ctid, each
    batch's rows read from the expiry index in order and the read stopped at the batch's count.
    The plan the batches ran (their prepared statement's generic plan, read back on the
    sweep's own connection) has neither a bitmap scan, which gathers the whole run for each
    batch (the planner's pick here, analyzed or not, without `tie_walk`; 400,000 rows of a
    never-analyzed table took 118 s so, against 3.2 s), nor a sequential scan, which reads
    again every page earlier batches emptied."""
    fixed_batches(monkeypatch, rows=500)
    db.execute("ALTER TABLE x_idempotency SET (autovacuum_enabled = off)")
    db.execute(
        "INSERT INTO x_idempotency (key, response, expires_at_ms)"
        " SELECT 'k' || i, '{}', %s FROM generate_series(1, 10000) i",
        (NOW - HOUR,),
    )
    # Live rows on few values, so the statistics (when there are any) see few distinct keys.
    db.execute(
        "INSERT INTO x_idempotency (key, response, expires_at_ms)"
        " SELECT 'l' || i, '{}', %s + (i %% 9) * 1000 FROM generate_series(1, 50000) i",
        (NOW + HOUR,),
    )
    if analyzed:
        db.execute("ANALYZE x_idempotency")
    one = await open_pool(schema_url, max_size=1)  # so the sweep's connection is the one read
    try:
        stats = await kinds.idempotency(one, settings=TINY).sweep(NOW)
        async with one.connection() as conn:
            nodes = await batch_plan_nodes(conn, "DELETE%ctid = ANY%", (NOW, NOW - HOUR, 500))
    finally:
        await one.close()

    assert (stats.strategy, stats.removed) == ("index", 10_000)
    assert stats.batches >= 10_000 // 500
    assert nodes & {"Index Scan", "Index Only Scan"}, nodes
    assert not nodes & {"Seq Scan", "Bitmap Heap Scan"}, nodes


async def test_keyset_batches_of_every_size_run_prepared_statements_by_their_generic_plan(
    db: psycopg.Connection[Any], schema_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches resized every time (a 1 ms target) read their boundary with one statement text,
    the batch's size a parameter, prepared at its first use and run by its generic plan, as is
    the DELETE: the size written into the text made each batch a statement planned anew, and
    planning a batch's boundary read probed the index over every entry earlier batches had
    deleted (docs/decisions/keyset-batches.md)."""
    # Each batch 250 rows larger than the last, whatever each took.
    monkeypatch.setattr(batching, "_resize", lambda size, *_: size + 250)
    db.execute(
        "INSERT INTO x_idempotency (key, response, expires_at_ms)"
        " SELECT 'k' || i, '{}', CASE WHEN i %% 10 = 0 THEN %s ELSE %s END"
        " FROM generate_series(0, 59_999) i ORDER BY random()",
        (NOW - HOUR, NOW + HOUR),
    )
    analyze(db, "x_idempotency")
    sizes: list[int] = []
    one = await open_pool(schema_url, max_size=1)  # so the sweep's connection is the one read
    try:
        target = kinds.idempotency(one)
        stats = await target.sweep(NOW, on_batch=lambda p: sizes.append(p.batch_removed))
        async with one.connection() as conn:
            cur = await conn.execute(
                "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
            )
            prepared = await cur.fetchall()
    finally:
        await one.close()

    assert (stats.strategy, stats.removed) == ("index", 6_000)
    assert len(set(sizes)) >= 3, sizes  # the batches did differ in size
    # The boundary reads: not the catalog's reads, also prepared (one has an OFFSET 0).
    bounds = [row for row in prepared if re.search(r"OFFSET \$\d+ LIMIT 1", row[0])]
    deletes = [row for row in prepared if row[0].startswith("DELETE")]
    # The first batch's (from the least key) and the others' (from where the last stopped).
    assert len(bounds) == 2, prepared
    assert sum(generic for _, generic, _ in bounds) == stats.batches, bounds
    assert deletes, prepared
    assert all(custom == 0 for _, _, custom in bounds + deletes), prepared


async def test_half_expired_table_in_expiry_order_goes_by_the_index_and_in_no_order_walks(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    """Half the rows expired is far above the share an index pays for when rows are spread
    (every page holds some), but in expiry order they fill the front half of the heap: keyset
    batches through the index read only those pages, a walk would read all of them."""

    def fill(order: str) -> None:
        db.execute("TRUNCATE x_idempotency")
        db.execute(
            "INSERT INTO x_idempotency (key, response, expires_at_ms)"
            " SELECT 'k' || i, '{}', %s + i FROM generate_series(0, 19_999) i"
            f" ORDER BY {order}",
            (NOW - 9_999,),  # k0..k9999 expired
        )
        analyze(db, "x_idempotency")

    fill("i")
    ordered = await kinds.idempotency(pool).sweep(NOW)
    left_ordered = keys(db, "x_idempotency")
    fill("random()")
    scattered = await kinds.idempotency(pool).sweep(NOW)

    assert (ordered.strategy, ordered.removed) == ("index", 10_000)
    assert (scattered.strategy, scattered.removed) == ("range", 10_000)
    assert left_ordered == keys(db, "x_idempotency") == {f"k{i}" for i in range(10_000, 20_000)}


def run_activity(
    pool: AsyncConnectionPool[Any],
    settings: SweepSettings,
    heartbeat_details: list[Any] | None = None,
    on_heartbeat: Callable[..., None] | None = None,
    cancel_after_batches: int | None = None,
    run_id: str | None = None,
    stop_after_batches: int | None = None,
) -> tuple[ActivityEnvironment, Any]:
    """The real activity on x_idempotency, in Temporal's activity test environment; a retried
    attempt passes the first's `run_id` (one pass) and its heartbeat details."""
    env = activity_env(heartbeat_details=heartbeat_details or [])
    if run_id is not None:
        env.info = dataclasses.replace(env.info, workflow_run_id=run_id, attempt=2)
    seen: list[dict[str, Any]] = []

    def beat(*details: Any) -> None:
        batch = details and isinstance(details[0], dict) and "batch_ms" in details[0]
        # The heartbeat an attempt sends as it fails (clean_exit) repeats the last batch's.
        if batch and not details[0].get("clean_exit"):
            seen.append(details[0])
            if cancel_after_batches is not None and len(seen) == cancel_after_batches:
                env.cancel()
            if stop_after_batches is not None and len(seen) == stop_after_batches:
                env.worker_shutdown()
        if on_heartbeat:
            on_heartbeat(*details)

    env.on_heartbeat = beat
    activities = PurgeActivities(TargetRegistry([kinds.idempotency(pool, settings=settings)]))
    step = PurgeStep(name="x_idempotency", now_ms=NOW)
    return env, (env.run(activities.purge_target, step), seen)


async def test_a_walk_commits_its_batches_lazily_and_reports_none_before_it_is_durable(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A walk's batches commit without waiting for their WAL, as index and keyset batches do
    (activities.engine.ledger): each waited for its own flush, where one DELETE waits once. So
    its reports trail what it committed, and never lead: at every batch heartbeat the table
    has lost at least the rows reported, and at some heartbeat more (batches committed lazily
    and reported together at the next durable point). Committed as the session does, each
    report would come right after its own batch, equal to what is gone."""
    fixed_batches(monkeypatch)  # 8 pages a batch: dozens of batches
    durable_every(monkeypatch, 4)
    expired = fill_idempotency(db, 40_000, expired_every=2)
    analyze(db, "x_idempotency")
    seen: list[tuple[int, int]] = []

    def gone_at_report(*details: Any) -> None:
        seen.append((int(details[0]["removed"]), expired - expired_left(db)))

    _, (running, beats) = run_activity(pool, TINY, on_heartbeat=gone_at_report)
    result: PurgeSweep = await running

    assert result.strategy == "range"
    assert result.removed == expired
    assert len(beats) > 10
    assert all(gone >= reported for reported, gone in seen)
    assert any(gone > reported for reported, gone in seen)


async def test_cancelled_sweep_stops_between_batches_and_its_count_is_true(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled at its fifth batch's report, a sweep finishes that batch and starts no other:
    what is gone is exactly what it reported, and its last heartbeat says it left cleanly."""
    fixed_batches(monkeypatch)  # 8 pages a batch: the table is dozens of them
    durable_every(monkeypatch, 1)  # each batch reported as it commits
    expired = fill_idempotency(db, 40_000, expired_every=2)
    analyze(db, "x_idempotency")
    last: list[Any] = []
    _, (running, seen) = run_activity(
        pool, TINY, cancel_after_batches=5, on_heartbeat=lambda *d: last.append(d[0])
    )

    with pytest.raises(asyncio.CancelledError):
        await running

    gone = expired - expired_left(db)
    # Stopped in the table's middle, after the batch in flight, every committed batch reported.
    assert len(seen) == 5
    assert 0 < gone == seen[-1]["removed"] < expired
    # Its last word says it left cleanly, so the next attempt trusts the count it resumes from.
    assert last[-1]["clean_exit"] is True
    assert last[-1]["removed"] == gone


async def test_a_worker_that_begins_to_stop_hands_its_sweep_on_after_the_batch_it_is_in(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deploy's SIGTERM at a sweep's fifth batch: the sweep starts no other batch, leaves
    cleanly (its last heartbeat says so, with every committed row), and fails with the
    retryable, benign `WorkerStopping` at once, not at the end of the worker's grace; the
    retry, on a worker that is not stopping, resumes there and sweeps the rest, each row
    counted once."""
    fixed_batches(monkeypatch)  # 8 pages a batch: the table is dozens of them
    durable_every(monkeypatch, 1)  # each batch reported as it commits
    expired = fill_idempotency(db, 40_000, expired_every=2)
    analyze(db, "x_idempotency")
    last: list[Any] = []
    env, (first, seen) = run_activity(
        pool, TINY, stop_after_batches=5, on_heartbeat=lambda *d: last.append(d[0])
    )
    with pytest.raises(ApplicationError) as stopping:
        await first
    gone = expired - expired_left(db)

    assert stopping.value.type == "WorkerStopping"
    assert not stopping.value.non_retryable
    assert stopping.value.category == ApplicationErrorCategory.BENIGN
    assert len(seen) == 5
    assert 0 < gone == seen[-1]["removed"] < expired
    assert last[-1]["clean_exit"] is True
    assert last[-1]["removed"] == gone

    _, (second, _) = run_activity(
        pool, TINY, run_id=env.info.workflow_run_id, heartbeat_details=[last[-1]]
    )
    result: PurgeSweep = await second
    assert expired_left(db) == 0
    assert result.removed == expired


async def test_retried_attempt_resumes_from_the_last_heartbeat_and_counts_each_row_once(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    fixed_batches(monkeypatch)  # 8 pages a batch: the table is dozens of them
    durable_every(monkeypatch, 2)
    expired = fill_idempotency(db, 40_000, expired_every=2)
    analyze(db, "x_idempotency")
    env, (first, first_beats) = run_activity(pool, TINY, cancel_after_batches=8)
    with pytest.raises(asyncio.CancelledError):
        await first
    last = first_beats[-1]

    _, (second, second_beats) = run_activity(
        pool, TINY, run_id=env.info.workflow_run_id, heartbeat_details=[last]
    )
    result: PurgeSweep = await second

    assert result.removed == expired  # the first attempt's rows and the second's, once each
    assert keys(db, "x_idempotency") == {f"k{i}" for i in range(1, 40_000, 2)}
    # Its first batch walked on from where the first attempt stopped (8 pages a batch), not
    # from the table's first page, which lies far behind it.
    assert last["page"] < second_beats[0]["page"] <= last["page"] + 16
    assert second_beats[0]["removed"] > last["removed"]
    assert result.batches == len(second_beats)


def slow_deletes(db: psycopg.Connection[Any], table: str, ms: float = 1.0, only: str = "") -> None:
    """Make every row of `table` (or those `only`, a condition on OLD, picks) take `ms` to
    delete (as a delete trigger or an unindexed child table would), so that a sweep outlasts a
    one-second budget on few rows."""
    sleep = f"PERFORM pg_sleep({ms / 1000});"
    if only:
        sleep = f"IF {only} THEN {sleep} END IF;"
    db.execute(
        "CREATE OR REPLACE FUNCTION slow_delete() RETURNS trigger LANGUAGE plpgsql AS"
        f" $$BEGIN {sleep} RETURN OLD; END$$"
    )
    db.execute(
        f"CREATE TRIGGER slow BEFORE DELETE ON {table} FOR EACH ROW EXECUTE FUNCTION slow_delete()"
    )


@pytest.mark.waits
async def test_time_budget_ends_the_sweep_with_a_backlog_and_the_next_pass_continues(
    db: psycopg.Connection[Any],
    pool: AsyncConnectionPool[Any],
    schema_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At the config's smallest budget (1s), spent while each sweep's first batch waits on a
    row: the index sweep's backlog is exactly the expired rows left, the walk's is estimated
    from the density it met, each flagged for what it is, and the next pass removes the
    rest."""
    [spec] = parse_config(
        {"sweep": {"time_budget": "1s"}, "targets": [{"kind": "idempotency"}]}, env={}
    ).targets
    assert spec.settings.time_budget_ms == 1_000
    expired = fill_idempotency(db, 20_000, expired_every=10)  # 10%, indexed: by index
    analyze(db, "x_idempotency")
    # The same rows made wide, no index: a walk of its pages.
    db.execute(
        "CREATE TABLE heap AS SELECT key, repeat('x', 800) AS pad, expires_at_ms FROM x_idempotency"
    )
    analyze(db, "heap")
    clock = budget_clock(monkeypatch)

    cut_short = await cut_short_at(
        db,
        schema_url,
        "x_idempotency",
        "k0",
        clock,
        lambda: kinds.idempotency(pool, settings=spec.settings).sweep(NOW),
    )
    heap = kinds.expiring(pool, "heap", TableName("heap"), "expires_at_ms", settings=spec.settings)
    # Through the activity: the flag reaches the result, and the report marks the estimate.
    activities = PurgeActivities(TargetRegistry([heap]))
    walked: PurgeSweep = await cut_short_at(
        db,
        schema_url,
        "heap",
        "k0",
        clock,
        lambda: activity_env().run(activities.purge_target, PurgeStep(name="heap", now_ms=NOW)),
    )

    def left(table: str) -> int:
        query = f"SELECT count(*) FROM {table} WHERE expires_at_ms <= %s"
        return int(db.execute(query, (NOW,)).fetchone()[0])  # type: ignore[index]

    assert cut_short.strategy == "index"
    assert 0 < cut_short.removed < expired
    assert cut_short.backlog == left("x_idempotency") == expired - cut_short.removed
    assert cut_short.backlog_estimated is False
    assert walked.strategy == "range"
    assert 0 < walked.removed < expired
    true_left = left("heap")
    assert abs(walked.backlog - true_left) <= 0.15 * true_left, (walked.backlog, true_left)
    assert walked.backlog_estimated is True
    shown = report_table(PurgeReport(swept=[walked], removed=walked.removed))
    assert f"~{walked.backlog}" in shown
    assert ESTIMATED_BACKLOG_NOTE in shown

    finished = await kinds.idempotency(pool, settings=spec.settings).sweep(NOW)
    assert (finished.removed, finished.backlog) == (expired - cut_short.removed, 0)
    assert left("x_idempotency") == 0


@pytest.mark.waits
async def test_a_backlog_count_that_runs_out_of_time_is_the_plans_estimate_and_says_so(
    db: psycopg.Connection[Any],
    pool: AsyncConnectionPool[Any],
    schema_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An index sweep out of time whose count of the rows left outlasts the count's own
    timeout (here, waiting for a lock another session holds until the count has returned)
    reports the planner's estimate less the rows it removed, flagged as an estimate."""
    fixed_batches(monkeypatch, rows=200)
    fill_idempotency(db, 20_000, expired_every=10)  # 10%, indexed: by index
    analyze(db, "x_idempotency")
    # Rows the statistics have not seen (too few for autovacuum to analyze again), so the
    # planner's estimate is not the count.
    db.execute(
        "INSERT INTO x_idempotency SELECT 'late' || i, null, %s FROM generate_series(1, 1500) i",
        (NOW - HOUR,),
    )
    explained = db.execute(
        "EXPLAIN (FORMAT JSON) SELECT 1 FROM x_idempotency WHERE expires_at_ms <= %s", (NOW,)
    ).fetchone()
    planned = int(explained[0][0]["Plan"]["Plan Rows"])  # type: ignore[index]
    expired = expired_left(db)
    assert planned < expired
    # The count waits for the lock past its own timeout, well inside the lock timeout.
    # A budget no machine spends before its first batch; the hand clock spends it after.
    settings = SweepSettings(time_budget_ms=60_000, lock_timeout_ms=3 * batching.COUNT_LEFT_MS)
    clock = budget_clock(monkeypatch)
    holder = psycopg.connect(schema_url)  # not autocommit: its lock stays until it commits

    def lock_and_spend_the_budget(progress: Any) -> None:
        # After the first batch (committed): the sweep's next step is the count of what is left.
        if progress.batches == 1:
            holder.execute("LOCK TABLE x_idempotency IN ACCESS EXCLUSIVE MODE")
            clock.spend(3_600)

    # The lock held for the whole count, let go only once it has returned: it cannot finish
    # in time, whenever the test looks, and how it gave up is seen, not guessed from a poll.
    counted: list[batching.Backlog] = []
    gave_up: list[BaseException] = []
    count_left = batching.count_left

    class Watched:
        """The sweep's connection for the count, keeping the error a statement ends with."""

        def __init__(self, conn: AsyncConnection[Any]) -> None:
            self.conn = conn

        def transaction(self) -> Any:
            return self.conn.transaction()

        async def execute(self, *args: Any) -> Any:
            try:
                return await self.conn.execute(*args)
            except psycopg.Error as err:
                gave_up.append(err)
                raise

    async def count_behind_the_lock(conn: AsyncConnection[Any], *args: Any) -> batching.Backlog:
        backlog = await count_left(cast(AsyncConnection[Any], Watched(conn)), *args)
        holder.commit()
        counted.append(backlog)
        return backlog

    monkeypatch.setattr(batching, "count_left", count_behind_the_lock)
    try:
        target = kinds.idempotency(pool, settings=settings)
        stats = await target.sweep(NOW, on_batch=lock_and_spend_the_budget)
    finally:
        holder.close()

    assert counted, "the sweep never counted what it left"
    # Cancelled by its own timeout (COUNT_LEFT_MS), not the lock timeout's three times it.
    [err] = gave_up
    assert isinstance(err, psycopg.errors.QueryCanceled), err
    assert "statement timeout" in str(err), err
    assert counted == [(planned - 200, True)]
    assert (stats.strategy, stats.removed) == ("index", 200)
    assert stats.backlog == planned - 200 < expired_left(db) == expired - 200
    assert stats.backlog_estimated is True


async def test_auth_out_of_time_on_its_first_table_leaves_the_second_for_the_next_pass(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    db.execute("INSERT INTO x_auth_lockouts VALUES ('carol', %s)", (NOW - 1,))
    cut_short = await kinds.auth(pool, settings=SweepSettings(time_budget_ms=0)).sweep(NOW)
    assert cut_short.removed == 0
    assert keys(db, "x_auth_lockouts") == {"carol"}
    assert (await kinds.auth(pool).sweep(NOW)).removed == 1


@pytest.mark.parametrize("local", [False, True])
async def test_a_retry_sweeps_only_what_is_left_of_the_pass_budget(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], local: bool
) -> None:
    """Every attempt is handed the budget the pass had left when it scheduled the target; what
    passed since (earlier attempts, their backoff, waiting in the queue) is spent. A retry that
    starts past it deletes nothing and reports the backlog; one inside it sweeps. A local
    activity (a pattern's small table) alike: the SDK gives its retries the first attempt's
    scheduled time too, on the worker's clock."""
    db.execute("INSERT INTO x_idempotency VALUES ('late', null, %s)", (NOW - 1,))
    activities = PurgeActivities(TargetRegistry([kinds.idempotency(pool)]))
    step = PurgeStep(name="x_idempotency", now_ms=NOW, budget_ms=60_000)
    scheduled = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)

    def attempt_started(after: timedelta) -> ActivityEnvironment:
        return activity_env(
            attempt=2, scheduled_time=scheduled, started_time=scheduled + after, is_local=local
        )

    past: PurgeSweep = await attempt_started(timedelta(minutes=2)).run(
        activities.purge_target, step
    )
    assert (past.removed, past.backlog) == (0, 1)
    assert keys(db, "x_idempotency") == {"late"}
    inside: PurgeSweep = await attempt_started(timedelta(seconds=30)).run(
        activities.purge_target, step
    )
    assert inside.removed == 1
    assert keys(db, "x_idempotency") == set()


# -- renewed rows ----------------------------------------------------------------------------


@dataclasses.dataclass
class Kind:
    """How to fill one kind's table(s) and how a client renews one of its rows."""

    target: Callable[[AsyncConnectionPool[Any]], Any]
    fill: list[str]
    renew: list[str]
    tables: list[str]
    expired_every: int = 2
    """Row k{i} is expired when i is a multiple of this (2: half the table, swept by a walk)."""


ROWS = 40_000
KINDS_UNDER_RENEWAL = {
    "idempotency": Kind(
        lambda pool: kinds.idempotency(pool, settings=TINY),
        ["INSERT INTO x_idempotency SELECT 'k' || i, null, CASE WHEN i % 2 = 0 THEN {old}"
         " ELSE {new} END FROM generate_series(0, {last}) i"],
        ["UPDATE x_idempotency SET expires_at_ms = {new} WHERE key = %s"],
        ["x_idempotency"],
    ),
    "idempotency-by-index": Kind(
        lambda pool: kinds.idempotency(pool, settings=TINY),
        ["INSERT INTO x_idempotency SELECT 'k' || i, null, CASE WHEN i % 20 = 0 THEN {old}"
         " ELSE {new} END FROM generate_series(0, {last}) i"],
        ["UPDATE x_idempotency SET expires_at_ms = {new} WHERE key = %s"],
        ["x_idempotency"],
        expired_every=20,
    ),
    "rate_limit": Kind(
        lambda pool: kinds.rate_limit(pool, settings=TINY),
        ["INSERT INTO x_rate_limit SELECT 'k' || i, CASE WHEN i % 2 = 0 THEN 4 ELSE 0 END,"
         " 4, 0.000001, {now} FROM generate_series(0, {last}) i"],
        # The client spends the bucket: no longer full, so deleting it would reset its limit.
        ["UPDATE x_rate_limit SET tokens = 0, last_ms = {now} WHERE key = %s"],
        ["x_rate_limit"],
    ),
    "auth": Kind(
        lambda pool: kinds.auth(pool, settings=TINY),
        ["INSERT INTO x_auth_failures (key, at_ms, expires_at_ms) SELECT 'k' || i, 0,"
         " CASE WHEN i % 2 = 0 THEN {old} ELSE {new} END FROM generate_series(0, {last}) i",
         "INSERT INTO x_auth_lockouts SELECT 'k' || i, CASE WHEN i % 2 = 0 THEN {old}"
         " ELSE {new} END FROM generate_series(0, {last}) i"],
        ["UPDATE x_auth_failures SET expires_at_ms = {new} WHERE key = %s",
         "UPDATE x_auth_lockouts SET until_ms = {new} WHERE key = %s"],
        ["x_auth_failures", "x_auth_lockouts"],
    ),
    "expiring": Kind(
        lambda pool: kinds.expiring(
            pool, "sessions", TableName("sessions"), "expires_at", settings=TINY
        ),
        ["CREATE TABLE sessions (key text PRIMARY KEY, expires_at timestamptz NOT NULL)",
         "CREATE INDEX ON sessions (expires_at)",
         "INSERT INTO sessions SELECT 'k' || i, to_timestamp(CASE WHEN i % 2 = 0 THEN {old}"
         " ELSE {new} END / 1000.0) FROM generate_series(0, {last}) i"],
        ["UPDATE sessions SET expires_at = to_timestamp({new} / 1000.0) WHERE key = %s"],
        ["sessions"],
    ),
}  # fmt: skip


class Renewer(threading.Thread):
    """A client renewing expired rows as fast as it can, each renewal holding its row lock a
    moment, so that batches meet rows locked mid-renewal. Records, per statement (per table),
    every key whose row it renewed (a row already deleted is not renewed: 0 rows updated)."""

    def __init__(self, url: str, statements: list[str], candidates: list[str]) -> None:
        super().__init__(daemon=True)
        self.url, self.statements, self.candidates = url, statements, candidates
        self.renewed: list[set[str]] = [set() for _ in statements]
        self.stop = threading.Event()
        self.running = threading.Event()
        """Set once its first renewal committed."""

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.is_set():
                key = random.choice(self.candidates)
                with conn.transaction():
                    hits = [conn.execute(s, (key,)).rowcount for s in self.statements]
                    conn.execute("SELECT pg_sleep(0.002)")
                for renewed, hit in zip(self.renewed, hits, strict=True):
                    if hit:
                        renewed.add(key)
                self.running.set()


@pytest.fixture
def renewer_factory() -> Iterator[Callable[[str, list[str], list[str]], Renewer]]:
    started: list[Renewer] = []

    def make(url: str, statements: list[str], candidates: list[str]) -> Renewer:
        renewer = Renewer(url, statements, candidates)
        started.append(renewer)
        renewer.start()
        return renewer

    yield make
    for renewer in started:
        renewer.stop.set()
        renewer.join(10)


@pytest.mark.parametrize("kind", list(KINDS_UNDER_RENEWAL))
async def test_rows_renewed_during_the_sweep_are_never_deleted(
    db: psycopg.Connection[Any],
    pool: AsyncConnectionPool[Any],
    schema_url: str,
    renewer_factory: Callable[[str, list[str], list[str]], Renewer],
    kind: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client renews expired rows while the sweep runs: every renewed row is kept, every
    other expired row goes. Where a renewal lands (before the sweep reaches its row, between
    batches, or inside one) is the machine's; the renewal that waits on a batch holding its
    row is made to happen in `test_a_row_renewed_while_its_batch_waits_on_the_lock_is_kept`."""
    fixed_batches(monkeypatch)  # dozens of batches, so renewals land between and inside them
    spec = KINDS_UNDER_RENEWAL[kind]
    values = {"old": NOW - HOUR, "new": NOW + HOUR, "now": NOW, "last": ROWS - 1}
    for statement in spec.fill:
        db.execute(statement.format(**values))
    for table in spec.tables:
        analyze(db, table)
    expired = [f"k{i}" for i in range(0, ROWS, spec.expired_every)]
    renewals = [s.format(**values) for s in spec.renew]

    renewer = renewer_factory(schema_url, renewals, expired)
    # The renewer is running before the first batch, however long it took to connect.
    assert await asyncio.to_thread(renewer.running.wait, 30), "the renewer never renewed"
    stats = await spec.target(pool).sweep(NOW)
    renewer.stop.set()
    renewer.join(10)

    for table, renewed in zip(spec.tables, renewer.renewed, strict=True):
        assert renewed  # renewals happened during the sweep (where each landed: above)
        left = keys(db, table)
        assert renewed <= left, f"{table} lost renewed rows"
        gone = set(expired) - renewed
        assert not (gone & left), f"{table} kept rows that expired and were never renewed"
        assert {f"k{i}" for i in range(ROWS)} - set(expired) <= left  # live rows kept
    assert stats.batches > 5
    assert stats.strategy == ("index" if spec.expired_every > 5 else "range")


async def renewed_while_a_batch_waits(
    db: psycopg.Connection[Any],
    pool: AsyncConnectionPool[Any],
    schema_url: str,
    kind: str,
    expired_every: int,
    first: Callable[[asyncio.Task[Any]], Awaitable[None]] | None = None,
) -> tuple[Any, set[str]]:
    """`kind`'s table with every `expired_every`-th of 4,000 rows expired, swept while a client
    renews the expired row k0 and holds it; once a batch waits on it (after `first`, given the
    running sweep, returns), the renewal commits. The sweep's stats and the keys left."""
    spec = KINDS_UNDER_RENEWAL[kind]
    values = {"old": NOW - HOUR, "new": NOW + HOUR, "now": NOW, "last": 3_999}
    for statement in spec.fill:
        db.execute(statement.replace("i % 2 = 0", f"i % {expired_every} = 0").format(**values))
    analyze(db, spec.tables[0])

    with psycopg.connect(schema_url) as client:  # not autocommit: the renewal stays open
        assert client.execute(spec.renew[0].format(**values), ("k0",)).rowcount == 1
        sweeping = asyncio.create_task(spec.target(pool).sweep(NOW))
        if first is not None:
            await first(sweeping)
        await until_a_sweep_waits(db, sweeping, holder=client)
        client.commit()
        stats = await sweeping
    return stats, keys(db, spec.tables[0])


@pytest.mark.parametrize(
    ("kind", "expired_every", "strategy"),
    [
        ("idempotency", 20, "index"),
        ("idempotency", 2, "range"),
        ("rate_limit", 2, "range"),
        ("expiring", 20, "index"),
        ("auth", 20, "index"),
    ],
)
async def test_a_row_renewed_while_its_batch_waits_on_the_lock_is_kept(
    db: psycopg.Connection[Any],
    pool: AsyncConnectionPool[Any],
    schema_url: str,
    kind: str,
    expired_every: int,
    strategy: str,
) -> None:
    """The race made certain: a client holds an expired row mid-renewal, the sweep's batch
    reaches it and waits for the lock, the renewal commits; the batch must re-check the row's
    new version and keep it. (A batch that deleted by key would lose it.)"""
    stats, left = await renewed_while_a_batch_waits(db, pool, schema_url, kind, expired_every)

    assert stats.strategy == strategy
    assert "k0" in left
    assert not {f"k{i}" for i in range(expired_every, 4_000, expired_every)} & left


async def test_a_whole_batch_whose_timeout_leaves_results_owed_rolls_back_and_the_sweep_goes_on(
    db: psycopg.Connection[Any],
    pool: AsyncConnectionPool[Any],
    schema_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The red CI run made certain: the first batch, which takes every expired row, runs past
    its statement_timeout on a held row, and psycopg's read of what the server still owes finds
    it late (its pipeline exit fails while busy). The batch must still be rolled back whole and
    the sweep go on by boundary reads: the held row, renewed meanwhile, kept, the rest gone."""
    late_results = results_late(monkeypatch)

    async def the_whole_batch_timed_out(sweeping: asyncio.Task[Any]) -> None:
        while not late_results.late:  # the whole batch timed out, the rest found late
            assert not sweeping.done(), "no batch ran past its statement_timeout"
            await asyncio.sleep(0.01)

    stats, left = await renewed_while_a_batch_waits(
        db, pool, schema_url, "idempotency", 20, first=the_whole_batch_timed_out
    )

    assert any("that batch was rolled back" in advice for advice in stats.advice)
    assert stats.strategy == "index"
    assert "k0" in left
    assert not {f"k{i}" for i in range(20, 4_000, 20)} & left


# -- the plan check --------------------------------------------------------------------------


async def test_large_table_read_whole_for_a_small_share_gets_the_index_to_create(
    db: psycopg.Connection[Any],
    pool: AsyncConnectionPool[Any],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    unhurried_whole_batch(monkeypatch)
    db.execute("CREATE TABLE audit (id bigint, expires_ms bigint NOT NULL, body text)")
    db.execute(
        "INSERT INTO audit SELECT i, CASE WHEN i %% 100 = 0 THEN %s ELSE %s END, repeat('x', 120)"
        " FROM generate_series(1, 80000) i",
        (NOW - HOUR, NOW + HOUR),
    )
    analyze(db, "audit")
    registry = TargetRegistry([kinds.expiring(pool, "audit", TableName("audit"), "expires_ms")])
    step = PurgeStep(name="audit", now_ms=NOW)

    with caplog.at_level("WARNING", logger="temporalio.activity"):
        unindexed = await activity_env().run(PurgeActivities(registry).purge_target, step)
    db.execute("CREATE INDEX ON audit (expires_ms)")
    db.execute("INSERT INTO audit SELECT i, %s, '' FROM generate_series(1, 800) i", (NOW - 1,))
    analyze(db, "audit")
    indexed = await activity_env().run(PurgeActivities(registry).purge_target, step)

    assert unindexed.removed == 800
    assert unindexed.strategy == "range"
    assert unindexed.advice.endswith('CREATE INDEX CONCURRENTLY ON "audit" ("expires_ms")')
    # The share is the planner's estimate, from ANALYZE's sample: near 1%, not exactly.
    assert re.search(
        r"about [\d,]+ of 80,000 rows \(\d\.\d%\) are expired and no index serves "
        r"expires_ms",
        unindexed.advice,
    ), unindexed.advice
    [warning] = caplog.records
    assert warning.getMessage().startswith(unindexed.advice)
    assert (indexed.removed, indexed.strategy, indexed.advice) == (800, "index", "")


async def test_a_walk_span_that_runs_into_statement_timeout_is_taken_again_in_fewer_pages(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table with no index on its expiry column (a walk, 8 heap pages a batch), whose first
    row on each of pages 1 to 3 takes 0.4 s to delete (a trigger's sleep): the first span holds
    the three, runs past the 1.1 s statement_timeout (always: a sleep is never shorter; a span
    of one or two of them leaves 300 ms or more of it) and is rolled back whole; the same pages
    are walked again in spans of 2 pages, then 1, and the sweep completes, every expired row
    gone and counted, saying why it slowed. Before, the span failed the attempt, and every retry
    began with the same span."""
    fixed_batches(monkeypatch, pages=8)
    db.execute("CREATE TABLE walked (key text NOT NULL, at bigint NOT NULL, slow boolean)")
    db.execute(
        "CREATE FUNCTION walked_slow() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN IF OLD.slow THEN PERFORM pg_sleep(0.4); END IF; RETURN OLD; END $$"
    )
    fill = (
        "INSERT INTO walked SELECT lpad(i::text, 8, '0'), %s, {slow} FROM generate_series(0, 899) i"
    )
    # Learn how many rows a page holds, then lay the table out again with the slow rows first
    # on pages 1, 2 and 3 (every row the same width, so the layout is the same).
    db.execute(fill.format(slow="false"), (NOW - HOUR,))
    [(per_page,)] = db.execute(
        "SELECT count(*) FROM walked WHERE (ctid::text::point)[0] = 0"
    ).fetchall()
    db.execute("TRUNCATE walked")
    db.execute(
        fill.format(slow="i %% %s = 0 AND i / %s BETWEEN 1 AND 3"), (NOW - HOUR, per_page, per_page)
    )
    pages = db.execute("SELECT (ctid::text::point)[0]::int FROM walked WHERE slow ORDER BY 1")
    assert [page for (page,) in pages] == [1, 2, 3]
    db.execute(
        "CREATE TRIGGER slow BEFORE DELETE ON walked FOR EACH ROW EXECUTE FUNCTION walked_slow()"
    )
    db.execute("ANALYZE walked")
    settings = SweepSettings(statement_timeout_ms=1_100)
    target = kinds.expiring(pool, "walked", TableName("walked"), "at", settings=settings)

    stats = await target.sweep(NOW)

    assert stats.strategy == "range"
    assert stats.removed == 900
    assert db.execute("SELECT count(*) FROM walked").fetchone() == (0,)
    assert any(
        "a batch's range of heap pages ran into statement_timeout (1100 ms), was rolled back" in a
        for a in stats.advice
    ), stats.advice
