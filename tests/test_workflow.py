"""The `Purge` workflow end to end on the real dev server, with the built-in targets on the real
PostgreSQL server: the report, the one clock, duplicates, dry runs, bad input."""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import WorkflowTaskFailedEventAttributes
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import ApplicationError

from activities import builtin_kinds as kinds
from activities.registry import TargetRegistry
from activities.sweep import PurgeActivities
from purge_config.fleet import MAX_TARGETS_PER_PASS
from tests.conftest import Harness
from tests.support.history import events, scheduled_targets
from tests.support.history import kinds as event_kinds
from tests.support.later_release import LATER_FORMAT, NEW_KEY, LaterPurge
from tests.support.passes import FAIL_WITHIN_S, failed_pass, own_queue_worker, run_pass
from tests.support.rows import HOUR, auth_rows, bucket_rows, idempotency_rows, keys
from workflows.chunk import PurgeChunkWorkflow


def builtins(pool: AsyncConnectionPool[Any]) -> list[Any]:
    return [kinds.idempotency(pool), kinds.rate_limit(pool), kinds.auth(pool)]


def seed_expired_and_live(db: psycopg.Connection[Any], now_ms: int) -> None:
    """Rows a pass at (about) `now_ms` must split cleanly, far from the boundary."""
    idempotency_rows(db, {"old-1": now_ms - HOUR, "old-2": now_ms - 2 * HOUR, "new": now_ms + HOUR})
    bucket_rows(
        db,
        {"full": (4.0, 4.0, 0.001, now_ms - HOUR), "empty": (0.0, 4.0, 1e-9, now_ms - 1000)},
    )
    auth_rows(db, {"f-old": now_ms - HOUR, "f-new": now_ms + HOUR}, {"l-old": now_ms - HOUR})


async def test_pass_sweeps_targets_in_input_order_and_reports_each(
    harness: Harness,
) -> None:
    seed_expired_and_live(harness.db, harness.now_ms)
    async with harness.run_worker(builtins(harness.pool)):
        result = await run_pass(
            harness.client,
            harness.task_queue,
            {"targets": ["x_auth", "x_idempotency", "x_rate_limit"]},
        )

    assert [(s["name"], s["removed"]) for s in result["swept"]] == [
        ("x_auth", 2),
        ("x_idempotency", 2),
        ("x_rate_limit", 1),
    ]
    assert result["removed"] == 5
    assert result["failed"] == []
    assert keys(harness.db, "x_idempotency") == {"new"}
    assert keys(harness.db, "x_rate_limit") == {"empty"}
    assert keys(harness.db, "x_auth_failures") == {"f-new"}
    assert keys(harness.db, "x_auth_lockouts") == set()


async def test_every_target_is_handed_the_one_instant_read_at_the_start(
    harness: Harness,
) -> None:
    seen: list[int] = []

    class Recorder:
        name = "recorder"

        async def purge_expired(self, now_ms: int) -> int:
            seen.append(now_ms)
            return 0

    workflow_id = f"purge-{uuid.uuid4()}"
    async with harness.run_worker([*builtins(harness.pool), Recorder()]):
        result = await run_pass(
            harness.client,
            harness.task_queue,
            {"targets": ["x_idempotency", "recorder", "x_rate_limit", "x_auth"]},
            workflow_id,
        )

    history = await events(harness.client, workflow_id)
    converter = harness.client.data_converter.payload_converter
    handed = [
        converter.from_payloads(e.activity_task_scheduled_event_attributes.input.payloads)[0]
        for e in history
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert {step["now_ms"] for step in handed} == {result["now_ms"]}
    assert seen == [result["now_ms"]]
    # It is the workflow's clock: the instant the server handed the first workflow task, which
    # lies between that task's scheduling and its completion, both in the server's clock. Not
    # the task-started event's own time to the millisecond: the server stamps the task it hands
    # out and the event apart, and they once differed by 1 ms (a CI run at eeb344a).
    kinds = event_kinds(history)
    assert kinds[1:4] == [
        "WORKFLOW_TASK_SCHEDULED",
        "WORKFLOW_TASK_STARTED",
        "WORKFLOW_TASK_COMPLETED",
    ]
    scheduled, completed = (history[i].event_time.ToMilliseconds() for i in (1, 3))
    assert scheduled <= result["now_ms"] <= completed


async def test_duplicate_names_fail_before_any_activity(
    harness: Harness,
) -> None:
    workflow_id = f"purge-{uuid.uuid4()}"
    async with harness.run_worker(builtins(harness.pool)):
        error = await failed_pass(
            harness.client,
            harness.task_queue,
            {"targets": ["x_auth", "x_idempotency", "x_auth", "x_rate_limit", "x_idempotency"]},
            workflow_id,
        )

    assert error.type == "DuplicatePurgeTarget"
    assert error.non_retryable
    assert "x_auth, x_idempotency" in error.message
    history = event_kinds(await events(harness.client, workflow_id))
    assert "ACTIVITY_TASK_SCHEDULED" not in history
    assert history[-1] == "WORKFLOW_EXECUTION_FAILED"


async def test_dry_run_counts_and_deletes_nothing(
    harness: Harness,
) -> None:
    seed_expired_and_live(harness.db, harness.now_ms)
    async with harness.run_worker(builtins(harness.pool)):
        result = await run_pass(
            harness.client,
            harness.task_queue,
            {"targets": ["x_idempotency", "x_rate_limit", "x_auth"], "dry_run": True},
        )

    assert [(s["name"], s["removed"]) for s in result["swept"]] == [
        ("x_idempotency", 2),
        ("x_rate_limit", 1),
        ("x_auth", 2),
    ]
    assert result["dry_run"] is True
    assert len(keys(harness.db, "x_idempotency")) == 3
    assert len(keys(harness.db, "x_rate_limit")) == 2
    assert len(keys(harness.db, "x_auth_failures")) + len(keys(harness.db, "x_auth_lockouts")) == 3


async def test_empty_target_list_is_a_pass_that_removes_nothing(
    harness: Harness,
) -> None:
    workflow_id = f"purge-{uuid.uuid4()}"
    async with harness.run_worker(builtins(harness.pool)):
        result = await run_pass(harness.client, harness.task_queue, {"targets": []}, workflow_id)

    assert result["swept"] == []
    assert result["removed"] == 0
    assert "ACTIVITY_TASK_SCHEDULED" not in event_kinds(await events(harness.client, workflow_id))


@pytest.mark.parametrize(
    ("request_", "complaint"),
    [
        ({"targets": "x_auth"}, "must be a list"),
        ({"targets": ["x_auth", 7]}, "not a target name"),
        ({"targets": ["x_auth; DROP TABLE x"]}, "not a target name"),
        ({"targets": ["x_auth"], "dryrun": True}, "unknown keys ['dryrun']"),
        ({"targets": ["x_auth"], "dry_run": "yes"}, "'dry_run' must be true or false"),
        ({"targets": ["x_auth"], "format": "2"}, "'format' must be a whole number from 1"),
        ({"targets": ["x_auth"], "format": 0}, "'format' must be a whole number from 1"),
        ({}, "no 'targets'"),
        (["x_auth"], "must be an object"),
        ({"targets": ["t"] * (MAX_TARGETS_PER_PASS + 1)}, f"at most {MAX_TARGETS_PER_PASS}"),
        # Hashed before their type was checked: a TypeError in the task, retried for ever.
        ({"targets": ["x_auth"], "patterns": [["x_auth"]]}, "'patterns' must list names"),
        ({"targets": ["x_auth"], "patterns": [{"a": 1}]}, "'patterns' must list names"),
        # A value sent by hand that may hold a password is not quoted.
        (
            {"targets": ["x_auth"], "databases": {"x_auth": "postgresql://app:s3cret@db/app"}},
            "got <44 characters not shown: may hold a password>",
        ),
        (
            {"targets": ["x_auth"], "postgresql://app:s3cret@db/app": 1},
            "has unknown keys <34 characters not shown: may hold a password>",
        ),
    ],
    ids=["not-a-list", "not-a-string", "not-a-name", "unknown-key", "bad-dry-run", "format-string",
         "format-zero", "no-targets",
         "not-an-object", "too-many", "patterns-of-lists", "patterns-of-objects",
         "databases-with-a-password", "key-with-a-password"],
)  # fmt: skip
async def test_bad_input_fails_the_pass_at_once_with_one_clear_error(
    harness: Harness,
    request_: Any,
    complaint: str,
) -> None:
    workflow_id = f"purge-{uuid.uuid4()}"
    async with harness.run_worker(builtins(harness.pool)):
        error = await failed_pass(harness.client, harness.task_queue, request_, workflow_id)

    assert error.type == "BadPurgeInput"
    assert complaint in error.message
    assert "\n" not in error.message
    assert "s3cret" not in error.message
    assert scheduled_targets(harness.client, await events(harness.client, workflow_id)) == []


@pytest.mark.waits
async def test_a_pass_of_a_later_release_s_format_waits_for_a_worker_of_that_release(
    harness: Harness,
) -> None:
    """Mid-deploy, a pass whose input a later release wrote (a key this release does not know,
    sent with `format` 2) reaches a worker of this release first: it fails the workflow task,
    not the pass, and deletes nothing; Temporal retries the task, and a worker of the later
    release that starts then runs the pass to the end. A typo (no format) still fails the pass
    at once (`test_bad_input_fails_the_pass_at_once_with_one_clear_error`)."""
    idempotency_rows(harness.db, {"old": harness.now_ms - HOUR, "new": harness.now_ms + HOUR})
    request = {"targets": ["x_idempotency"], "format": LATER_FORMAT, NEW_KEY: True}
    registry = builtins(harness.pool)
    workflow_id = f"purge-{uuid.uuid4()}"
    async with harness.run_worker(registry):
        handle = await harness.client.start_workflow(
            "Purge", request, id=workflow_id, task_queue=harness.task_queue
        )
        failed = await _first_task_failure(harness, workflow_id)
    assert failed.failure.message == (
        "input of format 2, from a later release (this worker reads format 1; keys new to it: "
        "['new_key']): left to a worker of that release"
    )
    assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
    assert keys(harness.db, "x_idempotency") == {"old", "new"}

    activities = PurgeActivities(TargetRegistry(registry))
    later = own_queue_worker(
        harness.client, harness.task_queue, activities, [LaterPurge, PurgeChunkWorkflow]
    )
    async with later:
        result = await handle.result()
    assert [(s["name"], s["status"], s["removed"]) for s in result["swept"]] == [
        ("x_idempotency", "ok", 1)
    ]
    assert keys(harness.db, "x_idempotency") == {"new"}


async def _first_task_failure(
    harness: Harness, workflow_id: str
) -> WorkflowTaskFailedEventAttributes:
    """The first failed workflow task of the run, once the server has it (within a minute);
    fails at once if the run ended instead."""
    for _ in range(600):
        for event in await events(harness.client, workflow_id):
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                return event.workflow_task_failed_event_attributes
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
                ended = event.workflow_execution_failed_event_attributes.failure.message
                raise AssertionError(f"the pass failed: {ended}")
        await asyncio.sleep(0.1)
    raise AssertionError(f"no workflow task of {workflow_id} failed within a minute")


@pytest.mark.parametrize("args", [[], [{"targets": ["x_auth"]}, {"targets": ["x_idempotency"]}]])
async def test_a_pass_started_with_no_input_or_two_fails_at_once(
    harness: Harness, args: list[Any]
) -> None:
    """`temporal workflow start --type Purge` with no --input, or two: the pass fails with one
    clear error, where a run method of one parameter failed its task (a TypeError) again and
    again until someone terminated it."""
    workflow_id = f"purge-{uuid.uuid4()}"
    async with harness.run_worker(builtins(harness.pool)):
        handle = await harness.client.start_workflow(
            "Purge",
            args=args,
            id=workflow_id,
            task_queue=harness.task_queue,
            execution_timeout=timedelta(seconds=FAIL_WITHIN_S),
        )
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()

    cause = failure.value.cause
    assert isinstance(cause, ApplicationError)
    assert cause.type == "BadPurgeInput"
    assert "takes one input, an object like" in cause.message
    assert cause.message.endswith(f"got {len(args)}")


async def test_one_log_line_when_rows_were_removed_and_none_otherwise(
    harness: Harness,
    caplog: pytest.LogCaptureFixture,
) -> None:
    seed_expired_and_live(harness.db, harness.now_ms)
    request = {"targets": ["x_idempotency", "x_auth"]}
    with caplog.at_level(logging.INFO, logger="temporalio.workflow"):
        async with harness.run_worker(builtins(harness.pool)):
            await run_pass(harness.client, harness.task_queue, request)
            first = [r.getMessage() for r in caplog.records if r.name == "temporalio.workflow"]
            caplog.clear()
            await run_pass(harness.client, harness.task_queue, request)  # nothing left to remove
            second = [r.getMessage() for r in caplog.records if r.name == "temporalio.workflow"]

    assert len(first) == 1
    assert first[0].startswith("purge pass removed 4 rows: x_idempotency=2, x_auth=2")
    assert second == []
