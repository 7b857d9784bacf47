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


def test_p95_is_the_nearest_rank_of_the_batches_durations() -> None:
    """The smallest duration that at least 95% of the batches took no longer than, worked out
    by hand: the 19th of 20, the 38th of 40, the 39th of 41, the only one of one."""
    shuffled = [float(n) for n in (7, 20, 1, 13, 19, 2, 18, 3, 17, 4, 16, 5, 15, 6, 14, 8, 12, 9)]
    cases = [
        ([*shuffled, 10.0, 11.0], 19.0),
        ([float(n) for n in range(1, 41)], 38.0),
        ([float(n) for n in range(1, 42)], 39.0),
        ([4.25], 4.25),
        ([], 0.0),
    ]
    for durations, p95 in cases:
        assert SweepStats(batch_ms=durations).p95_batch_ms == p95, durations
