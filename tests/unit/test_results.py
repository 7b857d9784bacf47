"""A batched sweep's stats become its report's figures in one place (`PurgeSweep.take_figures`)."""

from __future__ import annotations

from activities.progress import SweepStats
from activities.results import PurgeSweep


def test_every_figure_of_the_stats_reaches_the_report_under_its_payload_name() -> None:
    stats = SweepStats(
        removed=30,
        batches=3,
        strategies=["partitions", "index"],
        batch_ms=[1.0, 2.0, 3.0],
        backlog=7,
        backlog_estimated=True,
        advice=["create an index", "analyze"],
        oldest_expired_age_ms=1500,
        live_rows=3,
        dead_rows=1,
        analyzed=True,
        busy="held by another sweep",
        paused_s=0.12345,
        partitions=["app.p1", "app.p2"],
        partition_rows=20,
        partition_action="detached",
        archived=30,
    )
    sweep = PurgeSweep(name="t", removed=30)

    sweep.take_figures(stats)

    assert (sweep.strategy, sweep.batches, sweep.p95_batch_ms) == ("partitions+index", 3, 3.0)
    assert (sweep.status, sweep.reason) == ("busy", "held by another sweep")
    assert (sweep.backlog, sweep.backlog_estimated, sweep.archived) == (7, True, 30)
    assert (sweep.oldest_expired_age_s, sweep.dead_tuple_share) == (1.5, 0.25)
    assert (sweep.paused_s, sweep.analyzed) == (0.123, True)
    assert (sweep.partitions_detached, sweep.partitions_dropped) == (2, 0)
    assert sweep.partition_names == ["app.p1", "app.p2"]
    assert (sweep.partition_rows, sweep.edge_removed) == (20, 10)
    assert sweep.advice == "create an index | analyze"


def test_an_age_not_read_in_time_stays_unknown_and_a_pacing_reason_is_kept() -> None:
    sweep = PurgeSweep(name="t", removed=0)

    sweep.take_figures(SweepStats(oldest_expired_age_ms=None, reason="replica lag"))

    assert sweep.oldest_expired_age_s is None
    assert (sweep.status, sweep.reason) == ("ok", "replica lag")
