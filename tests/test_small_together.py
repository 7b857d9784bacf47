"""A pattern's small tables swept beside each other (issue 37): the catalog read of its matches
says which are small (one statement sweeps each), and the pass gives those children of their
own that sweep four at once on one database (within `max_concurrent`), where
`max_per_database` (1 by default) kept every match one at a time. A large match still sweeps
alone. Real Temporal, real PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

import psycopg
import pytest
from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.worker import (
    Interceptor,
    StartActivityInput,
    StartLocalActivityInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

from activities.builtin_kinds import build_registry
from activities.engine.small_tables import SMALL_PAGES
from activities.spread_steps import PatternPage, PatternStep
from activities.sweep import PurgeActivities
from purge_config.file import PurgeConfig, parse_config
from tests.conftest import Harness
from tests.support.activity import activity_env
from tests.support.delete_log import drop_log, log_each_delete, meet_first, most_at_once
from tests.support.history import child_runs, events, local_sweeps, scheduled_targets
from tests.support.passes import run_pass, run_pass_beside_older
from tests.support.tenants import (
    HOUR_MS,
    counts,
    create_tenants,
    expired_of,
    tenant_prefix,
    tenant_schemas,
)
from workflows.chunk import CHUNK_WORKFLOW

SMALL = 6
#: Live rows that fill a table past SMALL_PAGES (about 200 bytes a row, 40 rows a page).
LARGE_ROWS = SMALL_PAGES * 40 * 2


def config(prefix: str, **limits: int) -> PurgeConfig:
    return parse_config(
        {
            "pass": limits or {"max_concurrent": 4, "max_per_database": 1},
            "targets": [
                {
                    "kind": "expiring",
                    "name": "sessions",
                    "table": f"{prefix}_*.sessions",
                    "column": "expires_at",
                }
            ],
        }
    )


class SweepsAtOnce(Interceptor):
    """The most sweeps (local activities or activity tasks) each child (`PurgeChunk`) had under
    way at one moment, counted in its own workflow code: from when it starts one to when its
    result reaches the child. A child cannot run more at once than it started, on a machine of
    any speed, so this bounds what the database's log shows from above."""

    def __init__(self) -> None:
        self.most: Counter[str] = Counter()

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor] | None:
        most = self.most

        class Outbound(WorkflowOutboundInterceptor):
            running = 0

            def _counted(self, handle: asyncio.Task[Any]) -> None:
                info = workflow.info()
                if info.workflow_type != CHUNK_WORKFLOW:
                    return
                self.running += 1
                most[info.workflow_id] = max(most[info.workflow_id], self.running)
                handle.add_done_callback(lambda _: self._ended())

            def _ended(self) -> None:
                self.running -= 1

            def start_activity(self, input: StartActivityInput) -> workflow.ActivityHandle[Any]:
                handle = super().start_activity(input)
                self._counted(handle)
                return handle

            def start_local_activity(
                self, input: StartLocalActivityInput
            ) -> workflow.ActivityHandle[Any]:
                handle = super().start_local_activity(input)
                self._counted(handle)
                return handle

        class Inbound(WorkflowInboundInterceptor):
            def init(self, outbound: WorkflowOutboundInterceptor) -> None:
                super().init(Outbound(outbound))

        return Inbound


def make_large(conn: psycopg.Connection[Any], schema: str, now_ms: int) -> None:
    """Tenant `schema`'s sessions grown past SMALL_PAGES with live rows (padded)."""
    conn.execute(f"ALTER TABLE {schema}.sessions ADD COLUMN pad text")
    conn.execute(
        f"INSERT INTO {schema}.sessions (expires_at, pad)"
        f" SELECT %s, repeat('x', 180) FROM generate_series(1, {LARGE_ROWS})",
        (now_ms + HOUR_MS,),
    )


async def small_flags(harness: Harness, prefix: str) -> dict[str, bool]:
    cfg = harness.adopt(config(prefix))
    activities = PurgeActivities(build_registry(cfg, harness.pool))
    page = await activity_env().run(
        activities.expand_pattern, PatternStep(name="sessions", now_ms=harness.now_ms)
    )
    return dict(zip(page.matches, page.small, strict=True))


async def test_the_page_of_matches_says_which_tables_are_small(
    pg_url: str, harness: Harness
) -> None:
    """Small: a plain table of at most SMALL_PAGES heap pages. Not small: one past that, one a
    foreign key references (its deletes reach another table), one with an inheritance child,
    a partitioned one."""
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(3), harness.now_ms)
        make_large(conn, f"{prefix}_0001", harness.now_ms)
        conn.execute(
            f"CREATE TABLE {prefix}_0002.logins"
            f" (id bigint PRIMARY KEY, session bigint REFERENCES {prefix}_0002.sessions)"
        )
        conn.execute(f"CREATE SCHEMA {prefix}_0003")
        conn.execute(f"CREATE TABLE {prefix}_0003.sessions (id bigint, expires_at bigint)")
        conn.execute(
            f"CREATE TABLE {prefix}_0003.old_sessions () INHERITS ({prefix}_0003.sessions)"
        )
        conn.execute(f"CREATE SCHEMA {prefix}_0004")
        conn.execute(
            f"CREATE TABLE {prefix}_0004.sessions (id bigint, expires_at bigint)"
            " PARTITION BY RANGE (expires_at)"
        )

        flags = await small_flags(harness, prefix)

    assert flags == {
        f"sessions@{prefix}_0000": True,
        f"sessions@{prefix}_0001": False,
        f"sessions@{prefix}_0002": False,
        f"sessions@{prefix}_0003": False,
        f"sessions@{prefix}_0004": False,
    }


async def first_task_schedules(harness: Harness, workflow_id: str) -> list[tuple[int, int, int]]:
    """For each child run: (activities it scheduled before any completed, activities in all,
    sweeps it ran as local activities)."""
    runs = await child_runs(harness.client, await events(harness.client, workflow_id))
    found = []
    for history in (h for r in runs.values() for h in r):
        kinds = [e.event_type for e in history]
        ahead = 0
        for kind in kinds:
            if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                break
            ahead += kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        scheduled = kinds.count(EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
        found.append((ahead, scheduled, len(local_sweeps(history))))
    return found


async def child_inputs(harness: Harness, workflow_id: str) -> list[dict[str, Any]]:
    """The input each child of the pass was started with, in order."""
    converter = harness.client.data_converter.payload_converter
    return [
        converter.from_payloads(
            e.start_child_workflow_execution_initiated_event_attributes.input.payloads
        )[0]
        for e in await events(harness.client, workflow_id)
        if e.HasField("start_child_workflow_execution_initiated_event_attributes")
    ]


async def child_concurrency(harness: Harness, workflow_id: str) -> list[int]:
    """The targets at once each child of the pass was started to sweep, in order."""
    return [given["concurrency"] for given in await child_inputs(harness, workflow_id)]


@pytest.mark.parametrize(
    ("limits", "children", "at_once"),
    [
        # The defaults: the large match one at a time, the small ones four at once, as local
        # activities (their child is on the pass's own targets' queue: workflows.chunk).
        ((4, 1), [(1, 1, 0), (0, 0, SMALL)], [1, 4]),
        # Four at once on one database where max_per_database is lower: the pool's floor.
        ((8, 1), [(1, 1, 0), (0, 0, SMALL)], [1, 4]),
        ((2, 1), [(1, 1, 0), (0, 0, SMALL)], [1, 2]),  # never more than max_concurrent
        # max_per_database at four or above: no child of their own, one child as before (a
        # large match among them: activity tasks).
        ((8, 8), [(SMALL + 1, SMALL + 1, 0)], [8]),
    ],
    ids=["defaults", "8-1", "2-1", "8-8"],
)
async def test_small_matches_sweep_several_at_once_and_a_large_one_at_max_per_database(
    pg_url: str,
    harness: Harness,
    limits: tuple[int, int],
    children: list[tuple[int, int, int]],
    at_once: list[int],
) -> None:
    """The large match's child schedules one sweep at a time (`max_per_database`, 1 in most of
    these); the small matches' child sweeps several at once, each a local activity. Every
    expired row gone, every live one kept, the count exact. How many at once is read from the
    database's own log of the small tables' DELETEs: the first that many wait there to meet (so
    they overlap however slowly each starts), and no more than that many ever overlap. That
    no child ran more than its share at once is counted in its own workflow code
    (`SweepsAtOnce`): the log alone would miss a third DELETE that a slow machine started after
    the first two ended."""
    prefix = tenant_prefix()
    most, per_database = limits
    # The small tables with expired rows: a sweep of one with none may delete by no statement.
    logged = [f"{prefix}_{i:04d}" for i in range(SMALL + 1) if i != 3 and expired_of(i)]
    together = min(at_once[-1], len(logged))
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(SMALL + 1), harness.now_ms)
        make_large(conn, f"{prefix}_0003", harness.now_ms)
        log_table = log_each_delete(conn, prefix, [f"{s}.sessions" for s in logged])
        meet_first(conn, prefix, together)
        cfg = harness.adopt(config(prefix, max_concurrent=most, max_per_database=per_database))
        workflow_id = f"purge-small-{uuid.uuid4()}"
        sweeps_at_once = SweepsAtOnce()
        try:
            async with harness.run_worker(
                build_registry(cfg, harness.pool), config=cfg, interceptors=[sweeps_at_once]
            ):
                result = await run_pass(
                    harness.client, harness.task_queue, cfg.pass_input(), workflow_id
                )
            log = conn.execute(f"SELECT pid, edge FROM {log_table} ORDER BY at").fetchall()
        finally:
            drop_log(conn, prefix)
        scheduled = await first_task_schedules(harness, workflow_id)

        assert result["statuses"] == {"ok": SMALL + 1}
        assert result["removed"] == sum(expired_of(i) for i in range(SMALL + 1))
        left = counts(conn, prefix, harness.now_ms)
    assert scheduled == children
    assert await child_concurrency(harness, workflow_id) == at_once
    # Each child told that its targets' queue is the config's own (a child on it cannot tell).
    routes = [given["route"] for given in await child_inputs(harness, workflow_id)]
    assert routes == [{**routes[0], "queue": cfg.own_queue, "own_config": True}] * len(routes)
    # Each child ran as many at once as it was started to, or all its targets (at most
    # SMALL + 1), never more.
    assert sorted(sweeps_at_once.most.values()) == sorted(min(c, SMALL + 1) for c in at_once)
    assert {pid for pid, _ in log}, "no DELETE of a small table was logged"
    assert most_at_once(log) == together, log
    assert {expired for expired, _ in left.values()} == {0}
    assert sorted(live for _, live in left.values()) == [2] * SMALL + [2 + LARGE_ROWS]


async def test_small_matches_on_the_pass_s_own_queue_sweep_as_activity_tasks(
    pg_url: str, harness: Harness
) -> None:
    """A pass typed by hand (no `queues` in its input) runs its children on the pass's queue,
    where a worker may run workflows and no activity (`new_worker(sweeps=False)`): the small
    matches' child schedules activity tasks, four at once, and runs no local activity."""
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(SMALL + 1), harness.now_ms)
        make_large(conn, f"{prefix}_0003", harness.now_ms)
        cfg = harness.adopt(config(prefix))
        workflow_id = f"purge-small-{uuid.uuid4()}"
        async with harness.run_worker(build_registry(cfg, harness.pool), config=cfg):
            request = {k: v for k, v in cfg.pass_input().items() if k != "queues"}
            result = await run_pass(harness.client, harness.task_queue, request, workflow_id)
        scheduled = await first_task_schedules(harness, workflow_id)
        left = counts(conn, prefix, harness.now_ms)

    assert result["statuses"] == {"ok": SMALL + 1}
    assert scheduled == [(1, 1, 0), (4, SMALL, 0)]
    assert {expired for expired, _ in left.values()} == {0}


async def test_a_pass_without_limits_still_sweeps_small_matches_one_at_a_time(
    pg_url: str, harness: Harness
) -> None:
    """An input without limits (as the `temporal` CLI sends one) sweeps one target at a time,
    small matches too, in one child and in input order: a large match among them keeps its
    place."""
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(3), harness.now_ms)
        make_large(conn, f"{prefix}_0001", harness.now_ms)
        cfg = harness.adopt(config(prefix))
        workflow_id = f"purge-small-{uuid.uuid4()}"
        async with harness.run_worker(build_registry(cfg, harness.pool), config=cfg):
            limits = ("max_concurrent", "max_per_database", "budget_ms")
            request = {k: v for k, v in cfg.pass_input().items() if k not in limits}
            result = await run_pass(harness.client, harness.task_queue, request, workflow_id)
        children = await first_task_schedules(harness, workflow_id)
        runs = await child_runs(harness.client, await events(harness.client, workflow_id))

    assert result["statuses"] == {"ok": 3}
    assert children == [(1, 3, 0)]
    [[history]] = runs.values()
    assert scheduled_targets(harness.client, history) == [
        f"sessions@{prefix}_{i:04d}" for i in range(3)
    ]


class OlderActivities(PurgeActivities):
    """As a release before this one reads a pattern's matches: nothing of their size."""

    @activity.defn(name="expand_pattern")
    async def expand_pattern(self, step: PatternStep) -> PatternPage:
        page = await super().expand_pattern(step)
        page.small = []
        return page


async def test_matches_read_by_an_older_worker_sweep_at_max_per_database(
    pg_url: str, harness: Harness
) -> None:
    """The workers next to the database are of an earlier release: their pages say nothing of
    size, and the matches sweep one at a time at the default limits, as before. The pass
    completes, every row as it should be."""
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(3), harness.now_ms)
        cfg = harness.adopt(config(prefix))
        registry = build_registry(cfg, harness.pool)
        workflow_id = f"purge-small-{uuid.uuid4()}"
        older = OlderActivities(registry)
        result = await run_pass_beside_older(
            harness.client, harness.task_queue, cfg, registry, older, workflow_id
        )
        children = await first_task_schedules(harness, workflow_id)
        left = counts(conn, prefix, harness.now_ms)

    assert result["statuses"] == {"ok": 3}
    assert children == [(1, 3, 0)]
    assert set(left.values()) == {(0, 2)}
