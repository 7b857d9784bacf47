"""A worker of a later release beside this one's, mid-deploy: what it sends this release's
workflow code is read, not refused. A sweep's result with a status this release does not know,
a null or a changed type where it reads a figure, a key it has never seen: the pass (and each
child of a spread pass) completes and reports it, where Temporal's strict decoding failed the
workflow task on every retry and the pass stood still until its timeout. A child's input of a
later release's format waits for a worker of that release instead.

Tests of the workflow: the activities are stand-ins, returning what a later release would."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.worker import Worker

from tests.conftest import Harness
from tests.support.history import child_ids, events, kinds
from tests.support.passes import FAIL_WITHIN_S, until_polled

#: Sent by the stand-in for a later release's worker: a status, a figure whose type changed,
#: one it may leave null, and a key this release has never seen.
LATER = {"status": "deferred", "batches": "three", "dead_tuple_share": None, "next": {"a": 1}}


@activity.defn(name="purge_target")
async def later_sweep(step: Any) -> dict[str, Any]:
    return {"name": step["name"], "removed": 3, **LATER}


@activity.defn(name="expand_pattern")
async def later_page(step: Any) -> dict[str, Any]:
    return {"name": step["name"], "matches": ["p@a", "p@b"], "more": False, "next": True}


async def task_failure(client: Client, workflow_id: str) -> str | None:
    """The first workflow task failure in the pass's history or its children's, if any."""
    history = await events(client, workflow_id)
    for run in [workflow_id, *child_ids(history)]:
        for event in await events(client, run) if run != workflow_id else history:
            if event.HasField("workflow_task_failed_event_attributes"):
                return f"{run}: {event.workflow_task_failed_event_attributes.failure.message}"
    return None


async def completed(client: Client, task_queue: str, request: dict[str, Any]) -> dict[str, Any]:
    """The pass's report, or a failed test as soon as a workflow task of it failed."""
    workflow_id = f"purge-later-{uuid.uuid4()}"
    handle = await client.start_workflow(
        "Purge",
        request,
        id=workflow_id,
        task_queue=task_queue,
        result_type=dict,
        execution_timeout=timedelta(seconds=FAIL_WITHIN_S),
    )
    result = asyncio.ensure_future(handle.result())
    while not result.done():
        failed = await task_failure(client, workflow_id)
        assert failed is None, f"a workflow task failed: {failed}"
        await asyncio.wait([result], timeout=0.2)
    report: dict[str, Any] = result.result()
    return report


async def test_a_later_releases_sweep_result_is_read_by_the_pass(harness: Harness) -> None:
    own = f"{harness.task_queue}:0123456789ab"
    request = {
        "targets": ["t1", "t2"],
        "databases": {"t1": "_default", "t2": "_default"},
        "queues": {"_default": own},
    }
    async with (
        harness.run_worker([]),
        Worker(harness.client, task_queue=own, activities=[later_sweep]),
    ):
        await until_polled(harness.client, own, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)
        report = await completed(harness.client, harness.task_queue, request)

    assert report["removed"] == 6
    assert [(s["name"], s["status"], s["removed"]) for s in report["swept"]] == [
        ("t1", "deferred", 3),
        ("t2", "deferred", 3),
    ]
    sweep = report["swept"][0]
    assert sweep["batches"] == 0  # a figure this release cannot read: its default
    assert sweep["dead_tuple_share"] is None
    assert "next" not in sweep


async def test_a_later_releases_results_are_read_by_a_spread_pass_and_its_child(
    harness: Harness,
) -> None:
    own = f"{harness.task_queue}:0123456789ab"
    request = {
        "targets": ["p"],
        "patterns": ["p"],
        "databases": {"p": "_default"},
        "queues": {"_default": own},
    }
    stand_ins = [later_sweep, later_page]
    async with harness.run_worker([]), Worker(harness.client, task_queue=own, activities=stand_ins):
        await until_polled(harness.client, own, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)
        report = await completed(harness.client, harness.task_queue, request)

    assert report["compact"] is True
    assert len(report["children"]) == 1
    assert report["statuses"] == {"deferred": 2}
    assert report["removed"] == 6
    assert [(line["name"], line["tables"], line["removed"]) for line in report["patterns"]] == [
        ("p", 2, 6)
    ]


async def test_a_childs_input_of_a_later_format_waits_for_a_worker_of_that_release(
    harness: Harness,
) -> None:
    chunk = {"targets": ["t1"], "now_ms": 1, "deadline_ms": 2, "budget_ms": 1, "format": 2}
    workflow_id = f"purge-chunk-later-{uuid.uuid4()}"
    async with harness.run_worker([]):
        handle = await harness.client.start_workflow(
            "PurgeChunk", chunk, id=workflow_id, task_queue=harness.task_queue
        )
        try:
            async with asyncio.timeout(FAIL_WITHIN_S):
                while "WORKFLOW_TASK_FAILED" not in kinds(
                    await events(harness.client, workflow_id)
                ):
                    await asyncio.sleep(0.05)
            described = await handle.describe()
        finally:
            await handle.terminate("test over")

    failed = await task_failure(harness.client, workflow_id)
    assert failed is not None
    assert "ChunkInput of format 2, from a later release" in failed
    assert described.status == WorkflowExecutionStatus.RUNNING  # left, not failed
    assert "ACTIVITY_TASK_SCHEDULED" not in kinds(await events(harness.client, workflow_id))
