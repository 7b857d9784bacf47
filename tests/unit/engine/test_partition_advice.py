"""activities/engine/partition_advice.py without a server: when the day's passes call for
partitions, and the width the advice offers. The same advice over real passes is in
tests/test_partition_advice.py.
"""

from __future__ import annotations

from activities.engine.partition_advice import SharePass, remembered_advice

HOUR = 3_600_000


def hourly(*shares: float, removed: int = 40_000) -> list[SharePass]:
    """A pass an hour, each removing `removed` rows, `share` of the table before it."""
    return [
        SharePass(i * HOUR, removed, round(removed / share) - removed if share else removed)
        for i, share in enumerate(shares)
    ]


def advice(passes: list[SharePass]) -> str:
    return remembered_advice("sessions", "app.sessions", "expires_at", passes)


class TestRememberedAdvice:
    def test_a_large_share_in_most_passes_calls_for_partitions(self) -> None:
        """Three of four passes over 10%: told to partition, with the config line."""
        text = advice(hourly(0.4, 0.05, 0.4, 0.4))

        assert text.startswith("app.sessions: 3 of the last day's 4 passes removed more than 10%")
        assert "partition it by RANGE on expires_at" in text
        assert 'partitions = "drop" on target "sessions"' in text

    def test_half_the_passes_is_not_most(self) -> None:
        assert advice(hourly(0.4, 0.05, 0.4, 0.05)) == ""

    def test_two_passes_are_no_pattern(self) -> None:
        assert advice(hourly(0.9, 0.9)) == ""

    def test_small_shares_never_call_for_partitions(self) -> None:
        assert advice(hourly(*[0.09] * 24)) == ""

    def test_a_day_of_few_rows_is_not_worth_partitions(self) -> None:
        """99,999 rows in a day, however large their share: a batched delete keeps up."""
        assert advice(hourly(0.5, 0.5, 0.5, removed=33_333)) == ""

    def test_hourly_passes_get_15_minute_partitions_sized_by_the_rate(self) -> None:
        """40% an hour: a row stays 2.5 h, ten 15-minute partitions of a quarter-hour's rows."""
        text = advice(hourly(0.4, 0.4, 0.4))

        assert "a pass about every 60 min, so a row stays about 2.5 h" in text
        assert "in 15-minute partitions (about 10,000 rows each, 10 of them live" in text
        assert "about 12% of a pass's rows, is still deleted row by row" in text

    def test_daily_passes_get_6_hour_partitions(self) -> None:
        passes = [SharePass(i * 24 * HOUR, 50_000, 50_000) for i in range(3)]

        assert "in 6-hour partitions" in advice(passes)

    def test_passes_at_one_instant_give_no_width(self) -> None:
        assert advice([SharePass(0, 50_000, 50_000)] * 3) == ""
