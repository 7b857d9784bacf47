"""The unit check's verdict on a column's sampled values: which unit they look like, and the
fix it names for each kind of mistake."""

from __future__ import annotations

import pytest

from activities.engine.errors import BadTable
from activities.engine.units import judge_unit
from purge_config.names import TableName

NOW_MS = 1_796_000_000_000


def verdict(values: list[int]) -> str:
    with pytest.raises(BadTable) as refused:
        judge_unit(TableName("events"), "at", "ms", [(v, 1.0) for v in values])
    return str(refused.value)


def test_milliseconds_pass() -> None:
    judge_unit(TableName("events"), "at", "ms", [(NOW_MS + i, 1.0) for i in range(10)])


def test_seconds_are_told_to_set_the_unit() -> None:
    said = verdict([NOW_MS // 1000 + i for i in range(10)])
    assert said.endswith(
        '; they look like epoch seconds. Nothing was deleted; set unit = "s" '
        "on this target (kind expiring; a built-in kind takes epoch milliseconds only: sweep "
        "such a table as an expiring entry)"
    )


def test_nanoseconds_are_told_to_store_a_unit_a_target_takes() -> None:
    said = verdict([NOW_MS * 1_000_000 + i for i in range(10)])
    assert said.endswith(
        "; they look like epoch nanoseconds, a unit no target takes. Nothing was deleted; store "
        "epoch seconds, milliseconds or microseconds in it (an expiring target's unit = says "
        "which)"
    )


def test_values_that_are_no_instant_name_the_column_as_the_fix() -> None:
    said = verdict([100_000 + i for i in range(10)])
    assert "nor like an instant in any unit (s, ms, us, ns)" in said
    assert said.endswith(
        "is at the column that says when a row expires? (An expiring target "
        "names it with column =.)"
    )


def test_a_few_values_in_seconds_among_milliseconds_are_refused() -> None:
    """Three in a hundred would each read as 1970 and be deleted: the majority says ms, the
    few are refused all the same, naming one and the fix."""
    said = verdict([NOW_MS + i for i in range(97)] + [NOW_MS // 1000 + i for i in range(3)])
    assert said.startswith(
        f"table events column at: some of its values look like epoch seconds, not "
        f"milliseconds (e.g. {NOW_MS // 1000}, which reads as a time before 1973)"
    )
    assert "Nothing was deleted; store those values in milliseconds" in said


def test_a_few_values_in_seconds_or_ms_among_microseconds_are_refused() -> None:
    for coarse in (NOW_MS // 1000, NOW_MS):
        with pytest.raises(BadTable, match=r"some of its values look like epoch (seconds|milli)"):
            judge_unit(
                TableName("events"),
                "at",
                "us",
                [(NOW_MS * 1000 + i, 1.0) for i in range(99)] + [(coarse, 1.0)],
            )


def test_marks_below_any_unit_and_sentinels_pass_among_milliseconds() -> None:
    marks = [0, -1, 1, 99_999_999, 2**63 - 1, 2**31 - 1]
    judge_unit(TableName("events"), "at", "ms", [(v, 1.0) for v in [NOW_MS] * 10 + marks])
