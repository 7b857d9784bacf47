"""The report tells the whole truth: counts exact across lost attempts (the purge_progress
ledger), a lower bound said out loud without it, and what a sweep left behind.

Attempts are the real activity in Temporal's activity environment against real PostgreSQL. A
worker "killed" here is an attempt whose last heartbeats never reached the server: the retried
attempt is handed an older heartbeat than the batches the first attempt committed, exactly what
a SIGKILL leaves (the fault suite, `pytest -m slow`, does it with real processes).
"""

from __future__ import annotations

import asyncio
import logging
import time
import types
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool

from activities import builtin_kinds as kinds
from activities.engine import batching, keyset
from activities.engine.ledger import Ledger
from activities.inputs import PurgeStep
from activities.registry import TargetRegistry
from activities.results import PurgeSweep
from activities.schema import reference_ddl
from activities.sweep import PurgeActivities
from purge_config.kinds import BUILTIN_KINDS
from purge_config.names import TableName
from purge_config.settings import SweepSettings
from purge_ops.connect import open_pool
from tests.conftest import TEMPLATE_CACHE, Harness, Pools
from tests.support.activity import activity_env
from tests.support.arranging import arranging
from tests.support.pace import (
    budget_clock,
    durable_every,
    fixed_batches,
    row_locked,
    until_a_sweep_waits,
)
from tests.support.passes import run_pass
from tests.support.rows import HOUR, PAST_NOW, idempotency_rows
from tests.support.servers import cluster_template, running_postgres
from tests.test_batching import expired_left

NOW = PAST_NOW
DAY = 24 * HOUR
#: Batches of about a millisecond, where a test does not fix their size.
TINY = SweepSettings(batch_target_ms=1)
#: Rows in an index batch: `fill`'s 4,000 expired rows are 40 batches on any machine.
BATCH_ROWS = 100
#: Batches committed lazily between two durable points, so reports come in groups.
GROUP = 3


@pytest.fixture(autouse=True)
def known_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every sweep here in batches of BATCH_ROWS rows, reported in groups of GROUP (a durable
    point every third batch): a table is a known number of reports, whatever the machine."""
    fixed_batches(monkeypatch, rows=BATCH_ROWS)
    durable_every(monkeypatch, GROUP)


def fill(db: psycopg.Connection[Any], rows: int, every: int = 10) -> int:
    """`rows` keys, every tenth expired at NOW (swept through the index, in many batches; every
    other one: walked); returns how many are expired."""
    db.execute(
        "INSERT INTO x_idempotency (key, expires_at_ms)"
        " SELECT 'k' || i, CASE WHEN i %% %s = 0 THEN %s ELSE %s END"
        " FROM generate_series(0, %s - 1) i",
        (every, NOW - HOUR, NOW + HOUR, rows),
    )
    db.execute("VACUUM ANALYZE x_idempotency")
    return len(range(0, rows, every))


async def killed_attempt(
    pool: AsyncConnectionPool[Any], kept: int, die_after: int
) -> tuple[str, dict[str, Any]]:
    """A first attempt cancelled at its `die_after`th batch heartbeat, of which only the first
    `kept` reach the server: (its workflow run id, the last heartbeat the server kept). Lazily
    committed batches report together at a durable point (activities.engine.ledger), so the
    cancellation lands at the end of the group that holds that heartbeat."""
    env = activity_env()
    beats: list[dict[str, Any]] = []

    def beat(*details: Any) -> None:
        if details and isinstance(details[0], dict) and "batch_ms" in details[0]:
            if not details[0].get("clean_exit"):
                beats.append(details[0])
            if len(beats) == die_after:
                env.cancel()

    env.on_heartbeat = beat
    activities = PurgeActivities(TargetRegistry([kinds.idempotency(pool, settings=TINY)]))
    with pytest.raises(asyncio.CancelledError):
        await env.run(activities.purge_target, PurgeStep(name="x_idempotency", now_ms=NOW))
    assert len(beats) == die_after  # a group of lazy batches ends at the 6th
    return env.info.workflow_run_id, beats[kept - 1]


async def retried_attempt(
    pool: AsyncConnectionPool[Any], run_id: str, heartbeat: dict[str, Any], attempt: int = 2
) -> PurgeSweep:
    """Attempt `attempt` of the same pass, resumed from `heartbeat`, to its end."""
    env = activity_env(workflow_run_id=run_id, attempt=attempt, heartbeat_details=[heartbeat])
    activities = PurgeActivities(TargetRegistry([kinds.idempotency(pool, settings=TINY)]))
    result: PurgeSweep = await env.run(
        activities.purge_target, PurgeStep(name="x_idempotency", now_ms=NOW)
    )
    return result


async def test_a_retried_attempt_counts_the_rows_a_dead_attempt_deleted_after_its_heartbeat(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    expired = fill(db, 40_000)
    run_id, stale = await killed_attempt(pool, kept=2, die_after=6)
    gone_before_retry = expired - expired_left(db)
    assert gone_before_retry > stale["removed"]  # the server's heartbeat is behind the truth

    result = await retried_attempt(pool, run_id, stale)

    assert expired_left(db) == 0
    assert result.removed == expired  # every committed batch, counted once
    assert not result.lower_bound
    ledger = db.execute(
        "SELECT removed, batches FROM purge_progress WHERE run_id = %s AND target = %s",
        (run_id, "x_idempotency"),
    ).fetchone()
    assert ledger is not None
    assert ledger[0] == expired


@pytest.mark.parametrize("track_counts", ["on", "off"])
async def test_the_ledger_counts_every_batch_whether_or_not_the_server_counts_deletes(
    db: psycopg.Connection[Any], schema_url: str, pools: Pools, track_counts: str
) -> None:
    # With track_counts on, a plain batch's ledger row takes its count from the session's
    # statistics (the rows deleted since the batch began: they add up across its
    # transactions); off, they stay 0 and the count must come from the DELETE's tag instead.
    options = conninfo_to_dict(schema_url).get("options") or ""
    pool = await pools(
        make_conninfo(schema_url, options=f"{options} -c track_counts={track_counts}")
    )
    expired = fill(db, 40_000)
    env = activity_env()
    deleted: list[int] = []
    env.on_heartbeat = lambda *d: (
        deleted.append(d[0]["batch_removed"]) if "batch_ms" in d[0] else None
    )
    activities = PurgeActivities(TargetRegistry([kinds.idempotency(pool, settings=TINY)]))

    result = await env.run(activities.purge_target, PurgeStep(name="x_idempotency", now_ms=NOW))

    # On one connection: the session's count goes on between them. The ledger counts the
    # batches that deleted rows (the last one here only read that none were left).
    assert len(deleted) == result.batches > 40
    ledger = db.execute(
        "SELECT removed, batches FROM purge_progress WHERE run_id = %s",
        (env.info.workflow_run_id,),
    ).fetchone()
    deleting = sum(1 for n in deleted if n > 0)
    assert (expired_left(db), result.removed, ledger) == (0, expired, (expired, deleting))


async def test_a_cascade_within_the_table_is_not_counted_as_rows_the_sweep_removed(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    # A reply is deleted with its expired parent by the foreign key's cascade. The session's
    # own count of deleted rows would include the replies; the report and the ledger count
    # the expired rows the batches' DELETEs took, as their tags say, so the ledger's count is
    # not taken on the server for a table a foreign key references.
    db.execute(
        "CREATE TABLE notes (id bigint PRIMARY KEY, expires_at_ms bigint NOT NULL,"
        " parent bigint REFERENCES notes ON DELETE CASCADE);"
        "CREATE INDEX ON notes (expires_at_ms); CREATE INDEX ON notes (parent)"
    )
    db.execute(
        "INSERT INTO notes SELECT i, CASE WHEN i <= 3000 THEN %s ELSE %s END,"
        " CASE WHEN i > 3000 THEN i - 3000 END FROM generate_series(1, 6000) i",
        (NOW - HOUR, NOW + DAY),
    )
    db.execute("VACUUM ANALYZE notes")
    env = activity_env()
    target = kinds.expiring(pool, "notes", TableName("notes"), "expires_at_ms", settings=TINY)

    result = await env.run(
        PurgeActivities(TargetRegistry([target])).purge_target,
        PurgeStep(name="notes", now_ms=NOW),
    )

    assert db.execute("SELECT count(*) FROM notes").fetchone() == (0,)  # replies cascaded
    ledger = db.execute(
        "SELECT removed FROM purge_progress WHERE run_id = %s", (env.info.workflow_run_id,)
    ).fetchone()
    assert (result.removed, ledger) == (3000, (3000,))


async def test_without_the_ledger_a_lost_attempt_makes_the_count_a_marked_lower_bound(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], caplog: pytest.LogCaptureFixture
) -> None:
    db.execute("DROP TABLE purge_progress")
    expired = fill(db, 40_000)
    run_id, stale = await killed_attempt(pool, kept=2, die_after=6)

    with caplog.at_level(logging.WARNING):
        result = await retried_attempt(pool, run_id, stale)

    assert expired_left(db) == 0  # the sweep itself still did its whole job
    assert result.removed < expired  # the dead attempt's last batches are not counted...
    assert result.lower_bound  # ...and the report says so
    [warning] = [r for r in caplog.records if "LOWER BOUND" in r.getMessage()]
    assert "purge_progress" in warning.getMessage()
    assert getattr(warning, "purge_lower_bound", None) is True


async def test_without_the_ledger_an_attempt_that_left_cleanly_keeps_the_count_exact(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    db.execute("DROP TABLE purge_progress")
    expired = fill(db, 40_000)
    env = activity_env()
    last: list[dict[str, Any]] = []

    def beat(*details: Any) -> None:
        last.append(details[0])
        if sum(1 for d in last if "batch_ms" in d) == 4:
            env.cancel()  # a graceful stop: the attempt heartbeats its clean exit

    env.on_heartbeat = beat
    activities = PurgeActivities(TargetRegistry([kinds.idempotency(pool, settings=TINY)]))
    with pytest.raises(asyncio.CancelledError):
        await env.run(activities.purge_target, PurgeStep(name="x_idempotency", now_ms=NOW))
    assert last[-1]["clean_exit"] is True

    result = await retried_attempt(pool, env.info.workflow_run_id, last[-1])

    assert (result.removed, result.lower_bound) == (expired, False)


async def test_a_first_attempt_without_the_ledger_is_exact_and_not_marked(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    db.execute("DROP TABLE purge_progress")
    expired = fill(db, 2_000)

    result = await activity_env().run(
        PurgeActivities(TargetRegistry([kinds.idempotency(pool)])).purge_target,
        PurgeStep(name="x_idempotency", now_ms=NOW),
    )

    assert (result.removed, result.lower_bound) == (expired, False)


@pytest.mark.parametrize("ledger", [True, False], ids=["ledger", "no-ledger"])
async def test_a_local_sweep_is_exact_with_the_ledger_and_a_marked_lower_bound_without(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], ledger: bool
) -> None:
    """A local activity (a small table's, in a child of small tables) run again after its
    worker died starts as a first attempt with no heartbeat: without the ledger nothing says
    what the dead one deleted, so even a first attempt's count is reported as a lower bound."""
    if not ledger:
        db.execute("DROP TABLE purge_progress")
    expired = fill(db, 2_000)

    result = await activity_env(is_local=True).run(
        PurgeActivities(TargetRegistry([kinds.idempotency(pool)])).purge_target,
        PurgeStep(name="x_idempotency", now_ms=NOW),
    )

    assert (result.removed, result.lower_bound) == (expired, not ledger)


async def test_the_sweep_removes_ledger_rows_a_week_older_than_its_pass(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    for run, at in (("old", NOW - 8 * DAY), ("recent", NOW - 6 * DAY), ("later", NOW + DAY)):
        db.execute(
            "INSERT INTO purge_progress VALUES ('w', %s, 'x_idempotency', %s, 5, 1)", (run, at)
        )
    fill(db, 10)

    await activity_env().run(
        PurgeActivities(TargetRegistry([kinds.idempotency(pool)])).purge_target,
        PurgeStep(name="x_idempotency", now_ms=NOW),
    )

    runs = {r[0] for r in db.execute("SELECT run_id FROM purge_progress WHERE workflow_id = 'w'")}
    # Judged by the pass's clock (NOW, years ago), never the server's.
    assert runs == {"recent", "later"}


async def test_a_pass_through_temporal_leaves_its_exact_count_in_the_ledger(
    harness: Harness,
) -> None:
    idempotency_rows(
        harness.db,
        {f"old-{i}": harness.now_ms - HOUR for i in range(7)} | {"new": harness.now_ms + HOUR},
    )
    async with harness.run_worker([kinds.idempotency(harness.pool)]):
        result = await run_pass(
            harness.client, harness.task_queue, {"targets": ["x_idempotency"]}, "purge-ledger"
        )

    [swept] = result["swept"]
    assert (swept["removed"], swept["lower_bound"]) == (7, False)
    handle = harness.client.get_workflow_handle("purge-ledger")
    run_id = (await handle.describe()).run_id
    row = harness.db.execute(
        "SELECT workflow_id, removed FROM purge_progress WHERE run_id = %s", (run_id,)
    ).fetchone()
    assert row == ("purge-ledger", 7)


async def cleanly_stopped_attempt(
    pool: AsyncConnectionPool[Any],
    attempt: int,
    run_id: str,
    resume: dict[str, Any] | None,
    reports: int,
) -> list[dict[str, Any]]:
    """Attempt `attempt` of the pass, resumed from `resume`, stopped after `reports` batch
    heartbeats, as a lost connection stops one: its heartbeats, the last a clean exit."""
    info: dict[str, Any] = {"workflow_run_id": run_id, "attempt": attempt}
    env = activity_env(**info, heartbeat_details=[resume] if resume else [])
    beats: list[dict[str, Any]] = []

    def beat(*details: Any) -> None:
        beats.append(details[0])
        if sum(1 for d in beats if "batch_ms" in d and not d.get("clean_exit")) == reports:
            env.cancel()

    env.on_heartbeat = beat
    activities = PurgeActivities(TargetRegistry([kinds.idempotency(pool, settings=TINY)]))
    with pytest.raises(asyncio.CancelledError):
        await env.run(activities.purge_target, PurgeStep(name="x_idempotency", now_ms=NOW))
    assert beats[-1]["clean_exit"] is True
    return beats


async def test_a_count_once_short_stays_marked_through_later_clean_attempts(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    """Attempt 1 dies (no ledger), attempt 2 stops cleanly, attempt 3 finishes: the count is
    still short by attempt 1's lost rows, and still says so."""
    db.execute("DROP TABLE purge_progress")
    expired = fill(db, 40_000)
    run_id, stale = await killed_attempt(pool, kept=2, die_after=6)
    beats = await cleanly_stopped_attempt(pool, 2, run_id, stale, 3)
    assert all(b["short"] for b in beats if "batch_ms" in b)

    result = await retried_attempt(pool, run_id, beats[-1], attempt=3)

    assert expired_left(db) == 0
    assert result.removed < expired
    assert result.lower_bound


class CounterAdds:
    """What the activity adds to its `purge_rows_removed` counter, in place of the worker's
    Prometheus endpoint (an ActivityEnvironment has no runtime to serve one)."""

    def __init__(self) -> None:
        self.added: list[int] = []

    def add(self, value: int, additional_attributes: object = None) -> None:
        self.added.append(value)


async def test_the_counter_holds_a_batch_whose_reply_was_lost_through_two_more_attempts(
    db: psycopg.Connection[Any],
    pool: AsyncConnectionPool[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Attempt 1 stops cleanly; then 50 rows go with their count in the ledger and no report
    (a batch whose commit reply a crash lost). Attempt 2 resumes, reports one group of
    batches and stops cleanly; attempt 3 finishes. The worker's counter ends at the pass's
    count, every row once: attempt 2's first report carries the lost batch's rows (seen in
    the fault suite: before, they were never added, as attempt 2's heartbeat already held
    them)."""
    counter = CounterAdds()
    monkeypatch.setattr("activities.sweep._rows_removed", lambda: counter)
    expired = fill(db, 40_000)
    run_id = activity_env().info.workflow_run_id
    [*_, first] = await cleanly_stopped_attempt(pool, 1, run_id, None, GROUP)
    assert sum(counter.added) == first["removed"]
    db.execute(
        "DELETE FROM x_idempotency WHERE key IN (SELECT key FROM x_idempotency"
        " WHERE expires_at_ms <= %s ORDER BY key DESC LIMIT 50)",
        (NOW,),
    )
    db.execute("UPDATE purge_progress SET removed = removed + 50 WHERE run_id = %s", (run_id,))

    [*_, second] = await cleanly_stopped_attempt(pool, 2, run_id, first, GROUP)
    result = await retried_attempt(pool, run_id, second, attempt=3)

    assert expired_left(db) == 0
    assert result.removed == expired
    assert sum(counter.added) == expired


async def test_p95_batch_ms_is_the_nearest_rank_of_the_batches_own_durations(
    db: psycopg.Connection[Any],
    pool: AsyncConnectionPool[Any],
    schema_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One expired row is held locked by another session while the clock batches are timed by
    moves on an hour (under a lock_timeout far longer): that batch, the first, reports the
    wait, and p95 is the nearest-rank 95th percentile of exactly the durations the batches
    reported, below the wait's. How long the other batches (100 rows) take is the machine's,
    and not asserted: none of them takes an hour."""
    fill(db, 40_000)  # 4,000 expired rows: 40 batches of 100
    # The oldest expired row: the index-ordered sweep meets it in its first batch.
    db.execute(
        "UPDATE x_idempotency SET expires_at_ms = %s WHERE key = 'k20000'", (NOW - 2 * HOUR,)
    )
    beats: list[dict[str, Any]] = []
    env = activity_env()
    env.on_heartbeat = lambda *d: beats.append(d[0]) if "batch_ms" in d[0] else None
    patient = replace(TINY, lock_timeout_ms=60_000)
    activities = PurgeActivities(TargetRegistry([kinds.idempotency(pool, settings=patient)]))
    # The clock every batch is timed by (keyset's index batches, batching's others).
    ahead = [0.0]
    clock = types.SimpleNamespace(perf_counter=lambda: time.perf_counter() + ahead[0])
    for timed in (batching, keyset):
        monkeypatch.setattr(timed, "time", clock)
    with row_locked(schema_url, "x_idempotency", "k20000"):
        sweep = asyncio.ensure_future(
            env.run(activities.purge_target, PurgeStep(name="x_idempotency", now_ms=NOW))
        )
        await until_a_sweep_waits(db, sweep)
        ahead[0] = 3_600.0
    result: PurgeSweep = await sweep

    durations = [b["batch_ms"] for b in beats if not b.get("clean_exit")]
    assert len(durations) == result.batches >= 40
    # The batch that waited for the lock is the first, and it waited the hour it was held.
    assert durations[0] >= 3_600_000, durations
    # Nearest rank, by its definition: one of the durations, at least as long as 95% of them,
    # and longer than fewer than 95% (tests/unit/test_results.py pins the rank by hand).
    p95 = result.p95_batch_ms
    assert p95 in {round(ms, 3) for ms in durations}
    assert sum(round(ms, 3) <= p95 for ms in durations) >= 0.95 * len(durations)
    assert sum(round(ms, 3) < p95 for ms in durations) < 0.95 * len(durations)
    # The 95th percentile of 40 or more batches is the third largest or lower: below the
    # wait's hour.
    assert result.p95_batch_ms < durations[0]


async def test_a_role_that_may_only_read_the_ledger_sweeps_counting_from_heartbeats(
    db: psycopg.Connection[Any], schema_url: str, role: str
) -> None:
    """has_table_privilege asked of several privileges at once says whether ANY is held: the
    ledger is asked one privilege at a time, so a role that may only read it is not taken for
    one that may write it (whose first batch would then fail the target)."""
    expired = fill(db, 1_000)
    db.execute(f'GRANT SELECT, DELETE ON x_idempotency TO "{role}"')
    db.execute(f'GRANT SELECT ON purge_progress TO "{role}"')
    url = psycopg.conninfo.make_conninfo(schema_url, user=role)
    async with AsyncConnectionPool(url, kwargs={"autocommit": True}, open=False) as pool:
        activities = PurgeActivities(TargetRegistry([kinds.idempotency(pool)]))
        result = await activity_env().run(
            activities.purge_target, PurgeStep(name="x_idempotency", now_ms=NOW)
        )

    assert result.removed == expired
    assert expired_left(db) == 0
    assert db.execute("SELECT count(*) FROM purge_progress").fetchone() == (0,)


@pytest.mark.parametrize("since", ["unchanged", "dropped", "insert revoked"])
async def test_a_workers_next_pass_opens_the_ledger_as_the_tables_are_then(
    db: psycopg.Connection[Any], schema_url: str, role: str, since: str
) -> None:
    """A worker opens the ledger with no round trip of its own once it has seen it through the
    same connection settings: its reads and the check of the tables go in the table's plan's
    first round trip (`Ledger.ahead`, `TargetSweeper._prepare`). Two passes of one worker, the
    ledger changed between them: the second counts in the ledger as it then is: in it when
    `unchanged`; from its heartbeats, and exactly, when it was `dropped` (the plan's round
    trip fails with it, and both go again step by step) or this role may no longer add to it
    (`insert revoked`: its reads and its expiry still succeed, so only the check can tell)."""
    db.execute(f'GRANT SELECT, DELETE ON x_idempotency TO "{role}"')
    db.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON purge_progress, purge_shares TO "{role}"')
    url = make_conninfo(schema_url, user=role)
    counted = []
    async with AsyncConnectionPool(url, kwargs={"autocommit": True}, open=False) as pool:
        activities = PurgeActivities(TargetRegistry([kinds.idempotency(pool)]))
        for attempt in range(2):
            if attempt == 1 and since == "dropped":
                db.execute("DROP TABLE purge_progress")
            if attempt == 1 and since == "insert revoked":
                db.execute(f'REVOKE INSERT ON purge_progress FROM "{role}"')
            expired = fill(db, 1_000)
            env = activity_env()
            result: PurgeSweep = await env.run(
                activities.purge_target, PurgeStep(name="x_idempotency", now_ms=NOW)
            )
            ledger = (
                db.execute(
                    "SELECT removed FROM purge_progress WHERE run_id = %s",
                    (env.info.workflow_run_id,),
                ).fetchone()
                if attempt == 0 or since != "dropped"
                else None
            )
            counted.append((result.status, result.removed, result.lower_bound, ledger))
            db.execute("TRUNCATE x_idempotency")

    assert counted[0] == ("ok", expired, False, (expired,))
    in_ledger = (expired,) if since == "unchanged" else None
    assert counted[1] == ("ok", expired, False, in_ledger)


async def test_a_durable_point_the_ledgers_row_lock_holds_fails_in_seconds_not_never(
    db: psycopg.Connection[Any],
    pool: AsyncConnectionPool[Any],
    schema_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sweep's last durable point meets this pass's ledger row locked by another session
    (an older attempt's, an operator's): it fails under the ledger's own timeouts, retried as
    any lock timeout is, rather than wait with the table's lock held until the activity's
    start-to-close (30 minutes)."""
    durable_every(monkeypatch, 1_000_000)  # every batch lazy: one durable point, at the end
    fill(db, 4_000)
    original = Ledger.durable_point

    async def behind_a_lock(self: Ledger, conn: psycopg.AsyncConnection[Any]) -> None:
        holder.execute("SELECT 1 FROM purge_progress FOR UPDATE")
        await original(self, conn)

    monkeypatch.setattr(Ledger, "durable_point", behind_a_lock)
    activities = PurgeActivities(TargetRegistry([kinds.idempotency(pool, settings=TINY)]))
    with psycopg.connect(schema_url) as holder:  # its transaction open until the block ends
        async with asyncio.timeout(60):
            # Its lock or statement timeout, whichever the server meets first.
            with pytest.raises((psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled)):
                await activity_env().run(
                    activities.purge_target, PurgeStep(name="x_idempotency", now_ms=NOW)
                )


ENDS = ["out of time", "cancelled", "a crash at its first report"]


@pytest.mark.waits
@pytest.mark.parametrize(
    ("shape", "end"),
    [(shape, end) for shape in ("index", "walk") for end in ENDS],
)
async def test_a_server_crash_undoes_none_of_what_a_sweep_reported(
    pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch, shape: str, end: str
) -> None:
    """Batches commit lazily (their ledger rows with them), and nothing of theirs is reported
    before a durable point covers it. PostgreSQL crashed (immediate shutdown, so nothing in its
    WAL buffers is written) the moment the sweep ends by its budget or by a cancellation, or the
    moment its first batch heartbeat arrives, still has every row gone that the sweep reported
    removed. Without the durable point at the end, the last batches come back with the restart;
    reported at once, a lazy batch's heartbeat (and its rows in the worker's counter) would
    count rows the crash brings back. No purge_shares table: its record after the sweep would
    be a durable commit of its own.

    The sweep ends mid-table on any machine: a row half way through is held locked, and the
    budget is spent (or the cancellation sent) while its batch waits for it; no durable point
    comes before the end but the one a crash at the first report needs (every fifth batch)."""
    durable_every(monkeypatch, 5 if end == "a crash at its first report" else 1_000_000)
    clock = budget_clock(monkeypatch)
    cache = pytestconfig.cache
    template = cluster_template(cache.mkdir(TEMPLATE_CACHE)) if cache else None
    # The WAL writer writes lazy commits out within wal_writer_delay (200 ms by default), which
    # survives a crash of the server alone: on a slow machine it would have written them all
    # before the crash, and a report of a batch no durable point covers would go unseen. At its
    # longest, the last lazy commits are still in the WAL buffers when the server crashes.
    slow_writer = {"wal_writer_delay": "10s"}
    with running_postgres("purge-crash-pg-", template, slow_writer) as server:
        with arranging(server.url()) as db:
            db.execute(reference_ddl())
            db.execute("DROP TABLE purge_shares")
            # Every tenth row expired: through the index, 40 batches of 100; every other
            # one: a walk of 8 pages a batch. Row k20000 lies half way either way.
            expired = fill(db, 40_000, every=10 if shape == "index" else 2)
        pool = await open_pool(server.url())
        try:
            env = activity_env()
            beats: list[dict[str, Any]] = []

            def beat(*details: Any) -> None:
                if "batch_ms" not in details[0]:
                    return  # a heartbeat between batches
                beats.append(details[0])
                if end == "a crash at its first report" and len(beats) == 1:
                    server.stop(immediate=True)

            env.on_heartbeat = beat
            # Ten minutes, spent by hand once the sweep waits at the row (`budget_clock`).
            target = kinds.idempotency(pool, settings=replace(TINY, time_budget_ms=600_000))
            activities = PurgeActivities(TargetRegistry([target]))
            running = asyncio.ensure_future(
                env.run(activities.purge_target, PurgeStep(name="x_idempotency", now_ms=NOW))
            )
            if end != "a crash at its first report":
                with (
                    arranging(server.url()) as db,
                    row_locked(server.url(), "x_idempotency", "k20000"),
                ):
                    await until_a_sweep_waits(db, running)
                    if end == "out of time":
                        clock.spend(600)
                    else:
                        env.cancel()
            if end == "out of time":
                result: PurgeSweep = await running
                assert result.backlog > 0, "the budget did not cut the sweep short"
                reported = result.removed
            else:
                with pytest.raises((asyncio.CancelledError, psycopg.OperationalError)):
                    await running
                reported = int(beats[-1]["removed"])
        finally:
            server.stop(immediate=True)
            await pool.close()
        server.start()
        with arranging(server.url()) as db:
            assert beats
            assert {b["strategy"] for b in beats} == {"range" if shape == "walk" else "index"}
            assert 0 < reported < expired
            if end == "a crash at its first report":
                # At least what it reported; more only if the crash spared a later lazy batch.
                assert expired - expired_left(db) >= reported
            else:
                assert expired - expired_left(db) == reported


async def test_a_target_of_one_table_opens_the_ledger_on_that_tables_connection(
    db: psycopg.Connection[Any], schema_url: str, pools: Pools
) -> None:
    """One pool checkout (and the pool's check of it, a round trip) a table: the ledger's count
    is read on the connection that then sweeps the table, still before its first statement,
    and counts every row. (A target of several tables, `auth` here, opens it on a connection of
    its own first: it checks all its tables before the first delete.)"""
    pool = await pools(schema_url)
    expired = fill(db, 4_000)
    activities = PurgeActivities(
        TargetRegistry([kinds.idempotency(pool, settings=TINY), kinds.auth(pool, settings=TINY)])
    )
    checkouts, counted = [], []
    for name in ("x_idempotency", BUILTIN_KINDS["auth"].default_name):
        before = pool.get_stats().get("requests_num", 0)
        env = activity_env()
        result = await env.run(activities.purge_target, PurgeStep(name=name, now_ms=NOW))
        checkouts.append(pool.get_stats()["requests_num"] - before)
        ledger = db.execute(
            "SELECT removed FROM purge_progress WHERE run_id = %s", (env.info.workflow_run_id,)
        ).fetchone()
        counted.append((result.removed, ledger))

    assert counted == [(expired, (expired,)), (0, None)]
    assert checkouts[0] == 1
    assert checkouts[1] > 2  # the ledger's, then one a table at least
