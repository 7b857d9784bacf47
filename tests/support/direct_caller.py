"""A workflow of someone else's that calls the `purge_target` activity directly with raw steps,
as JSON would arrive: the activity must refuse a bad one itself, non-retryably."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError


@workflow.defn(name="DirectCaller")
class DirectCaller:
    @workflow.run
    async def run(self, step: Any) -> dict[str, Any]:
        try:
            result = await workflow.execute_activity(
                "purge_target",
                step,
                start_to_close_timeout=timedelta(minutes=1),
                retry_policy=RetryPolicy(maximum_attempts=3),
            )
        except ActivityError as err:
            cause = err.cause
            assert isinstance(cause, ApplicationError)
            return {
                "type": cause.type,
                "message": cause.message,
                "retryable": not cause.non_retryable,
            }
        return {"result": result}
