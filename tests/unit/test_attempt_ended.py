"""How a failed target's report says its begun attempt ended (`workflows.steps.began_before`),
from the failure Temporal hands the workflow with a retry's schedule-to-start timeout: a worker
that stopped is not said to have died, and a failure of the attempt's own is not blamed on its
worker."""

from __future__ import annotations

import pytest
from temporalio.exceptions import (
    ApplicationError,
    CancelledError,
    FailureError,
    TimeoutError,
    TimeoutType,
)

from activities.errors import WorkerStopping
from workflows.steps import began_before

HEARTBEAT = [{"removed": 700, "batches": 2}]


@pytest.mark.parametrize(
    ("ended", "said"),
    [
        (
            WorkerStopping("its worker is stopping"),
            "an attempt began on a worker that then stopped",
        ),
        (CancelledError("Worker shutting down"), "an attempt began on a worker that then stopped"),
        (
            TimeoutError("heartbeat", type=TimeoutType.HEARTBEAT, last_heartbeat_details=[]),
            "an attempt began on a worker that then stopped or died",
        ),
        (None, "an attempt began on a worker that then stopped or died"),
        # The SDK's own failure of a task its stopping worker polled and could not run (no
        # application's failure: the converter makes it a plain FailureError).
        (
            FailureError("Worker shutting down"),
            "an attempt began on a worker that then stopped or died",
        ),
        (
            ApplicationError("canceling statement due to lock timeout", type="LockNotAvailable"),
            "an attempt failed (LockNotAvailable: canceling statement due to lock timeout)",
        ),
        (
            ApplicationError("the connection was lost"),
            "an attempt failed (ApplicationError: the connection was lost)",
        ),
    ],
    ids=[
        "stopping",
        "shutdown-cancel",
        "heartbeat-lost",
        "unknown",
        "sdk-shutdown",
        "lock-timeout",
        "untyped",
    ],
)
def test_a_begun_attempt_is_said_to_have_ended_as_it_did(
    ended: BaseException | None, said: str
) -> None:
    assert began_before(HEARTBEAT, ended) == (
        f"{said}, having removed at least 700 rows (its last heartbeat)"
    )
    assert began_before([{"removed": 0}], ended) == (
        f"{said}, before its heartbeats had reported removing any rows"
    )


def test_no_heartbeat_is_no_attempt_begun_and_a_long_failure_is_cut() -> None:
    assert began_before([], WorkerStopping("x")) == ""
    long = began_before(HEARTBEAT, ApplicationError("x" * 500, type="QueryCanceled"))
    assert long.startswith("an attempt failed (QueryCanceled: " + "x" * 199 + "…), having")
