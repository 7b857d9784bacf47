"""Every committed history replays against the current workflow code.

A history is a shipped workflow shape: if a change to `workflows/purge.py` makes one of these fail,
the change must go behind `workflow.patched()` instead. Regenerate nothing to make this pass:
add new histories (`python -m tests.histories.record --prefix v2`) beside the old ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from tests.support.old_workflows import PurgeWithoutDuplicateCheck
from workflows.purge import PurgeWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def load(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(path.stem, path.read_text(encoding="utf-8"))


def test_the_shipped_shapes_are_all_here() -> None:
    """The three shapes the contract names, at least: a pass, a duplicate, a failed target."""
    names = {path.stem.split("-", 1)[1] for path in HISTORIES}
    assert {"pass", "duplicate", "failed-target"} <= names


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_committed_history_replays_against_current_code(path: Path) -> None:
    result = await Replayer(workflows=[PurgeWorkflow]).replay_workflow(
        load(path), raise_on_replay_failure=True
    )
    assert result.replay_failure is None


async def test_replay_catches_a_changed_shape() -> None:
    """The check above can fail: a shape change after shipping does not replay.

    (Reordering targets alone would replay: every step is the same activity type and replay
    does not compare arguments, which is why the target order is fixed by the input.)
    """
    [history] = [p for p in HISTORIES if p.stem.endswith("-duplicate")]
    with pytest.raises(NondeterminismError):
        await Replayer(workflows=[PurgeWithoutDuplicateCheck]).replay_workflow(load(history))
