"""`PurgeChunk`: one child of a spread pass, sweeping some targets of one database.

It sweeps `run_size` targets per run, then continues as new with the rest and what it has
swept so far, so no run's history grows past about 1,200 events whatever the child's share.
It never fails for a target: each outcome goes into the compact report it returns.

A child of small tables only on its database's own queue (`ChunkInput.local`, which the pass
sets) sweeps them as local activities: run by the worker that runs the child's workflow task,
each result recorded in the child's history as a marker, with no activity task for the server
to dispatch and complete (docs/decisions/spread-passes.md). Only there: every worker that
polls that queue for workflows runs its targets' activities too
(`purge_ops.runner.activity_worker`), which a worker polling the pass's own queue need not
(`new_worker(sweeps=False)`). Under a patch, read at the run's first workflow task: a run an
earlier release began keeps its activity tasks.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    # activities.results is imported here, not only through workflows.steps, so the sandbox
    # knows the module should anything resolve its type hints (SweepStatus) there; a sweep's
    # result is read by activities.wire, which resolved them as it was imported.
    import activities.results  # noqa: F401
    from activities.spread_steps import ChunkReport
    from activities.wire import read_chunk
    from workflows.steps import sweep_limited


#: The patch under which a child of small tables on its database's queue sweeps them as local
#: activities; a run without its marker sweeps them as activity tasks, as before.
SMALL_LOCAL = "small-tables-local"
#: The marker a local activity's result (or failure) is recorded in: the SDK core's name for
#: it, which readers of a child's history look for (`pg-purge report --tables`).
LOCAL_ACTIVITY_MARKER = "core_local_activity"


#: The child workflow's type name, by which the pass starts it.
CHUNK_WORKFLOW = "PurgeChunk"


@workflow.defn(name=CHUNK_WORKFLOW)
class PurgeChunkWorkflow:
    """Sweep a share of a pass's targets as of the pass's instant, inside its budget."""

    @workflow.run
    async def run(self, raw: Any) -> ChunkReport:
        # `Any`, read by activities.wire: strictly, but for the report carried from the run
        # before (a later release's statuses may be in it), mid-deploy; an input of a later
        # release's format waits for its workers.
        chunk = read_chunk(raw)
        report = chunk.carried or ChunkReport()
        names = chunk.targets[: chunk.run_size]
        deadline = datetime.fromtimestamp(chunk.deadline_ms / 1000, tz=UTC)
        local = chunk.local and workflow.patched(SMALL_LOCAL)
        outcomes = await sweep_limited(
            names,
            chunk.now_ms,
            chunk.dry_run,
            deadline,
            chunk.budget_ms,
            most=chunk.concurrency,
            per_database=chunk.concurrency,
            database_of=lambda _: "",
            route_of=lambda _: chunk.route,
            local=local,
        )
        patterns = set(chunk.patterns)
        for i, outcome in enumerate(outcomes):
            report.add(chunk.first + i, outcome, patterns)
        if len(chunk.targets) > len(names):
            workflow.continue_as_new(chunk.next_run(report))
        return report
