"""Guards refuse a target's sweep before its first delete, non-retryably, naming the numbers:
max_rows, max_fraction, and a clock that went back or jumped ahead of the previous pass."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool
from temporalio.exceptions import ApplicationError

from activities import builtin_kinds as kinds
from activities.payloads import PurgeReport, PurgeStep
from activities.registry import TargetRegistry
from activities.sweep import PurgeActivities
from purge_config.settings import Guards
from tests.conftest import Harness
from tests.support.activity import activity_env
from tests.support.history import events
from tests.support.passes import failed_pass, run_pass
from tests.support.rows import HOUR, auth_rows, idempotency_rows, keys


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
async def test_count_guards_refuse_before_any_delete_and_the_others_are_swept(
    harness: Harness,
    guards: Guards,
    refusal: str,
) -> None:
    seed(harness.db, harness.now_ms, expired=6, live=4)
    auth_rows(harness.db, {"f-old": harness.now_ms - HOUR}, {})
    workflow_id = f"purge-{uuid.uuid4()}"
    async with harness.run_worker(
        [kinds.idempotency(harness.pool, guards=guards), kinds.auth(harness.pool)]
    ):
        error = await failed_pass(
            harness.client,
            harness.task_queue,
            {"targets": ["x_idempotency", "x_auth"]},
            workflow_id,
        )

    report = PurgeReport.from_json(error.details[0])
    [failure] = report.failed
    assert (failure.name, failure.type) == ("x_idempotency", "PurgeGuardRefused")
    assert refusal in failure.message
    assert failure.message.endswith("nothing was deleted")
    assert len(keys(harness.db, "x_idempotency")) == 10
    assert [(s.name, s.removed) for s in report.swept] == [("x_auth", 1)]
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


async def test_clock_guard_passes_the_first_pass_on_a_queue(
    harness: Harness,
) -> None:
    seed(harness.db, harness.now_ms, expired=2, live=1)
    guarded = kinds.idempotency(harness.pool, guards=Guards(max_clock_jump_ms=HOUR))
    env = activity_env(
        harness.client, task_queue=f"tq-empty-{uuid.uuid4()}", workflow_id="purge-first"
    )
    swept = await env.run(
        PurgeActivities(TargetRegistry([guarded])).purge_target,
        PurgeStep(name="x_idempotency", now_ms=harness.now_ms),
    )
    assert swept.removed == 2


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
