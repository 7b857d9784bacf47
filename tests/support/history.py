"""Reading a workflow's event history in tests: `history` fetches it, the rest read it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.failure.v1 import Failure
from temporalio.client import Client, WorkflowHandle, WorkflowHistory
from temporalio.converter import DataConverter

from workflows.chunk import LOCAL_ACTIVITY_MARKER


async def history(client: Client, workflow_id: str) -> WorkflowHistory:
    """A workflow's history (of its latest run): the one place the tests read one. Its
    `to_json()` is what `temporal workflow show -o json` writes and `replay` reads."""
    return await client.get_workflow_handle(workflow_id).fetch_history()


async def events(client: Client, workflow_id: str) -> list[Any]:
    """The events of a workflow's history, oldest first."""
    return list((await history(client, workflow_id)).events)


async def cancel_once_scheduled(client: Client, workflow_id: str, cancel: str = "") -> None:
    """Cancel a workflow (`cancel`, else `workflow_id`) once `workflow_id`'s first activity is
    scheduled: on a queue no worker polls, the activity waits there, so the cancellation
    reaches the workflow at it on any machine."""
    while "ACTIVITY_TASK_SCHEDULED" not in kinds(await events(client, workflow_id)):
        await asyncio.sleep(0.05)
    await client.get_workflow_handle(cancel or workflow_id).cancel()


async def first_failure(handle: WorkflowHandle[Any, Any]) -> Failure:
    """The failure of the first activity attempt that failed, as the server keeps it while
    the activity waits for its retry (the retries' 2 s and more between attempts keep it
    pending meanwhile), however slow the machine: up to 120 s."""
    async with asyncio.timeout(120):
        while True:
            described = await handle.describe()
            pending = described.raw_description.pending_activities
            if pending and pending[0].HasField("last_failure"):
                return pending[0].last_failure
            await asyncio.sleep(0.02)


def kinds(history: list[Any]) -> list[str]:
    """Event type names without the prefix: ACTIVITY_TASK_SCHEDULED, WORKFLOW_EXECUTION_FAILED..."""
    return [EventType.Name(e.event_type).removeprefix("EVENT_TYPE_") for e in history]


def scheduled_targets(client: Client, history: list[Any]) -> list[str]:
    """The target name of each ActivityTaskScheduled event, in order."""
    converter = client.data_converter.payload_converter
    names = []
    for event in history:
        if event.HasField("activity_task_scheduled_event_attributes"):
            attrs = event.activity_task_scheduled_event_attributes
            [step] = converter.from_payloads(attrs.input.payloads)
            names.append(step["name"])
    return names


def local_sweeps(history: list[Any]) -> list[str]:
    """The target of each local activity that ended with a sweep's report (the name in its
    marker's result), in the order the history recorded them."""
    converter = DataConverter.default.payload_converter
    names = []
    for event in history:
        if not event.HasField("marker_recorded_event_attributes"):
            continue
        marker = event.marker_recorded_event_attributes
        if marker.marker_name != LOCAL_ACTIVITY_MARKER or "result" not in marker.details:
            continue
        [result] = converter.from_payloads(marker.details["result"].payloads)
        names.append(result["name"])
    return names


@dataclass(frozen=True)
class TargetRun:
    """How one target's activity ended in a pass's history."""

    identity: str
    """The worker whose attempt ended it (completed or failed)."""
    attempt: int
    """That attempt's number: 1 means no retry."""
    completions: int
    """How many times it completed: exactly 1 for a target swept once."""


def target_runs(client: Client, history: list[Any]) -> dict[str, TargetRun]:
    """Per target, the attempt that ended its activity and how often it completed."""
    converter = client.data_converter.payload_converter
    names: dict[int, str] = {}
    runs: dict[str, TargetRun] = {}
    for e in history:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = e.activity_task_scheduled_event_attributes
            names[e.event_id] = converter.from_payloads(attrs.input.payloads)[0]["name"]
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs = e.activity_task_started_event_attributes
            name = names[attrs.scheduled_event_id]
            done = runs[name].completions if name in runs else 0
            runs[name] = TargetRun(attrs.identity, attrs.attempt, done)
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            name = names[e.activity_task_completed_event_attributes.scheduled_event_id]
            run = runs[name]
            runs[name] = TargetRun(run.identity, run.attempt, run.completions + 1)
    return runs


def started_children(parent_events: list[Any]) -> list[Any]:
    """The execution (`workflow_id`, `run_id` of its first run) of each child the parent
    started, in order."""
    return [
        e.child_workflow_execution_started_event_attributes.workflow_execution
        for e in parent_events
        if e.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED
    ]


def child_ids(parent_events: list[Any]) -> list[str]:
    """The workflow id of each child the parent started, in order."""
    return [execution.workflow_id for execution in started_children(parent_events)]


async def child_runs(client: Client, parent_events: list[Any]) -> dict[str, list[list[Any]]]:
    """Per child started by a pass, the events of each of its runs, first run first."""
    runs: dict[str, list[list[Any]]] = {}
    for execution in started_children(parent_events):
        child, run_id = execution.workflow_id, execution.run_id
        runs[child] = []
        while run_id:
            handle = client.get_workflow_handle(child, run_id=run_id)
            history = list((await handle.fetch_history()).events)
            runs[child].append(history)
            last = history[-1]
            run_id = None
            if last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                attrs = last.workflow_execution_continued_as_new_event_attributes
                run_id = attrs.new_execution_run_id
    return runs


def scheduled_in(runs: dict[str, list[list[Any]]]) -> list[Any]:
    """The attributes of every ActivityTaskScheduled in `runs` (`child_runs`), child by child,
    run by run, in order."""
    return [
        e.activity_task_scheduled_event_attributes
        for child in runs.values()
        for history in child
        for e in history
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
