"""Past shapes of the `Purge` and `PurgeChunk` workflows, for proving what replay catches.

Its own module with few imports: the workflow sandbox re-imports the module a workflow is defined
in, and a test module's imports (paths resolved at import time) are not allowed there.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    # Known to the sandbox so decoding a sweep's result resolves its hints (SweepStatus).
    import activities.results  # noqa: F401
    from activities.input_checks import parse_input
    from activities.inputs import PurgeStep
    from activities.spread_steps import ChunkInput, ChunkReport
    from activities.sweep import PurgeActivities
    from workflows.steps import sweep_limited


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


@workflow.defn(name="PurgeChunk")
class PurgeChunkBeforeLocal:
    """`PurgeChunk` as the release before local activities ran it: every target an activity
    task, whatever its input's `local` says (a field that release's input did not have, which
    the data converter drops)."""

    @workflow.run
    async def run(self, chunk: ChunkInput) -> ChunkReport:
        report = chunk.carried or ChunkReport()
        names = chunk.targets[: chunk.run_size]
        outcomes = await sweep_limited(
            names,
            chunk.now_ms,
            chunk.dry_run,
            datetime.fromtimestamp(chunk.deadline_ms / 1000, tz=UTC),
            chunk.budget_ms,
            most=chunk.concurrency,
            per_database=chunk.concurrency,
            database_of=lambda _: "",
            route_of=lambda _: chunk.route,
        )
        patterns = set(chunk.patterns)
        for i, outcome in enumerate(outcomes):
            report.add(chunk.first + i, outcome, patterns)
        if len(chunk.targets) > len(names):
            workflow.continue_as_new(chunk.next_run(report))
        return report
