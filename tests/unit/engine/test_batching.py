"""activities/engine/batching.py without a server: how big the next batch is, how big the first
index batch is, and the backlog a walk estimates. The same rules on a real table (batch counts,
a first batch of rows in expiry order) are in tests/test_batching.py."""

from __future__ import annotations

import pytest

from activities.engine.batching import (
    FIRST_INDEX_PAGES,
    FIRST_ROWS,
    PAGES_RANGE,
    ROWS_RANGE,
    _resize,
    _walk_backlog,
    first_index_rows,
    fits_first_batch,
)
from activities.engine.planning import TablePlan

TARGET_MS = 15


def plan(
    pages: int = 1_000,
    rows: float | None = 100_000,
    expired: float = 0,
    correlation: float | None = None,
) -> TablePlan:
    return TablePlan(
        strategy="index",
        pages=pages,
        rows=rows,
        expired=expired,
        index="x_expires",
        correlation=correlation,
    )


class TestResize:
    def test_a_batch_on_target_keeps_its_size(self) -> None:
        assert _resize(1_000, TARGET_MS, TARGET_MS, ROWS_RANGE) == 1_000

    def test_a_fast_batch_grows_towards_the_target_but_at_most_4x(self) -> None:
        assert _resize(1_000, TARGET_MS / 2, TARGET_MS, ROWS_RANGE) == 2_000
        assert _resize(1_000, 0.0, TARGET_MS, ROWS_RANGE) == 4_000

    def test_a_slow_batch_shrinks_but_at_most_by_half(self) -> None:
        """One slow batch (a checkpoint, a lock wait) does not swing the size wildly."""
        assert _resize(1_000, TARGET_MS * 1.25, TARGET_MS, ROWS_RANGE) == 800
        assert _resize(1_000, 10_000, TARGET_MS, ROWS_RANGE) == 500

    @pytest.mark.parametrize("bounds", [ROWS_RANGE, PAGES_RANGE])
    def test_the_size_stays_within_its_bounds(self, bounds: tuple[int, int]) -> None:
        low, high = bounds

        assert _resize(low, 10_000, TARGET_MS, bounds) == low
        assert _resize(high, 0.0, TARGET_MS, bounds) == high


class TestFirstIndexRows:
    def test_without_statistics_the_first_batch_is_small(self) -> None:
        assert first_index_rows(plan(correlation=None)) == FIRST_ROWS
        assert first_index_rows(plan(rows=None, correlation=1.0)) == FIRST_ROWS

    @pytest.mark.parametrize("correlation", [1.0, -1.0])
    def test_rows_in_expiry_order_fill_the_first_batchs_pages(self, correlation: float) -> None:
        """A fixed TTL's table (either direction): its expired rows lie together, 100 a page."""
        rows = first_index_rows(plan(pages=1_000, rows=100_000, correlation=correlation))

        assert rows == FIRST_INDEX_PAGES * 100

    def test_rows_in_no_order_get_the_small_first_batch(self) -> None:
        """Each row may be on a page of its own: 128 rows would do, FIRST_ROWS is the floor."""
        assert first_index_rows(plan(correlation=0.0)) == FIRST_ROWS

    def test_between_the_two_by_the_correlations_square(self) -> None:
        rows = first_index_rows(plan(pages=100, rows=100_000, correlation=0.99))

        # 0.98 of a row's page read is shared with 999 others, 0.02 is its own: about 6,000.
        assert FIRST_ROWS < rows < FIRST_INDEX_PAGES * 1_000
        assert rows == int(FIRST_INDEX_PAGES / (0.99**2 / 1_000 + (1 - 0.99**2)))

    def test_never_more_than_the_largest_batch(self) -> None:
        assert first_index_rows(plan(pages=1, rows=10_000_000, correlation=1.0)) == ROWS_RANGE[1]


class TestFitsFirstBatch:
    def test_up_to_three_first_batches_by_the_estimate(self) -> None:
        """About one batch at the target: the first batch may take it whole."""
        assert fits_first_batch(plan(expired=3_000), 1_000)
        assert not fits_first_batch(plan(expired=3_001), 1_000)

    def test_a_table_never_analyzed_reads_its_boundary(self) -> None:
        """No statistics, no estimate worth a batch's bound: however few rows it guesses."""
        assert not fits_first_batch(plan(rows=None, expired=1), 1_000)


class TestWalkBacklog:
    def test_the_pages_not_walked_at_the_density_met_so_far(self) -> None:
        table = plan(pages=1_000, expired=50_000)

        # 300 rows in the 100 pages walked: 3 a page over the 900 left.
        assert _walk_backlog(table, removed=300, walked=100, page=100) == 2_700

    def test_a_resumed_walk_counts_only_this_attempts_pages(self) -> None:
        # This attempt walked pages 500 to 600: the earlier attempt's pages do not dilute it.
        assert _walk_backlog(plan(pages=1_000), removed=300, walked=100, page=600) == 1_200

    def test_before_any_page_the_planners_estimate_spread_over_the_table(self) -> None:
        table = plan(pages=1_000, expired=50_000)

        assert _walk_backlog(table, removed=0, walked=0, page=250) == 37_500

    def test_a_table_without_pages_has_no_backlog(self) -> None:
        assert _walk_backlog(plan(pages=0, expired=10), removed=0, walked=0, page=0) == 0
