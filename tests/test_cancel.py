"""A pass cancelled by request (`temporal workflow cancel`) ends cancelled where the
cancellation reaches it, and starts nothing after: no target, no expansion, no child. Before,
the cancelled activity it was waiting for was taken for one target's failure and the pass went
on, deleting the rows of the targets after it once a worker came.

Each pass waits for an activity on a task queue no worker polls (scheduled, never started), so
the cancellation reaches it there, whatever the machine's speed."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import CancelledError

from activities import builtin_kinds as kinds
from tests.conftest import Harness
from tests.support.history import cancel_once_scheduled, events
from tests.support.rows import HOUR
from tests.support.tenants import (
    counts,
    create_tenants,
    gated_tenants,
    tenant_prefix,
    tenant_schemas,
)

#: A queue no worker polls: the routed target's activity waits there until cancelled.
NOWHERE = "purge-nowhere"


def routed_pass(**more: Any) -> dict[str, Any]:
    """x_auth@eu on a queue no worker polls, then x_idempotency on the pass's own."""
    return {
        "targets": ["x_auth@eu", "x_idempotency"],
        "databases": {"x_auth@eu": "eu"},
        "queues": {"eu": f"{NOWHERE}-{uuid.uuid4()}"},
        "worker_wait_ms": 600_000,
        **more,
    }


PASSES = {
    # As the temporal CLI starts one: no limits, one target after another.
    "sequential": routed_pass(),
    # As a config's schedule starts one: limits, one at a time.
    "concurrent": routed_pass(max_concurrent=1, max_per_database=1, budget_ms=600_000),
}


async def cancelled_pass(harness: Harness, request: dict[str, Any]) -> list[Any]:
    """Start the pass, cancel it once its first activity is scheduled, and return its history
    after it ended, having checked that it ended cancelled."""
    workflow_id = f"purge-cancel-{uuid.uuid4()}"
    handle = await harness.client.start_workflow(
        "Purge", request, id=workflow_id, task_queue=harness.task_queue
    )
    await cancel_once_scheduled(harness.client, workflow_id)
    with pytest.raises(WorkflowFailureError) as ended:
        await handle.result()
    assert isinstance(ended.value.cause, CancelledError), ended.value.cause
    return await events(harness.client, workflow_id)


@pytest.mark.parametrize("shape", sorted(PASSES))
async def test_a_cancelled_pass_ends_cancelled_and_sweeps_no_target_after(
    harness: Harness, shape: str
) -> None:
    harness.db.execute(
        "INSERT INTO x_idempotency VALUES ('old', null, %s)", (harness.now_ms - HOUR,)
    )
    targets = [kinds.idempotency(harness.pool), kinds.auth(harness.pool, name="x_auth@eu")]
    async with harness.run_worker(targets):
        history = await cancelled_pass(harness, PASSES[shape])

    scheduled = [e for e in history if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
    assert len(scheduled) == 1  # x_auth@eu's, never x_idempotency's
    assert history[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED
    assert harness.db.execute("SELECT key FROM x_idempotency").fetchall() == [("old",)]


async def test_a_spread_pass_cancelled_while_it_expands_a_pattern_starts_no_child(
    harness: Harness,
) -> None:
    """The expansion of a pattern whose database's queue no worker polls waits; cancelled
    then, the pass starts none of its children (before, it started them, and the listed target
    beside the pattern was swept)."""
    harness.db.execute(
        "INSERT INTO x_idempotency VALUES ('old', null, %s)", (harness.now_ms - HOUR,)
    )
    request = {
        "targets": ["sessions", "x_idempotency"],
        "patterns": ["sessions"],
        "databases": {"sessions": "eu"},
        "queues": {"eu": f"{NOWHERE}-{uuid.uuid4()}"},
        "worker_wait_ms": 600_000,
        "max_concurrent": 1,
        "max_per_database": 1,
        "budget_ms": 600_000,
    }
    async with harness.run_worker([kinds.idempotency(harness.pool)]):
        history = await cancelled_pass(harness, request)

    assert not any(
        e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
        for e in history
    )
    assert history[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED
    assert harness.db.execute("SELECT key FROM x_idempotency").fetchall() == [("old",)]


async def test_a_spread_pass_cancelled_while_a_child_sweeps_ends_cancelled(
    pg_url: str, harness: Harness
) -> None:
    """Cancelled while its child sweeps (the gate first, the tenants behind it in that
    child), the pass ends cancelled, not failed with the child's targets, and no tenant's row
    is deleted: the child, terminated as its parent closes, starts nothing after the gate."""
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(2), harness.now_ms)
        before = counts(conn, prefix, harness.now_ms, range(2))
        gate, registry = gated_tenants(prefix, harness.pool)
        request = {"targets": ["gate", "sessions"], "patterns": ["sessions"]}
        workflow_id = f"purge-cancel-{uuid.uuid4()}"
        async with harness.run_worker(registry):
            handle = await harness.client.start_workflow(
                "Purge", request, id=workflow_id, task_queue=harness.task_queue
            )
            await asyncio.wait_for(gate.reached.wait(), 60)
            await handle.cancel()
            with pytest.raises(WorkflowFailureError) as ended:
                await handle.result()
            gate.release.set()
        history = await events(harness.client, workflow_id)
        after = counts(conn, prefix, harness.now_ms, range(2))

    assert isinstance(ended.value.cause, CancelledError), ended.value.cause
    assert history[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED
    assert after == before
