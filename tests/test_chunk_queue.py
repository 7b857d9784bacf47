"""Where a spread pass's children run (issue 37): on the queue of their database's activities
when the workers there said, by reading the pattern's matches, that they run children too; so
each activity is dispatched with the workflow task that schedules it. A worker of an older
release on that queue says nothing, and the children stay on the pass's queue as before: the
pass completes either way (real Temporal, real PostgreSQL)."""

from __future__ import annotations

import uuid

import pytest
from temporalio.api.enums.v1 import EventType

from activities.builtin_kinds import build_registry
from activities.sweep import PurgeActivities
from tests.conftest import Harness
from tests.support.history import child_runs, events, local_sweeps, scheduled_in
from tests.support.passes import run_pass, run_pass_beside_older
from tests.support.tenants import counts, create_tenants, tenant_prefix, tenant_schemas
from tests.test_small_together import LARGE_ROWS, make_large
from tests.test_tenants import pattern_config

TENANTS = 5


async def queues(harness: Harness, workflow_id: str) -> tuple[list[str], list[str], int]:
    """(the task queue each child was started on, the task queue of each activity its runs
    scheduled, the sweeps its runs ran as local activities)."""
    parent = await events(harness.client, workflow_id)
    started = [
        e.start_child_workflow_execution_initiated_event_attributes.task_queue.name
        for e in parent
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    ]
    runs = await child_runs(harness.client, parent)
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
            started, scheduled, local = await queues(harness, workflow_id)

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
        started, scheduled, local = await queues(harness, workflow_id)

        assert result["statuses"] == {"ok": TENANTS}
        assert all(expired == 0 for expired, _ in counts(conn, prefix, harness.now_ms).values())
    assert started == [harness.task_queue]
    assert (scheduled, local) == ([config.own_queue] * TENANTS, 0)
