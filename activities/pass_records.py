"""Passes as Temporal recorded them: which are a task queue's, and the report each one left.

Read by the clock guard (the instant of the previous pass) and by `report`; Temporal's history
is the only record of past passes this package keeps.
"""

from __future__ import annotations

from dataclasses import dataclass

from temporalio.client import (
    Client,
    WorkflowExecution,
    WorkflowExecutionStatus,
    WorkflowFailureError,
)

from activities.errors import failure_of
from activities.payloads import PurgeReport


def purge_query(task_queue: str, status: str | None = None) -> str:
    """The visibility query for the passes on `task_queue` (a queue name is [A-Za-z0-9_.:/-],
    so it needs no escaping), optionally only those whose ExecutionStatus is, or with a leading
    `!`, is not `status`."""
    query = f'WorkflowType = "Purge" AND TaskQueue = "{task_queue}"'
    if status is None:
        return query
    negated = status.startswith("!")
    return query + f' AND ExecutionStatus {"!=" if negated else "="} "{status.lstrip("!")}"'


@dataclass(frozen=True)
class PassRecord:
    """What a finished pass left: its report (the result, or a failed pass's partial report)
    and, for a failed pass, its error."""

    report: PurgeReport | None
    error: str = ""


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
