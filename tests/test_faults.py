"""Faults injected into passes on the real servers: the worker SIGKILLed at random points,
PostgreSQL and the Temporal server restarted in the middle of a target, batches failed by
lock_timeout and by statement_timeout.

Each pass sweeps five tables of 100,000 rows (every built-in kind, and an `expiring` table) in
batches of about a millisecond. After each: the pass completed, every live row is still there,
no expired row is left, and the history shows every target scheduled and completed exactly once
(an attempt a fault failed was retried; a target completed before a fault was not run again,
which the canary rows written into its tables after it completed also prove).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from temporalio.client import Client

from activities.engine.access import table_lock_keys
from purge_dev.servers import EmbeddedPostgres, TemporalDevServer
from tests.conftest import Harness
from tests.support.arranging import arranging
from tests.support.dead_worker import notice_the_dead_worker_sooner
from tests.support.faults import Fleet, Tally, TallyReport
from tests.support.oracle import (
    TABLES,
    TARGET_NAMES,
    check,
    create_tables,
    fill,
    tables_of,
    targets_toml,
)
from tests.support.procs import clean_env, worker_config
from tests.support.servers import RunningTemporal, running_postgres, running_temporal
from tests.support.watch import (
    HANG,
    Fault,
    PassWatch,
    Probe,
    Run,
    assert_ledger,
    watching,
)

pytestmark = pytest.mark.slow

#: Rows in each table: each target takes tens to hundreds of batches.
ROWS = 100_000
#: Batches of about a millisecond, so that a fault lands inside a table's sweep, between two
#: batches or in one.
SWEEP = {"batch_target": "1ms"}
KILLS = 20
#: Of the kills, at least this many must strike a sweep in the middle of its target (the server
#: shows the attempt it was running on the killed worker failed: `_struck`). Almost every kill
#: is aimed inside a table's sweep (`_kill_points`); one lands after its target completed only
#: when the target's last rows went within the moments between the probe's look and the kill
#: (17 of 24 kills struck in one run, the early ones of `rng.random() < 0.3` included). The
#: passes go on until this many have struck, so a run of many misses takes another pass.
STRUCK_KILLS = KILLS // 4
PG_RESTARTS = 5
TEMPORAL_RESTARTS = 3
#: A target has 5 attempts: kill none that is already on its third, so two stay spare.
KILLABLE_ATTEMPTS = 2
#: The name the run's `TallyReport` is registered under.
TALLY_PLUGIN = "purge-fault-tally"


@pytest.fixture(scope="module")
def tally(request: pytest.FixtureRequest) -> Tally:
    """The run's figures, printed in the terminal summary: one tally a process, whatever ran
    between this module's tests (a pytest-xdist worker that ran another module's meanwhile made
    this fixture again, and a second plugin under the name failed the next test's setup)."""
    registered = request.config.pluginmanager.get_plugin(TALLY_PLUGIN)
    if isinstance(registered, TallyReport):
        return registered.tally
    figures = Tally()
    request.config.pluginmanager.register(TallyReport(figures), TALLY_PLUGIN)
    return figures


@pytest.fixture
def rng(request: pytest.FixtureRequest, tally: Tally) -> random.Random:
    """The test's random choices; PURGE_FAULT_SEED replays them (not the timing they meet)."""
    seed = int(os.environ.get("PURGE_FAULT_SEED") or random.randrange(2**32))
    tally.seeds[request.node.name] = seed
    return random.Random(seed)


FleetFactory = Callable[..., Fleet]


@pytest.fixture
def fleets(tmp_path: Path) -> Iterator[FleetFactory]:
    """`fleets(config, env)`: worker processes, every one reaped when the test ends (their logs'
    tails printed, which pytest shows when the test failed)."""
    made: list[Fleet] = []

    def make(config: Path, env: Mapping[str, str], metrics: bool = False) -> Fleet:
        made.append(Fleet(config, env, tmp_path / f"workers-{len(made)}", metrics))
        return made[-1]

    try:
        yield make
    finally:
        for fleet in made:
            fleet.close()
        for fleet in made:
            print(fleet.logs())


@pytest.fixture
async def probes() -> AsyncIterator[Callable[[str], Probe]]:
    """`probes(url)`: connections watching the sweep, closed when the test ends."""
    made: list[Probe] = []

    def make(url: str) -> Probe:
        made.append(Probe(url))
        return made[-1]

    try:
        yield make
    finally:
        for probe in made:
            await probe.close()


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL server of this module's own, to stop and start again: its port and its data
    stay. The session's server, which other tests share, is never stopped."""
    with running_postgres("purge-fault-pg-") as server:
        yield server


@pytest.fixture(scope="module")
def own_temporal() -> Iterator[TemporalDevServer]:
    """A Temporal dev server of this module's own, its state in a database file so that a
    restart keeps every history and task queue; its ports stay."""
    with running_temporal("purge-fault-temporal-", persistent=True) as server:
        yield server


async def _checked(watch: PassWatch, tally: Tally) -> tuple[dict[str, Any], dict[str, Run]]:
    """The pass's result and its ledger, both checked, and every row checked."""
    result = await watch.result()
    await watch.close()
    runs = await assert_ledger(watch, result)
    with arranging(watch.db_url) as db:
        tally.rows += check(db, watch.oracle)
    tally.passes += 1
    return result, runs


def _kill_points(rng: random.Random) -> list[tuple[str, float]]:
    """Where to kill the worker in one pass, in sweep order: one or two points in each target,
    each a table of it and the share of that table's expired rows gone by then."""
    points = []
    for target in TARGET_NAMES:
        tables = tables_of(target)
        picks = [(rng.choice(tables), rng.uniform(0.05, 0.95)) for _ in range(rng.choice((1, 2)))]
        points += sorted(picks, key=lambda p: (tables.index(p[0]), p[1]))
    return points


async def _kill_and_replace(watch: PassWatch, fleet: Fleet, tally: Tally) -> None:
    """SIGKILL the pass's worker, start a new worker, and record what the kill struck: an
    attempt the server showed running on the dead worker counts as struck only once the server
    shows it failed (`_struck`)."""
    killed = fleet.kill()
    fault = await watch.record_kill("worker SIGKILL", killed)
    # 20 kills each waiting out the workflow's 15 s heartbeat timeout were most of this suite.
    await notice_the_dead_worker_sooner(watch.client, watch.handle.id)
    fleet.start()
    fault = await _struck(watch, fault)
    tally.add(fault.kind, in_target=fault.target is not None)


async def _struck(watch: PassWatch, fault: Fault) -> Fault:
    """The kill `fault` as the server settles it. An attempt still shown running on the dead
    worker right after the kill may yet complete: a completion the worker sent just before it
    died can reach the server after the look (no wait after the kill is long enough on a
    loaded machine). So it is struck once the server shows its failure (the heartbeat timeout
    `notice_the_dead_worker_sooner` set, and the retry after it); if the target completes
    first, that attempt completed, and the kill struck nothing (recorded so in `watch.faults`)."""
    if fault.target is None or fault.attempt is None:
        return fault
    failed = (fault.target, fault.attempt + 1)
    deadline = time.monotonic() + HANG
    while failed not in watch.failures:
        if fault.target in watch.completed or watch.closed:
            missed = Fault(fault.kind, None, None, fault.completed)
            [at] = [i for i, f in enumerate(watch.faults) if f is fault]
            watch.faults[at] = missed
            return missed
        assert time.monotonic() < deadline, f"hang after a kill: pending {watch.pending}"
        await asyncio.sleep(0.05)
        await watch.fresh()
    return fault


async def test_worker_sigkilled_at_random_points_of_passes(
    tmp_path: Path,
    harness: Harness,
    temporal_server: RunningTemporal,
    fleets: FleetFactory,
    probes: Callable[[str], Probe],
    rng: random.Random,
    tally: Tally,
) -> None:
    """The worker process SIGKILLed at random points of passes, at least 20 times, a new worker
    started after each: mostly part-way through a table (a random share of its expired rows
    gone, then up to 30 ms more), sometimes as it starts, between targets or in a retry. At
    least STRUCK_KILLS of the kills strike a target's running attempt (a kill that missed every
    sweep tests nothing of a resume)."""
    create_tables(harness.db, builtins=False)
    config = worker_config(
        tmp_path / "purge.toml", harness.url, harness.task_queue, targets_toml(**SWEEP)
    )
    fleet = fleets(config, clean_env(TEMPORAL_ADDRESS=temporal_server.address))
    progress = probes(harness.url)
    kills = struck = 0
    for _ in range(10):
        oracle = fill(harness.db, ROWS, rng)
        async with watching(
            harness.client, harness.task_queue, "purge-kill", harness.url, oracle
        ) as watch:
            if not fleet.alive:
                fleet.start()
            if rng.random() < 0.3:  # in the pass's first seconds: a worker starting, a first task
                await asyncio.sleep(rng.uniform(0.2, 2.0))
                await _kill_and_replace(watch, fleet, tally)
            at_last_kill: dict[str, int] = {}
            for table, share in _kill_points(rng):
                left = await watch.until_swept(table, share, progress)
                if left is None:
                    break  # the pass is over
                if not left or left == at_last_kill.get(table):
                    continue  # the sweep got past this point before the probe saw it
                if watch.top_attempt > KILLABLE_ATTEMPTS:
                    continue
                at_last_kill[table] = left
                await asyncio.sleep(rng.uniform(0, 0.03))
                await _kill_and_replace(watch, fleet, tally)
            await _checked(watch, tally)
        kills += len(watch.faults)
        # A kill the server settled as a miss (`_struck`) has no target in `watch.faults`.
        struck += sum(fault.target is not None for fault in watch.faults)
        if kills >= KILLS and struck >= STRUCK_KILLS:
            break
    assert kills >= KILLS, f"only {kills} kills in 10 passes"
    assert struck >= STRUCK_KILLS, f"only {struck} of {kills} kills struck a running target"


async def test_postgres_restarted_in_the_middle_of_targets(
    tmp_path: Path,
    client: Client,
    temporal_server: RunningTemporal,
    task_queue: str,
    own_postgres: EmbeddedPostgres,
    fleets: FleetFactory,
    probes: Callable[[str], Probe],
    rng: random.Random,
    tally: Tally,
) -> None:
    """PostgreSQL stopped part-way through a target's table, a crash (immediate shutdown) and a
    fast shutdown in turn, and started again 0.1-1.5 s later, until at least 5 stops have
    failed a running attempt: Temporal retries the target, the worker's pool reconnects, the
    sweep resumes. One worker rides through them all."""
    url = own_postgres.url()
    with arranging(url) as db:
        create_tables(db)
    config = worker_config(tmp_path / "purge.toml", url, task_queue, targets_toml(**SWEEP))
    fleet = fleets(config, clean_env(TEMPORAL_ADDRESS=temporal_server.address), metrics=True)
    progress = probes(url)
    worker = fleet.start()
    stops = hits = passes = 0
    expected: Counter[str] = Counter()
    while hits < PG_RESTARTS:
        assert stops < 3 * PG_RESTARTS, "the stops keep missing the targets"
        # A pass whose every table was swept past before the probe looked stops nothing: bound
        # the passes too, so that such a run fails instead of looping.
        assert passes < 3 * PG_RESTARTS, f"{stops} stops in {passes} passes"
        passes += 1
        with arranging(url) as db:
            oracle = fill(db, ROWS, rng)
        async with watching(client, task_queue, "purge-pg", url, oracle) as watch:
            for target in TARGET_NAMES:
                table = rng.choice(tables_of(target))
                if not await watch.until_swept(table, rng.uniform(0.05, 0.5), progress):
                    continue  # swept past it before the probe looked
                seen = set(watch.failures)
                crash = stops % 2 == 0
                await asyncio.to_thread(own_postgres.stop, immediate=crash)
                await asyncio.sleep(rng.uniform(0.1, 1.5))
                await asyncio.to_thread(own_postgres.start)
                stops += 1
                kind = "postgres crash" if crash else "postgres fast shutdown"
                fault = await watch.record_failure(kind, seen)
                tally.add(kind, in_target=fault.target is not None)
                hits += fault.target is not None
            await _checked(watch, tally)
        expected.update({target: oracle.expired_of(target) for target in TARGET_NAMES})
    assert worker.poll() is None, "the worker did not ride through the restarts"
    # The worker lived through every crash: its counter holds every row of every pass, once,
    # including a batch whose commit reply a crash lost (counted from the ledger on retry).
    assert fleet.rows_removed() == dict(expected)


async def test_temporal_server_restarted_mid_pass(
    tmp_path: Path,
    own_temporal: TemporalDevServer,
    harness: Harness,
    fleets: FleetFactory,
    probes: Callable[[str], Probe],
    rng: random.Random,
    tally: Tally,
) -> None:
    """The Temporal dev server (its state in a file) stopped while a target sweeps and started
    again 0.1-1.5 s later, at least 3 times: the worker and this test's client ride through,
    and the pass completes from its persisted history."""
    create_tables(harness.db, builtins=False)
    config = worker_config(
        tmp_path / "purge.toml", harness.url, harness.task_queue, targets_toml(**SWEEP)
    )
    fleet = fleets(config, clean_env(TEMPORAL_ADDRESS=own_temporal.address))
    progress = probes(harness.url)
    client = await Client.connect(own_temporal.address)
    worker = fleet.start()
    restarts = passes = 0
    while restarts < TEMPORAL_RESTARTS:
        # Bounded, as the PostgreSQL restarts' loop: a run whose probe never sees a table
        # mid-sweep fails instead of looping.
        assert passes < 3 * TEMPORAL_RESTARTS, f"{restarts} restarts in {passes} passes"
        passes += 1
        oracle = fill(harness.db, ROWS, rng)
        async with watching(
            client, harness.task_queue, "purge-temporal", harness.url, oracle
        ) as watch:
            for target in sorted(rng.sample(TARGET_NAMES, 3), key=TARGET_NAMES.index):
                table = rng.choice(tables_of(target))
                if not await watch.until_swept(table, rng.uniform(0.05, 0.6), progress):
                    continue
                await asyncio.to_thread(own_temporal.stop)
                await asyncio.sleep(rng.uniform(0.1, 1.5))
                await asyncio.to_thread(own_temporal.start)
                await watch.fresh()
                # Whether the running attempt survives depends on when its completion was sent.
                watch.faults.append(Fault("temporal restart", None, None, dict(watch.completed)))
                tally.add("temporal restart", in_target=True)
                restarts += 1
            await _checked(watch, tally)
    assert worker.poll() is None, "the worker did not ride through the restarts"


async def _blocked_by(probe: Probe, holder: psycopg.AsyncConnection[Any]) -> None:
    """Wait until a sweep's statement waits for a lock `holder` holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while not await probe.blocked_by(holder.info.backend_pid):
        assert loop.time() < deadline, "hang: no batch ever waited on the lock"
        await asyncio.sleep(0.01)


def _table_lock(db: psycopg.Connection[Any], table: str) -> tuple[int, int]:
    """The advisory lock every sweep of `table` holds while it sweeps it, across the batches a
    statement_timeout narrows, and releases as its attempt ends: its two keys as the sweep
    computes them (`activities.engine.access.table_lock_keys`)."""
    query = sql.SQL("SELECT {}").format(table_lock_keys())
    row = db.execute(query, {"rel": table}).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _after_the_sweep(lock: tuple[int, int], holder: int) -> sql.Composed:
    """One statement: wait for the table's lock (`_table_lock`), then end the session `holder`
    (its row locks go with it) and wait until it is gone, then let the lock go. Queued behind
    the sweep that waits for the lock, it runs when that sweep's attempt has ended, and no
    retry can take the table before the rows are free."""
    return sql.SQL(
        "DO $$BEGIN PERFORM pg_advisory_xact_lock({space}, {key});"
        " IF NOT pg_terminate_backend({pid}, 60000) THEN"
        " RAISE EXCEPTION 'the holder did not end'; END IF; END$$"
    ).format(space=sql.Literal(lock[0]), key=sql.Literal(lock[1]), pid=sql.Literal(holder))


async def _queued_behind(db: psycopg.Connection[Any], waiter: int, blocker: int) -> None:
    """Wait until backend `waiter` waits for a lock `blocker` holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    query = "SELECT %s = ANY(pg_blocking_pids(%s))"
    while db.execute(query, (blocker, waiter)).fetchone() != (True,):
        assert loop.time() < deadline, "hang: the wait for the table's lock never began"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize(
    ("kind", "bounds", "message"),
    [
        ("lock_timeout", {"lock_timeout": "300ms"}, "canceling statement due to lock timeout"),
        (
            "statement_timeout",
            {"statement_timeout": "500ms", "lock_timeout": "5s"},
            "canceling statement due to statement timeout",
        ),
    ],
    ids=["lock_timeout", "statement_timeout"],
)
async def test_batch_failed_by_a_held_lock_is_retried_and_resumes(
    tmp_path: Path,
    harness: Harness,
    temporal_server: RunningTemporal,
    fleets: FleetFactory,
    probes: Callable[[str], Probe],
    rng: random.Random,
    tally: Tally,
    kind: str,
    bounds: dict[str, str],
    message: str,
) -> None:
    """Other transactions hold FOR UPDATE on every expired row of every table. As the pass
    reaches each table, its batches wait on the lock until the timeout fails the attempt; the
    rows are let go as that attempt ends, and Temporal's retry resumes the target and completes
    it, counting each deleted row once.

    The rows are let go in an order PostgreSQL's lock queue keeps, not within the retry's 2 s
    backoff: the test holds each table's sweep lock (`_table_lock`) from the start, so the
    sweep that reaches the table waits for it first; a session then queues behind that sweep
    for the same lock (`_after_the_sweep`), and only then does the test let the lock go. The
    sweep takes it, fails its attempt on the held rows (all its narrower batches too, under
    statement_timeout) and releases it as the attempt ends; the queued session takes it next,
    ends the rows' holder, and lets it go. A retry, however soon, takes the table after that,
    so each table fails exactly one attempt on any machine."""
    create_tables(harness.db, builtins=False)
    # The sweep that reaches a table the test holds waits for it (busy_wait) while the test
    # queues the session behind it: up to 10 minutes, not the default 10 s, on any machine.
    config = worker_config(
        tmp_path / "purge.toml",
        harness.url,
        harness.task_queue,
        targets_toml(**SWEEP, **bounds, busy_wait="10m"),
    )
    fleet = fleets(config, clean_env(TEMPORAL_ADDRESS=temporal_server.address), metrics=True)
    locks = probes(harness.url)
    fleet.start()
    oracle = fill(harness.db, ROWS, rng)
    holders: dict[str, psycopg.AsyncConnection[Any]] = {}
    gates: dict[str, psycopg.AsyncConnection[Any]] = {}
    afters: list[psycopg.AsyncConnection[Any]] = []
    try:
        for table in TABLES:
            holders[table.name] = holder = await psycopg.AsyncConnection.connect(harness.url)
            await holder.execute(
                sql.SQL("SELECT key FROM {} WHERE key LIKE 'e%%' FOR UPDATE").format(
                    sql.Identifier(table.name)
                )
            )
            gates[table.name] = gate = await psycopg.AsyncConnection.connect(
                harness.url, autocommit=True
            )
            await gate.execute(
                "SELECT pg_advisory_lock(%s, %s)", _table_lock(harness.db, table.name)
            )
        async with watching(
            harness.client, harness.task_queue, f"purge-{kind}", harness.url, oracle
        ) as watch:
            for table in TABLES:
                seen = set(watch.failures)
                lock, gate = _table_lock(harness.db, table.name), gates[table.name]
                await _blocked_by(locks, gate)  # the sweep waits for the table's lock
                after = await psycopg.AsyncConnection.connect(harness.url, autocommit=True)
                afters.append(after)
                released = asyncio.ensure_future(
                    after.execute(_after_the_sweep(lock, holders[table.name].info.backend_pid))
                )
                await _queued_behind(harness.db, after.info.backend_pid, gate.info.backend_pid)
                await gate.execute("SELECT pg_advisory_unlock(%s, %s)", lock)
                fault = await watch.record_failure(kind, seen)
                assert fault.target == table.target, f"{table.name}: the blocked batch never failed"
                assert fault.attempt is not None
                tally.add(kind, in_target=True)
                assert watch.failures[(fault.target, fault.attempt + 1)].startswith(message)
                await asyncio.wait_for(released, HANG)  # the rows' holder is gone
            result, runs = await _checked(watch, tally)
    finally:
        for conn in [*holders.values(), *gates.values(), *afters]:
            await conn.close()
    for target in TARGET_NAMES:
        # One failed attempt per table of the target, then the one that completed it.
        assert runs[target].attempt == len(tables_of(target)) + 1, (target, runs[target])
    # No commit was in doubt (each failed batch deleted nothing), so the resumed count is exact.
    removed = {swept["name"]: swept["removed"] for swept in result["swept"]}
    assert removed == {target: oracle.expired_of(target) for target in TARGET_NAMES}
    assert fleet.rows_removed() == removed
