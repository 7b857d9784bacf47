"""A child of small tables sweeps them as local activities (issue 37): on its database's queue,
the worker that runs the child's workflow task runs each sweep, and the child's history records
its result as a marker, with no activity task for Temporal to dispatch. What must hold while a
fleet changes: a child an earlier release began keeps its activity tasks when a worker of this
release takes it over; and a worker killed in the middle of a local sweep loses nothing (real
Temporal, real PostgreSQL; the kill with worker processes, in the slow suite), and a pass
cancelled mid local sweep lets its statement finish; a local sweep longer than a workflow task
keeps its child alive (slow suite)."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHistory
from temporalio.exceptions import CancelledError
from temporalio.worker import Replayer, Worker
from temporalio.workflow import NondeterminismError

from activities.builtin_kinds import build_registry
from activities.sweep import PurgeActivities
from purge_config.file import PurgeConfig, load_config, parse_config
from purge_ops.runner import new_worker
from tests.conftest import Harness
from tests.support.dead_worker import notice_the_dead_worker_sooner
from tests.support.history import child_runs, events, kinds, local_sweeps, scheduled_in
from tests.support.old_workflows import PurgeChunkBeforeLocal
from tests.support.pace import until_a_sweep_waits
from tests.support.passes import run_pass
from tests.support.procs import clean_env, identity, start_worker, stop, wait_for, worker_config
from tests.support.servers import RunningTemporal
from tests.support.tenants import (
    HOUR_MS,
    counts,
    create_tenants,
    expired_of,
    tenant_prefix,
    tenant_schemas,
)
from tests.test_small_together import config
from workflows.chunk import PurgeChunkWorkflow
from workflows.purge import PurgeWorkflow

HISTORIES = Path(__file__).parent / "histories"
TENANTS = 6


async def test_a_child_an_earlier_release_began_keeps_its_activity_tasks(
    pg_url: str, harness: Harness
) -> None:
    """Mid-deploy, the small matches' child (its input saying `local`) is run by a worker of
    the release before: every match an activity task. A worker of this release that takes the
    child over replays that history without a nondeterminism error (no patch marker there, so
    it goes on with activity tasks): the replay below is what it does."""
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(TENANTS), harness.now_ms)
        cfg = harness.adopt(config(prefix))
        assert cfg.own_queue is not None
        registry = build_registry(cfg, harness.pool)
        acts = PurgeActivities(registry, runs_chunks=True)
        older = Worker(
            harness.client,
            task_queue=cfg.own_queue,
            workflows=[PurgeChunkBeforeLocal],
            activities=[acts.purge_target, acts.expand_pattern],
        )
        workflow_id = f"purge-local-{uuid.uuid4()}"
        async with new_worker(harness.client, registry, harness.task_queue), older:
            result = await run_pass(
                harness.client, harness.task_queue, cfg.pass_input(), workflow_id
            )
        runs = await child_runs(harness.client, await events(harness.client, workflow_id))
        left = counts(conn, prefix, harness.now_ms)

    assert result["statuses"] == {"ok": TENANTS}
    assert set(left.values()) == {(0, 2)}
    [[child]] = runs.values()
    converter = harness.client.data_converter.payload_converter
    [chunk] = converter.from_payloads(
        child[0].workflow_execution_started_event_attributes.input.payloads
    )
    assert chunk["local"] is True
    assert len(scheduled_in(runs)) == TENANTS
    assert local_sweeps(child) == []
    history = WorkflowHistory(workflow_id="child", events=child)
    replayed = await Replayer(workflows=[PurgeWorkflow, PurgeChunkWorkflow]).replay_workflow(
        history, raise_on_replay_failure=False
    )
    assert replayed.replay_failure is None


async def test_a_worker_of_the_release_before_cannot_replay_a_child_of_local_sweeps() -> None:
    """The other way round (what docs/fleets.md says of rolling deploys): a worker of the
    release before that takes over a child of local sweeps fails its workflow task with a
    nondeterminism error, and Temporal retries the task until a worker of this release takes
    it; no target fails for it. The committed history is such a child's."""
    path = HISTORIES / "v8-chunk-local.json"
    history = WorkflowHistory.from_json("child", path.read_text(encoding="utf-8"))
    with pytest.raises(NondeterminismError):
        await Replayer(workflows=[PurgeChunkBeforeLocal]).replay_workflow(history)


def waiting_config(prefix: str, lock_timeout: str) -> PurgeConfig:
    """A pattern over the tenants whose sweeps wait up to `lock_timeout` for a row lock."""
    target = {
        "kind": "expiring",
        "name": "sessions",
        "table": f"{prefix}_*.sessions",
        "column": "expires_at",
        "lock_timeout": lock_timeout,
    }
    return parse_config({"targets": [target]})


def _waiting_sweeps(conn: psycopg.Connection[Any]) -> int:
    found = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'temporal-pg-purge'"
        " AND wait_event_type = 'Lock'"
    ).fetchone()
    assert found is not None
    return int(found[0])


@pytest.mark.slow
@pytest.mark.parametrize("stop_with", [signal.SIGKILL, signal.SIGTERM], ids=["kill", "term"])
async def test_a_worker_stopped_mid_local_sweep_loses_nothing(
    tmp_path: Path,
    client: Client,
    temporal_server: RunningTemporal,
    task_queue: str,
    pg_url: str,
    schema_url: str,
    real_now: int,
    stop_with: signal.Signals,
) -> None:
    """A config's pass of small tables, its child's sweeps local activities. The first worker
    is stopped while one sweep waits for a row another session holds: SIGKILLed, or sent
    SIGTERM as a rolling deploy does (it lets the sweep finish once the row is let go). A second
    worker takes the child over and sweeps what is left: every expired row gone, every live one
    kept, each table's result recorded once, the pass's count exact (the ledger counts what the
    first worker's sweeps committed). After SIGKILL, the child's workflow task timed out and
    the held table's sweep is reported by the second worker."""
    prefix = tenant_prefix()
    held = f"{prefix}_0001"  # expired_of(1): one expired row
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(TENANTS), real_now)
        path = worker_config(
            tmp_path / "purge.toml",
            schema_url,
            task_queue,
            f"""
[pass]
max_concurrent = 4
max_per_database = 1

[[targets]]
kind = "expiring"
name = "sessions"
table = "{prefix}_*.sessions"
column = "expires_at"
lock_timeout = "60s"
""",
        )
        cfg = load_config(path)
        env = clean_env(TEMPORAL_ADDRESS=temporal_server.address)
        holder = psycopg.connect(pg_url, autocommit=True)
        holder.execute("BEGIN")
        holder.execute(
            f"SELECT 1 FROM {held}.sessions WHERE expires_at < %s FOR UPDATE",
            (real_now - HOUR_MS + 1,),
        )
        first = start_worker(path, env, tmp_path / "1.log")
        second = None
        workflow_id = f"purge-local-kill-{uuid.uuid4()}"
        try:
            handle = await client.start_workflow(
                "Purge", cfg.pass_input(), id=workflow_id, task_queue=task_queue
            )
            wait_for(lambda: _waiting_sweeps(conn) == 1, 60, "a local sweep to wait for the row")
            os.kill(first.pid, stop_with)
            if stop_with == signal.SIGKILL:
                first.wait(10)
                holder.execute("COMMIT")
            else:
                holder.execute("COMMIT")
                first.wait(60)  # its graceful shutdown: the sweep ends, then the worker
                assert first.returncode == 0
            parent = await events(client, workflow_id)
            children = [
                e.child_workflow_execution_started_event_attributes.workflow_execution.workflow_id
                for e in parent
                if e.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED
            ]
            for child in children:
                await notice_the_dead_worker_sooner(client, child)
            second = start_worker(path, env, tmp_path / "2.log")
            result = await asyncio.wait_for(handle.result(), 120)
        finally:
            holder.close()
            stop(first)
            if second is not None:
                stop(second)

        assert second is not None
        assert result["removed"] == sum(expired_of(i) for i in range(TENANTS))
        assert result["statuses"] == {"ok": TENANTS}
        assert set(counts(conn, prefix, real_now).values()) == {(0, 2)}

    runs = await child_runs(client, await events(client, workflow_id))
    [child] = [h for r in runs.values() for h in r]
    assert scheduled_in(runs) == []
    swept = local_sweeps(child)
    assert sorted(swept) == sorted(f"sessions@{prefix}_{i:04d}" for i in range(TENANTS))
    if stop_with != signal.SIGKILL:
        return
    assert "WORKFLOW_TASK_TIMED_OUT" in kinds(child) or "WORKFLOW_TASK_FAILED" in kinds(child)
    converter = client.data_converter.payload_converter
    for event in child:
        marker = event.marker_recorded_event_attributes
        if event.HasField("marker_recorded_event_attributes") and "result" in marker.details:
            [sweep] = converter.from_payloads(marker.details["result"].payloads)
            if sweep["name"] == f"sessions@{held}":
                assert sweep["worker"] == identity(second)


async def test_a_cancelled_pass_lets_a_local_sweep_finish_its_statement(
    pg_url: str, harness: Harness
) -> None:
    """`temporal workflow cancel` while a local sweep's DELETE waits for a row an application
    holds: the pass ends cancelled, the statement still commits once the row is let go (its
    rows in the ledger), nothing is half done and no live row is touched."""
    prefix = tenant_prefix()
    held = f"{prefix}_0001"
    with tenant_schemas(pg_url, prefix) as conn, psycopg.connect(pg_url) as holder:
        create_tenants(conn, prefix, range(TENANTS), harness.now_ms)
        holder.execute(
            f"SELECT 1 FROM {held}.sessions WHERE expires_at < %s FOR UPDATE", (harness.now_ms,)
        )
        cfg = harness.adopt(waiting_config(prefix, lock_timeout="30s"))
        async with harness.run_worker(build_registry(cfg, harness.pool), config=cfg):
            handle = await harness.client.start_workflow(
                "Purge",
                cfg.pass_input(),
                id=f"purge-local-cancel-{uuid.uuid4()}",
                task_queue=harness.task_queue,
            )
            running = asyncio.ensure_future(handle.result())
            await until_a_sweep_waits(conn, running)
            assert _waiting_sweeps(conn) == 1
            await handle.cancel()
            await asyncio.sleep(0.2)
            holder.rollback()
            with pytest.raises(WorkflowFailureError) as ended:
                await running
        left = counts(conn, prefix, harness.now_ms)
        done = harness.db.execute(
            "SELECT removed FROM purge_progress WHERE target = %s", (f"sessions@{held}",)
        ).fetchall()

    assert isinstance(ended.value.cause, CancelledError)
    assert left[held] == (0, 2)  # its statement committed after the cancellation
    assert done == [(expired_of(1),)]
    assert all(live == 2 and expired in (0, expired_of(int(schema[-4:])))
               for schema, (expired, live) in left.items())  # fmt: skip


#: Temporal's default workflow task timeout: a local sweep held longer than this outlasts it.
WORKFLOW_TASK_TIMEOUT_S = 10


@pytest.mark.slow
async def test_a_local_sweep_longer_than_a_workflow_task_keeps_its_child_alive(
    pg_url: str, harness: Harness
) -> None:
    """A local sweep held past the workflow task's timeout (its DELETE waits for a row another
    session holds for longer): the SDK keeps extending the child's workflow task while it runs,
    so no task times out and nothing is swept twice; the pass completes, every count exact."""
    prefix = tenant_prefix()
    held = f"{prefix}_0001"
    with tenant_schemas(pg_url, prefix) as conn, psycopg.connect(pg_url) as holder:
        create_tenants(conn, prefix, range(TENANTS), harness.now_ms)
        holder.execute(
            f"SELECT 1 FROM {held}.sessions WHERE expires_at < %s FOR UPDATE", (harness.now_ms,)
        )
        cfg = harness.adopt(waiting_config(prefix, lock_timeout="60s"))
        workflow_id = f"purge-local-long-{uuid.uuid4()}"
        async with harness.run_worker(build_registry(cfg, harness.pool), config=cfg):
            handle = await harness.client.start_workflow(
                "Purge", cfg.pass_input(), id=workflow_id, task_queue=harness.task_queue
            )
            running = asyncio.ensure_future(handle.result())
            await until_a_sweep_waits(conn, running)
            assert _waiting_sweeps(conn) == 1
            await asyncio.sleep(WORKFLOW_TASK_TIMEOUT_S * 1.5)
            holder.rollback()
            result = await running
        left = counts(conn, prefix, harness.now_ms)

    assert result["statuses"] == {"ok": TENANTS}
    assert result["removed"] == sum(expired_of(i) for i in range(TENANTS))
    assert set(left.values()) == {(0, 2)}
    runs = await child_runs(harness.client, await events(harness.client, workflow_id))
    [child] = [h for r in runs.values() for h in r]
    assert "WORKFLOW_TASK_TIMED_OUT" not in kinds(child)
    assert "WORKFLOW_TASK_FAILED" not in kinds(child)
    # The extensions: workflow tasks the worker completed while the sweep still ran.
    assert kinds(child).count("WORKFLOW_TASK_COMPLETED") >= 2
    assert sorted(local_sweeps(child)) == sorted(
        f"sessions@{prefix}_{i:04d}" for i in range(TENANTS)
    )
