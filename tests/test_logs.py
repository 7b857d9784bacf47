"""The worker's log lines (`purge_ops.logs`): a target that failed with one of this package's own
errors is one line, as a target's result is (docs/operating.md#logs); any other error keeps its
traceback, which is what says where it came from."""

from __future__ import annotations

import io
import logging

import pytest

from activities.errors import BadPurgeTarget, UnknownPurgeTarget
from purge_ops.logs import handler


def logged(error: BaseException) -> str:
    """What the worker's handler writes for the SDK's warning about an activity that failed with
    `error` (the SDK logs it with exc_info, from inside its except block)."""
    stream = io.StringIO()
    logger = logging.getLogger(f"tests.logs.{id(error)}")
    logger.propagate = False
    logger.addHandler(handler(stream))
    try:
        raise error
    except BaseException:
        logger.warning(
            "Completing activity as failed",
            exc_info=True,
            extra={"temporal_activity": {"workflow_id": "purge-hourly-1", "attempt": 1}},
        )
    return stream.getvalue()


def test_a_target_refused_by_this_package_is_one_line_naming_the_error() -> None:
    for error in (
        UnknownPurgeTarget("no target named 'x' on this worker; it knows: y"),
        BadPurgeTarget("x_auth_failures: column expires_at_ms is missing"),
    ):
        text = logged(error)

        assert text.count("\n") == 1, text
        assert "Traceback" not in text
        assert f"Completing activity as failed: {error.type}: {error.message}" in text
        assert f"purge_error={error.type}" in text
        assert "workflow_id=purge-hourly-1" in text


def test_any_other_error_keeps_its_traceback() -> None:
    text = logged(ValueError("boom"))

    assert "Traceback" in text
    assert "ValueError: boom" in text


def test_a_log_call_whose_arguments_do_not_fit_its_format_does_not_raise(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The DETAIL filter reads each record's message: a format and arguments that do not match
    are said by logging, as without the filter, never raised into the code that logged."""
    stream = io.StringIO()
    logger = logging.getLogger("tests.logs.mismatch")
    logger.propagate = False
    logger.addHandler(handler(stream))

    logger.warning("%s and %s", "one")

    assert "Logging error" in capsys.readouterr().err
    assert stream.getvalue() == ""
