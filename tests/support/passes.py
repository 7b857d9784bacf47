"""Starting passes and reading their outcome in tests."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine
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


async def run_pass_beside(
    worker: Callable[[asyncio.Event], Coroutine[Any, Any, None]],
    client: Client,
    task_queue: str,
    request: Any,
    workflow_id: str | None = None,
) -> dict[str, Any]:
    """`run_pass` while `worker(stop)` runs (a `purge_ops.runner.run_worker`, as `run` starts
    it); fails if the worker stops first, and stops it after the pass, whatever happened."""
    stop = asyncio.Event()
    running = asyncio.create_task(worker(stop))
    try:
        passing = asyncio.create_task(run_pass(client, task_queue, request, workflow_id))
        await asyncio.wait([running, passing], return_when=asyncio.FIRST_COMPLETED)
        assert not running.done(), f"the worker stopped: {running.exception()!r}"
        return await passing
    finally:
        stop.set()
        await running


async def failed_pass(
    client: Client, task_queue: str, request: Any, workflow_id: str
) -> ApplicationError:
    """Run `Purge` expecting it to fail; the ApplicationError it failed with."""
    with pytest.raises(WorkflowFailureError) as failure:
        await run_pass(client, task_queue, request, workflow_id)
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError), cause
    return cause
