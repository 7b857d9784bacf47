"""A worker of a later release beside this one's, mid-deploy: what it sends this release's workflow
code is read, not refused. A sweep's result with a status this release does not know, a null
where it reads a measurement, a key it has never seen: the pass (and each child of a spread
pass, its report carried from run to run) completes and reports it, where Temporal's strict
decoding failed the workflow task on every retry and the pass stood still until its timeout. A
child's input of a later release's format waits for a worker of that release instead.

Also what only the spread pass's workflow knows failed (a pattern's expansion, a child lost as
a whole) reaching the failures metric, with the same stand-ins.

Tests of the workflow: the activities are stand-ins, returning what a later release would."""

from __future__ import annotations

import asyncio
import contextlib
import tomllib
import urllib.request
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.client import (
    Client,
    ScheduleHandle,
    WorkflowExecutionStatus,
)
from temporalio.service import RPCError
from temporalio.worker import Worker

from activities.errors import BadPurgeTarget
from activities.input_checks import FORMAT
from activities.registry import TargetRegistry
from purge_config import PurgeConfig, parse_config
from purge_ops.connect import connect_temporal
from purge_ops.ports import free_ports
from purge_ops.runner import new_worker
from purge_ops.schedule import ensure_schedules
from tests.conftest import Harness
from tests.support.history import child_ids, events, kinds
from tests.support.passes import (
    FAIL_WITHIN_S,
    failed_pass,
    held_input,
    rewritten,
    until_polled,
)
from tests.support.probes import samples
from tests.support.servers import RunningTemporal

#: Sent by the stand-in for a later release's worker: a status, a measurement it left unknown
#: (null where this release reads a number), and a key this release has never seen.
LATER = {"status": "deferred", "p95_batch_ms": None, "dead_tuple_share": None, "next": {"a": 1}}


@activity.defn(name="purge_target")
async def later_sweep(step: Any) -> dict[str, Any]:
    return {"name": step["name"], "removed": 3, **LATER}


@activity.defn(name="expand_pattern")
async def later_page(step: Any) -> dict[str, Any]:
    return {"name": step["name"], "matches": ["p@a", "p@b"], "more": False, "next": True}


@activity.defn(name="expand_pattern")
async def unknown_or_later_page(step: Any) -> dict[str, Any]:
    """`later_page`'s for pattern `p`, and a refusal for any other (no worker knows it)."""
    if step["name"] != "p":
        raise BadPurgeTarget(f"no table pattern named {step['name']!r} on this worker")
    return await later_page(step)


async def task_failure(client: Client, workflow_id: str) -> str | None:
    """The first workflow task failure in the pass's history or its children's, if any."""
    histories = {workflow_id: await events(client, workflow_id)}
    for child in child_ids(histories[workflow_id]):
        histories[child] = await events(client, child)
    for run, history in histories.items():
        for event in history:
            if event.HasField("workflow_task_failed_event_attributes"):
                return f"{run}: {event.workflow_task_failed_event_attributes.failure.message}"
    return None


async def started_children(client: Client, workflow_id: str) -> list[str]:
    """The ids of the children the pass has started, once it has started one."""
    async with asyncio.timeout(FAIL_WITHIN_S):
        while True:
            with contextlib.suppress(RPCError):  # the pass itself not started yet
                if children := child_ids(await events(client, workflow_id)):
                    return children
            await asyncio.sleep(0.05)


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
    assert sweep["p95_batch_ms"] == 0  # a measurement left unknown: its default
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
        # One target a run: the child continues as new between them, its report (a later
        # release's status in it) carried in its next run's input.
        "run_size": 1,
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


async def test_a_failed_expansion_and_a_failed_child_count_in_the_failures_metric(
    harness: Harness, temporal_server: RunningTemporal
) -> None:
    """`purge_target_failures` (what `PurgeTargetFailing` alerts on) counts a spread pass's
    pattern whose expansion failed and each target of a child that failed as a whole, as it
    counts a target whose own sweep failed. (A test of the workflow: the expansion is a
    stand-in, and the child's one sweep waits until the test has terminated the child.)"""
    own = f"{harness.task_queue}:0123456789ab"
    held = asyncio.Event()

    @activity.defn(name="purge_target")
    async def held_sweep(step: Any) -> None:
        await held.wait()

    request = {
        "targets": ["p", "nowhere"],
        "patterns": ["p", "nowhere"],
        "databases": {"p": "_default", "nowhere": "_default"},
        "queues": {"_default": own},
    }
    [port] = free_ports(1)
    metered = await connect_temporal(temporal_server.address, metrics=f"127.0.0.1:{port}")
    workflow_id = f"purge-later-{uuid.uuid4()}"
    stand_ins = [held_sweep, unknown_or_later_page]
    async with (
        new_worker(metered, TargetRegistry([]), harness.task_queue),
        Worker(harness.client, task_queue=own, activities=stand_ins),
    ):
        failing = asyncio.ensure_future(
            failed_pass(harness.client, harness.task_queue, request, workflow_id)
        )
        children = await started_children(harness.client, workflow_id)
        await harness.client.get_workflow_handle(children[0]).terminate("test: a child lost")
        error = await failing
        held.set()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
            page = samples(reply.read().decode())

    failed = {f["name"]: f["message"] for f in error.details[0]["failed"]}
    assert sorted(failed) == ["nowhere", "p@a", "p@b"]
    assert failed["p@a"].startswith("child failed")
    # Summed by target, as the alert rule sums them: the child showed its sweeps' series at 0
    # under its own workflow type, the pass counts the failure under its own.
    for target in failed:
        series = page.get("purge_target_failures", [])
        found = [v for labels, v in series if labels["target"] == target]
        assert sum(found) == 1, (target, series)


def schedule_config(task_queue: str, schedule_id: str, *kinds: str) -> PurgeConfig:
    """A config of `kinds`' targets on one database, with a schedule of `schedule_id`."""
    entries = "".join(f'[[targets]]\nkind = "{kind}"\n' for kind in kinds)
    return parse_config(
        tomllib.loads(
            f'task_queue = "{task_queue}"\ndatabase_url = "postgresql://app@db/app"\n'
            f'{entries}[schedule]\nid = "{schedule_id}"\ncron = "0 0 1 1 *"\n'
        ),
        env={},
    )


async def test_a_worker_leaves_a_schedule_a_later_release_wrote_as_it_is(
    client: Client, task_queue: str
) -> None:
    """Mid-deploy, a worker of this release started with `--schedule` after a later release had
    written the schedule (its input of a later `format`) wrote this release's input back, so
    every pass went back to the old release's: it now leaves it as it is and warns, whatever its
    config. `pg-purge schedule`, typed by an operator, still writes it."""
    schedule_id = f"purge-later-{uuid.uuid4().hex[:8]}"
    config = schedule_config(task_queue, schedule_id, "idempotency")
    ours = config.scheduled_input(config.schedules[0])
    later_input = {**ours, "format": FORMAT + 1, "next": {"a": 1}}
    handle = client.get_schedule_handle(schedule_id)

    [made] = await ensure_schedules(client, config)
    try:
        await handle.update(rewritten(later_input))
        [by_worker] = await ensure_schedules(client, config, by_worker=True)
        kept = await held_input(client, schedule_id)
        [by_operator] = await ensure_schedules(client, config)
        written = await held_input(client, schedule_id)
    finally:
        await handle.delete()

    assert made.action == "created"
    assert (by_worker.action, by_worker.warns) == ("left as it is", True)
    assert by_worker.summary == (
        f"schedule {schedule_id}: its passes start with an input of format {FORMAT + 1}, a "
        f"later release's (this one writes format {FORMAT}): a worker of this release writes no "
        "schedule over it, which would turn the passes back to this release's mid-deploy. "
        "Write it with `pg-purge schedule` from this config if that is meant"
    )
    assert kept == later_input
    assert by_operator.action == "updated"
    assert written == ours


async def test_a_later_release_writing_between_a_workers_read_and_its_update_is_kept(
    client: Client, task_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker of this release reads the schedule (another config's input, which it would
    rewrite), then a later release's worker writes it, then this one's update is made: the
    update is judged again on the description it is made from, and the later input kept."""
    schedule_id = f"purge-later-{uuid.uuid4().hex[:8]}"
    older = schedule_config(task_queue, schedule_id, "idempotency", "auth")
    config = schedule_config(task_queue, schedule_id, "idempotency")
    later_input = {**config.scheduled_input(config.schedules[0]), "format": FORMAT + 1}
    update = ScheduleHandle.update

    async def another_writer_first(
        self: ScheduleHandle, updater: Callable[..., Any], **kwargs: Any
    ) -> None:
        monkeypatch.setattr(ScheduleHandle, "update", update)  # once
        await update(self, rewritten(later_input))
        await update(self, updater, **kwargs)

    [made] = await ensure_schedules(client, older)
    try:
        monkeypatch.setattr(ScheduleHandle, "update", another_writer_first)
        [by_worker] = await ensure_schedules(client, config, by_worker=True)
        kept = await held_input(client, schedule_id)
    finally:
        await client.get_schedule_handle(schedule_id).delete()

    assert made.action == "created"
    assert (by_worker.action, by_worker.warns) == ("left as it is", True)
    assert kept == later_input
