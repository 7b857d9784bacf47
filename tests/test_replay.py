"""Every committed history replays against the current workflow code.

A history is a shipped workflow shape: if a change to `workflows/purge.py` makes one of these fail,
the change must go behind `workflow.patched()` instead. Regenerate nothing to make this pass:
add new histories (`python -m tests.histories.record --prefix vN`, N one above the highest prefix in
`tests/histories/`: docs/workflow.md) beside the old ones.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowHistory
from temporalio.converter import DataConverter
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from tests.histories import record
from tests.support.history import kinds, local_sweeps
from tests.support.old_workflows import PurgeWithoutDuplicateCheck
from workflows.chunk import PurgeChunkWorkflow
from workflows.purge import PurgeWorkflow

#: Every workflow type a pass runs: the pass and, since the spread-pass patch, its children.
WORKFLOWS = [PurgeWorkflow, PurgeChunkWorkflow]

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))
CONVERTER = DataConverter.default.payload_converter


def load(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(path.stem, path.read_text(encoding="utf-8"))


@dataclass(frozen=True)
class Shape:
    """What a committed history holds, read from its events."""

    request: dict[str, Any]
    """The pass's input."""
    events: list[str]
    """Event type names, oldest first."""
    scheduled: list[str]
    """The target of each ActivityTaskScheduled, in order."""
    activity_failures: list[str]
    """The error type of each ActivityTaskFailed."""
    result: dict[str, Any] | None
    """The report, if the pass completed."""
    failure: str | None
    """The error type the pass failed with, if it failed."""
    activity_types: list[str]
    """The activity type of each ActivityTaskScheduled, in order."""
    activity_queues: list[str]
    """The task queue of each ActivityTaskScheduled, in order."""
    workflow_type: str
    child_queues: list[str] = field(default_factory=list)
    """The task queue each child was started on, in order."""
    child_inputs: list[dict[str, Any]] = field(default_factory=list)
    """The input of each child, in the order they were started."""
    local_sweeps: list[str] = field(default_factory=list)
    """The target of each sweep run as a local activity, in the order recorded."""


def shape_of(path: Path) -> Shape:
    events = list(load(path).events)
    [request] = CONVERTER.from_payloads(
        events[0].workflow_execution_started_event_attributes.input.payloads
    )
    scheduled, activity_types, activity_queues, activity_failures = [], [], [], []
    children = [
        e.start_child_workflow_execution_initiated_event_attributes
        for e in events
        if e.HasField("start_child_workflow_execution_initiated_event_attributes")
    ]
    child_queues = [child.task_queue.name for child in children]
    child_inputs = [CONVERTER.from_payloads(child.input.payloads)[0] for child in children]
    result, failure = None, None
    for e in events:
        if e.HasField("activity_task_scheduled_event_attributes"):
            attrs = e.activity_task_scheduled_event_attributes
            [step] = CONVERTER.from_payloads(attrs.input.payloads)
            scheduled.append(step["name"])
            activity_types.append(attrs.activity_type.name)
            activity_queues.append(attrs.task_queue.name)
        elif e.HasField("activity_task_failed_event_attributes"):
            cause = e.activity_task_failed_event_attributes.failure
            activity_failures.append(cause.application_failure_info.type)
        elif e.HasField("workflow_execution_completed_event_attributes"):
            attrs = e.workflow_execution_completed_event_attributes
            [result] = CONVERTER.from_payloads(attrs.result.payloads)
        elif e.HasField("workflow_execution_failed_event_attributes"):
            failure = (
                e.workflow_execution_failed_event_attributes.failure.application_failure_info.type
            )
    workflow_type = events[0].workflow_execution_started_event_attributes.workflow_type.name
    return Shape(
        request,
        kinds(events),
        scheduled,
        activity_failures,
        result,
        failure,
        activity_types,
        activity_queues,
        workflow_type,
        child_queues,
        child_inputs,
        local_sweeps(events),
    )


def is_pass(shape: Shape) -> None:
    """A completed pass that removed rows: one activity per target, in order."""
    assert shape.failure is None
    assert shape.result is not None
    assert not shape.request.get("dry_run")
    assert shape.scheduled == shape.request["targets"] != []
    assert shape.result["removed"] > 0
    assert [s["name"] for s in shape.result["swept"]] == shape.request["targets"]


def is_dry_run(shape: Shape) -> None:
    """A completed dry run: asked for one, reported as one, one activity per target."""
    assert shape.request["dry_run"] is True
    assert shape.failure is None
    assert shape.result is not None
    assert shape.result["dry_run"] is True
    assert shape.scheduled == shape.request["targets"] != []
    assert all(s["dry_run"] for s in shape.result["swept"])


def is_duplicate(shape: Shape) -> None:
    """A pass refused for a repeated target before any activity."""
    names = shape.request["targets"]
    assert len(set(names)) < len(names)
    assert "ACTIVITY_TASK_SCHEDULED" not in shape.events
    assert shape.failure == "DuplicatePurgeTarget"


def is_failed_target(shape: Shape) -> None:
    """A pass with a failed activity: the others still swept, the pass failed for it."""
    assert shape.scheduled == shape.request["targets"]
    assert shape.activity_failures != []
    assert (
        shape.events.count("ACTIVITY_TASK_COMPLETED")
        == len(shape.scheduled) - len(shape.activity_failures)
        > 0
    )
    assert shape.failure == "PurgeTargetsFailed"


def is_empty(shape: Shape) -> None:
    """A pass of no targets: nothing scheduled, an empty report."""
    assert shape.request["targets"] == []
    assert shape.scheduled == []
    assert shape.result is not None
    assert (shape.result["swept"], shape.result["removed"]) == ([], 0)


def is_concurrent(shape: Shape) -> None:
    """A pass with limits: the concurrent-pass patch's marker, activities overlapping (a second
    scheduled before the first completed), every target swept, reported in input order."""
    assert shape.request["max_concurrent"] > 1
    assert "MARKER_RECORDED" in shape.events
    first_done = shape.events.index("ACTIVITY_TASK_COMPLETED")
    assert shape.events[:first_done].count("ACTIVITY_TASK_SCHEDULED") >= 2
    assert shape.result is not None
    assert [s["name"] for s in shape.result["swept"]] == shape.request["targets"]
    assert all(s["status"] == "ok" for s in shape.result["swept"])


def is_out_of_budget(shape: Shape) -> None:
    """A pass whose budget its first target spent: the others reported skipped, unscheduled,
    and the pass completed."""
    assert "MARKER_RECORDED" in shape.events
    assert shape.result is not None
    statuses = [s["status"] for s in shape.result["swept"]]
    assert statuses[0] == "ok"
    assert statuses[1:] == ["skipped"] * (len(statuses) - 1) != []
    assert shape.scheduled == shape.request["targets"][:1]
    assert shape.failure is None


def is_spread(shape: Shape) -> None:
    """A pass spread over children: the spread-pass marker, the pattern expanded by an
    activity, every sweep in a child (two here), a compact report counting every target."""
    assert shape.workflow_type == "Purge"
    assert shape.request["patterns"]
    assert "MARKER_RECORDED" in shape.events
    assert shape.activity_types == ["expand_pattern"] * len(shape.request["patterns"])
    assert shape.events.count("START_CHILD_WORKFLOW_EXECUTION_INITIATED") >= 2
    assert shape.events.count("CHILD_WORKFLOW_EXECUTION_COMPLETED") >= 2
    assert shape.result is not None
    assert shape.result["compact"] is True
    assert shape.result["targets"] > len(shape.request["targets"])
    assert shape.result["removed"] > 0


def is_spread_routed(shape: Shape) -> None:
    """A spread pass whose pattern's database has a queue of its own, whose worker said it runs
    children: the pattern expanded there, and that database's child started on that queue (the
    chunk-on-database-queue marker), the other database's on the pass's own."""
    is_spread(shape)
    routed = shape.request["queues"][shape.request["databases"]["sessions"]]
    assert shape.activity_queues == [routed]
    assert routed in shape.child_queues
    assert any(queue != routed for queue in shape.child_queues)
    assert shape.events.count("MARKER_RECORDED") >= 2


def is_spread_small(shape: Shape) -> None:
    """A spread pass at the default limits whose pattern's matches the catalog showed small:
    the listed target in a child of its own sweeping one at a time, the matches in one
    sweeping `max_concurrent` at once (the small-tables-together marker)."""
    is_spread(shape)
    assert shape.events.count("MARKER_RECORDED") >= 2
    first, small = shape.child_inputs
    assert (first["targets"], first["concurrency"]) == (["x_idempotency"], 1)
    assert small["concurrency"] == shape.request["max_concurrent"] > 1
    assert all(name.startswith("sessions@") for name in small["targets"])


def is_chunk(shape: Shape) -> None:
    """A child's run that swept its share and continued as new with the rest."""
    assert shape.workflow_type == "PurgeChunk"
    assert shape.activity_types == ["purge_target"] * shape.request["run_size"]
    assert shape.scheduled == shape.request["targets"][: shape.request["run_size"]]
    assert shape.events[-1] == "WORKFLOW_EXECUTION_CONTINUED_AS_NEW"


def is_spread_local(shape: Shape) -> None:
    """A spread pass at the default limits whose pattern's database has a queue of its own:
    the small matches' child on that queue, its input saying `local`; the listed target's on
    the pass's own."""
    is_spread_small(shape)
    routed = shape.request["queues"][shape.request["databases"]["sessions"]]
    first, small = shape.child_inputs
    assert shape.child_queues == ["purge", routed]
    assert (first["local"], small["local"]) == (False, True)


def is_chunk_local(shape: Shape) -> None:
    """The small matches' child of that pass: the small-tables-local marker, then each match
    swept once as a local activity (no activity task), and completed."""
    assert shape.workflow_type == "PurgeChunk"
    assert shape.request["local"] is True
    assert shape.events[4] == "MARKER_RECORDED"  # the patch, at the first workflow task
    assert "ACTIVITY_TASK_SCHEDULED" not in shape.events
    assert sorted(shape.local_sweeps) == sorted(shape.request["targets"]) != []
    assert shape.events[-1] == "WORKFLOW_EXECUTION_COMPLETED"


def is_spread_duplicate(shape: Shape) -> None:
    """A spread pass refused after its expansion, a match repeating a listed name: nothing
    swept, no child started."""
    assert shape.activity_types == ["expand_pattern"]
    assert "START_CHILD_WORKFLOW_EXECUTION_INITIATED" not in shape.events
    assert shape.failure == "DuplicatePurgeTarget"


def is_routed(shape: Shape) -> None:
    """A pass with a routed database: its target's activity on that database's task queue,
    the other on the pass's own queue."""
    queues = shape.request["queues"]
    databases = shape.request["databases"]
    expected = [queues.get(databases.get(name, ""), "purge") for name in shape.scheduled]
    assert shape.activity_queues == expected != ["purge"] * len(expected)
    assert shape.failure is None
    assert shape.result is not None
    assert [s["name"] for s in shape.result["swept"]] == shape.request["targets"]


def is_searchable(shape: Shape) -> None:
    """A pass started with its search attributes: the searchable-pass marker, then the upsert
    of its outcome (after every target, before it fails for the one that failed)."""
    assert "MARKER_RECORDED" in shape.events
    upsert = shape.events.index("UPSERT_WORKFLOW_SEARCH_ATTRIBUTES")
    assert shape.events[:upsert].count("ACTIVITY_TASK_SCHEDULED") == len(shape.request["targets"])
    assert shape.activity_failures != []
    assert shape.failure == "PurgeTargetsFailed"


def is_unpolled(shape: Shape) -> None:
    """A pass whose routed queue no worker polls: one activity there, failed by its
    schedule-to-start timeout; the marker; the queue's other targets failed without one."""
    assert "MARKER_RECORDED" in shape.events
    assert shape.activity_queues == ["purge-nowhere", "purge"]
    assert shape.failure == "PurgeTargetsFailed"


def is_busy_resent(shape: Shape) -> None:
    """A pass of two targets at once on a queue whose one worker runs one sweep at a time: the
    second target's activity timed out unstarted behind the first (held on a row), then, once
    the first completed, was sent again, behind the marker, and taken: the pass completes."""
    assert shape.events.count("ACTIVITY_TASK_TIMED_OUT") == 1
    assert shape.events.count("ACTIVITY_TASK_STARTED") == 2  # the timed-out one never started
    resent = len(shape.events) - 1 - shape.events[::-1].index("ACTIVITY_TASK_SCHEDULED")
    assert shape.events.index("ACTIVITY_TASK_COMPLETED") < resent  # after the first completed
    assert shape.events.count("MARKER_RECORDED") == 2  # the concurrent pass's, the resend's
    [again] = [name for name in set(shape.scheduled) if shape.scheduled.count(name) == 2]
    assert shape.scheduled == [*sorted(set(shape.scheduled)), again]
    assert shape.failure is None
    assert shape.result is not None
    assert shape.result["failed"] == []


def is_spread_unpolled(shape: Shape) -> None:
    """A spread pass whose pattern's routed queue no worker polls: the expansion there failed
    by its schedule-to-start timeout; the marker; the plain target on that queue failed with
    no child of its own, so one child, for the target on the pass's own queue."""
    assert shape.workflow_type == "Purge"
    assert shape.request["patterns"]
    assert shape.activity_queues == ["purge-nowhere"]
    assert "MARKER_RECORDED" in shape.events
    assert shape.events.count("START_CHILD_WORKFLOW_EXECUTION_INITIATED") == 1
    assert [child["targets"] for child in shape.child_inputs] == [["x_idempotency"]]
    assert shape.failure == "PurgeTargetsFailed"


def is_cancelled(shape: Shape) -> None:
    """A sequential pass cancelled while its first target's activity waited on a queue no
    worker polls: the cancel-ends-pass marker, no other target scheduled, ended cancelled."""
    assert shape.workflow_type == "Purge"
    assert shape.activity_queues == ["purge-nowhere"]
    assert shape.scheduled == shape.request["targets"][:1]
    assert "WORKFLOW_EXECUTION_CANCEL_REQUESTED" in shape.events
    assert "MARKER_RECORDED" in shape.events
    assert shape.events[-1] == "WORKFLOW_EXECUTION_CANCELED"


def is_spread_cancelled(shape: Shape) -> None:
    """A spread pass cancelled while its pattern's expansion waited on a queue no worker
    polls: the marker, no child started, ended cancelled."""
    assert shape.request["patterns"]
    assert shape.activity_types == ["expand_pattern"]
    assert "START_CHILD_WORKFLOW_EXECUTION_INITIATED" not in shape.events
    assert "MARKER_RECORDED" in shape.events
    assert shape.events[-1] == "WORKFLOW_EXECUTION_CANCELED"


def is_spread_child_cancelled(shape: Shape) -> None:
    """A spread pass cancelled while its one child's routed activity waited on a queue no
    worker polls: its pattern expanded, that child started, then the pass ended cancelled with
    no child completed and none started after it."""
    assert shape.workflow_type == "Purge"
    assert shape.activity_types == ["expand_pattern"]
    assert [child["targets"] for child in shape.child_inputs] == [["x_auth@eu"]]
    assert shape.child_inputs[0]["route"]["queue"] == "purge-nowhere"
    assert "WORKFLOW_EXECUTION_CANCEL_REQUESTED" in shape.events
    assert "CHILD_WORKFLOW_EXECUTION_COMPLETED" not in shape.events
    assert shape.events[-1] == "WORKFLOW_EXECUTION_CANCELED"


def is_spread_child_unpolled(shape: Shape) -> None:
    """A spread pass started with its search attributes whose routed database's child found
    no worker on its queue: that child completed with its targets failed, the pattern's child
    after it, the outcome upserted, and the pass failed for the routed targets."""
    assert shape.workflow_type == "Purge"
    routed = [child["targets"] for child in shape.child_inputs if child["route"]]
    assert routed == [["x_auth@eu", "x_idempotency@eu"]]
    assert shape.events.count("CHILD_WORKFLOW_EXECUTION_COMPLETED") == 2
    assert "UPSERT_WORKFLOW_SEARCH_ATTRIBUTES" in shape.events
    assert shape.failure == "PurgeTargetsFailed"


def is_chunk_unpolled(shape: Shape) -> None:
    """That pass's routed child: its first target's activity timed out unstarted (no worker
    took one of its queue's since: the busy-queue-resent marker), its second failed with no
    activity (the unpolled-queue-once marker); the child completed, reporting both failed."""
    assert shape.workflow_type == "PurgeChunk"
    assert shape.activity_queues == ["purge-nowhere"]
    assert shape.scheduled == shape.request["targets"][:1]
    assert shape.events.count("ACTIVITY_TASK_TIMED_OUT") == 1
    assert shape.events.count("MARKER_RECORDED") == 2
    assert shape.result is not None
    assert shape.result["failed_total"] == len(shape.request["targets"]) == 2
    assert {f["failure"]["type"] for f in shape.result["failures"]} == {"NoPurgeWorker"}
    assert shape.events[-1] == "WORKFLOW_EXECUTION_COMPLETED"


def is_spread_searchable(shape: Shape) -> None:
    """A spread pass started with its search attributes, one listed target failing in its
    child: the outcome upserted after the child completed, then the pass failed."""
    assert shape.workflow_type == "Purge"
    assert shape.request["patterns"]
    [child] = shape.child_inputs
    assert "no_such_target" in child["targets"]
    completed = shape.events.index("CHILD_WORKFLOW_EXECUTION_COMPLETED")
    assert "UPSERT_WORKFLOW_SEARCH_ATTRIBUTES" in shape.events[completed:]
    assert shape.failure == "PurgeTargetsFailed"


def is_begun_held(shape: Shape) -> None:
    """A pass of three targets, two at once, on a queue whose one worker began the first two
    and stopped: the first's retry timed out unstarted while the second was out, so it was held
    (behind the begun-retry-held marker), not failed with its queue: the third was sent after
    it, and once a worker took one of the queue's sweeps the first failed alone."""
    assert shape.events.count("ACTIVITY_TASK_TIMED_OUT") == 1
    assert shape.scheduled == shape.request["targets"] == ["t1", "t2", "t3"]
    assert shape.events.count("ACTIVITY_TASK_COMPLETED") == 2
    assert shape.events.count("MARKER_RECORDED") == 2  # the concurrent pass's, the hold's
    timed_out = shape.events.index("ACTIVITY_TASK_TIMED_OUT")
    third = len(shape.events) - 1 - shape.events[::-1].index("ACTIVITY_TASK_SCHEDULED")
    assert timed_out < third  # sent after the first's timeout: its queue not failed
    assert shape.failure == "PurgeTargetsFailed"


SHAPES: dict[str, Callable[[Shape], None]] = {
    "begun-held": is_begun_held,
    "spread-child-cancelled": is_spread_child_cancelled,
    "spread-child-unpolled": is_spread_child_unpolled,
    "chunk-unpolled": is_chunk_unpolled,
    "spread-searchable": is_spread_searchable,
    "busy-resent": is_busy_resent,
    "cancelled": is_cancelled,
    "spread-cancelled": is_spread_cancelled,
    "spread-unpolled": is_spread_unpolled,
    "unpolled": is_unpolled,
    "searchable": is_searchable,
    "routed": is_routed,
    "spread": is_spread,
    "spread-routed": is_spread_routed,
    "spread-small": is_spread_small,
    "chunk": is_chunk,
    "spread-local": is_spread_local,
    "chunk-local": is_chunk_local,
    "spread-duplicate": is_spread_duplicate,
    "concurrent": is_concurrent,
    "out-of-budget": is_out_of_budget,
    "pass": is_pass,
    "dry-run": is_dry_run,
    "duplicate": is_duplicate,
    "failed-target": is_failed_target,
    "empty": is_empty,
}


async def test_the_shipped_shapes_are_all_here() -> None:
    """Every shape the contract names is committed, each history is the shape its name says
    (`<prefix>-<shape>.json`), and each replays against the current code."""
    by_shape: dict[str, list[Path]] = {}
    for path in HISTORIES:
        by_shape.setdefault(path.stem.split("-", 1)[1], []).append(path)
    assert set(by_shape) == set(SHAPES), "a history of no known shape, or a shape not committed"
    for shape, paths in by_shape.items():
        for path in paths:
            try:
                SHAPES[shape](shape_of(path))
            except AssertionError as err:
                raise AssertionError(f"{path.name} is not a {shape} history: {err}") from err
            await Replayer(workflows=WORKFLOWS).replay_workflow(
                load(path), raise_on_replay_failure=True
            )


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_committed_history_replays_against_current_code(path: Path) -> None:
    result = await Replayer(workflows=WORKFLOWS).replay_workflow(
        load(path), raise_on_replay_failure=True
    )
    assert result.replay_failure is None


async def test_replay_catches_a_changed_shape() -> None:
    """The check above can fail: a shape change after shipping does not replay.

    (Reordering targets alone would replay: every step is the same activity type and replay
    does not compare arguments, which is why the target order is fixed by the input.)
    """
    [history] = [p for p in HISTORIES if p.stem == "v1-duplicate"]
    with pytest.raises(NondeterminismError):
        await Replayer(workflows=[PurgeWithoutDuplicateCheck]).replay_workflow(load(history))


def test_recording_a_prefix_that_has_histories_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m tests.histories.record --prefix v3` would write over the histories that prove
    old passes replay: it is refused in one line before anything records, for every prefix that
    has files. (Recording is replaced by a failure here, so a missing check cannot overwrite.)"""

    async def records(prefix: str) -> None:
        raise AssertionError(f"{prefix} would have been recorded again")

    shipped = [prefix for prefix in record.SCENARIOS if record.recorded(prefix)]
    assert shipped == list(record.SCENARIOS), "every prefix record knows has shipped"
    monkeypatch.setattr(record, "record", records)
    monkeypatch.setattr(sys, "argv", ["record", "--prefix", "v3"])
    with pytest.raises(SystemExit) as refused:
        record.main()

    assert refused.value.code == 2
    said = capsys.readouterr().err
    assert said.startswith("record: v3 has histories already (v3-"), said
    assert len(said.strip().splitlines()) == 1
