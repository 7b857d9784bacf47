"""purge_config/values.py without a server: how durations are written back, crons' periods and
catch-up windows, byte rates.

What a config file's user meets is tested through the file in tests/test_config.py (every
`max_age` form, good and bad; crons out of range) and tests/test_pacing.py (a rate's floor):
not again here."""

from __future__ import annotations

import pytest

from purge_config.errors import ConfigError
from purge_config.values import (
    HOUR_MS,
    cron_fires,
    cron_ok,
    cron_period_ms,
    default_catchup_ms,
    duration_text,
    one_of,
    parse_duration,
    read_rate,
)

MINUTE_MS = 60_000
DAY_MS = 24 * HOUR_MS


class TestDurationText:
    @pytest.mark.parametrize(
        ("ms", "text"),
        [
            (0, "0m"),
            (250, "250ms"),
            (1000, "1s"),
            (90_000, "90s"),
            (5 * MINUTE_MS, "5m"),
            (90 * MINUTE_MS, "90m"),
            (HOUR_MS, "1h"),
            (DAY_MS, "1d"),
        ],
    )
    def test_the_largest_whole_unit_of_days_hours_minutes_seconds_or_ms(
        self, ms: int, text: str
    ) -> None:
        assert duration_text(ms) == text

    def test_reads_back_as_the_same_duration(self) -> None:
        for ms in (1, 999, 1000, 61_000, HOUR_MS, DAY_MS + 1):
            assert parse_duration(duration_text(ms)) == ms


class TestCron:
    @pytest.mark.parametrize(
        "cron",
        ["23 * * * *", "0 0 * * 0", "0 0 * * 7", "0 0 29 feb *", "0 0 * * MON", "0 0 * * mo"],
    )
    def test_temporal_crons_are_ok(self, cron: str) -> None:
        assert cron_ok(cron)

    @pytest.mark.parametrize(
        "cron",
        [
            "0 0 * * m",  # a weekday name needs two letters
            "0 0 * ja *",  # a month name needs three
            "0 0 * * funday",
            "*/x * * * *",
            "0 0 * * 1-",
            "0 0 ? * *",
        ],
    )
    def test_what_temporal_would_refuse_is_not(self, cron: str) -> None:
        assert not cron_ok(cron)

    @pytest.mark.parametrize(
        ("cron", "period_ms"),
        [
            ("23 * * * *", HOUR_MS),
            ("*/15 * * * *", 15 * MINUTE_MS),
            ("0,50 * * * *", 10 * MINUTE_MS),  # the shortest gap, not the usual one
            ("30 3 * * *", DAY_MS),
            ("0 9-17 * * mon-fri", HOUR_MS),
            ("0 0 * * sun", 7 * DAY_MS),
            # Both day fields restricted: both must match, as Temporal's server reads them.
            ("0 0 1-14 * mon", 7 * DAY_MS),
            # A range may start and end at 0 (it was read as the field's whole range).
            ("0-0 * * * *", HOUR_MS),
            ("0 0-0 * * *", DAY_MS),
            ("0 0 * * sun-sun", 7 * DAY_MS),
        ],
    )
    def test_period_is_the_shortest_time_between_two_fires(self, cron: str, period_ms: int) -> None:
        assert cron_period_ms(cron) == period_ms

    def test_a_monthly_cron_has_no_period_within_five_weeks(self) -> None:
        assert cron_period_ms("0 0 1 1 *") is None

    @pytest.mark.parametrize(
        "cron",
        ["0 0 30 2 *", "0 0 31 feb *", "0 0 31 4,6,9,11 *", "0 0 30-31 2 *", "0 0 31 2 mon"],
    )
    def test_a_date_no_calendar_has_never_fires(self, cron: str) -> None:
        assert cron_ok(cron)  # every field in its own range: Temporal's server takes it
        assert not cron_fires(cron)

    @pytest.mark.parametrize(
        "cron",
        [
            "0 0 29 2 *",  # once in four years
            "0 0 31 4,5 *",  # May has a 31st
            "0 0 29 2 mon",  # in 2044
            "0 0 13 * 5",  # Friday the 13th
            "0 0 * 2 *",
            "23 * * * *",
        ],
    )
    def test_a_cron_with_a_day_in_some_year_fires(self, cron: str) -> None:
        assert cron_fires(cron)

    @pytest.mark.parametrize(
        ("cron", "window_ms"),
        [
            ("30 3 * * *", DAY_MS),  # daily: a day
            ("23 * * * *", HOUR_MS),
            ("*/5 * * * *", HOUR_MS),
            ("0 3 * * mon", HOUR_MS),  # weekly: still an hour
        ],
    )
    def test_catchup_window_is_a_day_for_a_daily_cron_else_an_hour(
        self, cron: str, window_ms: int
    ) -> None:
        assert default_catchup_ms(cron) == window_ms


class TestReadRate:
    @pytest.mark.parametrize(
        ("text", "rate"),
        [("64kB/s", 64 * 1024), ("1.5 MB/s", 1536 * 1024), ("2GB/s", 2 * 1024**3)],
    )
    def test_units_are_1024_based_as_postgresql_reads_them(self, text: str, rate: int) -> None:
        assert read_rate("f.toml", "max_wal_rate", {"r": text}, "r") == rate

    @pytest.mark.parametrize("value", [64, "64kB", "64kb/s", "1e6B/s"])
    def test_a_number_alone_or_a_unit_not_a_second_is_refused(self, value: object) -> None:
        with pytest.raises(ConfigError, match="want a rate like '32MB/s'"):
            read_rate("f.toml", "max_wal_rate", {"r": value}, "r")


class TestOneOf:
    def test_a_member_comes_back_as_the_set_s_own_value(self) -> None:
        assert one_of("drop", ("delete", "drop", "detach")) == "drop"

    @pytest.mark.parametrize("value", ["DROP", "drop ", "", None, 1, ["drop"]])
    def test_anything_else_is_none(self, value: object) -> None:
        assert one_of(value, ("delete", "drop", "detach")) is None
