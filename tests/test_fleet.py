"""A fleet: targets over several databases, swept concurrently under limits and one budget per
pass, and never two sweeps of one table at a time."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, ClassVar

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from activities import builtin_kinds as kinds
from activities.engine import partition_advice
from activities.engine.access import LOCK_SPACE, table_lock_keys
from activities.engine.errors import BadTable, SweepRefused
from activities.inputs import PurgeStep
from activities.registry import TargetRegistry
from activities.results import PurgeSweep
from activities.schema import reference_ddl
from activities.sweep import PurgeActivities
from purge_config import ConfigError, parse_config
from purge_config.names import TableName
from purge_config.settings import SweepSettings
from purge_dev.servers import venv_executable
from purge_ops import runner
from purge_ops.connect import lazy_pools
from purge_ops.runner import activity_worker, new_worker
from tests.conftest import Harness, RunWorker
from tests.support.activity import activity_env
from tests.support.delete_log import (
    MEETING_S,
    a_second_sweep_s_chance,
    drop_log,
    log_each_delete,
    meet_first,
    one_at_a_time,
    took_to_meet,
)
from tests.support.history import events, scheduled_targets
from tests.support.history import kinds as event_kinds
from tests.support.pace import (
    budget_clock,
    cut_short_at,
    row_locked,
    unhurried_whole_batch,
    until_a_sweep_waits,
)
from tests.support.passes import failed_pass, run_pass, run_pass_beside, until_polled
from tests.support.procs import clean_env, use_env
from tests.support.rows import HOUR, PAST_NOW, idempotency_rows, keys
from tests.support.servers import RunningTemporal
from workflows.chunk import PurgeChunkWorkflow
from workflows.purge import PurgeWorkflow

NOW = PAST_NOW


class Sleeper:
    """A target that takes `seconds` and records how many sweeps overlap, overall and per
    database (its workflow test needs no table). Where a test sets `meet`, the first `meet`
    sweeps to start each wait (up to MEET_WITHIN) until all of them have started: sweeps the
    pass starts together then overlap however slowly the worker starts them."""

    running: ClassVar[Counter[str]] = Counter()
    most: ClassVar[Counter[str]] = Counter()
    meet: ClassVar[int] = 0
    started: ClassVar[int] = 0
    met: ClassVar[asyncio.Event] = asyncio.Event()

    def __init__(self, name: str, database: str, seconds: float) -> None:
        self.name, self.database, self.seconds = name, database, seconds

    async def purge_expired(self, now_ms: int) -> int:
        cls = Sleeper
        for key in ("*", self.database):
            cls.running[key] += 1
            cls.most[key] = max(cls.most[key], cls.running[key])
        try:
            cls.started += 1
            if cls.started == cls.meet:
                cls.met.set()
            if cls.started <= cls.meet:
                # Bounded only so that a pass that never starts them together fails the test
                # (its `most` short) instead of hanging it.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(cls.met.wait(), MEET_WITHIN)
            await asyncio.sleep(self.seconds)
        finally:
            for key in ("*", self.database):
                cls.running[key] -= 1
        return len(self.name)


#: How long the first sweeps wait for each other (seconds): only the end of a test whose pass
#: never starts them together.
MEET_WITHIN = 60.0


@pytest.fixture
def sleepers() -> type[Sleeper]:
    Sleeper.running, Sleeper.most = Counter(), Counter()
    Sleeper.meet, Sleeper.started, Sleeper.met = 0, 0, asyncio.Event()
    return Sleeper


@pytest.mark.waits
async def test_a_pass_runs_targets_concurrently_within_its_limits_and_reports_in_input_order(
    client: Client, task_queue: str, run_worker: RunWorker, sleepers: type[Sleeper]
) -> None:
    layout = {"a1": "db1", "a2": "db1", "b1": "db2", "b2": "db2", "c1": "", "c2": "", "b3": "db2"}
    targets = [Sleeper(name, db, 0.4) for name, db in layout.items()]
    # The two the pass starts first (a1 and b1, on two databases) overlap on any machine: each
    # waits until the other has started. The limits are what keeps any third from joining them.
    sleepers.meet = 2
    request = {
        "targets": list(layout),
        "max_concurrent": 2,
        "max_per_database": 1,
        "budget_ms": 600_000,
        "databases": {name: db for name, db in layout.items() if db},
    }
    workflow_id = f"purge-test-{uuid.uuid4()}"
    async with run_worker(targets):
        result = await run_pass(client, task_queue, request, workflow_id)
    history = await events(client, workflow_id)
    scheduled = scheduled_targets(client, history)

    assert [s["name"] for s in result["swept"]] == list(layout)
    assert all(s["status"] == "ok" for s in result["swept"])
    assert result["removed"] == sum(len(name) for name in layout)
    assert sleepers.most["*"] == 2  # two at once (made to meet)
    # Never more, by the pass's own ledger: how many sweeps it had scheduled and not yet seen
    # complete at once, overall and per database. (The sleepers' own count would miss a third
    # that a slow machine started after the first two ended.)
    assert sweeps_under_way(history, scheduled, layout) == {"*": 2, "db1": 1, "db2": 1, "": 1}
    # Scheduled in input order, a target whose database was busy letting the next one start.
    # (The history's order: the worker may start two activity tasks of one workflow task in
    # either order.)
    assert scheduled[:2] == ["a1", "b1"]


def sweeps_under_way(
    history: list[Any], scheduled: list[str], database_of: dict[str, str]
) -> Counter[str]:
    """The most activities a pass had scheduled and not yet seen end at one point of its
    `history`, overall ("*") and per database: `scheduled` names each scheduled activity's
    target, in the history's order."""
    names = iter(scheduled)
    target: dict[int, str] = {}
    running: Counter[str] = Counter()
    most: Counter[str] = Counter()
    for e in history:
        if e.HasField("activity_task_scheduled_event_attributes"):
            target[e.event_id] = next(names)
            for key in ("*", database_of[target[e.event_id]]):
                running[key] += 1
                most[key] = max(most[key], running[key])
        for ended in ("completed", "failed", "timed_out", "canceled"):
            field = f"activity_task_{ended}_event_attributes"
            if e.HasField(field):
                name = target[getattr(e, field).scheduled_event_id]
                for key in ("*", database_of[name]):
                    running[key] -= 1
    return most


@pytest.mark.waits
async def test_a_pass_out_of_budget_reports_the_rest_skipped_and_the_next_pass_sweeps_them(
    client: Client, task_queue: str, run_worker: RunWorker, sleepers: type[Sleeper]
) -> None:
    names = ["t1", "t2", "t3", "t4"]
    request = {"targets": names, "max_concurrent": 1, "budget_ms": 1_500}
    # On any machine: the first target starts with the whole budget (the deadline is read in
    # the workflow task that starts it), and t1 takes longer than the budget in workflow time,
    # which is the server's clock; so t2-t4 find it spent however slowly anything else ran.
    # Skipped by the first pass whatever they take, they need not make the second pass wait.
    seconds = {"t1": 2.0, "t2": 0.1, "t3": 0.1, "t4": 0.1}
    async with run_worker([Sleeper(name, "", seconds[name]) for name in names]):
        first = await run_pass(client, task_queue, request)
        second = await run_pass(
            client, task_queue, {**request, "targets": names[1:], "budget_ms": 60_000}
        )

    statuses = [(s["name"], s["status"]) for s in first["swept"]]
    assert statuses == [("t1", "ok"), ("t2", "skipped"), ("t3", "skipped"), ("t4", "skipped")]
    assert first["swept"][0]["removed"] == 2  # the target that outran the budget finished
    skipped = first["swept"][1]
    assert (skipped["removed"], skipped["reason"].startswith("the pass's budget")) == (0, True)
    assert not first["failed"]  # the pass ended normally
    assert [(s["name"], s["status"]) for s in second["swept"]] == [
        ("t2", "ok"),
        ("t3", "ok"),
        ("t4", "ok"),
    ]


async def test_a_pass_without_limits_is_the_sequential_pass(
    client: Client, task_queue: str, run_worker: RunWorker, sleepers: type[Sleeper]
) -> None:
    """As started by the `temporal` CLI: no limits in the input, no patch marker, one at a
    time."""
    async with run_worker([Sleeper(n, "", 0.1) for n in ("p", "q", "r")]):
        await run_pass(client, task_queue, {"targets": ["p", "q", "r"]}, "purge-plain")
    history = await client.get_workflow_handle("purge-plain").fetch_history()

    assert sleepers.most["*"] == 1
    # Each target scheduled only once the one before it completed, whatever the sleeps' overlap.
    steps = {"ACTIVITY_TASK_SCHEDULED", "ACTIVITY_TASK_COMPLETED"}
    order = [kind for kind in event_kinds(list(history.events)) if kind in steps]
    assert order == ["ACTIVITY_TASK_SCHEDULED", "ACTIVITY_TASK_COMPLETED"] * 3
    assert not any(e.HasField("marker_recorded_event_attributes") for e in history.events)


@pytest.mark.waits
async def test_a_built_in_sweep_ends_by_the_pass_budget_below_its_own_time_budget(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pass hands each target what is left of its budget: a sweep whose own time budget is
    10 minutes, in a pass of one minute, stops once two minutes pass on the hand clock, with a
    backlog (without the hand-off it would go on, its own budget far from spent, and take every
    row)."""
    expired = 12_000
    harness.db.execute(
        "INSERT INTO x_idempotency SELECT 'k' || i, null, CASE WHEN i <= %s THEN %s ELSE %s END"
        " FROM generate_series(1, %s) i",
        (expired, harness.now_ms - HOUR, harness.now_ms + HOUR, expired + 100),
    )
    target = kinds.idempotency(harness.pool)
    assert target.settings.time_budget_ms == 600_000  # the default: far above the pass's
    clock = budget_clock(monkeypatch)
    request = {"targets": ["x_idempotency"], "max_concurrent": 1, "budget_ms": 60_000}
    spent = 2 * request["budget_ms"] // 1000  # seconds: the pass's budget twice, not the target's
    async with harness.run_worker([target]):
        result = await cut_short_at(
            harness.db,
            harness.url,
            "x_idempotency",
            "k1",
            clock,
            lambda: run_pass(harness.client, harness.task_queue, request),
            seconds=spent,
        )

    [sweep] = result["swept"]
    assert sweep["status"] == "ok"
    assert 0 < sweep["removed"] < expired
    assert sweep["backlog"] == expired - sweep["removed"]


@pytest.mark.waits
async def test_a_sweep_not_taken_behind_a_busy_worker_is_sent_again_not_failed(
    harness: Harness, temporal_server: RunningTemporal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run --max-sweeps 1` under a pass of two tables at once and a 3 s worker_wait: the sweep
    the worker takes first waits on a held row far past that, so the other's activity is not
    taken within worker_wait, though the queue's one worker is only busy. It is held, then sent
    again once the first is done (a worker took an activity of its queue since it was sent):
    both tables swept, nothing failed. (Before BUSY_RESENT it failed as NoPurgeWorker, and the
    queue's later targets with it.)

    The resent sweep is taken at once by a poll already waiting on the server: a second worker
    of the queue, started once the first timeout is in and listed before the rows are let go.
    The busy worker's own poll, sent once its slot frees, may reach the server after the resend
    and, on a stalled machine, worker_wait after it: the resend would then fail as not taken."""
    tables = ["held_0", "held_1"]
    for table in tables:
        harness.db.execute(f"CREATE TABLE {table} (key text PRIMARY KEY, at bigint NOT NULL)")
        harness.db.execute(
            f"INSERT INTO {table} SELECT 'k' || i, %s FROM generate_series(1, 10) i",
            (harness.now_ms - HOUR,),
        )
    config = parse_config(
        {"database_url": harness.url, "task_queue": harness.task_queue,
         # 3 s, not 1: the resent sweep is taken within it too, from a poll that waits on
         # the server by then; a margin for the server's own dispatch.
         "pass": {"max_concurrent": 2, "max_per_database": 2, "worker_wait": "3s"},
         # Each sweep waits on its held row as long as the test holds it, not 2 s.
         "targets": [{"kind": "expiring", "name": t, "table": t, "column": "at",
                      "lock_timeout": "60s"} for t in tables]},
        env={},
    )  # fmt: skip
    assert config.own_queue is not None
    use_env(monkeypatch, clean_env())
    workflow_id = f"purge-busy-worker-{uuid.uuid4()}"
    stop = asyncio.Event()
    worker = asyncio.create_task(
        runner.run_worker(config, stop=stop, temporal_address=temporal_server.address, max_sweeps=1)
    )
    running = contextlib.AsyncExitStack()
    try:
        await until_polled(harness.client, config.own_queue, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)
        with row_locked(harness.url, tables[0], "k1"), row_locked(harness.url, tables[1], "k1"):
            handle = await harness.client.start_workflow(
                "Purge", config.pass_input(), id=workflow_id, task_queue=harness.task_queue
            )
            # The moment: one sweep held on its row, the other's activity timed out unstarted.
            async with asyncio.timeout(60):
                while "ACTIVITY_TASK_TIMED_OUT" not in event_kinds(
                    await events(harness.client, workflow_id)
                ):
                    assert not worker.done(), f"the worker stopped: {worker.exception()!r}"
                    await asyncio.sleep(0.05)
            # A poll waiting for the resend before the first sweep can end and send it.
            spare = f"spare-{uuid.uuid4()}"
            registry = kinds.build_registry(config, harness.pool)
            await running.enter_async_context(
                activity_worker(harness.client, registry, config.own_queue, identity=spare)
            )
            await until_polled_by(harness.client, config.own_queue, spare)
        result = await asyncio.wait_for(handle.result(), 60)
    finally:
        await running.aclose()
        stop.set()
        await worker

    assert result["failed"] == [], result
    assert {s["name"]: (s["status"], s["removed"]) for s in result["swept"]} == dict.fromkeys(
        tables, ("ok", 10)
    )
    history = event_kinds(await events(harness.client, workflow_id))
    assert history.count("ACTIVITY_TASK_SCHEDULED") == 3  # one table's sweep sent twice
    assert history.count("ACTIVITY_TASK_TIMED_OUT") == 1
    # The new shape replays on this release's workflows (its patch marker among its events).
    recorded = await harness.client.get_workflow_handle(workflow_id).fetch_history()
    await Replayer(workflows=[PurgeWorkflow, PurgeChunkWorkflow]).replay_workflow(recorded)


async def until_polled_by(client: Client, queue: str, identity: str) -> None:
    """Returns once the worker `identity`'s poll of `queue`'s activities reached the server
    (within a minute): a task put there from then on is taken at once."""
    request = DescribeTaskQueueRequest(
        namespace=client.namespace,
        task_queue=TaskQueue(name=queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
    )
    async with asyncio.timeout(60):
        while not any(
            poller.identity == identity
            for poller in (await client.workflow_service.describe_task_queue(request)).pollers
        ):
            await asyncio.sleep(0.05)


def hold_table_lock(conn: psycopg.Connection[Any], table: str) -> None:
    """Take the advisory lock a sweep of `table` takes, as another sweep would."""
    conn.execute(sql.SQL("SELECT pg_advisory_lock({})").format(table_lock_keys()), {"rel": table})


def patient_sweep(
    pool: AsyncConnectionPool[Any], busy_wait_ms: int
) -> tuple[PurgeActivities, PurgeStep]:
    """The activities for x_idempotency waiting `busy_wait_ms` for a held table, and its step."""
    patient = SweepSettings(busy_wait_ms=busy_wait_ms)
    activities = PurgeActivities(TargetRegistry([kinds.idempotency(pool, settings=patient)]))
    return activities, PurgeStep(name="x_idempotency", now_ms=NOW)


async def test_a_table_another_sweep_holds_is_reported_busy_and_nothing_is_deleted(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], schema_url: str
) -> None:
    db.execute(
        "INSERT INTO x_idempotency VALUES ('old', null, %s), ('new', null, %s)",
        (NOW - HOUR, NOW + HOUR),
    )
    activities, step = patient_sweep(pool, busy_wait_ms=300)
    with psycopg.connect(schema_url, autocommit=True) as other:
        hold_table_lock(other, "x_idempotency")
        started = time.monotonic()
        busy: PurgeSweep = await activity_env().run(activities.purge_target, step)
        waited = time.monotonic() - started

    assert (busy.status, busy.removed) == ("busy", 0)
    assert "another sweep held x_idempotency" in busy.reason
    assert waited >= 0.3  # it waited busy_wait for the lock (a ceiling would time the machine)
    assert keys(db, "x_idempotency") == {"old", "new"}
    # The other sweep's session ended: its lock went with it, and the next sweep runs.
    done: PurgeSweep = await activity_env().run(activities.purge_target, step)
    assert (done.status, done.removed) == ("ok", 1)


@pytest.mark.waits
async def test_an_empty_table_is_swept_without_waiting_for_its_lock(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], schema_url: str
) -> None:
    """A table without a page has nothing to delete: its sweep neither takes the table's lock
    nor waits for another sweep's, so a fleet's empty tables cost no lock round trips."""
    # Far longer than the empty sweep takes on any machine; the busy one waits a short one out.
    patient, step = patient_sweep(pool, busy_wait_ms=20_000)
    brief, _ = patient_sweep(pool, busy_wait_ms=300)
    with psycopg.connect(schema_url, autocommit=True) as other:
        hold_table_lock(other, "x_idempotency")
        started = time.monotonic()
        empty: PurgeSweep = await activity_env().run(patient.purge_target, step)
        waited = time.monotonic() - started
        # One expired row, and the table is no longer empty: a sweep waits and is busy.
        db.execute("INSERT INTO x_idempotency VALUES ('old', null, %s)", (NOW - HOUR,))
        busy: PurgeSweep = await activity_env().run(brief.purge_target, step)

    assert (empty.status, empty.removed, empty.batches) == ("ok", 0, 0)
    assert waited < 10  # not the 20 s busy_wait
    assert busy.status == "busy"
    assert keys(db, "x_idempotency") == {"old"}


def table_lock_holders(db: psycopg.Connection[Any], table: str) -> list[int]:
    """The backends holding the advisory lock a sweep of `table` takes (its second key is the
    table's OID less 2^31, which pg_locks shows as an unsigned objid)."""
    rows = db.execute(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2"
        " AND classid = %s::bigint::oid"
        " AND objid::bigint = (%s::regclass::oid::bigint + 2147483648) %% 4294967296",
        (LOCK_SPACE, table),
    )
    return [pid for (pid,) in rows]


@pytest.mark.parametrize("shares", ["recorded", "no table", "record held up"])
async def test_a_sweep_releases_its_table_lock_when_it_ends(
    db: psycopg.Connection[Any],
    pool: AsyncConnectionPool[Any],
    schema_url: str,
    monkeypatch: pytest.MonkeyPatch,
    shares: str,
) -> None:
    """Expired rows, so the sweep takes the table's lock (an empty table's never does); its
    pooled connection outlives the sweep, so only an unlock frees the table for the next. The
    unlock rides with the day's record of the table's share, the sweep's last statement,
    when that record is made (`recorded`); else it is a statement of its own: with no
    `purge_shares` table, or when the record gives up waiting for a lock on that table (held
    from the sweep's first batch on): its lock_timeout, and the sweep still ends ok."""
    idempotency_rows(db, {f"old-{i}": NOW - HOUR for i in range(1_000)})
    # Live rows enough that the pass removes a small share: a large one is advice of its own,
    # and then not recorded.
    db.execute(
        "INSERT INTO x_idempotency (key, response, expires_at_ms)"
        " SELECT 'new' || i, '{}', %s FROM generate_series(1, 20000) i",
        (NOW + HOUR,),
    )
    db.execute(
        "ANALYZE x_idempotency"
    )  # the rows left are known (a share no one knows is not kept)
    if shares == "no table":
        db.execute("DROP TABLE purge_shares")
    if shares == "record held up":
        # A lock held for certain: the record gives up at its lock_timeout, whatever the
        # machine, so a short one only saves time. A record that is made keeps its 2 s.
        monkeypatch.setattr(partition_advice, "RECORD_TIMEOUT_MS", 200)
    held_during: list[list[int]] = []
    blocker = psycopg.connect(schema_url)  # its LOCK TABLE stays until it is closed

    def beat(*_: Any) -> None:
        held_during.append(table_lock_holders(db, "x_idempotency"))
        if shares == "record held up" and len(held_during) == 1:
            blocker.execute("LOCK TABLE purge_shares IN ACCESS EXCLUSIVE MODE")

    env = activity_env()
    env.on_heartbeat = beat
    activities = PurgeActivities(TargetRegistry([kinds.idempotency(pool)]))
    try:
        done: PurgeSweep = await env.run(
            activities.purge_target, PurgeStep(name="x_idempotency", now_ms=NOW)
        )
        free = table_lock_holders(db, "x_idempotency") == []
    finally:
        blocker.close()
    recorded = (
        db.execute("SELECT count(*) FROM purge_shares WHERE now_ms = %s", (NOW,)).fetchone()
        if shares != "no table"
        else (0,)
    )

    assert (done.status, done.removed) == ("ok", 1_000)
    assert held_during, "no batch heartbeat was seen"
    assert all(len(holders) == 1 for holders in held_during), held_during  # the sweep held it
    assert recorded == ((1,) if shares == "recorded" else (0,))
    assert free
    with psycopg.connect(schema_url, autocommit=True) as other:
        taken = other.execute(
            sql.SQL("SELECT pg_try_advisory_lock({})").format(table_lock_keys()),
            {"rel": "x_idempotency"},
        ).fetchone()
    assert taken == (True,)


@pytest.mark.parametrize("refused", ["a column in the wrong unit", "an unindexed child table"])
async def test_a_sweep_refused_after_its_plan_took_the_table_lock_releases_it(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], refused: str
) -> None:
    """The table's lock is taken, when free, in the plan's own round trip, before the plan's
    checks are judged: a check that refuses the table (its epoch column read in the wrong
    unit; a child table with no index under `refuse_unindexed_children`) deletes nothing and
    leaves the lock free for the next sweep, though the refusing connection goes back to the
    pool with its session. (The batched path: a pacing setting keeps the one-statement sweep
    of a small table, which has a lock of its own, out of it.)"""
    batched = SweepSettings(max_wal_rate=10**12, refuse_unindexed_children=True)
    if refused == "a column in the wrong unit":
        table = "events"
        db.execute("CREATE TABLE events (key text PRIMARY KEY, at bigint NOT NULL)")
        db.execute(
            "INSERT INTO events SELECT 'r' || i, %s + (i - 50) * 3600"
            " FROM generate_series(0, 99) i",
            (NOW // 1000,),
        )  # seconds, read as milliseconds: all in January 1970, all expired
        target = kinds.expiring(pool, table, TableName(table), "at", settings=batched)
    else:
        table = "parent"
        db.execute("CREATE TABLE parent (id bigint PRIMARY KEY, expires_ms bigint NOT NULL)")
        db.execute(
            "CREATE TABLE child (id bigint PRIMARY KEY,"
            " parent_id bigint REFERENCES parent ON DELETE CASCADE)"
        )
        db.execute(
            "INSERT INTO parent SELECT i, %s + (i - 5) * 1000 FROM generate_series(1, 10) i",
            (NOW,),
        )
        db.execute("INSERT INTO child SELECT i, i FROM generate_series(1, 10) i")
        target = kinds.expiring(pool, table, TableName(table), "expires_ms", settings=batched)
    before = db.execute(f"SELECT count(*) FROM {table}").fetchone()

    with pytest.raises((BadTable, SweepRefused), match=r"[Nn]othing (was )?deleted"):
        await target.purge_expired(NOW)

    assert db.execute(f"SELECT count(*) FROM {table}").fetchone() == before
    assert table_lock_holders(db, table) == []


@pytest.fixture
def databases(pg_url: str) -> Iterator[dict[str, str]]:
    """Three databases of their own on the test server, with the built-in tables."""
    names = [f"fleet_{uuid.uuid4().hex[:8]}_{i}" for i in range(3)]
    with psycopg.connect(pg_url, autocommit=True) as admin:
        for name in names:
            admin.execute(f'CREATE DATABASE "{name}"')
    urls = {f"shard{i}": make_conninfo(pg_url, dbname=name) for i, name in enumerate(names)}
    for url in urls.values():
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(reference_ddl())
    yield urls
    with psycopg.connect(pg_url, autocommit=True) as admin:
        for name in names:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture
async def fleet_pools(databases: dict[str, str]) -> AsyncIterator[dict[str, Any]]:
    pools = lazy_pools(databases)
    yield pools
    for opened in pools.values():
        await opened.close()


@pytest.mark.waits
async def test_targets_over_three_databases_remove_exactly_their_rows_one_down_fails_alone(
    time_skipping: WorkflowEnvironment,
    task_queue: str,
    pool: AsyncConnectionPool[Any],
    databases: dict[str, str],
) -> None:
    """On the time-skipping server, so the down database's retries take seconds, not minutes."""
    # The time-skipping server's clock runs ahead of the machine's by all it skipped so far:
    # rows are written around its clock, the live one far enough ahead to outlast the retries.
    now = int((await time_skipping.get_current_time()).timestamp() * 1000)
    for i, url in enumerate(databases.values()):
        with psycopg.connect(url, autocommit=True) as conn:
            for n in range(i + 2):
                conn.execute(
                    "INSERT INTO x_idempotency VALUES (%s, null, %s)", (f"old{n}", now - HOUR)
                )
            conn.execute("INSERT INTO x_idempotency VALUES ('new', null, %s)", (now + 24 * HOUR,))
    down = {**databases, "gone": make_conninfo(databases["shard0"], port=1, host="127.0.0.1")}
    raw = {
        "database_url": "postgresql://unused@127.0.0.1/unused",
        "databases": {name: {"url": url} for name, url in down.items()},
        "pass": {"max_concurrent": 4, "max_per_database": 1},
        "targets": [
            {"kind": "idempotency", "name": f"idem@{name}", "database": name} for name in down
        ],
    }
    config = dataclasses.replace(parse_config(raw, env={}), task_queue=task_queue)
    # The down database's attempts fail within half a second each; the others wait for a
    # connection as long as a worker's do, however slow the machine is to give one.
    up = {name: url for name, url in config.databases.items() if name != "gone"}
    pools = {**lazy_pools(up), **lazy_pools({"gone": down["gone"]}, wait_seconds=0.5)}
    client = time_skipping.client
    try:
        registry = kinds.build_registry(config, pool, pools)
        assert config.own_queue is not None
        async with (
            new_worker(client, registry, task_queue),
            activity_worker(client, registry, config.own_queue),
        ):
            failure = await failed_pass(
                client, task_queue, config.pass_input(), f"purge-fleet-{uuid.uuid4()}"
            )
    finally:
        for opened in pools.values():
            await opened.close()

    report = failure.details[0]
    assert {s["name"]: s["removed"] for s in report["swept"]} == {
        "idem@shard0": 2,
        "idem@shard1": 3,
        "idem@shard2": 4,
    }
    [failed] = report["failed"]
    assert failed["name"] == "idem@gone"
    assert "database gone" in failed["message"]  # named, its URL without a password
    assert "unused" not in str(report)  # no URL of the default database in the report
    for url in databases.values():
        with psycopg.connect(url) as conn:
            assert {r[0] for r in conn.execute("SELECT key FROM x_idempotency")} == {"new"}


def test_fleet_config_errors_are_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    base = {"database_url": "postgresql://app@db/app"}
    cases = {
        "no such database": (
            {"targets": [{"kind": "idempotency", "database": "nope"}]},
            "database: no [databases.nope]",
        ),
        "both url and url_env": (
            {"databases": {"a": {"url": "postgresql://x@db/a", "url_env": "A"}}},
            "databases.a: give exactly one of url and url_env",
        ),
        "neither": ({"databases": {"a": {}}}, "got neither"),
        "unset variable": (
            {"databases": {"a": {"url_env": "PURGE_TEST_UNSET_VARIABLE"}}},
            "the variable PURGE_TEST_UNSET_VARIABLE is not set",
        ),
        "max_concurrent 0": ({"pass": {"max_concurrent": 0}}, "pass.max_concurrent"),
        "max_per_database 0": ({"pass": {"max_per_database": 0}}, "pass.max_per_database"),
        "budget no duration": ({"pass": {"budget": "soon"}}, "pass.budget: not a duration"),
        "budget past the period": (
            {"pass": {"budget": "1h"}},
            "pass.budget: must end before the schedule fires again (every 1h)",
        ),
        # A weekly schedule: the workflow's input refuses a budget over a day, so the config
        # does, where `check` reads it, not `run` after connecting.
        "database_url only spaces": (
            {"database_url": "   "},
            "database_url: must be a connection string, got an empty or blank one",
        ),
        "url_env of spaces": (
            {"databases": {"a": {"url_env": "PURGE_TEST_SPACES"}}},
            "databases.a.url_env: the variable PURGE_TEST_SPACES is not set (or empty)",
        ),
        "url_env starting with a digit": (
            {"databases": {"a": {"url_env": "1DB"}}},
            "databases.a.url_env: must name an environment variable (letters, digits, _, - and"
            " ., not starting with a digit), got '1DB'",
        ),
        "url_env named across lines": (
            {"databases": {"a": {"url_env": "A\nB"}}},
            "databases.a.url_env: must name an environment variable",
        ),
        "budget over a day": (
            {"pass": {"budget": "2d"}, "schedule": {"cron": "0 3 * * 0"}},
            "pass.budget: at most 1d, got '2d'",
        ),
    }
    for label, (extra, expected) in cases.items():
        with pytest.raises(ConfigError) as refused:
            parse_config({**base, **extra}, env={"PURGE_TEST_SPACES": "  "})
        message = str(refused.value)
        assert expected in message, (label, message)
        assert "\n" not in message


@pytest.mark.parametrize("queue", [{}, {"task_queue": "purge-a"}], ids=["polled", "routed"])
def test_a_connection_string_written_as_url_env_is_refused_unquoted(
    queue: dict[str, str],
) -> None:
    """`url_env` names the variable that holds the URL; an operator who writes the URL itself
    there is refused in one line that shows none of it, the password least of all. A database on
    a queue of its own is refused so too, rather than passed over as another worker's (whose
    variable this worker need not have), which left it unswept without a word."""
    for pasted in ("postgresql://purge:s3cr3t@db/app", "host=db password=s3cr3t"):
        with pytest.raises(ConfigError) as refused:
            parse_config(
                {
                    "database_url": "postgresql://app@db/app",
                    "databases": {"a": {"url_env": pasted, **queue}},
                    "targets": [{"kind": "idempotency", "name": "i@a", "database": "a"}],
                },
                env={},
            )
        message = str(refused.value)
        assert "databases.a.url_env: must name an environment variable" in message
        assert "s3cr3t" not in message
        assert "db=" not in message
        assert "db/app" not in message.split("url_env:")[1]


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (
            {"targets": [{"kind": "idempotency", "database": "postgresql://purge:s3cr3t@db/app"}]},
            "[[targets]] #1: database: not a database name, got <",
        ),
        (
            {
                "databases": {
                    "a": {"url": "postgresql://purge@db/a", "task_queue": "x password=s3cr3t"}
                }
            },
            "databases.a.task_queue: not a task queue name",
        ),
        ({"task_queue": "postgresql://purge:s3cr3t@db/app"}, "task_queue: not a task queue name"),
    ],
    ids=["target-database", "database-queue", "task-queue"],
)
def test_a_connection_string_in_a_name_field_is_refused_by_its_length(
    extra: dict[str, Any], said: str
) -> None:
    """A target's `database` (the key invites a URL), a database's or the config's task queue:
    a connection string written there fails the name's check, and the refusal quoted it."""
    with pytest.raises(ConfigError) as refused:
        parse_config({"database_url": "postgresql://app@db/app", **extra}, env={})
    message = str(refused.value)
    assert said in message
    assert "characters not shown: may hold a password>" in message
    assert "s3cr3t" not in message


def test_a_url_env_database_and_the_budget_default_below_a_short_period() -> None:
    config = parse_config(
        {
            "database_url": "postgresql://app@db/app",
            "databases": {"shard2": {"url_env": "SHARD2_URL"}},
            "schedule": {"cron": "*/15 * * * *"},
            "targets": [{"kind": "idempotency", "name": "i@2", "database": "shard2"}],
        },
        env={"SHARD2_URL": "postgresql://purge:secret@db2/app"},
    )

    assert config.databases == {"shard2": "postgresql://purge:secret@db2/app"}
    assert config.limits.budget_ms == 750_000  # five sixths of 15 minutes
    request = config.pass_input()
    assert request["databases"] == {"i@2": "shard2"}
    assert "secret" not in str(request)  # names travel in the input, never URLs


async def test_two_passes_started_by_two_paths_never_sweep_one_table_at_once(
    harness: Harness, temporal_server: RunningTemporal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One pass started by the client sweeps the table, its batch waiting on a row an
    application holds (as long as the test holds it); another, started by the `temporal` CLI
    meanwhile, finds the table busy within its busy_wait and removes nothing, rather than
    waiting on the same row. Once the row is let go, the first removes exactly the expired
    rows. (Without the table's lock the second would wait on the row, past the test's bound.)"""
    harness.db.execute(
        "INSERT INTO x_idempotency SELECT 'k' || i, null, CASE WHEN i %% 2 = 0 THEN %s ELSE %s END"
        " FROM generate_series(1, 600) i",
        (harness.now_ms - HOUR, harness.now_ms + HOUR),
    )
    unhurried_whole_batch(monkeypatch)
    patient = SweepSettings(busy_wait_ms=100, lock_timeout_ms=60_000, statement_timeout_ms=600_000)
    request = '{"targets": ["x_idempotency"], "max_concurrent": 2, "budget_ms": 60000}'
    async with harness.run_worker([kinds.idempotency(harness.pool, settings=patient)]):
        with row_locked(harness.url, "x_idempotency", "k2") as holder:
            by_client = await harness.client.start_workflow(
                "Purge", {"targets": ["x_idempotency"], "max_concurrent": 2, "budget_ms": 60_000},
                id=f"purge-client-{uuid.uuid4()}", task_queue=harness.task_queue,
            )  # fmt: skip
            first = asyncio.ensure_future(by_client.result())
            # The moment: the first pass's sweep holds the table, its batch waiting on the row.
            await until_a_sweep_waits(harness.db, first, holder=holder)
            cli_id = f"purge-cli-{uuid.uuid4()}"
            await asyncio.to_thread(
                subprocess.run,
                [
                    venv_executable("temporal"), "workflow", "start",
                    "--address", temporal_server.address, "--task-queue", harness.task_queue,
                    "--type", "Purge", "--workflow-id", cli_id, "--input", request,
                ],
                check=True,
                capture_output=True,
            )  # fmt: skip
            async with asyncio.timeout(60):
                second = await harness.client.get_workflow_handle(cli_id).result()
            assert not first.done()
        results = [await first, second]

    sweeps = [(r["swept"][0]["status"], r["swept"][0]["removed"]) for r in results]
    assert sweeps == [("ok", 300), ("busy", 0)]
    assert len(keys(harness.db, "x_idempotency")) == 300


def test_the_workflow_input_carries_names_of_databases_not_their_urls(tmp_path: Path) -> None:
    config = parse_config(
        {
            "database_url": "postgresql://purge:pw0@db0/app",
            "databases": {"shard1": {"url": "postgresql://purge:pw1@db1/app"}},
            "pass": {"max_concurrent": 8, "max_per_database": 2, "budget": "50m"},
            "targets": [
                {"kind": "idempotency"},
                {"kind": "idempotency", "name": "x_idempotency@shard1", "database": "shard1"},
            ],
        },
        env={},
    )

    assert config.pass_input() == {
        "targets": ["x_idempotency", "x_idempotency@shard1"],
        "max_concurrent": 8,
        "max_per_database": 2,
        "budget_ms": 3_000_000,
        "databases": {"x_idempotency": "_default", "x_idempotency@shard1": "shard1"},
        # The queue of this config's own targets: only workers that name both poll it.
        "queues": {"_default": config.own_queue, "shard1": config.own_queue},
        "worker_wait_ms": 300_000,
    }
    assert config.own_queue is not None
    assert config.own_queue.startswith("purge:")


async def test_max_sweeps_caps_how_many_sweeps_one_worker_runs_at_once(
    harness: Harness, temporal_server: RunningTemporal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run --max-sweeps 1`: a pass that would run three tables at once runs them one after
    another on this worker: each sweep's start comes after the one before it completed, and
    each DELETE, as the database logged it, ends before the next begins.

    The control first: the same pass beside a worker without the bound, its first two DELETEs
    made to meet, overlaps, and says how long this machine took to start a second sweep. The
    bounded run's first DELETE then waits ten times that for a second to meet it: a bound that
    broke would let one, on a machine of any speed."""
    tables = [f"slow_{n}" for n in range(3)]
    for table in tables:
        harness.db.execute(f"CREATE TABLE {table} (key text PRIMARY KEY, at bigint NOT NULL)")
    prefix = f"ms{uuid.uuid4().hex[:8]}"
    log_table = log_each_delete(harness.db, prefix, [f"{harness.schema}.{t}" for t in tables])
    config = parse_config(
        {"database_url": harness.url, "task_queue": harness.task_queue,
         "pass": {"max_concurrent": 3, "max_per_database": 3},
         # Past the wait to meet (MEETING_S at most), which ends no sweep itself.
         "targets": [{"kind": "expiring", "name": t, "table": t, "column": "at",
                      "statement_timeout": f"{2 * MEETING_S}s"} for t in tables]},
        env={},
    )  # fmt: skip
    use_env(monkeypatch, clean_env())

    async def one_pass(
        workflow_id: str, max_sweeps: int | None, meet_within_s: float
    ) -> dict[str, Any]:
        for table in tables:
            harness.db.execute(
                f"INSERT INTO {table} SELECT 'k' || i, %s FROM generate_series(1, 150) i",
                (harness.now_ms - HOUR,),
            )
        harness.db.execute(f"TRUNCATE {log_table}")
        meet_first(harness.db, prefix, 2, within_s=meet_within_s)
        return await run_pass_beside(
            lambda stop: runner.run_worker(
                config, stop=stop, temporal_address=temporal_server.address, max_sweeps=max_sweeps
            ),
            harness.client,
            harness.task_queue,
            config.pass_input(),
            workflow_id,
        )

    def logged() -> list[tuple[int, str]]:
        return harness.db.execute(f"SELECT pid, edge FROM {log_table} ORDER BY at").fetchall()

    try:
        control = await one_pass(f"purge-all-at-once-{uuid.uuid4()}", None, MEETING_S)
        unbounded = logged()
        chance = a_second_sweep_s_chance(took_to_meet(harness.db, log_table))
        workflow_id = f"purge-one-at-a-time-{uuid.uuid4()}"
        result = await one_pass(workflow_id, 1, chance)
        log = logged()
    finally:
        drop_log(harness.db, prefix)

    assert {s["name"]: s["removed"] for s in control["swept"]} == dict.fromkeys(tables, 150)
    assert not one_at_a_time(unbounded), unbounded
    assert {s["name"]: s["removed"] for s in result["swept"]} == dict.fromkeys(tables, 150)
    assert len(log) >= 2 * len(tables)
    assert one_at_a_time(log), log
    history = await events(harness.client, workflow_id)
    started = {
        e.activity_task_started_event_attributes.scheduled_event_id: e.event_time.ToDatetime()
        for e in history
        if e.HasField("activity_task_started_event_attributes")
    }
    completed = {
        e.activity_task_completed_event_attributes.scheduled_event_id: e.event_time.ToDatetime()
        for e in history
        if e.HasField("activity_task_completed_event_attributes")
    }
    spans = sorted((started[k], completed[k]) for k in completed)
    assert len(spans) == 3
    for (_, previous_end), (start, _) in itertools.pairwise(spans):
        assert start >= previous_end, spans


@pytest.mark.parametrize("per_database", [2, 6])
async def test_a_worker_s_pools_hold_four_or_its_own_config_s_max_per_database(
    schema_url: str, per_database: int
) -> None:
    """fleets.md: each of a worker's pools (the default database's and a named one's) holds
    `max(4, max_per_database)` sessions by the worker's own `[pass]`, whatever a pass asks."""
    config = parse_config(
        {"database_url": schema_url, "pass": {"max_per_database": per_database},
         "databases": {"eu": {"url": schema_url}},
         "targets": [{"kind": "idempotency"}, {"kind": "idempotency", "name": "eu_keys",
                      "database": "eu"}]},
        env={},
    )  # fmt: skip
    async with runner._pools(config, schema_url) as (pool, named):
        assert pool is not None
        assert pool.max_size == named["eu"]._pool.max_size == max(4, per_database)
