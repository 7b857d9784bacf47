"""Guards refuse a target's sweep before its first delete, non-retryably, naming the numbers:
max_rows, max_fraction, and a clock that went back or jumped ahead of the previous pass, on
every queue; a guard with nothing to compare with says so in the report and the log."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import AsyncConnectionPool
from temporalio.client import WorkflowExecution, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError

from activities import builtin_kinds as kinds
from activities.clock import iso_ms
from activities.guards import previous_pass_instant
from activities.inputs import PurgeStep
from activities.registry import TargetRegistry
from activities.results import PurgeReport
from activities.sweep import PurgeActivities
from purge_config.file import parse_config
from purge_config.settings import Guards, SweepSettings
from purge_ops.runner import activity_worker
from tests.conftest import Harness
from tests.support.activity import activity_env
from tests.support.history import events
from tests.support.history import kinds as event_kinds
from tests.support.pace import HandClock, budget_clock
from tests.support.passes import failed_pass, listed, run_pass
from tests.support.rows import HOUR, auth_rows, idempotency_rows, keys
from tests.support.tenants import create_tenants, tenant_prefix, tenant_schemas


def seed(db: psycopg.Connection[Any], real_now: int, expired: int, live: int) -> None:
    rows = {f"old-{i}": real_now - HOUR for i in range(expired)}
    rows |= {f"new-{i}": real_now + 24 * HOUR for i in range(live)}
    idempotency_rows(db, rows)


@pytest.mark.parametrize(
    ("guards", "refusal"),
    [
        (Guards(max_rows=5), "would remove 6 rows, more than its max_rows 5"),
        (Guards(max_fraction=0.5), "would remove 6 of 10 rows (60.0%), more than its "
         "max_fraction 50.0%"),
    ],
    ids=["max_rows", "max_fraction"],
)  # fmt: skip
@pytest.mark.parametrize("dry_run", [False, True], ids=["sweep", "dry-run"])
async def test_count_guards_refuse_before_any_delete_and_the_others_are_swept(
    harness: Harness,
    guards: Guards,
    refusal: str,
    dry_run: bool,
) -> None:
    """A dry run is refused as its sweep would be: one that counted the rows a guard then
    refuses would promise a sweep that never comes."""
    seed(harness.db, harness.now_ms, expired=6, live=4)
    auth_rows(harness.db, {"f-old": harness.now_ms - HOUR}, {})
    workflow_id = f"purge-{uuid.uuid4()}"
    async with harness.run_worker(
        [kinds.idempotency(harness.pool, guards=guards), kinds.auth(harness.pool)]
    ):
        error = await failed_pass(
            harness.client,
            harness.task_queue,
            {"targets": ["x_idempotency", "x_auth"], "dry_run": dry_run},
            workflow_id,
        )

    report = PurgeReport.from_json(error.details[0])
    [failure] = report.failed
    assert (failure.name, failure.type) == ("x_idempotency", "PurgeGuardRefused")
    assert refusal in failure.message
    assert failure.message.endswith("nothing was deleted")
    assert len(keys(harness.db, "x_idempotency")) == 10
    assert [(s.name, s.removed) for s in report.swept] == [("x_auth", 1)]
    assert len(keys(harness.db, "x_auth_failures")) == (1 if dry_run else 0)
    started = [
        e.activity_task_started_event_attributes.attempt
        for e in await events(harness.client, workflow_id)
        if e.HasField("activity_task_started_event_attributes")
    ]
    assert started == [1, 1]  # refused on its first attempt: never retried


@pytest.mark.parametrize(
    "guards",
    [Guards(max_rows=6), Guards(max_fraction=0.6), Guards(max_rows=6, max_fraction=0.6)],
    ids=["max_rows-at-limit", "max_fraction-at-limit", "both-at-limit"],
)
async def test_count_guards_allow_a_sweep_exactly_at_their_limit(
    harness: Harness,
    guards: Guards,
) -> None:
    seed(harness.db, harness.now_ms, expired=6, live=4)
    async with harness.run_worker([kinds.idempotency(harness.pool, guards=guards)]):
        result = await run_pass(harness.client, harness.task_queue, {"targets": ["x_idempotency"]})
    assert result["removed"] == 6
    assert keys(harness.db, "x_idempotency") == {f"new-{i}" for i in range(4)}


async def test_auth_guards_count_both_tables(
    pool: AsyncConnectionPool[Any], db: psycopg.Connection[Any], real_now: int
) -> None:
    auth_rows(
        db,
        {"f1": real_now - HOUR, "f2": real_now - HOUR, "f3": real_now + HOUR},
        {"l1": real_now - HOUR, "l2": real_now + HOUR},
    )
    target = kinds.auth(pool, guards=Guards(max_rows=2))
    with pytest.raises(ApplicationError, match="would remove 3 rows, more than its max_rows 2"):
        await activity_env().run(
            PurgeActivities(TargetRegistry([target])).purge_target,
            PurgeStep(name="x_auth", now_ms=real_now),
        )
    assert await target.measure(real_now) == (3, 5)


async def test_clock_guard_refuses_a_clock_behind_or_far_ahead_of_the_previous_pass(
    harness: Harness,
) -> None:
    """The previous instant is the one the last pass recorded in Temporal: no server clock."""
    guarded = kinds.idempotency(harness.pool, guards=Guards(max_clock_jump_ms=6 * HOUR))
    async with harness.run_worker([guarded]):
        first = await run_pass(harness.client, harness.task_queue, {"targets": ["x_idempotency"]})
        second = await run_pass(harness.client, harness.task_queue, {"targets": ["x_idempotency"]})
    previous = second["now_ms"]
    # The guard reads the previous pass from visibility, which lags the history.
    await listed(harness.client, f'TaskQueue = "{harness.task_queue}"', 2)
    assert first["failed"] == []
    assert second["failed"] == []  # seconds after the first: allowed
    seed(harness.db, harness.now_ms, expired=3, live=1)
    activities = PurgeActivities(TargetRegistry([guarded]))

    def step(now_ms: int) -> PurgeStep:
        return PurgeStep(name="x_idempotency", now_ms=now_ms)

    env = activity_env(harness.client, task_queue=harness.task_queue, workflow_id="purge-now")
    with pytest.raises(ApplicationError) as behind:
        await env.run(activities.purge_target, step(previous - 1))
    with pytest.raises(ApplicationError) as ahead:
        await env.run(activities.purge_target, step(previous + 6 * HOUR + 1))
    assert len(keys(harness.db, "x_idempotency")) == 4  # neither deleted anything
    within = await env.run(activities.purge_target, step(previous + 6 * HOUR))

    assert behind.value.type == "PurgeGuardRefused"
    assert behind.value.non_retryable
    assert "is earlier than the previous pass's" in behind.value.message
    assert ahead.value.type == "PurgeGuardRefused"
    assert "is 6:00:00.001000 after the previous pass's" in ahead.value.message
    assert "more than its max_clock_jump 6:00:00" in ahead.value.message
    assert within.removed == 3


async def test_clock_guard_compares_with_a_pass_visibility_still_lists_as_running(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Visibility lags the history: the pass that closed a moment ago may still be listed as
    running (and left out of a search for closed passes). The guard asks the pass itself, and
    compares with it, not with the pass before. The lag is played by the listing alone: every
    other read is the server's."""
    async with harness.run_worker([kinds.idempotency(harness.pool)]):
        older = await run_pass(harness.client, harness.task_queue, {"targets": ["x_idempotency"]})
        newest_id = f"purge-newest-{uuid.uuid4()}"
        newest = await run_pass(
            harness.client, harness.task_queue, {"targets": ["x_idempotency"]}, newest_id
        )
    closed = f'TaskQueue = "{harness.task_queue}" AND ExecutionStatus = "Completed"'
    [lagging_run] = [w.run_id for w in await listed(harness.client, closed, 2) if w.id == newest_id]
    real_list = harness.client.list_workflows

    async def lagging(query: str, limit: int | None = None) -> AsyncIterator[WorkflowExecution]:
        async for execution in real_list(query, limit=limit):
            if execution.run_id != lagging_run:
                yield execution
            elif 'ExecutionStatus != "Running"' not in query:
                yield dataclasses.replace(
                    execution, status=WorkflowExecutionStatus.RUNNING, close_time=None
                )

    monkeypatch.setattr(harness.client, "list_workflows", lagging)
    found = await previous_pass_instant(harness.client, harness.task_queue, run_id="another")

    assert found is not None
    assert found[1] == newest["now_ms"] != older["now_ms"]


async def test_clock_guard_passes_the_first_pass_on_a_queue_and_says_it_did_not_check(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """An activity run outside any pass compares with the passes on its own queue: none."""
    seed(harness.db, harness.now_ms, expired=2, live=1)
    guarded = kinds.idempotency(harness.pool, guards=Guards(max_clock_jump_ms=HOUR))
    queue = f"tq-empty-{uuid.uuid4()}"
    env = activity_env(harness.client, task_queue=queue, workflow_id="purge-first")
    with caplog.at_level(logging.WARNING, logger="temporalio.activity"):
        swept = await env.run(
            PurgeActivities(TargetRegistry([guarded])).purge_target,
            PurgeStep(name="x_idempotency", now_ms=harness.now_ms),
        )
    assert swept.removed == 2
    assert swept.unchecked_guards == {"max_clock_jump": unchecked(queue)}
    [line] = [r.getMessage() for r in caplog.records if "max_clock_jump" in r.getMessage()]
    assert line.startswith(f"purge target x_idempotency: max_clock_jump had {unchecked(queue)}")


async def test_a_guards_count_comes_out_of_the_sweeps_time_budget(
    pool: AsyncConnectionPool[Any],
    db: psycopg.Connection[Any],
    real_now: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The guards' counts and the sweep end by one time budget: a count that took all of it
    leaves the sweep none, which stops before its first batch and reports its backlog (it got
    a whole budget of its own, so a guarded target over a large table could run past the
    activity's start-to-close, and every retry count again). The count is made to take the
    budget on a clock the test moves (`budget_clock`)."""
    seed(db, real_now, expired=6, live=4)
    clock = budget_clock(monkeypatch)
    settings = SweepSettings(time_budget_ms=60_000)
    target = kinds.idempotency(pool, guards=Guards(max_rows=100), settings=settings)
    measure = target.measure

    async def takes_the_budget(
        now_ms: int, total: bool = True, *, deadline: float | None = None
    ) -> tuple[int, int]:
        counted = await measure(now_ms, total, deadline=deadline)
        clock.spend(60)
        return counted

    monkeypatch.setattr(target, "measure", takes_the_budget)
    swept = await activity_env().run(
        PurgeActivities(TargetRegistry([target])).purge_target,
        PurgeStep(name="x_idempotency", now_ms=real_now),
    )

    assert (swept.removed, swept.backlog) == (0, 6)
    assert len(keys(db, "x_idempotency")) == 10


#: A minute's budget (spent on the test's clock) and a lock wait longer than it: the deadline's
#: statement timeout, not the lock timeout, ends a count held behind the test's lock.
PATIENT = SweepSettings(time_budget_ms=60_000, lock_timeout_ms=60_000)


def held_past_the_deadline(
    db: psycopg.Connection[Any], clock: HandClock, count: Callable[..., Awaitable[Any]]
) -> Callable[..., Awaitable[Any]]:
    """`count` (a target's `measure` or `preview`) run past its step's deadline on any machine:
    the budget spent on the test's clock as it starts, then its read waits on a lock the test
    holds until the statement timeout the deadline set cancels it."""

    async def runs_out(*args: Any, **kwargs: Any) -> Any:
        clock.spend(60)
        with db.transaction():
            db.execute("LOCK TABLE x_idempotency IN ACCESS EXCLUSIVE MODE")
            return await count(*args, **kwargs)

    return runs_out


async def test_a_guards_count_the_deadline_cancels_leaves_the_sweep_out_of_time_not_failed(
    pool: AsyncConnectionPool[Any],
    db: psycopg.Connection[Any],
    real_now: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A guards' count still running at the step's deadline (a retry, or a pass's last
    minutes, with little time left) is cancelled by the statement timeout the deadline set:
    the sweep then starts out of time, deletes nothing and reports the backlog, as any sweep
    with no time left does, and says why; not a failure retried five times past the pass. The
    count waits on a lock the test holds, with the budget spent on the test's clock, so the
    deadline cancels it on any machine."""
    seed(db, real_now, expired=6, live=4)
    clock = budget_clock(monkeypatch)
    target = kinds.idempotency(pool, guards=Guards(max_rows=100), settings=PATIENT)
    monkeypatch.setattr(target, "measure", held_past_the_deadline(db, clock, target.measure))
    swept = await activity_env().run(
        PurgeActivities(TargetRegistry([target])).purge_target,
        PurgeStep(name="x_idempotency", now_ms=real_now),
    )

    assert (swept.removed, swept.backlog, swept.status) == (0, 6, "ok")
    assert swept.reason.startswith("its time ran out while its guards counted the rows: no batch")
    assert len(keys(db, "x_idempotency")) == 10


async def test_a_dry_runs_count_the_deadline_cancels_is_reported_skipped_not_failed(
    pool: AsyncConnectionPool[Any],
    db: psycopg.Connection[Any],
    real_now: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dry run's count still running at the step's deadline is cancelled by the statement
    timeout the deadline set: the target is reported `skipped`, saying why, not failed (its
    retries would have less time still). Made to happen as for the guards' count above. Its
    checks before the count end by that deadline too, not by the setting's statement_timeout
    (here the longest there is): they read the locked table first, and waited until the lock
    timeout failed the step."""
    seed(db, real_now, expired=6, live=4)
    clock = budget_clock(monkeypatch)
    longest = dataclasses.replace(PATIENT, statement_timeout_ms=600_000)
    target = kinds.idempotency(pool, settings=longest)
    monkeypatch.setattr(target, "preview", held_past_the_deadline(db, clock, target.preview))
    counted = await activity_env().run(
        PurgeActivities(TargetRegistry([target])).purge_target,
        PurgeStep(name="x_idempotency", now_ms=real_now, dry_run=True),
    )

    assert (counted.status, counted.removed, counted.dry_run) == ("skipped", 0, True)
    assert counted.reason.startswith("its time ran out while it counted the rows: no count")
    assert len(keys(db, "x_idempotency")) == 10


async def test_guards_are_not_asked_again_by_a_resumed_attempt(
    pool: AsyncConnectionPool[Any], db: psycopg.Connection[Any], real_now: int
) -> None:
    """An attempt that resumes after deleting has passed its guards; it finishes the job
    rather than refusing half way (its count now would be smaller anyway)."""
    seed(db, real_now, expired=6, live=4)
    resumed = {"table": 0, "page": 0, "removed": 2, "batches": 1, "strategy": "index"}
    env = activity_env(heartbeat_details=[resumed], attempt=2)
    # What the earlier attempt's one batch wrote to the ledger with its 2 deletes.
    db.execute(
        "INSERT INTO purge_progress VALUES (%s, %s, 'x_idempotency', %s, 2, 1)",
        (env.info.workflow_id, env.info.workflow_run_id, real_now),
    )
    guarded = kinds.idempotency(pool, guards=Guards(max_rows=1))
    swept = await env.run(
        PurgeActivities(TargetRegistry([guarded])).purge_target,
        PurgeStep(name="x_idempotency", now_ms=real_now),
    )
    assert swept.removed == 2 + 6


async def test_clock_guard_compares_with_the_pass_finished_as_its_own_began_not_one_beside_it(
    harness: Harness,
) -> None:
    """A short pass started and finished while a long one waited (a `sweep` typed by hand
    beside a scheduled pass) records a later instant than the long one's: the long one's
    guarded target compares with the pass that had finished when the long one began, and
    sweeps; a clock behind that pass's is still refused."""
    guarded = kinds.idempotency(harness.pool, guards=Guards(max_clock_jump_ms=6 * HOUR))
    nowhere = f"{harness.task_queue}-nowhere"
    async with harness.run_worker([guarded]):
        before_id = f"purge-before-{uuid.uuid4()}"
        before = await run_pass(harness.client, harness.task_queue, {"targets": []}, before_id)
        # The long pass: its target's activity waits on a queue no worker polls; the activity
        # run below is the one it waits to run.
        long = await harness.client.start_workflow(
            "Purge",
            {
                "targets": ["x_idempotency"],
                "databases": {"x_idempotency": "eu"},
                "queues": {"eu": nowhere},
                "worker_wait_ms": 600_000,
            },
            id=f"purge-long-{uuid.uuid4()}",
            task_queue=harness.task_queue,
        )
        try:
            await _until_scheduled(harness, long.id)
            beside = await run_pass(harness.client, harness.task_queue, {"targets": []})
            # What the guard reads: both earlier passes listed as finished.
            await listed(
                harness.client,
                f'TaskQueue = "{harness.task_queue}" AND ExecutionStatus = "Completed"',
                2,
            )
            seed(harness.db, harness.now_ms, expired=3, live=1)
            env = activity_env(
                harness.client,
                task_queue=nowhere,
                workflow_type="Purge",
                workflow_id=long.id,
                workflow_run_id=long.result_run_id,
            )
            activities = PurgeActivities(TargetRegistry([guarded]))
            with pytest.raises(ApplicationError) as behind:
                await env.run(
                    activities.purge_target,
                    PurgeStep(name="x_idempotency", now_ms=before["now_ms"] - 1),
                )
            assert len(keys(harness.db, "x_idempotency")) == 4
            swept = await env.run(
                activities.purge_target,
                PurgeStep(name="x_idempotency", now_ms=beside["now_ms"] - 1),
            )
        finally:
            await long.terminate()
    assert before["now_ms"] < beside["now_ms"]
    assert "is earlier than the previous pass's" in behind.value.message
    assert f"({before_id})" in behind.value.message
    assert swept.removed == 3
    assert swept.unchecked_guards == {}


async def _until_scheduled(harness: Harness, workflow_id: str) -> None:
    """Until the pass `workflow_id` has scheduled its first activity (up to 60 s)."""
    async with asyncio.timeout(60):
        while "ACTIVITY_TASK_SCHEDULED" not in event_kinds(
            await events(harness.client, workflow_id)
        ):
            await asyncio.sleep(0.05)


def unchecked(queue: str) -> str:
    """What the report and the log say of a max_clock_jump with no previous pass on `queue`."""
    return (
        f"no previous pass to compare with: no pass on task queue {queue!r} finished before this "
        "one started (of the last 20) and recorded an instant, as on a first pass or once older "
        "passes are past the namespace's retention; the sweep went ahead unchecked"
    )


@dataclass(frozen=True)
class Shape:
    """Where a guarded target's activities run: on the pass's own task queue, or on its
    database's own (`[databases.eu] task_queue`), and there as a pattern's matches, swept by the
    children of a spread pass."""

    routed: bool
    pattern: bool


SHAPES = [Shape(False, False), Shape(True, False), Shape(True, True)]
SHAPE_IDS = ["pass-queue", "routed", "routed-pattern"]


@dataclass(frozen=True)
class Guarded:
    """A target guarded by `max_clock_jump = "1s"` in one shape: the pass's input, its workers,
    and its rows."""

    harness: Harness
    shape: Shape
    registry: TargetRegistry
    request: dict[str, Any]
    tables: list[sql.Composable]
    routed_queue: str

    @asynccontextmanager
    async def workers(self) -> AsyncIterator[None]:
        """A worker of the pass's queue and, for a routed target, one of its database's queue
        that alone has the target, as a regional worker would."""
        if not self.shape.routed:
            async with self.harness.run_worker(self.registry):
                yield
            return
        async with (
            self.harness.run_worker(TargetRegistry([])),
            activity_worker(self.harness.client, self.registry, self.routed_queue),
        ):
            yield

    def add_expired(self) -> None:
        """One expired row more in each of the target's tables."""
        insert = (
            "INSERT INTO {} (expires_at) VALUES (%s)"
            if self.shape.pattern
            else "INSERT INTO {} (key, expires_at_ms) VALUES (gen_random_uuid()::text, %s)"
        )
        for table in self.tables:
            self.harness.db.execute(sql.SQL(insert).format(table), (self.harness.now_ms - HOUR,))

    def expired_left(self) -> int:
        """Expired rows left in the target's tables."""
        column = sql.Identifier("expires_at" if self.shape.pattern else "expires_at_ms")
        left = 0
        for table in self.tables:
            query = sql.SQL("SELECT count(*) FROM {} WHERE {} <= %s").format(table, column)
            row = self.harness.db.execute(query, (self.harness.now_ms,)).fetchone()
            assert row is not None
            left += row[0]
        return left


@pytest.fixture(params=SHAPES, ids=SHAPE_IDS)
def guarded(request: pytest.FixtureRequest, harness: Harness, pg_url: str) -> Iterator[Guarded]:
    """The guarded target in each shape; a pattern's tenant schemas dropped after."""
    shape: Shape = request.param
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        if shape.pattern:
            create_tenants(conn, prefix, range(2), harness.now_ms, live=1)
            target = {"kind": "expiring", "name": "sessions", "table": f"{prefix}_*.sessions"}
            target |= {"column": "expires_at"}
            tables = [sql.Identifier(f"{prefix}_{i:04d}", "sessions") for i in range(2)]
        else:
            target = {"kind": "idempotency"}
            tables = [sql.Identifier(harness.schema, "x_idempotency")]
        config = parse_config({"targets": [{**target, "max_clock_jump": "1s"}]})
        [name] = config.target_names
        # Routed by hand, as a config's `[databases.eu] task_queue` routes it: the input's
        # `databases` and `queues`.
        routed_queue = f"{harness.task_queue}-eu"
        pass_input: dict[str, Any] = {"targets": [name]}
        if shape.pattern:
            pass_input["patterns"] = [name]
        if shape.routed:
            pass_input |= {"databases": {name: "eu"}, "queues": {"eu": routed_queue}}
        registry = kinds.build_registry(config, harness.pool)
        yield Guarded(harness, shape, registry, pass_input, tables, routed_queue)


async def test_clock_guard_refuses_a_jump_past_its_limit_on_every_queue(guarded: Guarded) -> None:
    """Two real passes more than max_clock_jump apart: the second is refused, naming the
    first, wherever the target's activities run. The previous pass is read on the pass's task
    queue, where a routed database's queue has none."""
    harness = guarded.harness
    first_id = f"purge-first-{uuid.uuid4()}"
    async with guarded.workers():
        first = await run_pass(harness.client, harness.task_queue, guarded.request, first_id)
        assert first["failed"] == []
        await listed(harness.client, f'TaskQueue = "{harness.task_queue}"')  # what it compares
        # The second pass's instant is then more than the 1 s limit after the first's.
        while time.time() * 1000 <= first["now_ms"] + 1100:
            await asyncio.sleep(0.05)
        guarded.add_expired()
        error = await failed_pass(
            harness.client, harness.task_queue, guarded.request, f"purge-{uuid.uuid4()}"
        )

    assert error.type == "PurgeTargetsFailed"
    report = PurgeReport.from_json(error.details[0])
    assert len(report.failed) == len(guarded.tables)
    previous = f"after the previous pass's {iso_ms(first['now_ms'])} ({first_id})"
    for failure in report.failed:
        assert failure.type == "PurgeGuardRefused"
        assert previous in failure.message
        assert "more than its max_clock_jump 0:00:01; nothing was deleted" in failure.message
    assert guarded.expired_left() == len(guarded.tables)


async def test_clock_guard_of_a_first_pass_on_every_queue_says_it_had_nothing_to_compare(
    guarded: Guarded, caplog: pytest.LogCaptureFixture
) -> None:
    """The first pass sweeps, and each sweep's report and one log line say that max_clock_jump
    had no previous pass on the pass's task queue to compare with."""
    harness = guarded.harness
    guarded.add_expired()
    with caplog.at_level(logging.WARNING, logger="temporalio.activity"):
        async with guarded.workers():
            result = await run_pass(harness.client, harness.task_queue, guarded.request)

    report = PurgeReport.from_json(result)
    assert report.failed == []
    assert len(report.swept) == len(guarded.tables)
    assert guarded.expired_left() == 0
    for sweep in report.swept:
        assert sweep.unchecked_guards == {"max_clock_jump": unchecked(harness.task_queue)}
    lines = sorted(r.getMessage() for r in caplog.records if "max_clock_jump" in r.getMessage())
    assert len(lines) == len(report.swept)
    for line, sweep in zip(lines, sorted(report.swept, key=lambda s: s.name), strict=True):
        expected = f"purge target {sweep.name}: max_clock_jump had {unchecked(harness.task_queue)}"
        assert line.startswith(expected)


async def test_clock_guard_of_a_routed_activity_refuses_a_clock_behind_its_pass_s_previous(
    harness: Harness,
) -> None:
    """A routed activity (its own task queue) of a running pass compares with the passes on
    the pass's queue: a clock behind the last one's is refused."""
    guarded = kinds.idempotency(harness.pool, guards=Guards(max_clock_jump_ms=6 * HOUR))
    async with harness.run_worker([guarded]):
        previous = await run_pass(harness.client, harness.task_queue, {"targets": []})
    await listed(harness.client, f'TaskQueue = "{harness.task_queue}"')  # what the guard reads
    seed(harness.db, harness.now_ms, expired=3, live=1)
    # A pass no worker runs yet: the activity below is one it would route to purge-eu.
    running = await harness.client.start_workflow(
        "Purge", {"targets": ["x_idempotency"]}, id=f"purge-{uuid.uuid4()}",
        task_queue=harness.task_queue,
    )  # fmt: skip
    try:
        env = activity_env(
            harness.client,
            task_queue=f"{harness.task_queue}-eu",
            workflow_type="Purge",
            workflow_id=running.id,
            workflow_run_id=running.result_run_id,
        )
        with pytest.raises(ApplicationError) as behind:
            await env.run(
                PurgeActivities(TargetRegistry([guarded])).purge_target,
                PurgeStep(name="x_idempotency", now_ms=previous["now_ms"] - 1),
            )
    finally:
        await running.terminate()
    assert behind.value.type == "PurgeGuardRefused"
    assert "is earlier than the previous pass's" in behind.value.message
    assert len(keys(harness.db, "x_idempotency")) == 4
