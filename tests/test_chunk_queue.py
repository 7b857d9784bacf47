"""Where a spread pass's children run (issue 37): on the queue of their database's activities
when the workers there said, by reading the pattern's matches, that they run children too; so
each activity is dispatched with the workflow task that schedules it. A worker of an older
release on that queue says nothing, and the children stay on the pass's queue as before: the
pass completes either way (real Temporal, real PostgreSQL)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType, TaskQueueType
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner

from activities.builtin_kinds import build_registry
from activities.spread_steps import ChunkInput
from activities.sweep import PurgeActivities
from purge_ops.runner import new_worker
from tests.conftest import Harness
from tests.support.history import child_runs, events, local_sweeps, scheduled_in
from tests.support.passes import (
    failed_pass,
    own_queue_worker,
    run_pass,
    run_pass_beside_older,
    until_polled,
)
from tests.support.tenants import counts, create_tenants, tenant_prefix, tenant_schemas
from tests.test_small_together import LARGE_ROWS, make_large
from tests.test_tenants import pattern_config
from workflows import spread

TENANTS = 5


async def queues(client: Client, workflow_id: str) -> tuple[list[str], list[str], int]:
    """(the task queue each child was started on, the task queue of each activity its runs
    scheduled, the sweeps its runs ran as local activities)."""
    parent = await events(client, workflow_id)
    started = [
        e.start_child_workflow_execution_initiated_event_attributes.task_queue.name
        for e in parent
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    ]
    runs = await child_runs(client, parent)
    scheduled = [attrs.task_queue.name for attrs in scheduled_in(runs)]
    local = sum(len(local_sweeps(h)) for r in runs.values() for h in r)
    return started, scheduled, local


@pytest.mark.parametrize("large", [True, False], ids=["a-large-match", "all-small"])
async def test_a_child_runs_on_the_queue_of_its_databases_activities(
    pg_url: str, harness: Harness, large: bool
) -> None:
    """A config's pattern: its matches' activities go to the config's own queue, and so does
    the child that schedules them, which the own queue's worker runs: every expired row gone,
    every live one kept. With a large match among them, each match is an activity task on that
    queue; a child of small matches only sweeps them there as local activities."""
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(TENANTS), harness.now_ms)
        if large:
            make_large(conn, f"{prefix}_0001", harness.now_ms)
        config = harness.adopt(pattern_config(prefix))
        workflow_id = f"purge-chunkq-{uuid.uuid4()}"
        async with harness.run_worker(build_registry(config, harness.pool), config=config):
            result = await run_pass(
                harness.client, harness.task_queue, config.pass_input(), workflow_id
            )
            started, scheduled, local = await queues(harness.client, workflow_id)

        assert result["statuses"] == {"ok": TENANTS}
        assert all(expired == 0 for expired, _ in counts(conn, prefix, harness.now_ms).values())
        assert sum(live for _, live in counts(conn, prefix, harness.now_ms).values()) == (
            2 * TENANTS + (LARGE_ROWS if large else 0)
        )
    assert config.own_queue is not None
    assert started == [config.own_queue]
    if large:
        assert (scheduled, local) == ([config.own_queue] * TENANTS, 0)
    else:
        assert (scheduled, local) == ([], TENANTS)


async def test_beside_an_older_worker_that_runs_no_children_they_stay_on_the_pass_queue(
    pg_url: str, harness: Harness
) -> None:
    """The own queue's worker is of a release before this one: activities only, and pages that
    do not say `runs_chunks`. The child then runs on the pass's queue, as it always did, and
    its activities still go to the own queue: the pass completes, every row as it should be."""
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(TENANTS), harness.now_ms)
        config = harness.adopt(pattern_config(prefix))
        assert config.own_queue is not None
        registry = build_registry(config, harness.pool)
        older = PurgeActivities(registry)  # as an older release builds them
        workflow_id = f"purge-chunkq-{uuid.uuid4()}"
        result = await run_pass_beside_older(
            harness.client, harness.task_queue, config, registry, older, workflow_id
        )
        started, scheduled, local = await queues(harness.client, workflow_id)

        assert result["statuses"] == {"ok": TENANTS}
        assert all(expired == 0 for expired, _ in counts(conn, prefix, harness.now_ms).values())
    assert started == [harness.task_queue]
    assert (scheduled, local) == ([config.own_queue] * TENANTS, 0)


@pytest.mark.waits
async def test_a_child_whose_queue_lost_its_workers_fails_its_targets_at_its_bound(
    pg_url: str, harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The own queue's worker read the pattern's matches and said it runs children, then left
    that queue's workflows (here: it polls activities only, as a worker whose workflow poller
    is gone): the child placed there is never taken. Its execution timeout, what is left of the
    pass's budget and CHUNK_GRACE, ends it: the pass reports every match failed as `child
    failed`, deletes nothing, and ends.

    The bound the workflow gives the child is checked as a value: no more than the budget and
    CHUNK_GRACE, no less than the grace. The server then runs a bound the test shortens to a
    second, so the pass ends at once; the budget is the config's (50 minutes), which no machine
    spends before the child is placed (a budget of seconds, short enough to wait out, could run
    out first on a loaded machine, and the matches would come back `skipped`). The workflows
    run outside the sandbox, so the test's hold on the options the workflow places the child
    with reaches them; the time-skipping server cannot stand in, since it does not skip while
    a workflow task waits for a worker."""
    placed_with: list[timedelta] = []
    placed = spread._placed

    def shortened(chunk: ChunkInput, chunk_queues: set[str]) -> dict[str, Any]:
        options = placed(chunk, chunk_queues)
        if "execution_timeout" in options:
            placed_with.append(options["execution_timeout"])
            options = {**options, "execution_timeout": CHILD_ENDS_AFTER}
        return options

    monkeypatch.setattr(spread, "_placed", shortened)
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(TENANTS), harness.now_ms)
        before = counts(conn, prefix, harness.now_ms)
        config = harness.adopt(pattern_config(prefix))
        budget = timedelta(milliseconds=config.limits.budget_ms)
        assert budget >= timedelta(minutes=10), budget
        assert config.own_queue is not None
        registry = build_registry(config, harness.pool)
        said_so = PurgeActivities(registry, runs_chunks=True)
        regional = own_queue_worker(harness.client, config.own_queue, said_so)
        workflow_id = f"purge-chunk-left-{uuid.uuid4()}"
        central = new_worker(
            harness.client,
            registry,
            harness.task_queue,
            workflow_runner=UnsandboxedWorkflowRunner(),
        )
        async with central, regional:
            # Both polling before the pass starts: the expansion is taken at once.
            await until_polled(
                harness.client, harness.task_queue, TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW
            )
            await until_polled(
                harness.client, config.own_queue, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY
            )
            failure = await failed_pass(
                harness.client, harness.task_queue, config.pass_input(), workflow_id
            )
        left = counts(conn, prefix, harness.now_ms)

    # Bounded by what was left of the budget at the child's start, and the grace past it.
    [bound] = placed_with
    assert spread.CHUNK_GRACE < bound <= budget + spread.CHUNK_GRACE, bound
    report = failure.details[0]
    assert report["swept"] == []
    assert len(report["failed"]) == TENANTS, report["failed"]
    assert all("child failed" in f["message"] for f in report["failed"]), report["failed"]
    assert left == before  # nothing deleted
    started, _, _ = await queues(harness.client, workflow_id)
    assert started == [config.own_queue]  # placed on the queue whose worker said so
    [[child]] = (
        await child_runs(harness.client, await events(harness.client, workflow_id))
    ).values()
    assert child[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT


#: The child's execution timeout as the server runs it in the test of a child no worker takes:
#: ended by the server, at once, whatever the machine.
CHILD_ENDS_AFTER = timedelta(seconds=1)
