"""The partition advice remembers: a plain table that loses a large share in most of a day's
passes is told to partition, with the `partitions = "drop"` line and a partition width, even
though no single pass removed enough for the one-pass advice.

Passes are the real activity in Temporal's activity environment (or, for the last, a `Purge`
pass through the dev server) against real PostgreSQL, an hour apart by the instants they are
handed. A feed table is refilled before each pass, so every pass finds the same share expired.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from activities import builtin_kinds as kinds
from activities.engine.leftover import leftover
from activities.engine.sql_target import SqlTarget
from activities.inputs import PurgeStep
from activities.registry import TargetRegistry
from activities.results import PurgeReport, PurgeSweep
from activities.sweep import PurgeActivities
from purge_config.names import TableName
from purge_ops.render import report_table
from tests.conftest import Harness
from tests.support.activity import activity_env
from tests.support.passes import run_pass
from tests.support.rows import HOUR, PAST_NOW
from tests.test_fleet import table_lock_holders

SLOT = HOUR // 2
ADVICE = "partition it by RANGE on expires_ms"


class Feed:
    """A table whose rows expire in half-hour slots counted from `origin`, `slots` of them
    before each pass, the two before its instant expired: an hourly pass removes two slots,
    2/`slots` of the table. A slot's rows expire at its middle, so a pass up to a quarter of an
    hour late still finds exactly the slots before its instant expired."""

    def __init__(
        self, db: psycopg.Connection[Any], name: str, slot_rows: int, slots: int, origin: int
    ) -> None:
        self.db, self.name, self.slot_rows, self.slots = db, name, slot_rows, slots
        self.origin = origin
        self.filled_to: int | None = None
        db.execute(f"CREATE TABLE {name} (id bigserial PRIMARY KEY, expires_ms bigint NOT NULL)")
        db.execute(f"CREATE INDEX ON {name} (expires_ms)")

    def refill(self, now_ms: int) -> None:
        """The slots missing up to `slots` - 3 after the one that begins at `now_ms`."""
        last = (now_ms - self.origin) // SLOT + self.slots - 3
        first = last - self.slots + 1 if self.filled_to is None else self.filled_to + 1
        self.db.execute(
            f"INSERT INTO {self.name} (expires_ms)"
            " SELECT %s + s * %s + %s FROM generate_series(%s::bigint, %s) s,"
            " generate_series(1, %s) r",
            (self.origin, SLOT, SLOT // 2, first, last, self.slot_rows),
        )
        # The live rows the share is taken of, as the statistics views know them.
        self.db.execute(f"ANALYZE {self.name}")
        self.filled_to = max(last, first - 1)

    def target(self, pool: AsyncConnectionPool[Any]) -> SqlTarget:
        return kinds.expiring(pool, self.name, TableName(self.name), "expires_ms")


async def sweep(target: SqlTarget, now_ms: int) -> PurgeSweep:
    """One pass of `target` at `now_ms`: the activity as a `Purge` pass runs it."""
    result: PurgeSweep = await activity_env().run(
        PurgeActivities(TargetRegistry([target])).purge_target,
        PurgeStep(name=target.name, now_ms=now_ms),
    )
    return result


async def hourly_passes(feed: Feed, pool: AsyncConnectionPool[Any], count: int) -> list[PurgeSweep]:
    """`count` passes an hour apart, the first at the feed's origin."""
    results = []
    for i in range(count):
        now_ms = feed.origin + i * HOUR
        feed.refill(now_ms)
        results.append(await sweep(feed.target(pool), now_ms))
    return results


async def test_a_table_losing_40_percent_every_pass_is_told_to_partition_once_the_day_adds_up(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """2,500 rows a pass, a quarter of what the one-pass advice needs: told from the pass at
    which the day's passes add up to the window's 10,000 rows, with the width and the config
    line. (Both thresholds a tenth of the shipped 100,000, and the table with them.)"""
    monkeypatch.setattr("activities.engine.partition_advice.WINDOW_ROWS", 10_000)
    monkeypatch.setattr("activities.engine.partition_advice.PARTITION_ADVICE_ROWS", 10_000)
    feed = Feed(db, "feed", slot_rows=1_250, slots=5, origin=PAST_NOW)

    results = await hourly_passes(feed, pool, 5)

    assert [r.removed for r in results] == [2_500] * 5
    assert [ADVICE in r.advice for r in results] == [False, False, False, True, True]
    assert "narrower than the time between passes" not in results[-1].advice  # the one-pass
    advice = results[-1].advice
    assert "feed: 5 of the last day's 5 passes removed more than 10% of the table" in advice
    assert "(median 40%, " in advice
    assert "12,500 rows in all, a pass about every 60 min" in advice
    assert "in 15-minute partitions (about 625 rows each" in advice
    assert 'set partitions = "drop" on target "feed"' in advice


async def test_a_table_losing_a_small_share_every_pass_is_not_told(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """5% a pass, however many rows the day's passes add up to."""
    monkeypatch.setattr("activities.engine.partition_advice.WINDOW_ROWS", 1_000)
    feed = Feed(db, "steady", slot_rows=500, slots=40, origin=PAST_NOW)

    results = await hourly_passes(feed, pool, 5)

    assert [r.removed for r in results] == [1_000] * 5
    assert not any(ADVICE in r.advice for r in results)


@pytest.mark.parametrize(
    ("slots", "told", "recorded"),
    [(40, False, 1), (5, True, 0)],
    ids=["a small share: recorded", "a large share: told by the pass, not recorded"],
)
async def test_a_pass_of_the_one_pass_bar_reads_what_it_left_and_records_in_one_round_trip(
    db: psycopg.Connection[Any],
    pool: AsyncConnectionPool[Any],
    monkeypatch: pytest.MonkeyPatch,
    slots: int,
    told: bool,
    recorded: int,
) -> None:
    """A pass that removed the one-pass advice's rows or more (1,000 here, the bar a
    hundredth of the shipped one): the views' read of what it left, the day's record and the
    unlock are one statement, as for a smaller pass, never the step-by-step read. Of a small
    share (5%) the pass is recorded; of a large one (40%) that pass alone is told to partition
    and, as ever, not recorded."""
    monkeypatch.setattr("activities.engine.partition_advice.PARTITION_ADVICE_ROWS", 1_000)
    step_by_step: list[str] = []

    async def read_alone(*args: Any, **kwargs: Any) -> Any:
        step_by_step.append("read")
        return await leftover(*args, **kwargs)

    monkeypatch.setattr("activities.engine.target_tables.leftover", read_alone)
    feed = Feed(db, "feed", slot_rows=500, slots=slots, origin=PAST_NOW)
    feed.refill(PAST_NOW)

    result = await sweep(feed.target(pool), PAST_NOW)

    assert result.removed == 1_000
    assert step_by_step == []
    assert (ADVICE in result.advice) is told
    shares = db.execute("SELECT count(*) FROM purge_shares WHERE table_name = 'feed'").fetchone()
    assert shares == (recorded,)
    # The table's lock went with that statement (its own: other tests' sweeps hold theirs).
    assert table_lock_holders(db, "feed") == []


async def test_a_large_share_in_only_some_passes_is_not_most(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two of five passes find 40% expired; the other three, each a minute after another,
    find nothing: at no pass did most of the day's passes remove a large share."""
    monkeypatch.setattr("activities.engine.partition_advice.WINDOW_ROWS", 1_000)
    feed = Feed(db, "bursty", slot_rows=1_000, slots=5, origin=PAST_NOW)
    minute = 60_000
    results = []
    for offset in (0, minute, 2 * minute, HOUR, HOUR + minute):
        feed.refill(PAST_NOW + offset)
        results.append(await sweep(feed.target(pool), PAST_NOW + offset))

    assert [r.removed for r in results] == [2_000, 0, 0, 2_000, 0]
    assert not any(ADVICE in r.advice for r in results)


async def test_without_the_shares_table_passes_sweep_as_before_and_are_not_told(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("activities.engine.partition_advice.WINDOW_ROWS", 1_000)
    db.execute("DROP TABLE purge_shares")
    feed = Feed(db, "feed", slot_rows=1_000, slots=5, origin=PAST_NOW)

    results = await hourly_passes(feed, pool, 4)

    assert [r.removed for r in results] == [2_000] * 4
    assert not any(ADVICE in r.advice for r in results)


async def test_a_role_that_may_only_read_the_shares_table_sweeps_and_is_not_told(
    db: psycopg.Connection[Any], schema_url: str, role: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("activities.engine.partition_advice.WINDOW_ROWS", 1_000)
    feed = Feed(db, "feed", slot_rows=1_000, slots=5, origin=PAST_NOW)
    db.execute(f'GRANT SELECT, DELETE ON feed TO "{role}"')
    db.execute(f'GRANT SELECT ON purge_shares TO "{role}"')
    url = psycopg.conninfo.make_conninfo(schema_url, user=role)
    async with AsyncConnectionPool(url, kwargs={"autocommit": True}, open=False) as pool:
        results = await hourly_passes(feed, pool, 4)

    assert [r.removed for r in results] == [2_000] * 4
    assert not any(ADVICE in r.advice for r in results)
    assert db.execute("SELECT count(*) FROM purge_shares").fetchone() == (0,)


async def test_a_pass_through_temporal_carries_the_advice_to_its_result_and_report(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three hourly passes at instants before the test began, then the `Purge` pass at the
    workflow's clock, seconds after the test began."""
    monkeypatch.setattr("activities.engine.partition_advice.WINDOW_ROWS", 1_000)
    origin = harness.now_ms - 3 * HOUR
    feed = Feed(harness.db, "feed", slot_rows=1_000, slots=5, origin=origin)
    await hourly_passes(feed, harness.pool, 3)
    feed.refill(harness.now_ms)

    async with harness.run_worker([feed.target(harness.pool)]):
        result = await run_pass(harness.client, harness.task_queue, {"targets": ["feed"]})

    [swept] = result["swept"]
    assert swept["removed"] == 2_000
    assert "feed: 4 of the last day's 4 passes removed more than 10%" in swept["advice"]
    assert 'set partitions = "drop" on target "feed"' in swept["advice"]
    assert "feed: 4 of the last day's 4 passes" in report_table(PurgeReport.from_json(result))


async def test_without_the_ledger_the_shares_still_remember(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The two optional tables are independent: counts from heartbeats, advice from shares."""
    monkeypatch.setattr("activities.engine.partition_advice.WINDOW_ROWS", 1_000)
    db.execute("DROP TABLE purge_progress")
    feed = Feed(db, "feed", slot_rows=1_000, slots=5, origin=PAST_NOW)

    results = await hourly_passes(feed, pool, 3)

    assert [r.removed for r in results] == [2_000] * 3
    assert [ADVICE in r.advice for r in results] == [False, False, True]
