"""purge_ops.connect's failure converter without a server: a failure's message and type as the
default converter makes them, its stack traces cut short enough for the server to keep it."""

from __future__ import annotations

from temporalio.api.failure.v1 import Failure
from temporalio.converter import DataConverter
from temporalio.exceptions import ApplicationError

from purge_ops.connect import DATA_CONVERTER, STACK_TRACE_KEPT


def deep(n: int) -> None:
    # Two functions calling each other: Python folds a run of one repeated frame, not this.
    if n == 0:
        try:
            raise OSError("the connection was lost")
        except OSError as err:
            raise ApplicationError("batch failed: lock timeout", type="LockNotAvailable") from err
    deeper(n - 1)


def deeper(n: int) -> None:
    deep(n)


def failure_of(converter: DataConverter) -> Failure:
    try:
        deep(60)
    except ApplicationError as err:
        failure = Failure()
        converter.failure_converter.to_failure(err, converter.payload_converter, failure)
        return failure
    raise AssertionError("deep() did not raise")


def test_a_deep_stack_is_cut_to_its_innermost_frames_and_the_message_kept() -> None:
    default, trimmed = failure_of(DataConverter.default), failure_of(DATA_CONVERTER)

    assert len(default.stack_trace) > 4 * 1024  # what the server would refuse to keep whole
    assert trimmed.message == default.message == "batch failed: lock timeout"
    assert trimmed.application_failure_info.type == "LockNotAvailable"
    assert len(trimmed.stack_trace) <= STACK_TRACE_KEPT + 4
    assert trimmed.stack_trace.startswith("...\n")
    assert default.stack_trace.endswith(trimmed.stack_trace[4:])  # the raising frames stay
    assert trimmed.cause.message == "the connection was lost"
    assert len(trimmed.cause.stack_trace) <= STACK_TRACE_KEPT + 4
