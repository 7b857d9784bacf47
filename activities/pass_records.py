"""Passes as Temporal recorded them: which are a task queue's, which one an activity belongs
to, and the report each one left.

Read by the clock guard (the instant of the previous pass) and by `report`; Temporal's history
is the only record of past passes this package keeps.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from temporalio.client import (
    Client,
    WorkflowExecution,
    WorkflowExecutionStatus,
    WorkflowFailureError,
)
from temporalio.service import RPCError, RPCStatusCode

from activities.errors import failure_of
from activities.results import PurgeReport

#: The workflow type of a pass. Its children (`PurgeChunk`) are not passes: each leads back to one.
PURGE_WORKFLOW = "Purge"
#: How many parents up from an activity's workflow its pass may be (a spread pass's child: one).
PASS_DEPTH = 4


def purge_query(task_queue: str, status: str | None = None) -> str:
    """The visibility query for the passes on `task_queue` (a queue name is [A-Za-z0-9_.:/-],
    so it needs no escaping), optionally only those whose ExecutionStatus is, or with a leading
    `!`, is not `status`."""
    query = f'WorkflowType = "{PURGE_WORKFLOW}" AND TaskQueue = "{task_queue}"'
    if status is None:
        return query
    negated = status.startswith("!")
    return query + f' AND ExecutionStatus {"!=" if negated else "="} "{status.lstrip("!")}"'


@dataclass(frozen=True)
class PassRun:
    """One run of a pass, and the task queue it runs on: the queue its passes are listed by,
    which is not the queue of an activity routed to its database's own."""

    id: str
    run_id: str
    task_queue: str
    started: datetime | None = None
    """When Temporal started the run (its own clock, as every pass's close time)."""


async def pass_of(client: Client, workflow_id: str, run_id: str) -> PassRun | None:
    """The `Purge` run that the workflow run `workflow_id`/`run_id` is, or was started by (a
    spread pass's child); None when there is none: a run Temporal does not know (an activity
    run outside a workflow), or a workflow of someone else's that calls the activity."""
    for _ in range(PASS_DEPTH):
        try:
            found = await client.get_workflow_handle(workflow_id, run_id=run_id or None).describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return None
            raise
        if found.workflow_type == PURGE_WORKFLOW:
            return PassRun(found.id, found.run_id, found.task_queue, found.start_time)
        if not found.parent_id:
            return None
        workflow_id, run_id = found.parent_id, found.parent_run_id or ""
    return None


@dataclass(frozen=True)
class PassRecord:
    """What a finished pass left: its report (the result, or a failed pass's partial report)
    and, for a failed pass, its error."""

    report: PurgeReport | None
    error: str = ""


async def current(client: Client, execution: WorkflowExecution) -> WorkflowExecution:
    """`execution` as it stands now. Visibility lags the history (seconds on a loaded
    cluster): a pass it lists as running may have closed a moment ago, and its own
    description says so. Any other status is final and taken as listed."""
    if execution.status != WorkflowExecutionStatus.RUNNING:
        return execution
    return await client.get_workflow_handle(execution.id, run_id=execution.run_id).describe()


async def pass_record(client: Client, execution: WorkflowExecution) -> PassRecord:
    """The record of `execution`; empty for a pass still running, terminated or timed out."""
    handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
    if execution.status == WorkflowExecutionStatus.COMPLETED:
        return PassRecord(PurgeReport.from_json(await handle.result()))
    if execution.status != WorkflowExecutionStatus.FAILED:
        return PassRecord(None)
    try:
        await handle.result()
    except WorkflowFailureError as err:
        failure = failure_of(err)
        partial = failure.details[0] if failure.details else None
        report = PurgeReport.from_json(partial) if isinstance(partial, dict) else None
        return PassRecord(report, f"{failure.type}: {failure.message}")
    return PassRecord(None)
