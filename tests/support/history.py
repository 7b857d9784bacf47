"""Reading a workflow's event history in tests: `history` fetches it, the rest read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory


async def history(client: Client, workflow_id: str) -> WorkflowHistory:
    """A workflow's history (of its latest run): the one place the tests read one. Its
    `to_json()` is what `temporal workflow show -o json` writes and `replay` reads."""
    return await client.get_workflow_handle(workflow_id).fetch_history()


async def events(client: Client, workflow_id: str) -> list[Any]:
    """The events of a workflow's history, oldest first."""
    return list((await history(client, workflow_id)).events)


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
