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
