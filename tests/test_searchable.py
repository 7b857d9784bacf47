"""Passes an operator can search for: where the namespace defines `PurgeFailedTargets` and
`PurgeRowsRemoved` (made with the `temporal operator search-attribute create` commands the docs
give), a pass records its failed targets and rows removed, and "the passes that failed on
tenant_0042" is one visibility query. Where it does not, passes run exactly as before.

The namespace with the attributes is a dev server of this module's own: defining them on the
session's server would change every other test's passes.
"""

from __future__ import annotations

import subprocess
import time
import tomllib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Replayer

from activities import builtin_kinds as kinds
from activities.builtin_kinds import build_registry
from activities.registry import TargetRegistry
from activities.search_attributes import FAILED_TARGETS, ROWS_REMOVED
from purge_config import parse_config
from purge_config.file import PurgeConfig
from purge_config.names import TableName
from purge_dev.servers import TemporalDevServer, venv_executable
from purge_ops.namespace_check import namespace_defines
from purge_ops.passes import sweep
from purge_ops.runner import activity_worker, new_worker
from purge_ops.schedule import ensure_schedules
from tests.conftest import Harness
from tests.support.passes import listed
from tests.support.rows import HOUR, idempotency_rows
from tests.support.servers import running_temporal
from tests.support.tenants import create_tenants, expired_of, tenant_prefix, tenant_schemas
from workflows.chunk import PurgeChunkWorkflow
from workflows.purge import PurgeWorkflow

#: The module's tests on one pytest-xdist worker, so its server (and the commands run on it) is
#: made once, not by every worker that runs one of them: two did in CI's log, 3.4-3.6 s each.
pytestmark = pytest.mark.xdist_group("searchable-server")

#: The commands docs/operating.md gives, run here as written there.
CREATE_COMMAND = ["operator", "search-attribute", "create"]
CREATE = [
    ["--name", "PurgeFailedTargets", "--type", "KeywordList"],
    ["--name", "PurgeRowsRemoved", "--type", "Int"],
]


@pytest.fixture(scope="module")
def searchable_server() -> Iterator[TemporalDevServer]:
    """A dev server whose `default` namespace defines the pass's search attributes."""
    with running_temporal("purge-test-searchable-") as server:
        for command in CREATE:
            created(server.address, command)
        yield server


def created(address: str, command: list[str]) -> None:
    """`temporal operator search-attribute create` `command`, tried again for up to a minute:
    on a loaded machine a server just started may refuse or time out the first call (CI saw
    exit 1), and a retry of a call the server did carry out finds the attribute there."""
    deadline = time.monotonic() + 60
    while True:
        done = subprocess.run(
            [venv_executable("temporal"), *CREATE_COMMAND, *command, "--address", address],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode == 0 or "already exists" in done.stderr:
            return
        assert time.monotonic() < deadline, f"{command}: {done.stderr.strip()}"
        time.sleep(0.5)


@pytest.fixture
async def searchable_client(searchable_server: TemporalDevServer) -> Client:
    return await Client.connect(searchable_server.address)


def registry(pool: AsyncConnectionPool[Any]) -> TargetRegistry:
    """x_idempotency, and a target whose table does not exist: it fails with BadPurgeTarget."""
    broken = kinds.expiring(pool, "tenant_0042", TableName("no_such_table"), "expires_at_ms")
    return TargetRegistry([kinds.idempotency(pool), broken])


async def test_a_failed_pass_is_found_by_the_target_it_failed_on(
    harness: Harness, searchable_client: Client
) -> None:
    idempotency_rows(harness.db, {"old": harness.now_ms - HOUR, "new": harness.now_ms + HOUR})
    queue = harness.task_queue
    async with new_worker(searchable_client, registry(harness.pool), queue):
        status = await sweep(
            searchable_client, queue, {"targets": ["x_idempotency", "tenant_0042"]}, print
        )

    assert status == 1
    query = f'TaskQueue = "{queue}" AND PurgeFailedTargets = "tenant_0042"'
    [execution] = await listed(searchable_client, query)
    assert execution.typed_search_attributes.get(FAILED_TARGETS) == ["tenant_0042"]
    assert execution.typed_search_attributes.get(ROWS_REMOVED) == 1
    # Visibility holds the pass's final attributes now (the query above saw them), so one
    # listing answers the negative query: waiting out `found` would only wait 10 s.
    larger = f'TaskQueue = "{queue}" AND PurgeRowsRemoved > 1'
    assert not [e async for e in searchable_client.list_workflows(larger)]
    # The recorded history replays on this code (the upsert is behind its patch).
    history = await searchable_client.get_workflow_handle(execution.id).fetch_history()
    types = [event.event_type for event in history.events]
    assert EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES in types
    await Replayer(workflows=[PurgeWorkflow, PurgeChunkWorkflow]).replay_workflow(history)


async def test_a_spread_pass_is_found_by_the_tenant_it_failed_on(
    pg_url: str, harness: Harness, searchable_client: Client
) -> None:
    """A pattern over tenants, one of whose tables lacks the column: the pass, spread over
    children, records that tenant's target, and the query for it finds the pass."""
    prefix = tenant_prefix()
    config = parse_config(
        {
            "targets": [
                {
                    "kind": "expiring",
                    "name": "sessions",
                    "table": f"{prefix}_*.sessions",
                    "column": "expires_at",
                }
            ]
        }
    )
    queue = harness.task_queue
    config = harness.adopt(config)
    registry = build_registry(config, harness.pool)
    assert config.own_queue is not None
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(3), harness.now_ms)
        create_tenants(conn, prefix, range(42, 43), harness.now_ms, column="valid_until")
        async with (
            new_worker(searchable_client, registry, queue),
            activity_worker(searchable_client, registry, config.own_queue),
        ):
            status = await sweep(searchable_client, queue, config.pass_input(), print)

    assert status == 1
    failed = f"sessions@{prefix}_0042"
    [execution] = await listed(searchable_client, f'PurgeFailedTargets = "{failed}"')
    assert execution.task_queue == queue
    removed = sum(expired_of(i) for i in range(3))
    assert execution.typed_search_attributes.get(ROWS_REMOVED) == removed


async def test_a_namespace_without_the_attributes_runs_passes_as_before(
    harness: Harness,
) -> None:
    assert not await namespace_defines(harness.client)
    idempotency_rows(harness.db, {"old": harness.now_ms - HOUR})
    async with harness.run_worker(registry(harness.pool)):
        status = await sweep(
            harness.client, harness.task_queue, {"targets": ["x_idempotency"]}, print
        )

    assert status == 0
    [execution] = await listed(harness.client, f'TaskQueue = "{harness.task_queue}"')
    assert execution.typed_search_attributes.get(ROWS_REMOVED) is None


def scheduled_config(task_queue: str, schedule_id: str) -> PurgeConfig:
    """A config of one target whose schedule is `schedule_id` on `task_queue`."""
    return parse_config(
        tomllib.loads(
            f'task_queue = "{task_queue}"\n[schedule]\nid = "{schedule_id}"\n'
            '[[targets]]\nkind = "idempotency"\n'
        ),
        env={"PURGE_DATABASE_URL": "postgresql://x@y/z"},
    )


async def test_the_schedule_starts_its_passes_with_the_attributes_where_they_are_defined(
    searchable_client: Client, task_queue: str
) -> None:
    schedule_id = f"purge-searchable-{uuid.uuid4().hex[:8]}"
    config = scheduled_config(task_queue, schedule_id)

    (first,) = await ensure_schedules(searchable_client, config)
    (again,) = await ensure_schedules(searchable_client, config)

    assert (first.action, again.action) == ("created", "unchanged")
    handle = searchable_client.get_schedule_handle(schedule_id)
    action = (await handle.describe()).schedule.action
    assert action.typed_search_attributes.get(ROWS_REMOVED) == 0  # type: ignore[union-attr]
    await handle.delete()


async def test_a_worker_whose_namespace_will_not_say_keeps_the_schedule_as_it_was_made(
    searchable_client: Client, task_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers of two roles, one whose listing of the search attributes is refused: where that
    refusal read as "not defined", its start rewrote the schedule without them, the other's
    with them, at every start. Refused, a worker now leaves the schedule's choice as it is."""
    schedule_id = f"purge-refused-{uuid.uuid4().hex[:8]}"
    config = scheduled_config(task_queue, schedule_id)
    (made,) = await ensure_schedules(searchable_client, config)

    async def refused(*args: Any, **kwargs: Any) -> Any:
        raise RPCError(
            "listing search attributes is not allowed", RPCStatusCode.PERMISSION_DENIED, b""
        )

    operator = searchable_client.operator_service
    monkeypatch.setattr(operator, "list_search_attributes", refused)
    (again,) = await ensure_schedules(searchable_client, config)

    handle = searchable_client.get_schedule_handle(schedule_id)
    action = (await handle.describe()).schedule.action
    await handle.delete()
    assert (made.action, again.action) == ("created", "unchanged")
    assert action.typed_search_attributes.get(ROWS_REMOVED) == 0  # type: ignore[union-attr]
