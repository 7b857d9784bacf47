"""Telling the Temporal server at once what it would find out by itself about a SIGKILLed
worker: that its running activities are dead (their 15 s heartbeat timeout) and that its sticky
queue will never be polled again (10 s). The retry still comes from the server timing out the
killed attempt, on a real process killed mid-target; the tests just do not wait the timeouts out.
"""

from __future__ import annotations

from google.protobuf.duration_pb2 import Duration
from google.protobuf.field_mask_pb2 import FieldMask
from temporalio.api.activity.v1 import ActivityOptions
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.api.workflowservice.v1 import (
    ResetStickyTaskQueueRequest,
    UpdateActivityOptionsRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

#: The heartbeat timeout a killed attempt gets, so the server times it out within this of being
#: told. The retry on the new worker keeps it too: it heartbeats as it starts, then every 3 s
#: even inside one long statement (activities.sweep.HEARTBEAT_EVERY_S), each sent within the
#: worker's 1 s throttle; 10 s leaves a loaded machine six seconds of stall before a live
#: attempt would be timed out and retried (an extra attempt the tests count).
NOTICED_AFTER = Duration(seconds=10)


async def notice_the_dead_worker_sooner(
    client: Client, workflow_id: str, after: Duration = NOTICED_AFTER
) -> None:
    """Every started activity of the workflow gets a heartbeat timeout of `after` (a live
    worker's heartbeats keep its own attempt going), and its next workflow task goes to the task
    queue rather than a dead worker's sticky queue. Neither writes to the history."""
    execution = WorkflowExecution(workflow_id=workflow_id)
    described = await client.get_workflow_handle(workflow_id).describe()
    try:
        for running in described.raw_description.pending_activities:
            if running.state != PendingActivityState.PENDING_ACTIVITY_STATE_STARTED:
                continue  # not bound to any worker yet: whoever polls next takes it
            await client.workflow_service.update_activity_options(
                UpdateActivityOptionsRequest(
                    namespace=client.namespace,
                    execution=execution,
                    id=running.activity_id,
                    activity_options=ActivityOptions(heartbeat_timeout=after),
                    update_mask=FieldMask(paths=["heartbeat_timeout"]),
                )
            )
        await client.workflow_service.reset_sticky_task_queue(
            ResetStickyTaskQueueRequest(namespace=client.namespace, execution=execution)
        )
    except RPCError as err:
        # "workflow execution already completed": the pass ended before or since the kill (one
        # that finished within the random wait before it), so nothing waits on the dead worker.
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
