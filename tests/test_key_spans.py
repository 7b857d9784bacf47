"""Key spans (issue 37): after a sweep's first keyset batch, each batch deletes a span of the
expiry index's keys sized from the density the last one met, with no boundary read before it.

On the real server, with batches of a fixed number of rows (`fixed_batches`) so that a table is a
known number of spans whatever the machine's speed. Boundary reads are counted by observing
`batching.run_key_batch` (the batch that reads one) as the sweep looks it up: the engine runs
as it ships.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from activities import builtin_kinds as kinds
from activities.engine import batching, keyset
from activities.inputs import PurgeStep
from activities.registry import TargetRegistry
from activities.results import PurgeSweep
from activities.sweep import PurgeActivities
from purge_config.names import TableName
from purge_config.settings import SweepSettings
from purge_ops.connect import open_pool
from tests.support.activity import activity_env
from tests.support.pace import (
    ENGINE_RESIZE,
    fixed_batches,
    unhurried_whole_batch,
)
from tests.support.plans import batch_plan_nodes
from tests.support.rows import HOUR, PAST_NOW

NOW = PAST_NOW
ROWS = 200


def boundary_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that gets one entry per keyset batch that reads its boundary."""
    seen: list[int] = []
    run = batching.run_key_batch

    async def counted(*args: Any) -> Any:
        seen.append(1)
        return await run(*args)

    monkeypatch.setattr(batching, "run_key_batch", counted)
    return seen


def fill(db: psycopg.Connection[Any], expired: int, live: int, spacing_ms: int) -> None:
    """`expired` keys spaced `spacing_ms` apart, the last at NOW; `live` after NOW."""
    db.execute(
        "INSERT INTO x_idempotency (key, response, expires_at_ms)"
        " SELECT 'k' || i, '{}', %s - i * %s::bigint FROM generate_series(0, %s - 1) i",
        (NOW, spacing_ms, expired),
    )
    db.execute(
        "INSERT INTO x_idempotency (key, response, expires_at_ms)"
        " SELECT 'live' || i, '{}', %s + 1 + i FROM generate_series(0, %s - 1) i",
        (NOW, live),
    )
    db.execute("VACUUM ANALYZE x_idempotency")


def on_batch(removed: list[int]) -> Callable[[Any], None]:
    return lambda progress: removed.append(progress.batch_removed)


async def swept_counted(
    pool: AsyncConnectionPool[Any], db: psycopg.Connection[Any], settings: SweepSettings
) -> tuple[PurgeSweep, Any]:
    """The activity's sweep of x_idempotency under `settings`, and the ledger's row of its pass
    (what the pass counted, every attempt of it)."""
    activities = PurgeActivities(TargetRegistry([kinds.idempotency(pool, settings=settings)]))
    env = activity_env()
    result: PurgeSweep = await env.run(
        activities.purge_target, PurgeStep(name="x_idempotency", now_ms=NOW)
    )
    ledger = db.execute(
        "SELECT removed FROM purge_progress WHERE run_id = %s", (env.info.workflow_run_id,)
    ).fetchone()
    return result, ledger


async def test_after_the_first_batch_spans_hold_a_batch_each_with_no_boundary_read(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """4,000 expired keys a second apart: the first batch reads its boundary, every batch after
    it deletes a span of about ROWS keys without one, and the last takes the rest up to the
    cutoff, also without one (the remainder narrower than half a span rides with it). Without
    spans every one of the 20 batches would read its boundary; without the rest, the last would
    read one again (to find where the rows end)."""
    fixed_batches(monkeypatch, rows=ROWS)
    reads = boundary_reads(monkeypatch)
    fill(db, 4_000, 40_000, spacing_ms=1_000)
    removed: list[int] = []

    stats = await kinds.idempotency(pool).sweep(NOW, on_batch=on_batch(removed))

    assert (stats.strategy, stats.removed) == ("index", 4_000)
    assert db.execute("SELECT count(*) FROM x_idempotency").fetchone() == (40_000,)
    assert len(reads) == 1 < stats.batches
    assert stats.batches == len(removed) <= 4_000 // ROWS + 1
    # A span holds about a batch: the density of an even table is what the last span met.
    assert max(removed[:-1]) <= ROWS + 1
    # The rest: at most a span and a half.
    assert 0 < removed[-1] <= ROWS * 3 // 2


async def test_a_few_old_keys_far_below_the_rest_do_not_make_the_spans_wide(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three rows ten minutes older than the 4,000 others (a second apart) open the first
    batch: sized from the key range of its whole batch, every span would reach over about four
    batches' rows. Sized from its upper half, each still holds about a batch."""
    fixed_batches(monkeypatch, rows=ROWS)
    reads = boundary_reads(monkeypatch)
    fill(db, 4_000, 40_000, spacing_ms=1_000)
    db.execute(
        "INSERT INTO x_idempotency (key, response, expires_at_ms)"
        " SELECT 'old' || i, '{}', %s - 4000 * 1000 - 600 * 1000 - i FROM generate_series(0, 2) i",
        (NOW,),
    )
    removed: list[int] = []

    stats = await kinds.idempotency(pool).sweep(NOW, on_batch=on_batch(removed))

    assert stats.removed == 4_003
    assert len(reads) <= 3 < stats.batches
    assert max(removed) <= 2 * ROWS


@pytest.mark.parametrize(("below", "run", "first"), [(20, 150, 199), (60, 80, 159)])
async def test_a_run_of_one_key_at_the_half_way_probe_keeps_the_first_batch_within_a_batch(
    db: psycopg.Connection[Any],
    pool: AsyncConnectionPool[Any],
    monkeypatch: pytest.MonkeyPatch,
    below: int,
    run: int,
    first: int,
) -> None:
    """`below` distinct keys, then `run` rows sharing one key across the half-way probe (its
    position ROWS/2), then 4,000 keys a second apart. The first batch's n-th key is read from the
    half-way key, whose rows below it move that read down: the batch holds more than half a
    batch and at most a batch, and no run shorter than a batch is walked by ctid. 150 rows from
    the 20th: the read from the half-way key lands on the run itself, and the n-th is read again
    from the least key (without that, a first batch of 20 rows, and a walk of the run). 80 rows
    from the 60th: it lands past the run, a batch of 159."""
    fixed_batches(monkeypatch, rows=ROWS)
    walked = tie_walks(monkeypatch)
    fill(db, 4_000, 40_000, spacing_ms=1_000)
    oldest = NOW - 4_000 * 1_000 - 600 * 1_000
    db.execute(
        "INSERT INTO x_idempotency (key, response, expires_at_ms)"
        " SELECT 'old' || i, '{}', %s - i * 1000 FROM generate_series(1, %s) i",
        (oldest, below),
    )
    db.execute(
        "INSERT INTO x_idempotency (key, response, expires_at_ms)"
        " SELECT 'run' || i, '{}', %s FROM generate_series(1, %s) i",
        (oldest + 1_000, run),
    )
    db.execute("ANALYZE x_idempotency")
    removed: list[int] = []

    stats = await kinds.idempotency(pool).sweep(NOW, on_batch=on_batch(removed))

    assert stats.removed == 4_000 + below + run
    assert db.execute("SELECT count(*) FROM x_idempotency").fetchone() == (40_000,)
    assert removed[0] == first
    assert walked == []


def tie_walks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that gets one entry per batch of a run of one key taken by ctid (`tie_delete`)."""
    seen: list[int] = []
    tie = keyset.tie_delete

    def counted(*args: Any) -> Any:
        seen.append(1)
        return tie(*args)

    monkeypatch.setattr(keyset, "tie_delete", counted)
    return seen


@pytest.mark.parametrize("column_type", ["timestamptz", "timestamp"])
async def test_spans_walk_a_timestamp_key_in_microseconds(
    db: psycopg.Connection[Any],
    pool: AsyncConnectionPool[Any],
    monkeypatch: pytest.MonkeyPatch,
    column_type: str,
) -> None:
    """An `expiring` target on a timestamp column, with or without a time zone (the latter read
    as UTC): spans are counted in microseconds, every expired row goes (the one exactly at the
    cutoff too) and no live one."""
    fixed_batches(monkeypatch, rows=ROWS)
    reads = boundary_reads(monkeypatch)
    db.execute(f"CREATE TABLE stamped (id bigint PRIMARY KEY, seen {column_type} NOT NULL)")
    db.execute("CREATE INDEX ON stamped (seen)")
    cutoff = datetime.fromtimestamp((NOW - HOUR) / 1000, UTC)
    if column_type == "timestamp":
        cutoff = cutoff.replace(tzinfo=None)
    db.execute(
        "INSERT INTO stamped SELECT i, %s - i * interval '1.5 seconds'"
        " FROM generate_series(0, 2999) i",
        (cutoff,),
    )
    db.execute(
        "INSERT INTO stamped SELECT 10000 + i, %s + i * interval '1 second'"
        " FROM generate_series(1, 20000) i",
        (cutoff,),
    )
    db.execute("VACUUM ANALYZE stamped")
    target = kinds.expiring(pool, "stamped", TableName("stamped"), "seen", max_age_ms=HOUR)

    stats = await target.sweep(NOW)

    assert (stats.strategy, stats.removed) == ("index", 3_000)
    assert db.execute("SELECT count(*), min(seen) FROM stamped").fetchone() == (
        20_000,
        cutoff + timedelta(seconds=1),
    )
    assert len(reads) <= 3 < stats.batches


#: How long deleting a slow row takes (`slow_rows`), and the statement_timeout the tests of
#: them sweep under: three slow rows in one statement always run past it (a sleep is never
#: shorter), while two leave 300 ms of it, and one 700 ms, for a loaded machine's rest.
SLOW_ROW_S = 0.4
SLOW_TIMEOUT_MS = 1_100


@pytest.fixture
def slow_rows(db: psycopg.Connection[Any]) -> None:
    """Deleting a row whose key starts with 'slow' takes SLOW_ROW_S (a trigger's sleep): three
    such rows in one statement run past SLOW_TIMEOUT_MS, one or two do not."""
    db.execute(
        "CREATE FUNCTION slow_delete() RETURNS trigger LANGUAGE plpgsql AS $$"
        f" BEGIN IF OLD.key LIKE 'slow%' THEN PERFORM pg_sleep({SLOW_ROW_S}); END IF;"
        " RETURN OLD; END $$"
    )
    db.execute(
        "CREATE TRIGGER slow BEFORE DELETE ON x_idempotency"
        " FOR EACH ROW EXECUTE FUNCTION slow_delete()"
    )


@pytest.mark.usefixtures("slow_rows")
async def test_a_span_that_runs_into_statement_timeout_is_rolled_back_and_taken_narrower(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five slow rows, 60 keys apart, in the middle of 4,000: a span of ROWS keys holds three
    or four of them and runs past statement_timeout; it is rolled back whole (its rows and its
    ledger row), and the same keys are taken again at a quarter of the width, each piece holding
    at most one. The sweep completes with every expired row gone, counted exactly in the ledger
    and the result, and says why it slowed; it never fails for it."""
    fixed_batches(monkeypatch, rows=ROWS)
    fill(db, 4_000, 40_000, spacing_ms=1_000)
    db.execute(
        "UPDATE x_idempotency SET key = 'slow' || key"
        " WHERE key IN ('k2000', 'k2060', 'k2120', 'k2180', 'k2240')"
    )
    spans: list[tuple[int, int, str]] = []  # start, end, how it ended
    run_span = batching.run_key_span

    async def noted(*args: Any) -> Any:
        start, end = args[-2:]
        try:
            ran = await run_span(*args)
        except Exception as err:
            spans.append((start, end, type(err).__name__))
            raise
        spans.append((start, end, "deleted"))
        return ran

    monkeypatch.setattr(batching, "run_key_span", noted)
    result, ledger = await swept_counted(
        pool, db, SweepSettings(statement_timeout_ms=SLOW_TIMEOUT_MS)
    )

    assert result.removed == 4_000
    assert db.execute(
        "SELECT count(*) FROM x_idempotency WHERE expires_at_ms <= %s", (NOW,)
    ).fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM x_idempotency").fetchone() == (40_000,)
    assert ledger == (4_000,)
    assert f"ran into statement_timeout ({SLOW_TIMEOUT_MS} ms), was rolled back" in result.advice
    # Taken again from the same start at a quarter of the width it was cancelled at.
    cancelled = next(i for i, (_, _, how) in enumerate(spans) if how == "QueryCanceled")
    start, end, _ = spans[cancelled]
    assert spans[cancelled + 1][:2] == (start, start + (end - start) // 4)


def rest_batches(monkeypatch: pytest.MonkeyPatch, name: str = "run_key_rest") -> list[str]:
    """A list that gets, for each last batch tried with no boundary read (`run_key_rest`, or
    with `name="run_key_whole"` a first batch that takes every expired row), how it ended:
    "deleted", "nothing" or the error's class name."""
    seen: list[str] = []
    run = getattr(batching, name)

    async def observed(*args: Any) -> Any:
        try:
            ran = await run(*args)
        except Exception as err:
            seen.append(type(err).__name__)
            raise
        seen.append("deleted" if ran[1] else "nothing")
        return ran

    monkeypatch.setattr(batching, name, observed)
    return seen


@pytest.mark.parametrize(
    ("expired", "name"),
    [(3_000, "run_key_rest"), (300, "run_key_whole")],
    ids=["the rest", "a first batch that took every row"],
)
async def test_a_last_batch_counts_the_greatest_keys_rows_and_deletes_by_the_index(
    db: psycopg.Connection[Any],
    schema_url: str,
    monkeypatch: pytest.MonkeyPatch,
    expired: int,
    name: str,
) -> None:
    """A last batch with no boundary read (the rest, or a first batch that takes every expired
    row) first counts the rows of the greatest expired key, up to a batch, then deletes. Live
    rows on nine values, so the statistics see few distinct keys: left to itself, the generic
    plan goes by bitmap scans (the planner's pick here without `tie_walk`'s settings), which
    gather every row of the key before the count stops. The plan the batch ran (its prepared
    statement's generic plan, read back on the sweep's own connection) has neither a bitmap
    scan nor a sequential scan."""
    fixed_batches(monkeypatch, rows=ROWS)
    ended = rest_batches(monkeypatch, name)
    db.execute(
        "INSERT INTO x_idempotency (key, response, expires_at_ms)"
        " SELECT 'k' || i, '{}', %s - i FROM generate_series(0, %s - 1) i",
        (NOW, expired),
    )
    db.execute(
        "INSERT INTO x_idempotency (key, response, expires_at_ms)"
        " SELECT 'l' || i, '{}', %s + (i %% 9) * 1000 FROM generate_series(1, 50000) i",
        (NOW + HOUR,),
    )
    db.execute("VACUUM ANALYZE x_idempotency")
    one = await open_pool(schema_url, max_size=1)  # so the sweep's connection is the one read
    try:
        stats = await kinds.idempotency(one).sweep(NOW)
        async with one.connection() as conn:
            nodes = await batch_plan_nodes(conn, "DELETE%(SELECT count(*)%")
    finally:
        await one.close()

    assert (stats.removed, ended) == (expired, ["deleted"])
    assert nodes & {"Index Scan", "Index Only Scan"}, nodes
    assert not nodes & {"Seq Scan", "Bitmap Heap Scan"}, nodes


async def test_a_run_of_one_key_under_a_batch_at_the_cutoff_goes_with_the_rest(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """150 more rows share the greatest expired key (fewer than a batch of ROWS): the last
    batch takes them with the rest of the keys, with no boundary read. A batch's worth or more
    would be walked instead (`test_batching`'s run of 6,000 at the cutoff)."""
    fixed_batches(monkeypatch, rows=ROWS)
    reads = boundary_reads(monkeypatch)
    rests = rest_batches(monkeypatch)
    fill(db, 4_000, 40_000, spacing_ms=1_000)
    db.execute(
        "INSERT INTO x_idempotency (key, response, expires_at_ms)"
        " SELECT 'tie' || i, '{}', %s FROM generate_series(1, 150) i",
        (NOW,),
    )
    db.execute("ANALYZE x_idempotency")
    removed: list[int] = []

    stats = await kinds.idempotency(pool).sweep(NOW, on_batch=on_batch(removed))

    assert stats.removed == 4_150
    assert db.execute("SELECT count(*) FROM x_idempotency").fetchone() == (40_000,)
    assert (len(reads), rests) == (1, ["deleted"])
    assert removed[-1] > 150


@pytest.mark.usefixtures("slow_rows")
async def test_a_last_batch_that_runs_into_statement_timeout_is_taken_in_narrower_spans(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three slow rows among the last 81 keys: the last batch, which takes at least half a
    span's keys (ROWS), holds all three and runs past statement_timeout. It is rolled back
    whole and its keys taken again in spans of a quarter of the width (none holds three), and
    the rest after them: every expired row gone, counted once."""
    fixed_batches(monkeypatch, rows=ROWS)
    rests = rest_batches(monkeypatch)
    fill(db, 4_000, 40_000, spacing_ms=1_000)
    db.execute("UPDATE x_idempotency SET key = 'slow' || key WHERE key IN ('k0', 'k40', 'k80')")
    result, ledger = await swept_counted(
        pool, db, SweepSettings(statement_timeout_ms=SLOW_TIMEOUT_MS)
    )

    assert result.removed == 4_000
    assert db.execute("SELECT count(*) FROM x_idempotency").fetchone() == (40_000,)
    assert ledger == (4_000,)
    assert rests[0] == "QueryCanceled"
    assert rests[-1] == "deleted"
    assert f"ran into statement_timeout ({SLOW_TIMEOUT_MS} ms), was rolled back" in result.advice


@pytest.mark.usefixtures("slow_rows")
async def test_a_span_that_runs_past_twice_the_target_halves_the_next(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One slow row (0.4 s, far past twice the 15 ms target on any machine) in the middle of
    4,000 even keys: the span that meets it is followed by one of half its width, so half its
    rows. The moment is the sleep, which no machine's speed shortens; every other batch keeps
    its size (a loaded machine's would otherwise shrink towards the floor, where half of
    anything is the floor), so the span that meets it holds a full batch."""

    def kept_unless_slow(size: int, ms: float, target_ms: int, span: tuple[int, int]) -> int:
        return ENGINE_RESIZE(size, ms, target_ms, span) if ms >= SLOW_ROW_S * 1000 else size

    monkeypatch.setattr(batching, "_resize", kept_unless_slow)
    monkeypatch.setattr(batching, "FIRST_ROWS", ROWS)
    monkeypatch.setattr(batching, "ROWS_RANGE", (50, 2 * ROWS))
    fill(db, 4_000, 40_000, spacing_ms=1_000)
    db.execute("UPDATE x_idempotency SET key = 'slow' || key WHERE key = 'k2000'")
    batches: list[tuple[int, float]] = []

    stats = await kinds.idempotency(pool).sweep(
        NOW, on_batch=lambda p: batches.append((p.batch_removed, p.batch_ms))
    )

    assert stats.removed == 4_000
    slow = next(i for i, (_, ms) in enumerate(batches) if ms >= SLOW_ROW_S * 1000)
    assert slow + 1 < len(batches) - 1  # the next batch is a span, not the last boundary read
    slow_rows, _ = batches[slow]
    assert slow_rows >= ROWS // 2  # a span of a batch's rows, not the floor's
    assert slow_rows // 2 - 1 <= batches[slow + 1][0] <= slow_rows // 2 + 1


async def test_where_a_batch_takes_less_than_one_key_step_the_batches_read_their_boundary(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Epoch seconds: 200 rows a second apart, then 100 rows to each second for a minute. Once
    a span meets that crowd, a batch of 50 rows is less than one second of keys: a span cannot
    be narrower than a second, so the batches read their boundary again and walk each second
    50 rows at a time, instead of spans of one second holding twice their rows each."""
    fixed_batches(monkeypatch, rows=50)
    db.execute("CREATE TABLE coarse (id bigint PRIMARY KEY, at_s bigint NOT NULL)")
    db.execute("CREATE INDEX ON coarse (at_s)")
    start_s = (NOW - HOUR) // 1000
    db.execute("INSERT INTO coarse SELECT i, %s + i FROM generate_series(0, 199) i", (start_s,))
    db.execute(
        "INSERT INTO coarse SELECT 1000 + i, %s + 200 + i / 100 FROM generate_series(0, 5999) i",
        (start_s,),
    )
    db.execute(
        "INSERT INTO coarse SELECT 100000 + i, %s + i FROM generate_series(1, 60000) i",
        (NOW // 1000,),
    )
    db.execute("VACUUM ANALYZE coarse")
    target = kinds.expiring(pool, "coarse", TableName("coarse"), "at_s", unit="s")
    removed: list[int] = []

    stats = await target.sweep(NOW, on_batch=on_batch(removed))

    assert (stats.strategy, stats.removed) == ("index", 6_200)
    assert db.execute("SELECT count(*) FROM coarse").fetchone() == (60_000,)
    # The one span that met the crowd held more than a batch; no batch after it did.
    assert sum(1 for n in removed if n > 50) <= 1


@pytest.mark.parametrize(
    ("expired", "first"),
    [(250, "deleted"), (0, "nothing"), (2_000, None)],
    ids=["within three first batches", "none expired", "more than three first batches"],
)
async def test_a_sweep_the_planner_expects_to_fit_its_first_batch_reads_no_boundary(
    db: psycopg.Connection[Any],
    pool: AsyncConnectionPool[Any],
    monkeypatch: pytest.MonkeyPatch,
    expired: int,
    first: str | None,
) -> None:
    """Where ANALYZE's statistics put the expired rows at most three first batches (of ROWS),
    about one batch at the target, the first batch deletes them all with no boundary read, in
    one round trip, and is the sweep's last (the views then count its rows with no flush after
    it); where none is expired, it finds none and the sweep ends there. Where the planner
    expects more, the first batch reads its boundary as before."""
    fixed_batches(monkeypatch, rows=ROWS)
    unhurried_whole_batch(monkeypatch)
    reads = boundary_reads(monkeypatch)
    wholes = rest_batches(monkeypatch, "run_key_whole")
    fill(db, expired, 40_000, spacing_ms=1)
    removed: list[int] = []

    stats = await kinds.idempotency(pool).sweep(NOW, on_batch=on_batch(removed))

    assert (stats.strategy, stats.removed) == ("index", expired)
    assert db.execute("SELECT count(*) FROM x_idempotency").fetchone() == (40_000,)
    if first is None:
        assert (wholes, len(reads)) == ([], 1)
        return
    assert (wholes, reads, stats.batches) == ([first], [], 1)
    assert (stats.live_rows, stats.dead_rows, stats.live_from) == (40_000, expired, "stats")


async def test_a_run_of_one_key_at_the_top_of_a_sweep_expected_in_one_batch_is_walked(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The planner expects at most three first batches (600 here), and all 240 expired rows
    share one key (more than a batch of ROWS, which a key range cannot split): the first batch
    deletes nothing, and the boundary read after it walks the run a batch at a time, as it
    would have."""
    fixed_batches(monkeypatch, rows=ROWS)
    reads = boundary_reads(monkeypatch)
    wholes = rest_batches(monkeypatch, "run_key_whole")
    fill(db, 240, 40_000, spacing_ms=0)
    removed: list[int] = []

    stats = await kinds.idempotency(pool).sweep(NOW, on_batch=on_batch(removed))

    assert stats.removed == 240
    assert db.execute("SELECT count(*) FROM x_idempotency").fetchone() == (40_000,)
    assert wholes == ["nothing"]
    assert len(reads) >= 2
    assert max(removed) <= ROWS


@pytest.mark.usefixtures("slow_rows")
async def test_a_first_batch_by_the_estimate_that_runs_past_ten_targets_is_rolled_back(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first batch that takes every expired row by the planner's estimate runs under a
    statement_timeout of ten batch targets (here 100 ms), not the setting's 10 s: one of its
    250 rows takes 0.4 s to delete, as a stale estimate's many rows would take long. It is
    rolled back whole, the sweep goes on by boundary reads under the setting's timeout and
    removes every expired row, counted once, and it says why."""
    fixed_batches(monkeypatch, rows=ROWS)
    reads = boundary_reads(monkeypatch)
    wholes = rest_batches(monkeypatch, "run_key_whole")
    fill(db, 250, 40_000, spacing_ms=1)
    db.execute("UPDATE x_idempotency SET key = 'slow' || key WHERE key = 'k100'")
    settings = SweepSettings(batch_target_ms=10)
    assert settings.statement_timeout_ms >= 1_000  # the slow row alone would not reach it

    result, ledger = await swept_counted(pool, db, settings)

    assert result.removed == 250
    assert db.execute("SELECT count(*) FROM x_idempotency").fetchone() == (40_000,)
    assert ledger == (250,)
    assert wholes == ["QueryCanceled"]
    assert len(reads) >= 1
    assert "ran past 100 ms (10 times the batch target)" in result.advice


@pytest.mark.parametrize("column_type", ["timestamptz", "timestamp"])
async def test_a_key_python_cannot_hold_goes_with_the_rest(
    db: psycopg.Connection[Any],
    pool: AsyncConnectionPool[Any],
    monkeypatch: pytest.MonkeyPatch,
    column_type: str,
) -> None:
    """`-infinity` (an "always expired" stand-in) and a date BC are keys no Python datetime
    holds: the sweep's batches order by them on the server instead, and they go with the rest
    (an `infinity` stays: it never expires)."""
    fixed_batches(monkeypatch, rows=ROWS)
    db.execute(f"CREATE TABLE stamped (id bigint PRIMARY KEY, seen {column_type})")
    db.execute("CREATE INDEX ON stamped (seen)")
    db.execute(
        "INSERT INTO stamped SELECT 100 + i, %s::timestamptz - i * interval '1 second'"
        " FROM generate_series(1, 1000) i",
        (datetime.fromtimestamp(NOW / 1000, UTC),),
    )
    db.execute(
        "INSERT INTO stamped SELECT 10000 + i, %s::timestamptz + i * interval '1 second'"
        " FROM generate_series(1, 20000) i",
        (datetime.fromtimestamp(NOW / 1000, UTC),),
    )
    db.execute(
        "INSERT INTO stamped VALUES (1, '-infinity'), (2, '-infinity'), (3, '0044-03-15 BC'),"
        " (4, 'infinity'), (5, NULL)"
    )
    db.execute("VACUUM ANALYZE stamped")
    target = kinds.expiring(pool, "stamped", TableName("stamped"), "seen")
    activities = PurgeActivities(TargetRegistry([target]))
    env = activity_env()

    swept = await env.run(activities.purge_target, PurgeStep(name="stamped", now_ms=NOW))

    assert (swept.strategy, swept.removed) == ("index", 1_003)
    ledger = db.execute(
        "SELECT removed FROM purge_progress WHERE run_id = %s", (env.info.workflow_run_id,)
    ).fetchone()
    assert ledger == (1_003,)
    left = db.execute("SELECT id FROM stamped WHERE id < 10").fetchall()
    assert sorted(left) == [(4,), (5,)]
    assert db.execute("SELECT count(*) FROM stamped").fetchone() == (20_002,)


async def test_a_first_batch_that_takes_only_unloadable_keys_counts_them(
    db: psycopg.Connection[Any], pool: AsyncConnectionPool[Any]
) -> None:
    """A table whose only expired rows are `-infinity` and a date BC (a session ended by
    setting its expiry to `-infinity`) is swept by one first batch, which reads its greatest
    expired key beside the DELETE and loads it after the commit: a key no Python value holds
    must not lose that batch's rows from the count; the sweep goes on by the index batches."""
    db.execute("CREATE TABLE ended (id bigint PRIMARY KEY, seen timestamptz)")
    db.execute("CREATE INDEX ON ended (seen)")
    db.execute(
        "INSERT INTO ended SELECT 100 + i, %s::timestamptz + i * interval '1 second'"
        " FROM generate_series(1, 2000) i",
        (datetime.fromtimestamp(NOW / 1000, UTC),),
    )
    db.execute("INSERT INTO ended VALUES (1, '-infinity'), (2, '-infinity'), (3, '0044-03-15 BC')")
    db.execute("VACUUM ANALYZE ended")
    target = kinds.expiring(pool, "ended", TableName("ended"), "seen")
    activities = PurgeActivities(TargetRegistry([target]))
    env = activity_env()

    swept = await env.run(activities.purge_target, PurgeStep(name="ended", now_ms=NOW))

    assert swept.removed == 3
    assert db.execute("SELECT count(*) FROM ended WHERE id < 10").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM ended").fetchone() == (2_000,)
