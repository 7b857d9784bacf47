"""Reading a workflow's event history in tests."""

from __future__ import annotations

from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client


async def events(client: Client, workflow_id: str) -> list[Any]:
    """The events of a workflow's history, oldest first."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return list(history.events)


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
