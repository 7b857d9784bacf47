"""`sweep` starts a pass of its own where the config's schedule would start another: it says
which of the reasons docs/operating.md#sweep gives is this one's."""

from __future__ import annotations

from typing import Any

import pytest

from purge_ops.passes import _another_pass

SCHEDULED = {"targets": ["a", "b"], "max_concurrent": 4, "budget_ms": 3_000_000}


@pytest.mark.parametrize(
    ("scheduled", "request_", "why"),
    [
        (SCHEDULED, {**SCHEDULED, "dry_run": True}, "this is a dry run"),
        (SCHEDULED, {**SCHEDULED, "targets": ["a"]}, "this pass sweeps some of its targets"),
        (SCHEDULED, {**SCHEDULED, "targets": ["a", "c"]}, "its targets are not the config's"),
        (SCHEDULED, {**SCHEDULED, "budget_ms": 600_000}, "its input differs from the config's"),
        (None, SCHEDULED, "does not start a Purge pass of one input"),
    ],
    ids=["dry-run", "some-targets", "other-targets", "other-limits", "no-input"],
)
def test_the_reason_is_the_one_that_holds(
    scheduled: object, request_: dict[str, Any], why: str
) -> None:
    assert why in _another_pass(scheduled, request_)
