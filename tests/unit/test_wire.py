"""What a worker of another release sends, read by this one (`activities.wire`): a result
leniently, an input strictly and by its format."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
from dataclasses import asdict

import pytest

from activities import wire
from activities.errors import NewerPurgeFormat
from activities.results import PurgeSweep
from activities.spread_steps import ChunkInput, ChunkReport, RankedSweep
from activities.wire import read, read_chunk


def test_a_result_of_this_release_reads_back_as_it_was_sent() -> None:
    sweep = PurgeSweep(name="t", removed=4, batches=2, dead_tuple_share=None, status="busy")
    report = ChunkReport(targets=1, removed=4, statuses={"busy": 1})
    report.largest.append(RankedSweep(position=0, sweep=sweep))

    assert read(PurgeSweep, asdict(sweep)) == sweep
    assert read(ChunkReport, asdict(report)) == report


def test_a_later_releases_status_is_kept_and_an_unknown_measurement_takes_its_default() -> None:
    sent = {"name": "t", "removed": 4, "status": "deferred", "p95_batch_ms": None, "seen": [1]}

    sweep = read(PurgeSweep, sent)

    assert (sweep.name, sweep.removed, sweep.status, sweep.p95_batch_ms) == ("t", 4, "deferred", 0)
    nested = read(
        ChunkReport, {"statuses": {"deferred": 2}, "largest": [{"position": 1, "sweep": sent}]}
    )
    assert nested.statuses == {"deferred": 2}
    assert nested.largest[0].sweep.status == "deferred"


def test_a_result_that_does_not_fit_otherwise_is_refused_not_defaulted() -> None:
    """A count, a flag or a list that decides what the pass reports is never its default."""
    # Each refused by the class and field that does not fit, not by some other TypeError.
    for sent, refused in (
        ({"name": "t"}, r"^PurgeSweep: .*'removed'"),
        ({"name": "t", "removed": "four"}, r"^PurgeSweep\.removed: "),
        ({"name": "t", "removed": 4, "batches": "4"}, r"^PurgeSweep\.batches: "),
        ({"name": "t", "removed": 4, "status": 3}, r"^PurgeSweep\.status: expected one of "),
    ):
        with pytest.raises(TypeError, match=refused):
            read(PurgeSweep, sent)
    for report, refused in (
        ({"failed_total": None}, r"^ChunkReport\.failed_total: "),
        ({"failures": [{"position": 0}]}, r"^ChunkReport\.failures: RankedFailure\b.*'failure'"),
        ({"lower_bound": 1}, r"^ChunkReport\.lower_bound: .*bool"),
    ):
        with pytest.raises(TypeError, match=refused):
            read(ChunkReport, report)


def test_a_childs_input_is_read_strictly_its_carried_report_leniently_and_by_its_format() -> None:
    sent = {"targets": ["t"], "now_ms": 1, "deadline_ms": 2, "budget_ms": 1}

    assert read_chunk({**sent, "format": 1}) == ChunkInput(
        targets=["t"], now_ms=1, deadline_ms=2, budget_ms=1
    )
    carried = read_chunk({**sent, "carried": {"statuses": {"deferred": 1}, "removed": 3}})
    assert carried.carried == ChunkReport(removed=3, statuses={"deferred": 1})
    with pytest.raises(TypeError, match=r"\bconcurrency\b.*\bChunkInput\b"):
        read_chunk({**sent, "concurrency": "two"})  # never its default instead
    with pytest.raises(NewerPurgeFormat, match="ChunkInput of format 2"):
        read_chunk({**sent, "format": 2, "concurrency": "two"})


#: A process's first import of activities.wire, and the classes it resolved as it did.
PRINT_RESOLVED = "import activities.wire as w; print(*(k.__name__ for k in w._HINTS))"


def test_the_results_types_are_resolved_as_the_module_is_imported() -> None:
    """Every dataclass a workflow reads through `read` (the two results and each inside them)
    has its type hints resolved at import, outside any sandbox: a read in a workflow never
    resolves them against the modules its sandbox happens to have imported."""
    reachable: set[type] = set()
    todo: list[type] = [PurgeSweep, ChunkReport]
    while todo:
        kind = todo.pop()
        if kind in reachable:
            continue
        reachable.add(kind)
        for hint in typing.get_type_hints(kind).values():
            todo.extend(_inner_dataclasses(hint))

    assert {RankedSweep, PurgeSweep, ChunkReport} < reachable
    # In a process of its own: this one's reads (the tests above) fill the cache as well.
    imported = subprocess.run(
        [sys.executable, "-c", PRINT_RESOLVED],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert {kind.__name__ for kind in reachable} <= set(imported)
    for kind in reachable:
        assert wire._hints(kind) == typing.get_type_hints(kind)


def _inner_dataclasses(hint: object) -> list[type]:
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return [hint]
    return [kind for arg in typing.get_args(hint) for kind in _inner_dataclasses(arg)]
