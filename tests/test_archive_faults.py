"""Archive before delete under faults: the worker SIGKILLed and PostgreSQL crashed (immediate
shutdown) in the middle of an archiving sweep, several times a pass. After the pass, the source
and its archive together hold every original row exactly once, each column as it was, the
archive exactly the expired ones; the count (from the ledger) is exact and equals what moved.

Each batch's DELETE feeds its INSERT in one statement, so whatever dies, a row is in one table
or the other, never both and never neither: these tests kill at random points of a sweep of
1 ms batches and check every row. Each point is made to happen, not hoped for: a trigger on the
archive (`Gate`) holds the sweep's batch, its rows moved but not committed, once the archive
has taken a chosen number of rows, until the fault has struck (a whole sweep took 0.19 s on a
fast moment of this machine, faster than a watch of the archive could strike).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from temporalio.client import Client

from activities.schema import reference_ddl
from purge_dev.servers import EmbeddedPostgres
from tests.conftest import Harness
from tests.support.arranging import arranging
from tests.support.dead_worker import notice_the_dead_worker_sooner
from tests.support.faults import Fleet
from tests.support.procs import clean_env, worker_config
from tests.support.servers import RunningTemporal, running_postgres

pytestmark = pytest.mark.slow

ROWS = 100_000
HOUR = 3_600_000
#: A target has 5 attempts: at most three faults a pass leave one spare. A kill costs the killed
#: attempt's heartbeat timeout before the retry (cut from the workflow's 15 s to 5 s once the
#: worker is dead: tests.support.dead_worker), a crash only the retry's backoff.
KILLS_PER_PASS = 2
CRASHES_PER_PASS = 3
#: How long a pass may take: each faulted attempt waits out a heartbeat timeout and a retry
#: backoff of up to 18 s.
PASS_TIMEOUT = 300.0


def target_toml(archive: str) -> str:
    return f"""
[sweep]
batch_target = "1ms"

[[targets]]
kind = "expiring"
name = "audit"
table = "audit_log"
column = "created_at"
max_age = "1h"
archive_table = "{archive}.audit_log"
"""


def create(db: psycopg.Connection[Any], archive: str) -> None:
    """audit_log (identity, json, a live/expired mix to come) and its archive, whose id is an
    identity GENERATED ALWAYS too (the sweep keeps each row's own) and which adds a column."""
    db.execute(
        "CREATE TABLE audit_log (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
        " actor text NOT NULL, body jsonb, created_at bigint NOT NULL)"
    )
    db.execute("CREATE INDEX ON audit_log (created_at)")
    db.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(archive)))
    db.execute(
        sql.SQL(
            "CREATE TABLE {}.audit_log (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
            " actor text NOT NULL, body jsonb, created_at bigint NOT NULL,"
            " archived_at timestamptz NOT NULL DEFAULT now())"
        ).format(sql.Identifier(archive))
    )


def fill(db: psycopg.Connection[Any], archive: str, rng: random.Random) -> int:
    """Empty both tables and fill audit_log: a random share of rows (10% to 60%, so both the
    index and the range walk are met) hours past the 1h age, the rest minutes old; a copy of
    every row is kept in `audit_original`. How many are expired."""
    now_ms = int(time.time() * 1000)
    share = rng.uniform(0.1, 0.6)
    db.execute("DROP TABLE IF EXISTS audit_original")
    db.execute("TRUNCATE audit_log")
    db.execute(sql.SQL("TRUNCATE {}.audit_log").format(sql.Identifier(archive)))
    db.execute(
        "INSERT INTO audit_log (actor, body, created_at)"
        " SELECT 'user' || i, jsonb_build_object('i', i, 'note', md5(i::text)),"
        " CASE WHEN random() < %s THEN %s - 6 * %s - (random() * 1e8)::bigint"
        " ELSE %s - (random() * 6e5)::bigint END FROM generate_series(1, %s) i",
        (share, now_ms, HOUR, now_ms, ROWS),
    )
    db.execute("CREATE TABLE audit_original AS SELECT * FROM audit_log")
    db.execute("VACUUM ANALYZE audit_log")
    row = db.execute(
        "SELECT count(*) FROM audit_log WHERE created_at <= %s", (now_ms - 2 * HOUR,)
    ).fetchone()
    assert row is not None
    return int(row[0])


def check(db: psycopg.Connection[Any], archive: str, expired: int) -> None:
    """Source and archive hold every original row exactly once, as it was; the archive holds
    the expired ones."""
    moved = sql.SQL("SELECT id, actor, body::text, created_at FROM {}.audit_log").format(
        sql.Identifier(archive)
    )
    both = sql.SQL(
        "(SELECT id, actor, body::text, created_at FROM audit_log UNION ALL {moved})"
    ).format(moved=moved)
    original = sql.SQL("(SELECT id, actor, body::text, created_at FROM audit_original)")
    # Multisets equal: nothing in one that is not in the other, duplicates counted.
    difference = sql.SQL(
        "SELECT (SELECT count(*) FROM ({a} EXCEPT ALL {b}) x),"
        " (SELECT count(*) FROM ({b} EXCEPT ALL {a}) y)"
    ).format(a=original, b=both)
    assert db.execute(difference).fetchone() == (0, 0), "a row lost, doubled or changed"
    counts = db.execute(
        sql.SQL("SELECT count(*), count(DISTINCT id) FROM {}.audit_log").format(
            sql.Identifier(archive)
        )
    ).fetchone()
    assert counts == (expired, expired)


class Gate:
    """The archive's gate: a row trigger that counts the rows the archive takes, committed or
    not, and holds the batch that would take one past `hold` (sleeping in the trigger: the
    batch's rows are moved, uncommitted) until the hold is raised. A connection of the test's
    own sets it and sees the held batch, reconnecting after a crash."""

    def __init__(self, url: str, archive: str) -> None:
        self.url, self.archive = url, archive
        self.conn: psycopg.AsyncConnection[Any] | None = None

    @staticmethod
    def create(db: psycopg.Connection[Any], archive: str) -> None:
        schema = sql.Identifier(archive)
        db.execute(sql.SQL("CREATE TABLE {}.gate_count (taken bigint NOT NULL)").format(schema))
        db.execute(sql.SQL("CREATE TABLE {}.gate_hold (hold bigint)").format(schema))
        db.execute(sql.SQL("INSERT INTO {}.gate_count VALUES (0)").format(schema))
        db.execute(sql.SQL("INSERT INTO {}.gate_hold VALUES (NULL)").format(schema))
        # The count's row is the held batch's to update, so the hold is a table of its own
        # that the test updates while the batch waits. A worker killed while its batch waits
        # leaves a session that notices its client gone within 100 ms and rolls back.
        db.execute(
            sql.SQL(
                "CREATE FUNCTION {s}.gate() RETURNS trigger LANGUAGE plpgsql"
                " SET client_connection_check_interval = 100 AS $$"
                " DECLARE n bigint; BEGIN"
                " UPDATE {s}.gate_count SET taken = taken + 1 RETURNING taken INTO n;"
                " WHILE n > coalesce((SELECT hold FROM {s}.gate_hold), n) LOOP"
                " PERFORM pg_sleep(0.005); END LOOP;"
                " RETURN NEW; END $$"
            ).format(s=schema)
        )
        db.execute(
            sql.SQL(
                "CREATE TRIGGER gate BEFORE INSERT ON {s}.audit_log"
                " FOR EACH ROW EXECUTE FUNCTION {s}.gate()"
            ).format(s=schema)
        )

    async def _run(self, query: sql.Composable, params: tuple[Any, ...] = ()) -> Any:
        """One statement on the gate's connection, retried over a server's restart (a minute)."""
        async with asyncio.timeout(60):
            while True:
                try:
                    if self.conn is None:
                        self.conn = await psycopg.AsyncConnection.connect(
                            self.url, autocommit=True, connect_timeout=2
                        )
                    cur = await self.conn.execute(query, params)
                    return await cur.fetchone() if cur.description else None
                except psycopg.OperationalError:
                    await self.close()
                    await asyncio.sleep(0.05)

    async def reset(self, hold: int) -> None:
        """A pass's first hold, the count at 0 (the archive emptied for it)."""
        schema = sql.Identifier(self.archive)
        await self._run(sql.SQL("UPDATE {}.gate_count SET taken = 0").format(schema))
        await self.set(hold)

    async def set(self, hold: int | None) -> None:
        """Hold the batch that would take the archive past `hold` rows; None lets all go."""
        query = sql.SQL("UPDATE {}.gate_hold SET hold = %s").format(sql.Identifier(self.archive))
        await self._run(query, (hold,))

    async def now(self) -> Any:
        """The server's clock, to tell sessions started after a fault from those before it."""
        return (await self._run(sql.SQL("SELECT clock_timestamp()")))[0]

    async def until_held(self, done: asyncio.Future[Any], since: Any | None) -> None:
        """Returns once a sweep's batch (a session named temporal-pg-purge, started after
        `since` when given) sleeps in the gate; fails if the pass ended first."""
        query = sql.SQL(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'temporal-pg-purge'"
            " AND wait_event = 'PgSleep' AND (%s::timestamptz IS NULL OR backend_start > %s)"
        )
        async with asyncio.timeout(PASS_TIMEOUT):
            while not (await self._run(query, (since, since)))[0]:
                assert not done.done(), f"the pass ended before its sweep reached the gate: {done}"
                await asyncio.sleep(0.01)

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()
            self.conn = None


@pytest.fixture
def rng() -> random.Random:
    """PURGE_FAULT_SEED replays a run's choices (not the timing they meet)."""
    seed = int(os.environ.get("PURGE_FAULT_SEED") or random.randrange(2**32))
    print(f"PURGE_FAULT_SEED={seed}")
    return random.Random(seed)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Callable[[Path, dict[str, str]], Fleet]]:
    made: list[Fleet] = []

    def make(config: Path, env: dict[str, str]) -> Fleet:
        made.append(Fleet(config, env, tmp_path / f"workers-{len(made)}"))
        return made[-1]

    try:
        yield make
    finally:
        for each in made:
            each.close()
            print(each.logs())


async def run_pass(
    client: Client,
    task_queue: str,
    fault: Callable[[str], Any],
    faults: int,
    gate: Gate,
    expired: int,
    rng: random.Random,
) -> dict[str, Any]:
    """A pass of `audit`, with `fault` injected at `faults` random points of its sweep: at each,
    once the archive has taken a random share of the expired rows, the batch that would take
    more held in the gate, its rows moved and not committed, until the fault has struck."""
    holds = sorted(int(expired * rng.uniform(0.05, 0.9)) for _ in range(faults))
    await gate.reset(holds[0])
    handle = await client.start_workflow(
        "Purge", {"targets": ["audit"]}, id=f"purge-archive-{uuid.uuid4()}", task_queue=task_queue
    )
    result = asyncio.ensure_future(handle.result())
    try:
        since = None
        for hold in holds:
            await gate.set(hold)
            # A session from before the last fault (a killed worker's, until it notices) is
            # not the sweep that goes on.
            await gate.until_held(result, since)
            since = await gate.now()
            await fault(handle.id)
        await gate.set(None)
        out: dict[str, Any] = await asyncio.wait_for(result, PASS_TIMEOUT)
        return out
    finally:
        if not result.done():
            result.cancel()
            await handle.terminate("the test ended")


async def test_worker_sigkilled_mid_archive_leaves_every_row_once(
    tmp_path: Path,
    harness: Harness,
    temporal_server: RunningTemporal,
    fleet: Callable[[Path, dict[str, str]], Fleet],
    rng: random.Random,
) -> None:
    archive = f"{harness.schema}_archive"
    create(harness.db, archive)
    Gate.create(harness.db, archive)
    config = worker_config(
        tmp_path / "purge.toml", harness.url, harness.task_queue, target_toml(archive)
    )
    workers = fleet(config, clean_env(TEMPORAL_ADDRESS=temporal_server.address))
    gate = Gate(harness.url, archive)
    kills = 0

    async def kill(workflow_id: str) -> None:
        nonlocal kills
        workers.kill()
        kills += 1
        await notice_the_dead_worker_sooner(harness.client, workflow_id)
        workers.start()

    try:
        for _ in range(2):
            expired = fill(harness.db, archive, rng)
            if not workers.alive:
                workers.start()
            result = await run_pass(
                harness.client, harness.task_queue, kill, KILLS_PER_PASS, gate, expired, rng
            )
            [swept] = result["swept"]
            assert (swept["removed"], swept["archived"]) == (expired, expired), swept
            check(harness.db, archive, expired)
    finally:
        await gate.close()
        harness.db.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(archive)))
    assert kills == 2 * KILLS_PER_PASS


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[EmbeddedPostgres]:
    """A server of this module's own to crash and start again (its port and data stay)."""
    with running_postgres("purge-archive-pg-") as server:
        yield server


async def test_postgres_crashed_mid_archive_leaves_every_row_once(
    tmp_path: Path,
    client: Client,
    temporal_server: RunningTemporal,
    task_queue: str,
    own_postgres: EmbeddedPostgres,
    fleet: Callable[[Path, dict[str, str]], Fleet],
    rng: random.Random,
) -> None:
    """Immediate shutdown (a crash: no checkpoint, recovery from WAL on start) at random points
    of the sweep, started again 0.1-1.5 s later; one worker rides through them all."""
    url = own_postgres.url()
    archive = "archive"
    with arranging(url) as db:
        db.execute(reference_ddl())  # purge_progress: the count stays exact through crashes
        create(db, archive)
        Gate.create(db, archive)
        expired = fill(db, archive, rng)
    config = worker_config(tmp_path / "purge.toml", url, task_queue, target_toml(archive))
    workers = fleet(config, clean_env(TEMPORAL_ADDRESS=temporal_server.address))
    worker = workers.start()
    gate = Gate(url, archive)
    crashes = 0

    async def crash(_workflow_id: str) -> None:
        nonlocal crashes
        await asyncio.to_thread(own_postgres.stop, immediate=True)
        crashes += 1
        await asyncio.sleep(rng.uniform(0.1, 1.5))
        await asyncio.to_thread(own_postgres.start)

    try:
        result = await run_pass(client, task_queue, crash, CRASHES_PER_PASS, gate, expired, rng)
    finally:
        await gate.close()
    [swept] = result["swept"]
    assert (swept["removed"], swept["archived"]) == (expired, expired), swept
    with arranging(url) as db:
        check(db, archive, expired)
    assert crashes == CRASHES_PER_PASS
    assert worker.poll() is None, "the worker did not ride through the crashes"
