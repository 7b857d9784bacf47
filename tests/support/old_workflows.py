"""A past shape of the `Purge` workflow, for proving replay catches a changed shape.

Its own module with few imports: the workflow sandbox re-imports the module a workflow is defined
in, and a test module's imports (paths resolved at import time) are not allowed there.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    # Known to the sandbox so decoding a sweep's result resolves its hints (SweepStatus).
    import activities.results  # noqa: F401
    from activities.input_checks import parse_input
    from activities.inputs import PurgeStep
    from activities.sweep import PurgeActivities


@workflow.defn(name="Purge")
class PurgeWithoutDuplicateCheck:
    """The pass had the duplicate check been dropped: against a history in which duplicates failed
    the pass before any activity, this schedules one, and must not replay."""

    @workflow.run
    async def run(self, request: Any) -> None:
        order = parse_input(request)
        now_ms = int(workflow.now().timestamp() * 1000)
        for name in order.targets:
            await workflow.execute_activity_method(
                PurgeActivities.purge_target,
                PurgeStep(name=name, now_ms=now_ms),
                start_to_close_timeout=timedelta(minutes=1),
            )
