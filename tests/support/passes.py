"""Starting passes and reading their outcome in tests."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import (
    Client,
    ScheduleActionStartWorkflow,
    ScheduleDescription,
    ScheduleHandle,
    ScheduleUpdate,
    ScheduleUpdateInput,
    WorkflowExecution,
    WorkflowFailureError,
)
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from activities.registry import TargetRegistry
from activities.sweep import PurgeActivities
from purge_config.file import PurgeConfig
from purge_ops.runner import new_worker, run_worker


def quiet_cron() -> str:
    """A daily cron whose next firing is about twelve hours away (in any time zone, give or take
    its offset): a schedule a test makes on the shared dev server never fires on its own while
    the test runs, where `23 * * * *` fired in one test an hour, whenever it ran over minute 23."""
    at = datetime.now(UTC) + timedelta(hours=12)
    return f"{at.minute} {at.hour} * * *"


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


def own_queue_worker(
    client: Client, queue: str, activities: PurgeActivities, workflows: Sequence[type] = ()
) -> Worker:
    """A worker of a config's own `queue` as a test builds it, not as this release's
    `activity_worker` does: `activities`' sweeps and expansions, and `workflows` (none: it runs
    no child there, as a release before `PurgeChunk` ran on every queue, or one whose workflow
    poller is gone)."""
    return Worker(
        client,
        task_queue=queue,
        workflows=list(workflows),
        activities=[activities.purge_target, activities.expand_pattern],
    )


async def run_pass_beside_older(
    client: Client,
    task_queue: str,
    config: PurgeConfig,
    registry: TargetRegistry,
    older: PurgeActivities,
    workflow_id: str,
) -> dict[str, Any]:
    """`run_pass` of `config`'s pass, its workflows on a worker of this release and the
    activities of its own queue on a worker of an older one: `older`'s, with no workflows (as a
    release before `PurgeChunk` ran on every queue built it)."""
    assert config.own_queue is not None
    async with (
        new_worker(client, registry, task_queue),
        own_queue_worker(client, config.own_queue, older),
    ):
        return await run_pass(client, task_queue, config.pass_input(), workflow_id)


async def started_and_stopped(config: PurgeConfig, address: str, **options: Any) -> None:
    """`run_worker(config)` (as `pg-purge run` runs it) against the Temporal at `address`, told
    to stop before it starts: it connects, does what a start does (writing or reading the
    schedule, saying what it polls), polls, and stops at once. `options` as run_worker's."""
    stopping = asyncio.Event()
    stopping.set()
    await run_worker(config, stop=stopping, temporal_address=address, **options)


#: How long a pass expected to fail at once may take to fail (seconds of real time): far beyond
#: what it takes on a loaded machine, far short of for ever.
FAIL_WITHIN_S = 120
#: The pass's own execution timeout there, in the server's time: long enough for every retry
#: pause of its targets (80 s for `TARGET_RETRY`'s four), which the time-skipping server spends
#: in no real time and counts against this; the real-time bound is `FAIL_WITHIN_S`.
FAIL_WITHIN_SERVER_TIME = timedelta(hours=1)


async def failed_pass(
    client: Client, task_queue: str, request: Any, workflow_id: str
) -> ApplicationError:
    """Run `Purge` expecting it to fail; the ApplicationError it failed with. Within
    FAIL_WITHIN_S of real time: a pass whose task fails again and again (an error the workflow
    does not turn into its own failure) fails the test instead of waiting for ever. The bound
    is the client's, not the execution timeout: on the time-skipping server, a target's retry
    pauses are skipped time that counts against an execution timeout, and a pass whose
    targets' pauses add up past it would time out in a few seconds of real time."""
    with pytest.raises(WorkflowFailureError) as failure:
        async with asyncio.timeout(FAIL_WITHIN_S):
            await client.execute_workflow(
                "Purge",
                request,
                id=workflow_id,
                task_queue=task_queue,
                result_type=dict,
                execution_timeout=FAIL_WITHIN_SERVER_TIME,
            )
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError), cause
    return cause


#: How long `listed` waits for visibility: far beyond its lag on a loaded machine (seconds).
LISTING_WAIT_S = 120.0


async def listed(client: Client, query: str, count: int = 1) -> list[WorkflowExecution]:
    """What visibility lists for `query`, once it lists at least `count` executions.

    Visibility lags the histories, most on a loaded machine: a command that reads it (`report`,
    `replay --last`) sees only what it lists, so a test waits for the listing, not a moment.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LISTING_WAIT_S
    while True:
        found = [w async for w in client.list_workflows(query)]
        if len(found) >= count:
            return found
        if loop.time() > deadline:
            raise AssertionError(
                f"visibility listed {len(found)} of {count} executions for {query} "
                f"in {LISTING_WAIT_S:.0f} s"
            )
        await asyncio.sleep(0.05)


async def listed_pollers(client: Client, queue: str, kind: TaskQueueType.ValueType) -> int:
    """How many pollers Temporal lists on `queue` for `kind` (workflow or activity tasks)."""
    described = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace, task_queue=TaskQueue(name=queue), task_queue_type=kind
        )
    )
    return len(described.pollers)


async def until_polled(
    client: Client, queue: str, kind: TaskQueueType.ValueType, at_least: int = 1
) -> None:
    """Returns once `at_least` workers' polls of `queue` have reached the server (within a
    minute): a task put there from then on is taken at once, however slowly they started."""
    async with asyncio.timeout(60):
        while await listed_pollers(client, queue, kind) < at_least:
            await asyncio.sleep(0.05)


def rewritten(args: dict[str, Any]) -> Callable[[ScheduleUpdateInput], ScheduleUpdate]:
    """An update of a schedule's passes' input to `args`, all else as it is (a hand edit, or a
    later release's write)."""

    def update(given: ScheduleUpdateInput) -> ScheduleUpdate:
        schedule = given.description.schedule
        assert isinstance(schedule.action, ScheduleActionStartWorkflow)
        schedule.action.args = [args]
        return ScheduleUpdate(schedule=schedule)

    return update


async def held_input(client: Client, schedule_id: str) -> Any:
    """The input a schedule's passes start with, as JSON reads it."""
    action = (await client.get_schedule_handle(schedule_id).describe()).schedule.action
    assert isinstance(action, ScheduleActionStartWorkflow)
    [arg] = action.args
    return client.data_converter.payload_converter.from_payload(arg)


async def until_described(
    handle: ScheduleHandle, done: Callable[[ScheduleDescription], bool], within_s: float = 120.0
) -> ScheduleDescription:
    """The schedule's description once `done` holds of it: what its scheduler has taken in
    (triggers, skips, its passes' ends) reaches the description a moment later, most on a
    loaded machine. `within_s` only keeps a broken schedule from hanging the run."""
    async with asyncio.timeout(within_s):
        while not done(described := await handle.describe()):
            await asyncio.sleep(0.05)
    return described
