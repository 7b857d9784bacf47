"""What a worker of another release sends, read by this one (`activities.wire`): a result
leniently, an input strictly and by its format."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from activities.errors import NewerPurgeFormat
from activities.results import PurgeSweep
from activities.spread_steps import ChunkInput, ChunkReport, RankedSweep
from activities.wire import read, read_input


def test_a_result_of_this_release_reads_back_as_it_was_sent() -> None:
    sweep = PurgeSweep(name="t", removed=4, batches=2, dead_tuple_share=None, status="busy")
    report = ChunkReport(targets=1, removed=4, statuses={"busy": 1})
    report.largest.append(RankedSweep(position=0, sweep=sweep))

    assert read(PurgeSweep, asdict(sweep)) == sweep
    assert read(ChunkReport, asdict(report)) == report


def test_a_later_releases_status_is_kept_and_an_unreadable_figure_takes_its_default() -> None:
    sent = {"name": "t", "removed": 4, "status": "deferred", "batches": "4", "seen": [1]}

    sweep = read(PurgeSweep, sent)

    assert (sweep.name, sweep.removed, sweep.status, sweep.batches) == ("t", 4, "deferred", 0)
    nested = read(
        ChunkReport, {"statuses": {"deferred": 2}, "largest": [{"position": 1, "sweep": sent}]}
    )
    assert nested.statuses == {"deferred": 2}
    assert nested.largest[0].sweep.status == "deferred"


def test_a_result_without_a_field_it_cannot_do_without_is_refused() -> None:
    with pytest.raises(TypeError, match="PurgeSweep"):
        read(PurgeSweep, {"name": "t"})
    with pytest.raises(TypeError, match="PurgeSweep"):
        read(PurgeSweep, {"name": "t", "removed": "four"})


def test_an_input_is_read_strictly_and_a_later_format_is_left_to_its_release() -> None:
    sent = {"targets": ["t"], "now_ms": 1, "deadline_ms": 2, "budget_ms": 1}

    assert read_input(ChunkInput, {**sent, "format": 1}) == ChunkInput(
        targets=["t"], now_ms=1, deadline_ms=2, budget_ms=1
    )
    with pytest.raises(TypeError):
        read_input(ChunkInput, {**sent, "concurrency": "two"})  # never its default instead
    with pytest.raises(NewerPurgeFormat, match="ChunkInput of format 2"):
        read_input(ChunkInput, {**sent, "format": 2, "concurrency": "two"})
