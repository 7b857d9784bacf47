"""Two worker processes on one task queue share a pass, and the SIGKILL of either loses
nothing: Temporal is the distribution, the ledger keeps every count exact."""

from __future__ import annotations

import asyncio
import signal
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from temporalio.api.enums.v1 import PendingActivityState, TaskQueueType
from temporalio.client import WorkflowExecutionStatus

from purge_config import parse_config
from tests.conftest import Harness
from tests.support.dead_worker import notice_the_dead_worker_sooner
from tests.support.history import events
from tests.support.passes import until_polled
from tests.support.procs import clean_env, identity, start_worker, stop, wait_for, worker_config
from tests.support.rows import HOUR
from tests.support.servers import RunningTemporal

pytestmark = pytest.mark.slow

TABLES = [f"events_{i}" for i in range(8)]
ROWS = 1_000  # 500 expired rows whose deletes take 2 ms each: a second a table
#: The advisory lock every row's delete waits for while the test holds it.
GATE = 4_242


def targets_toml() -> str:
    return "\n".join(
        f'[[targets]]\nkind = "expiring"\nname = "{t}"\ntable = "{t}"\ncolumn = "at"\n'
        for t in TABLES
    )


async def sweeping_on(handle: Any, worker: str) -> list[str]:
    """The activities `worker` is running now (history records a start only at its end: the
    server's pending activities say who runs what)."""
    description = await handle.describe()
    return [
        pending.activity_id
        for pending in description.raw_description.pending_activities
        if pending.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
        and pending.last_worker_identity == worker
    ]


def fill(db: psycopg.Connection[Any], now: int) -> None:
    for table in TABLES:
        db.execute(f"DELETE FROM {table}")
        db.execute(
            f"INSERT INTO {table} SELECT 'k' || i, CASE WHEN i %% 2 = 0 THEN %s ELSE %s END"
            " FROM generate_series(1, %s) i",
            (now - HOUR, now + 24 * HOUR, ROWS),
        )


def started_by(history: list[Any]) -> set[str]:
    return {
        e.activity_task_started_event_attributes.identity
        for e in history
        if e.HasField("activity_task_started_event_attributes")
    }


async def test_two_workers_share_a_pass_and_a_kill_of_either_loses_nothing(
    tmp_path: Path,
    harness: Harness,
    temporal_server: RunningTemporal,
) -> None:
    """Eight targets, eight at once, on two workers that each run at most four (`--max-sweeps
    4`): both workers sweep (the history names both). Then a second pass, one worker SIGKILLed
    while it sweeps: its target is retried on the other, and every count is exact."""
    # Each deleted row takes 2 ms, and waits for the gate (GATE, a shared advisory lock) the
    # test holds from before the second pass until its kill: however slowly the test sees the
    # victim sweep, the victim cannot finish a target before it is killed.
    harness.db.execute(
        "CREATE FUNCTION slow_delete() RETURNS trigger LANGUAGE plpgsql AS"
        " $$BEGIN PERFORM pg_sleep(0.002);"
        f" PERFORM pg_advisory_xact_lock_shared({GATE}); RETURN OLD; END$$"
    )
    for table in TABLES:
        harness.db.execute(f"CREATE TABLE {table} (key text PRIMARY KEY, at bigint NOT NULL)")
        harness.db.execute(f"CREATE INDEX ON {table} (at)")
        harness.db.execute(
            f"CREATE TRIGGER slow BEFORE DELETE ON {table} FOR EACH ROW"
            " EXECUTE FUNCTION slow_delete()"
        )
    limits = {"max_concurrent": 8, "max_per_database": 8}
    # A batch at the gate waits until the test lets it go, for up to 60 s: its wait is a
    # lock's (lock_timeout 60 s, not the default 2 s) inside its DELETE (statement_timeout
    # 120 s, not the default 10 s, so the wait and the rows after it fit in one statement).
    # With 2 s, every sweep at the gate failed an attempt each time it waited that long, and
    # the gate is held for as long as this machine takes to see the victim sweep and kill it.
    toml = (
        "[pass]\nmax_concurrent = 8\nmax_per_database = 8\n\n"
        '[sweep]\nlock_timeout = "60s"\nstatement_timeout = "120s"\n\n' + targets_toml()
    )
    config = worker_config(tmp_path / "purge.toml", harness.url, harness.task_queue, toml)
    env = clean_env(TEMPORAL_ADDRESS=temporal_server.address)
    parsed = parse_config(
        {"database_url": harness.url, "task_queue": harness.task_queue, "pass": limits,
         "targets": [{"kind": "expiring", "name": t, "table": t, "column": "at"}
                     for t in TABLES]},
        env={},
    )  # fmt: skip
    request = parsed.pass_input()
    assert parsed.own_queue is not None
    # Without a cap one worker's pollers may take all eight (they did once, in CI); with four
    # slots each, the second worker must take the four the first cannot.
    workers = [
        start_worker(config, env, tmp_path / f"worker-{n}.log", "--max-sweeps", "4")
        for n in range(2)
    ]
    gate = psycopg.connect(harness.url, autocommit=True)
    try:
        for n in range(2):
            log = tmp_path / f"worker-{n}.log"
            wait_for(lambda log=log: "worker on task queue" in log.read_text(), 60, "a worker")
        # Both workers' activity polls on the server before the pass: the first to poll would
        # otherwise take its four and the next four as it finishes them, however fast.
        kind = TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY
        await until_polled(harness.client, parsed.own_queue, kind, at_least=2)
        fill(harness.db, harness.now_ms)
        shared = f"purge-shared-{uuid.uuid4()}"
        first = await harness.client.execute_workflow(
            "Purge", request, id=shared, task_queue=harness.task_queue, result_type=dict
        )
        assert started_by(await events(harness.client, shared)) == {identity(w) for w in workers}

        fill(harness.db, harness.now_ms)
        gate.execute("SELECT pg_advisory_lock(%s)", (GATE,))
        killed = f"purge-killed-{uuid.uuid4()}"
        handle = await harness.client.start_workflow(
            "Purge", request, id=killed, task_queue=harness.task_queue
        )
        victim = identity(workers[1])
        async with asyncio.timeout(60):  # until the victim sweeps a target of the pass
            while not await sweeping_on(handle, victim):
                described = await handle.describe()
                assert described.status == WorkflowExecutionStatus.RUNNING, "the pass ended"
                await asyncio.sleep(0.05)
        workers[1].send_signal(signal.SIGKILL)
        workers[1].wait(10)
        # The batches held at the gate go on: the survivor's, and the victim's in its orphaned
        # backends (a retry meeting their rows waits for them, under the same lock_timeout).
        gate.execute("SELECT pg_advisory_unlock(%s)", (GATE,))
        await notice_the_dead_worker_sooner(harness.client, killed)
        second = await asyncio.wait_for(handle.result(), 120)
    finally:
        gate.close()
        for proc in workers:
            stop(proc)

    for result in (first, second):
        assert [s["name"] for s in result["swept"]] == TABLES
        assert {s["name"]: s["removed"] for s in result["swept"]} == dict.fromkeys(
            TABLES, ROWS // 2
        )
        assert not any(s["lower_bound"] for s in result["swept"])
    for table in TABLES:
        assert harness.db.execute(f"SELECT count(*) FROM {table}").fetchone() == (ROWS // 2,), table
    # The killed worker's targets were finished by the other.
    assert started_by(await events(harness.client, killed)) == {identity(workers[0])}
