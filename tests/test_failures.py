"""A target that fails, fails alone: the pass sweeps the others and then fails with the partial
report. Configuration faults fail at once; transient ones get bounded retries."""

from __future__ import annotations

import uuid
from typing import Any

from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from activities import builtin_kinds as kinds
from activities.registry import TargetRegistry
from activities.results import PurgeReport
from purge_config.names import TableName
from purge_ops.connect import STACK_TRACE_KEPT
from purge_ops.runner import new_worker
from tests.conftest import Harness, RunWorker
from tests.support.history import events, first_failure, target_runs
from tests.support.passes import failed_pass
from tests.support.rows import HOUR, idempotency_rows, keys
from workflows.steps import TARGET_RETRY


async def test_unknown_and_broken_targets_fail_alone_and_the_others_are_swept(
    harness: Harness,
) -> None:
    idempotency_rows(harness.db, {"old": harness.now_ms - HOUR, "new": harness.now_ms + HOUR})
    harness.db.execute("CREATE TABLE typed (key text, expires_at text)")
    targets = [
        kinds.idempotency(harness.pool),
        kinds.expiring(harness.pool, "missing_table", TableName("no_such_table"), "expires_at"),
        kinds.expiring(harness.pool, "missing_column", TableName("x_idempotency"), "gone_at"),
        kinds.expiring(harness.pool, "text_column", TableName("typed"), "expires_at"),
        kinds.auth(harness.pool),
    ]
    order = ["missing_table", "x_idempotency", "nobody", "missing_column", "text_column", "x_auth"]
    workflow_id = f"purge-{uuid.uuid4()}"
    async with harness.run_worker(targets):
        error = await failed_pass(
            harness.client, harness.task_queue, {"targets": order}, workflow_id
        )

    assert error.type == "PurgeTargetsFailed"
    report = PurgeReport.from_json(error.details[0])
    assert [s.name for s in report.swept] == ["x_idempotency", "x_auth"]
    assert keys(harness.db, "x_idempotency") == {"new"}
    failed = {f.name: f for f in report.failed}
    assert list(failed) == ["missing_table", "nobody", "missing_column", "text_column"]
    assert failed["nobody"].type == "UnknownPurgeTarget"
    assert "it knows: missing_column, missing_table, text_column, x_auth, x_idempotency" in (
        failed["nobody"].message
    )
    assert failed["missing_table"].type == "BadPurgeTarget"
    assert "no_such_table does not exist" in failed["missing_table"].message
    assert failed["missing_column"].type == "BadPurgeTarget"
    assert "x_idempotency has no column 'gone_at'" in failed["missing_column"].message
    assert failed["text_column"].type == "BadPurgeTarget"
    assert "typed.expires_at is text" in failed["text_column"].message
    for name in failed:
        assert name in error.message
    # Configuration faults are not retried: each failed on its first attempt.
    runs = target_runs(harness.client, await events(harness.client, workflow_id))
    assert {name: runs[name].attempt for name in failed} == dict.fromkeys(failed, 1)


async def test_dry_run_of_a_target_without_count_expired_fails_that_target(
    harness: Harness,
) -> None:
    class DeleteOnly:
        name = "delete_only"

        async def purge_expired(self, now_ms: int) -> int:
            raise AssertionError("a dry run must not delete")

    async with harness.run_worker([DeleteOnly(), kinds.idempotency(harness.pool)]):
        error = await failed_pass(
            harness.client,
            harness.task_queue,
            {"targets": ["delete_only", "x_idempotency"], "dry_run": True},
            f"purge-{uuid.uuid4()}",
        )

    report = PurgeReport.from_json(error.details[0])
    assert [(f.name, f.type) for f in report.failed] == [("delete_only", "DryRunUnsupported")]
    assert [s.name for s in report.swept] == ["x_idempotency"]


async def test_a_target_returning_something_other_than_a_count_fails(
    client: Client, task_queue: str, run_worker: RunWorker
) -> None:
    class Sloppy:
        name = "sloppy"

        async def purge_expired(self, now_ms: int) -> Any:
            return "3 rows"

    async with run_worker([Sloppy()]):
        error = await failed_pass(
            client, task_queue, {"targets": ["sloppy"]}, f"purge-{uuid.uuid4()}"
        )

    [failure] = PurgeReport.from_json(error.details[0]).failed
    assert failure.type == "BadPurgeTarget"
    assert "'3 rows'" in failure.message


class Flaky:
    """Fails its first `failures` calls with an error Temporal retries, then succeeds."""

    def __init__(self, name: str, failures: int) -> None:
        self.name = name
        self.failures = failures
        self.calls = 0

    async def purge_expired(self, now_ms: int) -> int:
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError(f"{self.name}: server closed the connection (call {self.calls})")
        return 7


async def test_transient_failures_are_retried_and_bounded(
    time_skipping: WorkflowEnvironment, task_queue: str
) -> None:
    """A target that recovers within its attempts is swept; one that never does fails after
    exactly `maximum_attempts` and does not stop the target after it."""
    recovers = Flaky("recovers", failures=2)
    never = Flaky("never", failures=10**6)
    after = Flaky("after", failures=0)
    registry = TargetRegistry([recovers, never, after])
    client = time_skipping.client
    async with new_worker(client, registry, task_queue):
        error = await failed_pass(
            client,
            task_queue,
            {"targets": ["recovers", "never", "after"]},
            f"purge-{uuid.uuid4()}",
        )

    report = PurgeReport.from_json(error.details[0])
    assert [(s.name, s.removed) for s in report.swept] == [("recovers", 7), ("after", 7)]
    [failure] = report.failed
    assert failure.name == "never"
    assert "server closed the connection" in failure.message
    assert recovers.calls == 3
    assert never.calls == TARGET_RETRY.maximum_attempts == 5
    assert after.calls == 1


def _deep(n: int) -> None:
    # Two functions calling each other: Python folds a run of one repeated frame, not this.
    if n == 0:
        raise ConnectionError("deep: server closed the connection")
    _deeper(n - 1)


def _deeper(n: int) -> None:
    _deep(n)


class Deep:
    """Fails, with an error Temporal retries, from 80 frames down."""

    name = "deep"

    async def purge_expired(self, now_ms: int) -> int:
        _deep(80)
        return 0


async def test_a_retried_failure_raised_deep_in_a_stack_keeps_its_message_on_the_server(
    harness: Harness,
) -> None:
    """The server keeps a retrying activity's last failure only up to 4 KB, stack trace
    included, and past that shows "Failure exceeds size limit." instead of why it failed. A
    worker this package starts trims each stack trace to its innermost frames, even on a client
    connected without the package's converter (as this harness's is): the failure the server
    holds still names the error and where it was raised."""
    handle = await harness.client.start_workflow(
        "Purge",
        {"targets": ["deep"]},
        id=f"purge-{uuid.uuid4()}",
        task_queue=harness.task_queue,
    )
    async with harness.run_worker([Deep()]):
        failure = await first_failure(handle)
        await handle.terminate("the failure was read")

    assert failure.message == "deep: server closed the connection"
    assert len(failure.stack_trace) <= STACK_TRACE_KEPT + 4
    assert "_deep" in failure.stack_trace
