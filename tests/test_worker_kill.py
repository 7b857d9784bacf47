"""A worker killed with SIGKILL in the middle of a pass: another worker finishes it from the
history, the targets completed before the kill are not run again, and every table ends right.

The server notices a dead worker only by timeouts: the running activity's missed heartbeats (the
workflow's 15 s) and, for the next workflow task, the dead worker's sticky queue (10 s). The test
shortens both for its own pass once the worker is dead (tests.support.dead_worker) instead of
waiting them out: the retry still comes from the server timing out the killed attempt.
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.client import WorkflowHandle
from temporalio.converter import DataConverter

from activities import builtin_kinds as kinds
from activities.engine.access import table_lock_keys
from purge_config.file import load_config
from purge_config.settings import SweepSettings
from tests.conftest import Harness
from tests.support.dead_worker import notice_the_dead_worker_sooner
from tests.support.history import events, target_runs
from tests.support.pace import (
    durable_every,
    fixed_batches,
    row_locked,
    until_a_sweep_waits,
    waiting_sweeps,
)
from tests.support.procs import clean_env, identity, start_worker, stop, wait_for, worker_config
from tests.support.rows import HOUR, auth_rows, bucket_rows, idempotency_rows, keys
from tests.support.servers import RunningTemporal
from tests.test_small_local import STOPPING

TARGETS = """
[[targets]]
kind = "idempotency"

[[targets]]
kind = "auth"

[[targets]]
kind = "python"
factory = "tests.support.gate:targets"
names = ["gate"]

[[targets]]
kind = "rate_limit"

[[targets]]
kind = "expiring"
name = "sessions"
table = "sessions"
column = "expires_at_ms"
"""


# Fault injection, in the slow suite: worker processes, a SIGKILL and the server's timeout.
@pytest.mark.slow
async def test_sigkilled_worker_is_replaced_and_the_pass_resumes_at_its_target(
    tmp_path: Path,
    harness: Harness,
    temporal_server: RunningTemporal,
) -> None:
    idempotency_rows(harness.db, {"old": harness.now_ms - HOUR, "new": harness.now_ms + HOUR})
    auth_rows(
        harness.db,
        {"f-old": harness.now_ms - HOUR, "f-new": harness.now_ms + HOUR},
        {"l-old": harness.now_ms - 1},
    )
    bucket_rows(
        harness.db,
        {"full": (0.0, 4.0, 1.0, harness.now_ms - HOUR), "empty": (0.0, 4.0, 1e-9, harness.now_ms)},
    )
    harness.db.execute(
        "CREATE TABLE sessions (key text PRIMARY KEY, expires_at_ms bigint NOT NULL)"
    )
    harness.db.execute(
        "INSERT INTO sessions VALUES ('s-old', %s), ('s-new', %s)",
        (harness.now_ms - HOUR, harness.now_ms + HOUR),
    )
    config = worker_config(tmp_path / "purge.toml", harness.url, harness.task_queue, TARGETS)
    gate_dir = tmp_path / "gate"
    gate_dir.mkdir()
    env = clean_env(TEMPORAL_ADDRESS=temporal_server.address, PURGE_TEST_GATE_DIR=str(gate_dir))

    first = start_worker(config, {**env, "PURGE_TEST_GATE_HANG": "1"}, tmp_path / "first.log")
    second = None
    try:
        workflow_id = f"purge-kill-{uuid.uuid4()}"
        handle = await harness.client.start_workflow(
            "Purge",
            {"targets": ["x_idempotency", "x_auth", "gate", "x_rate_limit", "sessions"]},
            id=workflow_id,
            task_queue=harness.task_queue,
        )
        wait_for((gate_dir / "hanging").exists, 60, "the first worker to reach the gate")
        # Completed before the kill, by the first worker:
        assert keys(harness.db, "x_idempotency") == {"new"}
        assert keys(harness.db, "sessions") == {"s-old", "s-new"}

        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
        # The heartbeat timeout set here is the retry's too, on the second worker: the 10 s
        # of every kill test, not 5 s, though the retry (the gate, which returns at once) is
        # quick. A retry is timed out when its first beat comes later than that after the
        # server handed it over, and a new worker's first task on a loaded machine can be slow.
        await notice_the_dead_worker_sooner(harness.client, workflow_id)
        second = start_worker(config, env, tmp_path / "second.log")
        result = await handle.result()
    finally:
        stop(first)
        if second is not None:
            stop(second)

    assert [s["name"] for s in result["swept"]] == [
        "x_idempotency", "x_auth", "gate", "x_rate_limit", "sessions",
    ]  # fmt: skip
    history = await events(harness.client, workflow_id)
    first_id, second_id = identity(first), identity(second)
    runs = target_runs(harness.client, history)
    assert all(run.completions == 1 for run in runs.values())
    assert {name: (run.identity, run.attempt) for name, run in runs.items()} == {
        "x_idempotency": (first_id, 1),
        "x_auth": (first_id, 1),
        "gate": (second_id, 2),  # the killed attempt was retried, on the new worker
        "x_rate_limit": (second_id, 1),
        "sessions": (second_id, 1),
    }
    scheduled = [e for e in history if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
    assert len(scheduled) == 5
    # The killed attempt ended by its heartbeat timeout: the server noticed the dead worker.
    [retried] = [
        e.activity_task_started_event_attributes
        for e in history
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        and e.activity_task_started_event_attributes.attempt == 2
    ]
    timeout = retried.last_failure.timeout_failure_info.timeout_type
    assert timeout == TimeoutType.TIMEOUT_TYPE_HEARTBEAT, retried.last_failure
    assert len(list(gate_dir.glob("run-*"))) == 2  # one hung attempt, one that finished
    assert keys(harness.db, "x_idempotency") == {"new"}
    assert keys(harness.db, "x_auth_failures") == {"f-new"}
    assert keys(harness.db, "x_auth_lockouts") == set()
    assert keys(harness.db, "x_rate_limit") == {"empty"}
    assert keys(harness.db, "sessions") == {"s-new"}


@pytest.mark.waits
async def test_the_server_has_a_waiting_sweeps_progress_within_seconds(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retry resumes from the last progress the server got: with the SDK's default throttle
    (12 s here) a killed worker's last 12 s of deleted rows would be missing from the report's
    count; the worker's is one second (`runner.HEARTBEAT_THROTTLE`), read from the worker that
    runs the sweep. The sweep is held at a row after a few committed batches (with a lock
    timeout longer than the test), and while it waits there the server comes to hold all their
    rows as the attempt's progress. How soon is the throttle's to say, not a wall clock's: a
    heartbeat late on a busy machine is no slower throttle (SEEN_WITHIN only ends a test whose
    progress never comes). From a moment the test makes, not at samples taken while batches
    run."""
    # 2,000 expired rows among 20,000, each older than the next key's: index batches of 200
    # take k2000 down towards k1000 first, and the one that reaches k1000 waits there. Each
    # batch commits and beats on its own.
    seed_k_rows(harness)
    fixed_batches(monkeypatch, rows=200)
    durable_every(monkeypatch, 1)
    # The batch at k1000 waits there for as long as the test holds it (not the default 2 s):
    # an attempt that gave up would send its progress on its way out, whatever the throttle.
    patient = SweepSettings(lock_timeout_ms=600_000)
    async with harness.run_worker([kinds.idempotency(harness.pool, settings=patient)]) as worker:
        # The sweep's worker sends its progress at least every second: past that throttle, the
        # last seconds of a killed attempt's rows would be missing from the report's count.
        throttle = worker.config(active_config=True)["max_heartbeat_throttle_interval"]
        assert throttle <= timedelta(seconds=1), throttle
        with row_locked(harness.url, "x_idempotency", "k1000") as holder:
            handle = await harness.client.start_workflow(
                "Purge",
                {"targets": ["x_idempotency"]},
                id=f"purge-beats-{uuid.uuid4()}",
                task_queue=harness.task_queue,
            )
            result = asyncio.ensure_future(handle.result())
            await until_a_sweep_waits(harness.db, result, holder)
            [(left,)] = harness.db.execute(
                "SELECT count(*) FROM x_idempotency WHERE expires_at_ms < %s", (harness.now_ms,)
            ).fetchall()
            committed = 2_000 - left
            assert committed > 0  # the batches before k1000's (about five)
            reported = None
            try:
                async with asyncio.timeout(SEEN_WITHIN):
                    while (reported := await server_progress(handle)) != committed:
                        await asyncio.sleep(0.1)
            except TimeoutError:
                raise AssertionError(
                    f"after {SEEN_WITHIN:g} s of waiting the server has {reported} of "
                    f"{committed} rows"
                ) from None
        report = await result

    assert report["swept"][0]["removed"] == 2_000


#: How long (seconds) the test waits for the server to hold a waiting sweep's progress: only
#: the end of a test whose progress never comes, far past any throttle (the worker's 1 s, the
#: SDK's default 12 s) on any machine; how soon is the throttle's, checked on the worker.
SEEN_WITHIN = 120.0


async def server_progress(handle: WorkflowHandle[Any, Any]) -> int | None:
    """The rows the pass's running sweep last reported removed, as the server holds them."""
    described = await handle.describe()
    for running in described.raw_description.pending_activities:
        if running.HasField("heartbeat_details"):
            [details] = await DataConverter.default.decode(running.heartbeat_details.payloads)
            return int(details["removed"])
    return None


# A rolling deploy's stop, in the slow suite: worker processes and a held row.
@pytest.mark.slow
async def test_a_worker_sent_sigterm_mid_sweep_hands_the_sweep_on_after_its_batch(
    tmp_path: Path,
    harness: Harness,
    temporal_server: RunningTemporal,
) -> None:
    """A deploy's SIGTERM while a sweep's batch waits at a row another session holds: the
    worker stops taking work on every queue at once; once the row is let go, that batch
    commits, the sweep starts no other and fails with the retryable `WorkerStopping` (not a
    cancel at the end of the worker's grace), the worker exits 0, and the next worker's retry
    sweeps the rest from where it stood: the pass completes with no target failed, every
    expired row gone and counted once."""
    config = held_at_k1000(tmp_path, harness, statement_timeout="120s")
    env = clean_env(TEMPORAL_ADDRESS=temporal_server.address)
    first = start_worker(config, env, tmp_path / "1.log")
    second = None
    try:
        # k1500, not k1000: the batch after the first (500 rows, to k1501) is a span of at most
        # 1,000 keys from k1501, so it holds k1500 and leaves 500 rows or more after it on any
        # machine. The worker's batches are sized by its own timings (no pace reaches its
        # process): a later span, up to four times as wide, could reach k1000 and every key
        # after it, and the held batch then be the sweep's last.
        with row_locked(harness.url, "x_idempotency", "k1500") as holder:
            handle = await pass_waiting_at(harness, config, holder)
            first.send_signal(signal.SIGTERM)
            wait_for(
                lambda: STOPPING in (tmp_path / "1.log").read_text(errors="replace"),
                60,
                "the worker to begin its stop",
            )
            assert waiting_sweeps(harness.db, holder) == 1  # the batch still in flight
        assert first.wait(60) == 0
        left_by_first = expired_rows(harness)
        second = start_worker(config, env, tmp_path / "2.log")
        report = await asyncio.wait_for(handle.result(), 120)
    finally:
        stop(first)
        if second is not None:
            stop(second)

    [sweep] = report["swept"]
    assert (sweep["status"], sweep["removed"], report["failed"]) == ("ok", 2_000, [])
    assert 0 < left_by_first < 2_000  # the first stopped midway, after the held batch
    assert expired_rows(harness) == 0
    assert sweep["worker"] == identity(second)
    [retry] = [
        e.activity_task_started_event_attributes
        for e in await events(harness.client, handle.id)
        if e.HasField("activity_task_started_event_attributes")
    ]
    assert retry.attempt == 2
    assert retry.last_failure.application_failure_info.type == "WorkerStopping"
    assert "Traceback" not in (tmp_path / "1.log").read_text(errors="replace")


def seed_k_rows(harness: Harness) -> None:
    """2,000 expired rows among 20,000, k1 to k2000, each older than the next key's: a sweep
    takes them from k2000 down."""
    harness.db.execute(
        "INSERT INTO x_idempotency (key, response, expires_at_ms)"
        " SELECT 'k' || i, null, CASE WHEN i <= 2_000 THEN %s - i ELSE %s END"
        " FROM generate_series(1, 20_000) i ORDER BY random()",
        (harness.now_ms - HOUR, harness.now_ms + HOUR),
    )
    harness.db.execute("ANALYZE x_idempotency")


def held_at_k1000(tmp_path: Path, harness: Harness, statement_timeout: str) -> Path:
    """2,000 expired rows among 20,000, each older than the next key's (the sweep takes them
    from k2000 down, and the batch that reaches a held k1000 waits there), and the config of a
    worker whose batch waits for that row up to 60 s, not the default 2 s."""
    seed_k_rows(harness)
    return worker_config(
        tmp_path / "purge.toml",
        harness.url,
        harness.task_queue,
        '[[targets]]\nkind = "idempotency"\n\n'
        f'[sweep]\nlock_timeout = "60s"\nstatement_timeout = "{statement_timeout}"\n',
    )


async def pass_waiting_at(
    harness: Harness, config: Path, holder: psycopg.Connection[Any]
) -> WorkflowHandle[Any, Any]:
    """The config's pass, returned once its sweep's batch waits at `holder`'s row."""
    handle = await harness.client.start_workflow(
        "Purge",
        load_config(config).pass_input(),
        id=f"purge-held-{uuid.uuid4()}",
        task_queue=harness.task_queue,
    )
    wait_for(lambda: waiting_sweeps(harness.db, holder) == 1, 60, "the sweep to wait at the row")
    return handle


def expired_rows(harness: Harness) -> int:
    [(left,)] = harness.db.execute(
        "SELECT count(*) FROM x_idempotency WHERE expires_at_ms < %s", (harness.now_ms,)
    ).fetchall()
    return int(left)


@pytest.mark.slow
async def test_a_worker_killed_mid_statement_lets_its_table_go_within_seconds(
    tmp_path: Path,
    harness: Harness,
    temporal_server: RunningTemporal,
) -> None:
    """SIGKILLed while a sweep's batch waits at a row another session holds (a lock timeout of
    60 s, a statement timeout of 10 min), the worker's session, and the table's advisory lock
    with it, are gone while the row is still held: the server looks every 5 s whether a
    running statement's client is there (`client_connection_check_interval`), where it once
    waited out the statement, and a retry found the table busy. The wait below ends well
    before the lock timeout would have ended that statement."""
    config = held_at_k1000(tmp_path, harness, statement_timeout="600s")
    env = clean_env(TEMPORAL_ADDRESS=temporal_server.address)
    worker = start_worker(config, env, tmp_path / "1.log")
    try:
        with row_locked(harness.url, "x_idempotency", "k1000") as holder:
            handle = await pass_waiting_at(harness, config, holder)
            assert not table_lock_free(harness)  # the waiting sweep holds it
            worker.send_signal(signal.SIGKILL)
            worker.wait(10)
            # Half the lock timeout: the statement's own end would come at 60 s.
            wait_for(
                lambda: waiting_sweeps(harness.db, holder) == 0,
                30,
                "the dead worker's session to go",
            )
            assert table_lock_free(harness)
        await handle.terminate()
    finally:
        stop(worker)


def table_lock_free(harness: Harness) -> bool:
    """Whether another session can take the advisory lock every sweep of x_idempotency holds
    (`activities.engine.access.table_lock_keys`); let go at once if it could."""
    keys = table_lock_keys()
    rel = {"rel": "x_idempotency"}
    [(taken,)] = harness.db.execute(
        sql.SQL("SELECT pg_try_advisory_lock({})").format(keys), rel
    ).fetchall()
    if taken:
        harness.db.execute(sql.SQL("SELECT pg_advisory_unlock({})").format(keys), rel)
    return bool(taken)
