"""Advice never from empty statistics: where PostgreSQL's statistics views hold no count of a
table (a database made from a template, after pg_stat_reset()), the views say 0 live rows and a
pass would read as having removed all of the table. Then the share comes from the planner's
estimate, or is not given at all, and the report says which."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from activities import builtin_kinds as kinds
from activities.engine import partition_advice
from activities.inputs import PurgeStep
from activities.registry import TargetRegistry
from activities.results import PurgeReport, PurgeSweep
from activities.schema import table_ddl
from activities.sweep import PurgeActivities
from purge_ops.connect import open_pool
from purge_ops.render import NO_STATISTICS_NOTE, report_table
from tests.support.activity import activity_env
from tests.support.arranging import arranging
from tests.support.rows import HOUR
from tests.test_leftovers import NOW

Databases = Callable[[str | None], str]


@pytest.fixture
def databases(pg_url: str, pg_admin: psycopg.Connection[Any]) -> Iterator[Databases]:
    """`databases(template)`: a database of the test's own (a copy of `template` when given),
    its URL; every one dropped after the test."""
    made: list[str] = []

    def make(template: str | None) -> str:
        name = f"s_{uuid.uuid4().hex[:12]}"
        copy = f' TEMPLATE "{template}"' if template else ""
        pg_admin.execute(f'CREATE DATABASE "{name}"{copy}')
        made.append(name)
        return name

    yield make
    for name in reversed(made):
        pg_admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture
def url_of(pg_url: str) -> Callable[[str], str]:
    return lambda name: make_conninfo(pg_url, dbname=name)


async def _sweep(url: str) -> PurgeSweep:
    pool = await open_pool(url)
    try:
        activities = PurgeActivities(TargetRegistry([kinds.idempotency(pool)]))
        step = PurgeStep(name="x_idempotency", now_ms=NOW)
        result: PurgeSweep = await activity_env().run(activities.purge_target, step)
        return result
    finally:
        await pool.close()


def _prepare(url: str, rows: int, expired_every: int, analyze: bool, shares: bool = False) -> int:
    """The idempotency table and its ledger (and, with `shares`, the day's share record),
    `rows` rows of which every `expired_every`th is expired; analyzed, or with its statistics
    reset and never analyzed."""
    with arranging(url) as conn:
        parts = table_ddl()
        tables = ("x_idempotency", "purge_progress") + (("purge_shares",) if shares else ())
        conn.execute("".join(parts[t] for t in tables))
        conn.execute(
            "INSERT INTO x_idempotency (key, expires_at_ms)"
            " SELECT 'k' || i, CASE WHEN i %% %s = 0 THEN %s ELSE %s END"
            " FROM generate_series(0, %s - 1) i",
            (expired_every, NOW - HOUR, NOW + HOUR, rows),
        )
        if analyze:
            conn.execute("ANALYZE x_idempotency")
        else:
            # The inserts' counts reach the views before this statement's reply (the session
            # flushes as it goes idle), so the reset that follows clears them too.
            conn.execute("SELECT pg_stat_force_next_flush()")
            conn.execute("SELECT pg_stat_reset()")
    return len(range(0, rows, expired_every))


async def test_a_copy_made_from_a_template_takes_the_share_from_the_planners_estimate(
    databases: Databases, url_of: Callable[[str], str]
) -> None:
    """The template's table was analyzed (reltuples 10,000); the copy's views know nothing of
    it. The share is the planner's (50%, not 100%), and the report says it is an estimate."""
    template = databases(None)
    expired = _prepare(url_of(template), 10_000, 2, analyze=True)
    copy = databases(template)

    result = await _sweep(url_of(copy))

    assert result.removed == expired == 5_000
    assert result.live_rows_from == "estimate"
    assert "removed 5,000 rows (50% of the table (by the planner's estimate" in result.advice
    assert "100%" not in result.advice
    assert result.dead_tuple_share is not None
    assert result.dead_tuple_share <= 0.5
    table = report_table(PurgeReport(now_ms=NOW, swept=[result]))
    assert NO_STATISTICS_NOTE in table
    assert "~" in table.split("x_idempotency", 1)[1].splitlines()[0]


async def test_after_pg_stat_reset_with_no_estimate_no_share_is_given(
    databases: Databases, url_of: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Filled, never analyzed, its statistics reset: neither the views nor the planner know
    the rows left, so no share, no vacuum or partition advice (its bar lowered under the rows
    removed, so that only the unknown share keeps it out), and the report shows `?`."""
    monkeypatch.setattr(partition_advice, "PARTITION_ADVICE_ROWS", 100)
    name = databases(None)
    expired = _prepare(url_of(name), 10_000, 2, analyze=False)

    result = await _sweep(url_of(name))

    assert result.removed == expired
    assert result.live_rows_from == "unknown"
    assert result.dead_tuple_share is None
    assert "% of the table" not in result.advice
    assert "VACUUM" not in result.advice
    assert "partition it by RANGE" not in result.advice
    table = report_table(PurgeReport(now_ms=NOW, swept=[result]))
    assert NO_STATISTICS_NOTE in table
    assert "?" in table.split("x_idempotency", 1)[1].splitlines()[0]


async def test_a_table_the_pass_emptied_is_still_all_of_it(
    databases: Databases, url_of: Callable[[str], str]
) -> None:
    """Zero live rows in the views is the truth when no row is left: 100%, from the views."""
    name = databases(None)
    expired = _prepare(url_of(name), 2_000, 1, analyze=False)

    result = await _sweep(url_of(name))

    assert result.removed == expired == 2_000
    assert result.live_rows_from == "stats"
    assert "removed 2,000 rows (100% of the table)" in result.advice


@pytest.mark.parametrize(
    ("case", "recorded"),
    [("from a template", [(5_000, 5_000)]), ("reset", []), ("emptied", [(2_000, 0)])],
)
async def test_the_days_record_keeps_a_share_only_where_the_live_rows_are_known(
    databases: Databases, url_of: Callable[[str], str], case: str, recorded: list[Any]
) -> None:
    """With `purge_shares`, the record of the pass takes its live rows from where the report
    does: the planner's estimate in a copy made from a template (5,000, never the views' 0),
    none at all when neither knows them, and the views' 0 when the pass emptied the table. The
    views' read and the record share one statement where the views can be taken at their
    word, so a record made on their 0 would say the pass removed all of a table it halved."""
    if case == "from a template":
        template = databases(None)
        _prepare(url_of(template), 10_000, 2, analyze=True, shares=True)
        name = databases(template)
    else:
        name = databases(None)
        _prepare(
            url_of(name),
            2_000 if case == "emptied" else 10_000,
            1 if case == "emptied" else 2,
            analyze=False,
            shares=True,
        )

    result = await _sweep(url_of(name))

    with psycopg.connect(url_of(name)) as conn:
        rows = conn.execute("SELECT removed, live FROM purge_shares").fetchall()
    assert result.status == "ok"
    assert rows == recorded
