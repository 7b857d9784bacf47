"""Starting passes and reading their outcome in tests."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError


async def run_pass(
    client: Client, task_queue: str, request: Any, workflow_id: str | None = None
) -> dict[str, Any]:
    """Run `Purge` with `request` (sent as the raw JSON a hand-made start would send)."""
    return await client.execute_workflow(
        "Purge",
        request,
        id=workflow_id or f"purge-test-{uuid.uuid4()}",
        task_queue=task_queue,
        result_type=dict,
    )


async def failed_pass(
    client: Client, task_queue: str, request: Any, workflow_id: str
) -> ApplicationError:
    """Run `Purge` expecting it to fail; the ApplicationError it failed with."""
    with pytest.raises(WorkflowFailureError) as failure:
        await run_pass(client, task_queue, request, workflow_id)
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError), cause
    return cause
