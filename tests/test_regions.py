"""Workers next to their databases: one pass, each database's activities on its own task
queue, swept by workers whose configs hold only their own database's URL. The default run's
workers are `run_worker` in this process (what `pg-purge run` runs, from a config read with only
that region's URL in its environment); the slow SIGKILL test's are worker processes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from temporalio.api.enums.v1 import EventType, TaskQueueType
from temporalio.client import Client
from temporalio.service import RPCError

from activities.builtin_kinds import build_registry
from activities.engine.batching import FIRST_ROWS
from activities.results import PurgeReport
from activities.schema import reference_ddl
from purge_config.file import PurgeConfig, parse_config
from purge_ops.runner import run_worker
from purge_ops.schedule import ensure_schedules
from tests.conftest import Harness
from tests.support.arranging import arranging
from tests.support.dead_worker import notice_the_dead_worker_sooner
from tests.support.history import events
from tests.support.passes import LISTING_WAIT_S, failed_pass, held_input, run_pass, until_polled
from tests.support.procs import clean_env, identity, run_main, start_worker, stop, wait_for
from tests.support.rows import HOUR
from tests.support.servers import RunningTemporal

REGIONS = ("eu", "us")


@pytest.fixture
def regions(pg_url: str) -> Iterator[dict[str, str]]:
    """A database per region, with the built-in tables."""
    names = {region: f"region_{region}_{uuid.uuid4().hex[:8]}" for region in REGIONS}
    with psycopg.connect(pg_url, autocommit=True) as admin:
        for name in names.values():
            admin.execute(f'CREATE DATABASE "{name}"')
    urls = {region: make_conninfo(pg_url, dbname=name) for region, name in names.items()}
    for url in urls.values():
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(reference_ddl())
    try:
        yield urls
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            for name in names.values():
                admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def region_toml(task_queue: str, regions: tuple[str, ...], worker_wait: str = "5m") -> str:
    """A config naming `regions` only: each its database by `url_env`, its own task queue, and
    its idempotency target. No database_url: no target sweeps a default database."""
    text = f'task_queue = "{task_queue}"\n[pass]\nworker_wait = "{worker_wait}"\n'
    for region in regions:
        text += (
            f'[databases.{region}]\nurl_env = "{region.upper()}_URL"\n'
            f'task_queue = "{task_queue}-{region}"\n'
        )
    for region in regions:
        text += f'[[targets]]\nkind = "idempotency"\nname = "x_idempotency@{region}"\n'
        text += f'database = "{region}"\n'
    return text


def full_config(task_queue: str, worker_wait: str = "5m") -> PurgeConfig:
    """The scheduler's view: every region, no URL at all."""
    return parse_config(tomllib.loads(region_toml(task_queue, REGIONS, worker_wait)), env={})


def add_rows(url: str, now: int, count: int = 3) -> int:
    """`count` expired keys and one live one; the expired count."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO x_idempotency (key, expires_at_ms) "
            "SELECT 'k' || g || '-' || %s, %s FROM generate_series(1, %s) g",
            (uuid.uuid4().hex[:6], now - HOUR, count),
        )
        conn.execute(
            "INSERT INTO x_idempotency (key, expires_at_ms) VALUES (%s, %s)",
            (f"live-{uuid.uuid4().hex[:6]}", now + HOUR),
        )
    return count


def left(url: str, now: int) -> tuple[int, int]:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE expires_at_ms <= %s), "
            "count(*) FILTER (WHERE expires_at_ms > %s) FROM x_idempotency",
            (now, now),
        ).fetchone()
        assert row is not None
        return row[0], row[1]


class Region:
    """A worker process next to one region's database: its config names only that region,
    and only that region's URL is in its environment."""

    def __init__(
        self,
        tmp_path: Path,
        region: str,
        url: str,
        task_queue: str,
        address: str,
        tag: str = "",
        sweep: str = "",
    ) -> None:
        self.config = tmp_path / f"{region}{tag}.toml"
        # `sweep`: a `[sweep]` table's lines (its bounds change no task queue's name).
        tail = f"[sweep]\n{sweep}" if sweep else ""
        self.config.write_text(region_toml(task_queue, (region,)) + tail, encoding="utf-8")
        self.env = clean_env(TEMPORAL_ADDRESS=address, **{f"{region.upper()}_URL": url})
        self.log = tmp_path / f"{region}{tag}.log"
        self.proc: Any = None

    def start(self) -> Region:
        self.proc = start_worker(self.config, self.env, self.log)
        wait_for(lambda: "also polling task queue" in self.text(), 60, "the worker to poll")
        return self

    def text(self) -> str:
        return self.log.read_text(encoding="utf-8") if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)


class RegionWorker:
    """`pg-purge run` next to one region's database, in this process: `run_worker` with a config
    that names only that region, read with only that region's URL in its environment."""

    def __init__(
        self, region: str, url: str, task_queue: str, address: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        self.config = parse_config(
            tomllib.loads(region_toml(task_queue, (region,))), env={f"{region.upper()}_URL": url}
        )
        self.polls = f"also polling task queue '{task_queue}-{region}' for the activities of "
        self.region = region
        self.address = address
        self.caplog = caplog
        self.stopping = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> RegionWorker:
        self.caplog.set_level(logging.INFO, logger="purge.worker")
        self.task = asyncio.create_task(
            run_worker(self.config, stop=self.stopping, temporal_address=self.address)
        )
        while self.polls not in self.caplog.text:  # logged once every queue is polled
            assert not self.task.done(), f"the worker stopped: {self.task.exception()!r}"
            await asyncio.sleep(0.02)
        # Logged as its pollers start, not once a poll reached the server: a pass started now,
        # under a short worker_wait, would race the worker's first poll of its region's queue.
        client = await Client.connect(self.address)
        queue = self.config.routed_queues[self.region]
        await until_polled(client, queue, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)
        return self

    async def stop(self) -> None:
        self.stopping.set()
        if self.task is not None:
            await self.task


def activity_runs(client: Client, history: list[Any]) -> dict[str, tuple[str, str]]:
    """Per swept target: (the task queue its activity was scheduled on, the worker that ran
    its last attempt)."""
    scheduled: dict[int, tuple[str, str]] = {}
    runs: dict[str, tuple[str, str]] = {}
    for e in history:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = e.activity_task_scheduled_event_attributes
            [step] = client.data_converter.payload_converter.from_payloads(attrs.input.payloads)
            name = step["name"]
            scheduled[e.event_id] = (name, attrs.task_queue.name)
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs = e.activity_task_started_event_attributes
            name, queue = scheduled[attrs.scheduled_event_id]
            runs[name] = (queue, attrs.identity)
    return runs


async def test_one_pass_sweeps_each_database_on_its_own_queue_by_the_worker_next_to_it(
    client: Client,
    temporal_server: RunningTemporal,
    task_queue: str,
    regions: dict[str, str],
    real_now: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    expected = {
        region: add_rows(url, real_now, count)
        for (region, url), count in zip(regions.items(), (3, 5), strict=True)
    }
    workers = {
        region: RegionWorker(region, url, task_queue, temporal_server.address, caplog)
        for region, url in regions.items()
    }
    try:
        for worker in workers.values():
            await worker.start()
        config = full_config(task_queue)
        # Each says which queues it polls, for which database, and that it has no other's URL:
        # the queue of passes from a config that says the same of eu's targets, and eu's own.
        eu_queue = config.routed_queues["eu"]
        assert eu_queue.startswith(f"{task_queue}-eu:")
        assert f"also polling task queue {eu_queue!r} for the activities of database eu\n" in (
            caplog.text
        )
        assert (
            f"also polling task queue '{task_queue}-eu' for the activities of database eu in "
            "passes typed by hand"
        ) in caplog.text
        workflow_id = f"purge-regions-{uuid.uuid4()}"
        result = await run_pass(client, task_queue, config.pass_input(), workflow_id)
    finally:
        for worker in workers.values():
            await worker.stop()

    assert {s["name"]: s["removed"] for s in result["swept"]} == {
        f"x_idempotency@{region}": count for region, count in expected.items()
    }
    for url in regions.values():
        assert left(url, real_now) == (0, 1)
    # Each region's sweep was scheduled on, and taken from, its own queue, which only the worker
    # with that region's URL polls.
    runs = activity_runs(client, await events(client, workflow_id))
    assert {name: queue for name, (queue, _) in runs.items()} == {
        f"x_idempotency@{region}": config.routed_queues[region] for region in REGIONS
    }


@pytest.mark.waits
async def test_a_region_without_a_worker_fails_alone_naming_its_queue_then_is_swept_again(
    client: Client,
    temporal_server: RunningTemporal,
    task_queue: str,
    regions: dict[str, str],
    real_now: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    add_rows(regions["eu"], real_now)
    us_expired = add_rows(regions["us"], real_now, 4)
    eu = RegionWorker("eu", regions["eu"], task_queue, temporal_server.address, caplog)
    us = RegionWorker("us", regions["us"], task_queue, temporal_server.address, caplog)
    config = full_config(task_queue, worker_wait="2s")
    try:
        await eu.start()
        error = await failed_pass(
            client, task_queue, config.pass_input(), f"purge-regions-{uuid.uuid4()}"
        )
        assert error.type == "PurgeTargetsFailed"
        report = error.details[0]
        [failed] = report["failed"]
        assert failed["name"] == "x_idempotency@us"
        assert failed["type"] == "NoPurgeWorker"
        assert f"task queue {config.routed_queues['us']!r} (database 'us')" in failed["message"]
        assert "each worker says at start which queues it polls" in failed["message"]
        assert [s["name"] for s in report["swept"]] == ["x_idempotency@eu"]
        assert left(regions["eu"], real_now) == (0, 1)
        assert left(regions["us"], real_now) == (us_expired, 1)

        await us.start()
        # The queue the failure named is the one the right worker says at start it polls.
        assert f"also polling task queue {config.routed_queues['us']!r}" in caplog.text
        # Both queues polled, so this pass's worker_wait is the config's own (5 minutes): 2 s
        # would ask eu's worker to poll again within them after its sweep of the first pass,
        # which a loaded machine can miss (a NoPurgeWorker of nothing this test is about).
        again = full_config(task_queue)
        assert again.routed_queues == config.routed_queues
        result = await run_pass(client, task_queue, again.pass_input())
    finally:
        await eu.stop()
        await us.stop()
    assert {s["name"]: s["removed"] for s in result["swept"]} == {
        "x_idempotency@eu": 0,
        "x_idempotency@us": us_expired,
    }


def shared_toml(task_queue: str, worker_wait: str) -> str:
    """Every region's database routed to one task queue, each by its own `url_env`."""
    text = f'task_queue = "{task_queue}"\n[pass]\nworker_wait = "{worker_wait}"\n'
    for region in REGIONS:
        text += (
            f'[databases.{region}]\nurl_env = "{region.upper()}_URL"\n'
            f'task_queue = "{task_queue}-shared"\n'
        )
    for region in REGIONS:
        text += f'[[targets]]\nkind = "idempotency"\nname = "x_idempotency@{region}"\n'
        text += f'database = "{region}"\n'
    return text


@pytest.mark.waits
async def test_a_worker_without_every_url_of_a_shared_queue_polls_none_of_it(
    client: Client,
    temporal_server: RunningTemporal,
    task_queue: str,
    regions: dict[str, str],
    real_now: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two databases routed to one task queue: a worker with the URL of one of them only would
    take the other's activities too and fail them (a target it does not know). It polls none
    of that queue and says why, so a pass it alone serves fails both targets for want of a
    worker (NoPurgeWorker, after worker_wait), and once a worker with both URLs runs beside it,
    that one sweeps both."""
    eu_expired = add_rows(regions["eu"], real_now)
    us_expired = add_rows(regions["us"], real_now, 4)
    text = tomllib.loads(shared_toml(task_queue, "2s"))
    scheduler = parse_config(text, env={})
    partial = parse_config(text, env={"EU_URL": regions["eu"]})
    both = parse_config(text, env={"EU_URL": regions["eu"], "US_URL": regions["us"]})
    caplog.set_level(logging.INFO, logger="purge.worker")
    stops = [asyncio.Event(), asyncio.Event()]
    address = temporal_server.address
    tasks = [asyncio.create_task(run_worker(partial, stop=stops[0], temporal_address=address))]
    try:
        async with asyncio.timeout(60):  # its start lines, logged before it polls
            while "taking no activity from task queue" not in caplog.text:
                assert not tasks[0].done(), f"the worker stopped: {tasks[0].exception()!r}"
                await asyncio.sleep(0.02)
        assert (
            f"not polling task queue '{task_queue}-shared' of database eu: databases us share it"
        ) in caplog.text
        error = await failed_pass(
            client, task_queue, scheduler.pass_input(), f"purge-shared-{uuid.uuid4()}"
        )
        failed = {f["name"]: f["type"] for f in error.details[0]["failed"]}
        assert failed == dict.fromkeys([f"x_idempotency@{r}" for r in REGIONS], "NoPurgeWorker")
        assert left(regions["eu"], real_now) == (eu_expired, 1)

        tasks.append(asyncio.create_task(run_worker(both, stop=stops[1], temporal_address=address)))
        kind = TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY
        await until_polled(client, scheduler.routed_queues["eu"], kind)
        # The shared queue polled now, this pass waits the default worker_wait (5 minutes): under
        # 2 s, the worker's poll again after its first sweep, late on a loaded machine, would
        # fail the second target as NoPurgeWorker, which this test is not about.
        patient = parse_config(tomllib.loads(shared_toml(task_queue, "5m")), env={})
        assert patient.routed_queues == scheduler.routed_queues
        result = await run_pass(client, task_queue, patient.pass_input())
    finally:
        for stop, task in zip(stops, tasks, strict=False):
            stop.set()
            await task
    assert {s["name"]: s["removed"] for s in result["swept"]} == {
        "x_idempotency@eu": eu_expired,
        "x_idempotency@us": us_expired,
    }


#: The advisory lock the regional kill test's deletes wait for once past the first batch.
KILL_GATE = 4_243


def held_at_gate(gate: psycopg.Connection[Any]) -> bool:
    """Whether a session waits for KILL_GATE (a bigint advisory key: its low half in objid)."""
    row = gate.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND objid = %s AND objsubid = 1",
        (KILL_GATE,),
    ).fetchone()
    return bool(row and row[0])


@pytest.mark.slow
async def test_sigkill_of_a_regional_worker_mid_target_loses_nothing(
    tmp_path: Path,
    client: Client,
    temporal_server: RunningTemporal,
    task_queue: str,
    regions: dict[str, str],
    real_now: int,
) -> None:
    """A second worker on the same regional queue takes the killed attempt's retry; the
    count is exact from the database's ledger."""
    from tests.test_batching import slow_deletes

    # 3,000 expired keys among 30,000, in no order (index batches, small ones), each taking a
    # millisecond to delete: seconds of short batches, each committed with its ledger count.
    # Past the first batch's rows (FIRST_ROWS: no order, so no more), each row's delete waits
    # for a gate (an advisory lock) the test holds until its kill: the kill lands with a batch
    # committed and the next one held, however slow this machine.
    with arranging(regions["eu"]) as conn:
        conn.execute(
            "INSERT INTO x_idempotency (key, expires_at_ms)"
            " SELECT 'k' || i, CASE WHEN i <= 3000 THEN %s ELSE %s END"
            " FROM generate_series(1, 30000) i ORDER BY random()",
            (real_now - HOUR, real_now + HOUR),
        )
        conn.execute("ANALYZE x_idempotency")
        slow_deletes(conn, "x_idempotency")
        conn.execute("CREATE SEQUENCE deleted_rows")
        conn.execute(
            "CREATE OR REPLACE FUNCTION slow_delete() RETURNS trigger LANGUAGE plpgsql AS"
            " $$BEGIN PERFORM pg_sleep(0.001);"
            f" IF nextval('deleted_rows') > {FIRST_ROWS + 100} THEN"
            f" PERFORM pg_advisory_xact_lock_shared({KILL_GATE}); END IF; RETURN OLD; END$$"
        )
    add_rows(regions["us"], real_now)
    # The batch at the gate waits until the test lets it go, for up to 60 s: its wait is a
    # lock's (lock_timeout 60 s, not the default 2 s) inside its DELETE (statement_timeout
    # 120 s, not the default 10 s, so the wait and the rows after it fit in one statement).
    # With 2 s, a test slow to see it there and kill the worker left it failing attempt after
    # attempt, and the retry could fail on the killed worker's orphaned batch's rows too.
    patient = 'lock_timeout = "60s"\nstatement_timeout = "120s"\n'
    address = temporal_server.address
    first = Region(tmp_path, "eu", regions["eu"], task_queue, address, "1", patient)
    second = Region(tmp_path, "eu", regions["eu"], task_queue, address, "2", patient)
    us = Region(tmp_path, "us", regions["us"], task_queue, temporal_server.address)
    config = full_config(task_queue)
    workflow_id = f"purge-regions-{uuid.uuid4()}"
    gate = psycopg.connect(regions["eu"], autocommit=True)
    try:
        gate.execute("SELECT pg_advisory_lock(%s)", (KILL_GATE,))
        first.start()
        us.start()
        handle = await client.start_workflow(
            "Purge", config.pass_input(), id=workflow_id, task_queue=task_queue
        )
        wait_for(lambda: held_at_gate(gate), 120, "a batch to wait at the gate")
        assert left(regions["eu"], real_now)[0] < 3000, "no batch committed before the gate"
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(10)
        # The killed worker's held batch goes on, in its orphaned backend.
        gate.execute("SELECT pg_advisory_unlock(%s)", (KILL_GATE,))
        second.start()
        await notice_the_dead_worker_sooner(client, workflow_id)
        result = await handle.result()
    finally:
        gate.close()
        for worker in (first, second, us):
            worker.stop()
    removed = {s["name"]: s for s in result["swept"]}
    assert removed["x_idempotency@eu"]["removed"] == 3000
    assert removed["x_idempotency@eu"]["lower_bound"] is False
    assert removed["x_idempotency@eu"]["worker"] == identity(second.proc)
    assert left(regions["eu"], real_now) == (0, 27_000)


@pytest.mark.parametrize("queue", ["", "has space", "x" * 201, 7])
def test_a_database_task_queue_that_is_no_queue_name_is_one_line(queue: object) -> None:
    from purge_config.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        parse_config(
            {"databases": {"eu": {"url_env": "EU_URL", "task_queue": queue}}},
            Path("purge.toml"),
            env={},
        )
    message = str(refused.value)
    assert message.startswith("purge.toml: databases.eu.task_queue: not a task queue name")
    assert "\n" not in message


def test_the_scheduler_needs_no_regional_url_and_the_input_names_queues_not_urls() -> None:
    config = full_config("purge", worker_wait="90s")
    assert config.databases == {}
    assert not config.needs_default_database
    request = config.pass_input()
    assert request["queues"] == config.routed_queues
    assert set(config.routed_queues) == {"eu", "us"}
    assert config.routed_queues["eu"].startswith("purge-eu:")
    assert request["worker_wait_ms"] == 90_000
    # Every target has a queue of its database's: this config has no queue of its own.
    assert config.own_queue is None
    # A config with targets of its own routes them to its own queue.
    plain = parse_config({"targets": [{"kind": "idempotency"}]}, env={})
    assert plain.pass_input()["queues"] == {"_default": plain.own_queue}


@pytest.mark.parametrize("central_first", [True, False], ids=["central-first", "regional-first"])
async def test_a_regional_and_a_central_worker_in_either_order_fail_no_target(
    client: Client,
    temporal_server: RunningTemporal,
    task_queue: str,
    regions: dict[str, str],
    real_now: int,
    caplog: pytest.LogCaptureFixture,
    central_first: bool,
) -> None:
    """A central worker (the default database and its target, eu's queue left to others) and a
    worker next to eu, started in either order: eight passes of the config and eight typed by
    hand (no route for the default database's target) all complete. The regional worker takes
    no activity from the pass's queue, where it would fail the central target it does not know."""
    central_toml = (
        f"database_url = {regions['us']!r}\n"
        + region_toml(task_queue, ("eu",))
        + '[[targets]]\nkind = "idempotency"\n'
    )
    central = parse_config(tomllib.loads(central_toml), env={})
    assert "eu" not in central.databases
    regional = RegionWorker("eu", regions["eu"], task_queue, temporal_server.address, caplog)
    stopping = asyncio.Event()
    caplog.set_level(logging.INFO, logger="purge.worker")
    started: list[asyncio.Task[None]] = []

    async def start_central() -> None:
        started.append(
            asyncio.create_task(
                run_worker(central, stop=stopping, temporal_address=temporal_server.address)
            )
        )
        while "for the activities of its own targets (x_idempotency)" not in caplog.text:
            assert not started[0].done(), f"the worker stopped: {started[0].exception()!r}"
            await asyncio.sleep(0.02)

    typed = {
        "targets": ["x_idempotency", "x_idempotency@eu"],
        "databases": {"x_idempotency@eu": "eu"},
        "queues": {"eu": f"{task_queue}-eu"},
    }
    try:
        if central_first:
            await start_central()
            await regional.start()
        else:
            await regional.start()
            await start_central()
        assert f"taking no activity from task queue {task_queue!r}" in caplog.text
        results = await asyncio.gather(
            *(run_pass(client, task_queue, central.pass_input()) for _ in range(8)),
            *(run_pass(client, task_queue, typed) for _ in range(8)),
        )
    finally:
        stopping.set()
        await regional.stop()
        for task in started:
            await task

    for result in results:
        assert [s["status"] for s in result["swept"]] == ["ok", "ok"], result


async def test_a_pass_typed_by_hand_without_routes_says_why_a_routed_target_is_not_here(
    harness: Harness,
) -> None:
    """`temporal workflow execute --input '{"targets": [...]}'` sends every activity to the
    pass's own queue: a worker there whose config names the target but has no URL for its
    database says so, and how to route it, not that it knows no such target."""
    config = full_config(harness.task_queue)
    async with harness.run_worker(build_registry(config, harness.pool)):
        error = await failed_pass(
            harness.client,
            harness.task_queue,
            {"targets": ["x_idempotency@eu"]},
            f"purge-{uuid.uuid4()}",
        )
    [failure] = PurgeReport.from_json(error.details[0]).failed

    assert (failure.name, failure.type) == ("x_idempotency@eu", "UnknownPurgeTarget")
    assert failure.message == (
        "target 'x_idempotency@eu' sweeps database 'eu', which this worker has no URL for: the "
        "pass's input does not route it to that database's workers (a pass typed by hand needs "
        'the config\'s "databases" and "queues": `pg-purge schedule --print-input` prints them)'
    )


async def test_a_regional_worker_started_with_schedule_leaves_the_central_schedule_as_it_is(
    tmp_path: Path,
    client: Client,
    temporal_server: RunningTemporal,
    task_queue: str,
    regions: dict[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker next to eu started with `--schedule` (its config names eu alone, with the same
    schedule id) beside the scheduler's schedule over eu and the default database: writing its
    own would drop the default database's target from every pass, so it leaves the schedule as
    it is and warns. `pg-purge schedule` from that config, typed by an operator, writes it and
    says what it drops; so does a worker of a config with targets of its own (the scheduler's
    kind, which may retire a database at a deploy)."""
    schedule_id = f"purge-regions-{uuid.uuid4().hex[:8]}"
    block = f'[schedule]\nid = "{schedule_id}"\ncron = "0 0 1 1 *"\n'
    central_toml = (
        f"database_url = {regions['us']!r}\n"
        + region_toml(task_queue, ("eu",))
        + '[[targets]]\nkind = "idempotency"\n'
        + block
    )
    central = parse_config(tomllib.loads(central_toml), env={})
    regional_toml = tmp_path / "eu.toml"
    regional_toml.write_text(region_toml(task_queue, ("eu",)) + block, encoding="utf-8")
    regional = parse_config(tomllib.loads(regional_toml.read_text()), env={"EU_URL": regions["eu"]})
    handle = client.get_schedule_handle(schedule_id)

    async def targets() -> list[str]:
        return list((await held_input(client, schedule_id))["targets"])

    [made] = await ensure_schedules(client, central)
    try:
        assert made.action == "created"
        caplog.set_level(logging.INFO, logger="purge.worker")
        stopping = asyncio.Event()
        worker = asyncio.create_task(
            run_worker(
                regional,
                stop=stopping,
                temporal_address=temporal_server.address,
                ensure_schedule=True,
            )
        )
        try:
            while "also polling task queue" not in caplog.text:  # past the schedule's write
                assert not worker.done(), f"the worker stopped: {worker.exception()!r}"
                await asyncio.sleep(0.02)
        finally:
            stopping.set()
            await worker
        [left] = [r for r in caplog.records if r.getMessage().startswith("left as it is")]
        assert left.levelno == logging.WARNING
        assert left.getMessage() == (
            f"left as it is schedule {schedule_id}: its passes sweep 1 target on the default "
            "database, which this config names no target on, and every target of this config "
            "has a database queue of its own (a regional worker's config): a worker writes no "
            "schedule that would drop them. Write it with `pg-purge schedule` from the config "
            "that names every database of the pass (from this one, if it drops them on "
            "purpose), or give this config's schedule another `id` under [schedule]"
        )
        assert await targets() == ["x_idempotency@eu", "x_idempotency"]

        env = clean_env(TEMPORAL_ADDRESS=temporal_server.address, EU_URL=regions["eu"])
        done = await asyncio.to_thread(
            run_main, "schedule", "--config", str(regional_toml), env=env
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"updated schedule {schedule_id}: ")
        assert "\ndrops 1 target on the default database: its passes no longer sweep them\n" in (
            done.stdout
        )
        assert await targets() == ["x_idempotency@eu"]

        # The scheduler's kind of config (a target of its own) drops eu at a deploy.
        await ensure_schedules(client, central)
        retired = parse_config(
            tomllib.loads(
                f"database_url = {regions['us']!r}\n"
                + f'task_queue = "{task_queue}"\n'
                + '[[targets]]\nkind = "idempotency"\n'
                + block
            ),
            env={},
        )
        [by_its_worker] = await ensure_schedules(client, retired, by_worker=True)
        assert (by_its_worker.action, by_its_worker.warns) == ("updated", True)
        assert by_its_worker.summary.endswith(
            "\ndrops 1 target on database eu: its passes no longer sweep them"
        )
        assert await targets() == ["x_idempotency"]
    finally:
        await handle.delete()


async def test_a_regional_worker_creates_no_schedule_beside_another_config_s_and_calls_none_left(
    client: Client, task_queue: str, regions: dict[str, str]
) -> None:
    """The scheduler's config names its schedule one id, a regional config (the same task
    queue, eu alone) another: a regional worker started with `--schedule` once created its own
    beside it (every pass's eu target swept twice an hour) and called the scheduler's `left
    behind`, to be deleted. It now creates none beside a schedule whose passes sweep its
    targets, warning why, and calls none left behind; a regional worker of another database
    (no schedule sweeps its targets) creates its own; an operator's `pg-purge schedule` from
    the first config still writes its own, and calls the scheduler's none either."""
    central_id = f"purge-central-{uuid.uuid4().hex[:8]}"
    regional_id = f"purge-eu-{uuid.uuid4().hex[:8]}"
    cron = 'cron = "0 0 1 1 *"\n'
    central = parse_config(
        tomllib.loads(
            f"database_url = {regions['us']!r}\n"
            + region_toml(task_queue, ("eu",))
            + '[[targets]]\nkind = "idempotency"\n'
            + f'[schedule]\nid = "{central_id}"\n{cron}'
        ),
        env={},
    )
    regional = parse_config(
        tomllib.loads(
            region_toml(task_queue, ("eu",)) + f'[schedule]\nid = "{regional_id}"\n{cron}'
        ),
        env={"EU_URL": regions["eu"]},
    )
    # A second regional config, us alone, its own id: no schedule sweeps its targets.
    us_id = f"purge-us-{uuid.uuid4().hex[:8]}"
    us = parse_config(
        tomllib.loads(region_toml(task_queue, ("us",)) + f'[schedule]\nid = "{us_id}"\n{cron}'),
        env={"US_URL": regions["us"]},
    )
    [made] = await ensure_schedules(client, central)
    try:
        # The list of schedules the guard reads is a visibility read, which lags (seconds on a
        # loaded machine): the moment the test needs is the central one listed.
        async with asyncio.timeout(LISTING_WAIT_S):
            while central_id not in [s.id async for s in await client.list_schedules()]:
                await asyncio.sleep(0.1)
        by_worker = await ensure_schedules(client, regional, by_worker=True)
        by_us_worker = await ensure_schedules(client, us, by_worker=True)
        by_operator = await ensure_schedules(client, regional)
    finally:
        for made_id in (central_id, regional_id, us_id):
            with contextlib.suppress(RPCError):
                await client.get_schedule_handle(made_id).delete()

    assert made.action == "created"
    [left] = by_worker
    assert (left.action, left.warns) == ("left as it is", True)
    assert left.summary.startswith(
        f"schedule {regional_id}: not created: {central_id} start passes on task queue "
        f"{task_queue!r} that sweep its targets"
    )
    # The eu worker's is not there to stop us (and it calls the central one nothing either).
    assert [o.action for o in by_us_worker] == ["created"]
    assert [o.action for o in by_operator] == ["created"]  # the central one is not its own
