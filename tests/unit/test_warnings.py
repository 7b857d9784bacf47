"""The suite's warning filters (pyproject.toml): every warning an error, but for the one the
SDK's activity worker gives inside its poll loop, where an error fails the whole worker."""

from __future__ import annotations

import warnings

import pytest


def test_the_sdk_s_warning_of_a_cancel_for_a_gone_local_activity_is_not_an_error() -> None:
    """temporalio/worker/_activity.py warns so when core cancels a local activity of a run it
    evicted (a workflow task timed out on a loaded machine) after the activity completed.
    Warned as the SDK does, under the suite's own filters (not `pytest.warns`, which lets every
    warning through): an error here would be one in the worker's poll loop."""
    warnings.warn(
        "Cannot find activity to cancel for token b'local_act_\\x11'", UserWarning, stacklevel=1
    )


def test_any_other_warning_is_still_an_error() -> None:
    with pytest.raises(UserWarning):
        warnings.warn("Cannot find the thing", UserWarning, stacklevel=1)
