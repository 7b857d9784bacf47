"""Every error this package raises on purpose.

The Temporal ones carry their `type` (the class name) across the wire, so a caller that only sees
an `ApplicationError` can still tell them apart; the names are part of the design contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from temporalio.client import WorkflowFailureError
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    ApplicationErrorCategory,
    FailureError,
)


class PurgeError(ApplicationError):
    """A purge failure whose Temporal error type is the class name, never retried."""

    def __init__(self, message: str, *details: Any) -> None:
        super().__init__(message, *details, type=type(self).__name__, non_retryable=True)


class DuplicatePurgeTarget(PurgeError):
    """The same target name appears twice, in one pass or among a worker's targets."""


class UnknownPurgeTarget(PurgeError):
    """No target of this name is registered on the worker that ran the step."""


class BadPurgeTarget(PurgeError):
    """A target's table or column is missing, of the wrong type, or not ours to delete from."""


class DryRunUnsupported(PurgeError):
    """A dry run asked a target that has no `count_expired` to count."""


class BadPurgeInput(PurgeError):
    """A workflow input or activity step that does not have the documented shape."""


class NewerPurgeFormat(Exception):
    """A workflow input or activity step that says it is of a later release's format (`format`
    above `activities.input_checks.FORMAT`), whatever its keys. Not an `ApplicationError`, on
    purpose: in the workflow it fails the workflow task, which Temporal retries until a worker
    of that release takes it; in an activity it is a retried failure (of `TARGET_RETRY`'s
    attempts)."""


class WorkerStopping(ApplicationError):
    """A sweep that ended after its batch because its worker began to stop (a deploy's
    SIGTERM): retried by the target's retry policy, on another worker, from where it stopped.
    Benign: the SDK logs it at DEBUG, so a worker at INFO says nothing of it at every deploy."""

    def __init__(self, message: str) -> None:
        super().__init__(
            message,
            type=type(self).__name__,
            non_retryable=False,
            category=ApplicationErrorCategory.BENIGN,
        )


class PurgeGuardRefused(PurgeError):
    """A target's guard (max_rows, max_fraction, max_clock_jump) refused its sweep."""


class TargetFactoryFailed(PurgeError):
    """A `python` target's factory raised, or returned what is not a target, while a step
    looked for a name no other target gives: named, as the factory's own error does not say
    where it came from. Not retried: a factory's error (a setting its module reads, missing)
    comes back the same a second later, and the next pass asks it again."""


class PurgeTargetsFailed(PurgeError):
    """One or more targets failed; the others were swept and the partial report is attached."""


@dataclass(frozen=True)
class Failure:
    """What a failed activity or workflow failed with, as a report names it."""

    type: str
    """The Temporal error type (`BadPurgeTarget`), or the class of a timeout or cancellation."""
    message: str
    details: tuple[Any, ...] = ()


def failure_of(err: FailureError | WorkflowFailureError) -> Failure:
    """Unpack the cause of an activity's failure (in the workflow) or a workflow's (in a
    client): an ApplicationError keeps its type and details; a timeout or a cancellation is
    named by its class. A local activity's failure is not wrapped: it is its own cause."""
    wrapped = isinstance(err, ActivityError | WorkflowFailureError)
    cause = err.cause if wrapped else err
    if isinstance(cause, ApplicationError) and cause.type:
        return Failure(cause.type, cause.message, tuple(cause.details))
    if isinstance(cause, FailureError):
        return Failure(type(cause).__name__, cause.message)
    return Failure(type(err).__name__, getattr(err, "message", str(err)))
