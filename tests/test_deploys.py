"""A fleet that changes: worker processes of an old and a new config side by side, as in a
rolling deploy. A pass from one config's targets runs its activities on that config's own
queue (`PurgeConfig.own_queue`), so a worker whose config lacks a target never takes it: the
pass completes, each target swept once, by a worker that knows it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import tomllib
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType, TaskQueueType
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.worker import Replayer, Worker

from activities import builtin_kinds as kinds
from activities.errors import WorkerStopping
from activities.inputs import PurgeStep
from activities.progress import Progress
from activities.registry import TargetRegistry
from activities.routing import Route
from activities.spread_steps import ChunkInput
from activities.sweep import PurgeActivities
from purge_config.file import load_config, parse_config
from purge_config.names import TableName
from purge_config.settings import Guards
from purge_ops.schedule import ensure_schedules
from tests.conftest import Harness
from tests.support.activity import activity_env
from tests.support.history import child_ids, events
from tests.support.history import kinds as event_kinds
from tests.support.passes import (
    failed_pass,
    rewritten,
    run_pass,
    started_and_stopped,
    until_polled,
)
from tests.support.procs import clean_env, identity, start_worker, stop, use_env, wait_for
from tests.support.rows import HOUR, auth_rows, keys
from tests.support.servers import RunningTemporal
from tests.support.tenants import create_tenants, tenant_prefix, tenant_schemas
from tests.test_fleet import until_polled_by
from workflows.chunk import PurgeChunkWorkflow
from workflows.purge import PurgeWorkflow

#: Passes per case: with the old behaviour half of them failed the target one worker lacked,
#: so all eight passing by chance would be one in 256.
PASSES = 8


def tables_toml(names: list[str], extra: str = "") -> str:
    return (
        "".join(
            f'[[targets]]\nkind = "expiring"\nname = "{n}"\ntable = "{n}"\ncolumn = "at"\n'
            for n in names
        )
        + extra
    )


def make_tables(db: psycopg.Connection[Any], names: list[str], now_ms: int) -> None:
    for name in names:
        db.execute(f"CREATE TABLE {name} (key text PRIMARY KEY, at bigint NOT NULL)")
        db.execute(f"CREATE INDEX ON {name} (at)")
        add_expired(db, name, now_ms)


def add_expired(db: psycopg.Connection[Any], table: str, now_ms: int) -> None:
    """Two expired rows and a live one, under fresh keys."""
    tag = uuid.uuid4().hex[:8]
    db.execute(
        f"INSERT INTO {table} VALUES (%s, %s), (%s, %s), (%s, %s)",
        (f"a-{tag}", now_ms - HOUR, f"b-{tag}", now_ms - HOUR, f"live-{tag}", now_ms + HOUR),
    )


class Fleet:
    """Worker processes (`pg-purge run`), each from a config file of its own."""

    def __init__(self, tmp_path: Path, harness: Harness, address: str) -> None:
        self.tmp_path, self.harness = tmp_path, harness
        self.env = clean_env(TEMPORAL_ADDRESS=address)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def config(self, name: str, targets: str) -> Path:
        path = self.tmp_path / f"{name}.toml"
        path.write_text(
            f"database_url = {self.harness.url!r}\ntask_queue = {self.harness.task_queue!r}\n"
            f"{targets}",
            encoding="utf-8",
        )
        return path

    def start(self, name: str, *args: str) -> str:
        """Start the worker of config `name`; its identity once it polls its queues."""
        log = self.tmp_path / f"{name}.log"
        self.procs[name] = start_worker(self.tmp_path / f"{name}.toml", self.env, log, *args)
        wait_for(lambda: "worker on task queue" in _read(log), 60, f"the {name} worker")
        return identity(self.procs[name])

    def stop_all(self) -> None:
        for proc in self.procs.values():
            stop(proc)


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.exists() else ""


@pytest.fixture
def fleet(tmp_path: Path, harness: Harness, temporal_server: RunningTemporal) -> Iterator[Fleet]:
    started = Fleet(tmp_path, harness, temporal_server.address)
    try:
        yield started
    finally:
        started.stop_all()


async def attempts(client: Client, workflow_id: str) -> dict[str, list[tuple[str, str]]]:
    """Per target (a pattern's expansion under its own name): each attempt's (task queue,
    worker identity), in order."""
    scheduled: dict[int, tuple[str, str]] = {}
    runs: dict[str, list[tuple[str, str]]] = {}
    convert = client.data_converter.payload_converter
    for e in await events(client, workflow_id):
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = e.activity_task_scheduled_event_attributes
            [step] = convert.from_payloads(attrs.input.payloads)
            name = step["name"] if isinstance(step, dict) and "name" in step else str(step)
            scheduled[e.event_id] = (name, attrs.task_queue.name)
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs = e.activity_task_started_event_attributes
            name, queue = scheduled[attrs.scheduled_event_id]
            runs.setdefault(name, []).append((queue, attrs.identity))
    return runs


async def passes_side_by_side(
    harness: Harness, request: dict[str, Any], tables: list[str]
) -> list[str]:
    """PASSES passes of `request` at once, rows added to every table before each; their
    workflow ids, after checking each completed and removed every expired row."""
    ids = []
    for _ in range(PASSES):
        for table in tables:
            add_expired(harness.db, table, harness.now_ms)
        ids.append(f"purge-deploy-{uuid.uuid4()}")
    results = await asyncio.gather(
        *(run_pass(harness.client, harness.task_queue, request, i) for i in ids)
    )
    for result in results:
        assert all(s["status"] == "ok" for s in result["swept"]), result
    for table in tables:
        [(expired,)] = harness.db.execute(
            f"SELECT count(*) FROM {table} WHERE at <= %s", (harness.now_ms,)
        ).fetchall()
        assert expired == 0, table
    return ids


# Real worker processes, 7 s: the slow suite (tests/README.md), as the fleet tests are.
@pytest.mark.slow
async def test_a_target_only_the_new_config_has_is_swept_by_a_new_worker_beside_old_ones(
    harness: Harness, fleet: Fleet
) -> None:
    """Old workers (t1, t2) and a new one (t1, t2, t3) side by side; passes of the new config's
    input: each completes, and t3 was taken once, by the new worker, from the new config's
    queue (the old ones take none of them)."""
    make_tables(harness.db, ["t1", "t2", "t3"], harness.now_ms)
    fleet.config("old", tables_toml(["t1", "t2"]))
    new = load_config(fleet.config("new", tables_toml(["t1", "t2", "t3"])))
    old_worker = fleet.start("old")
    new_worker = fleet.start("new")

    ids = await passes_side_by_side(harness, new.pass_input(), ["t1", "t2", "t3"])

    for workflow_id in ids:
        runs = await attempts(harness.client, workflow_id)
        assert set(runs) == {"t1", "t2", "t3"}
        assert all(tries == [(new.own_queue, new_worker)] for tries in runs.values()), runs
        assert old_worker not in {who for tries in runs.values() for _, who in tries}


async def test_a_pass_of_the_old_config_is_swept_by_old_workers_while_a_new_one_schedules(
    harness: Harness, fleet: Fleet
) -> None:
    """The reverse: the old config has t3, the new one dropped it. A worker of the new config
    starts with `--schedule` (the schedule's input becomes the new config's) while passes of
    the old input are still being started: each completes, t3 by the old worker."""
    make_tables(harness.db, ["t1", "t2", "t3"], harness.now_ms)
    old = load_config(fleet.config("old", tables_toml(["t1", "t2", "t3"])))
    schedule_id = f"purge-deploy-{uuid.uuid4()}"
    schedule = f'[schedule]\nid = "{schedule_id}"\n'
    new = load_config(fleet.config("new", schedule + tables_toml(["t1", "t2"])))
    old_worker = fleet.start("old")
    new_worker = fleet.start("new", "--schedule")

    try:
        ids = await passes_side_by_side(harness, old.pass_input(), ["t1", "t2", "t3"])
        described = await harness.client.get_schedule_handle(schedule_id).describe()
        action: Any = described.schedule.action
        convert = harness.client.data_converter.payload_converter
        assert [convert.from_payload(p) for p in action.args] == [new.pass_input()]
    finally:
        await harness.client.get_schedule_handle(schedule_id).delete()

    for workflow_id in ids:
        runs = await attempts(harness.client, workflow_id)
        assert runs["t3"] == [(old.own_queue, old_worker)], runs
        assert new_worker not in {who for tries in runs.values() for _, who in tries}


async def test_a_worker_started_without_schedule_says_the_schedule_is_another_configs(
    harness: Harness,
    temporal_server: RunningTemporal,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mid-deploy, workers of a new config (t1's `max_age` changed) started without
    `--schedule` leave the old config's schedule: its passes send t1 to the old config's queue,
    where it fails `NoPurgeWorker` once the old workers are gone. A new worker says so as it
    starts, with the fix; a worker of the config that wrote it, and one that writes it with
    `--schedule`, say nothing of it. Nor do a worker of a regional config (its one target on a
    database queue of its own: the scheduler's passes are not its to judge), and one that
    finds an input that is not a pass's (written by hand): each starts."""
    schedule_id = f"purge-deploy-{uuid.uuid4().hex[:8]}"

    def config(extra: str, names: list[str]) -> Any:
        return parse_config(
            tomllib.loads(
                f"database_url = {harness.url!r}\ntask_queue = {harness.task_queue!r}\n"
                f'[schedule]\nid = "{schedule_id}"\ncron = "0 0 1 1 *"\n'
                + tables_toml(names).replace('column = "at"\n', f'column = "at"\n{extra}', 1)
            ),
            env={},
        )

    old, new = config("", ["t1", "t2"]), config('max_age = "1h"\n', ["t1", "t2"])
    regional = parse_config(
        tomllib.loads(
            f"task_queue = {harness.task_queue!r}\n"
            f'[databases.eu]\nurl = {harness.url!r}\ntask_queue = "eu-{schedule_id}"\n'
            f'[schedule]\nid = "{schedule_id}"\ncron = "0 0 1 1 *"\n'
            + tables_toml(["t1"]).replace('column = "at"\n', 'column = "at"\ndatabase = "eu"\n')
        ),
        env={},
    )
    assert regional.own_queue is None
    use_env(monkeypatch, clean_env())  # Temporal's client settings come from the test alone

    async def started(config: Any, **options: Any) -> list[str]:
        """The warnings a worker of these arguments logs as it starts (then stopped)."""
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="purge"):
            await started_and_stopped(config, temporal_server.address, **options)
        return [r.getMessage() for r in caplog.records if schedule_id in r.getMessage()]

    handle = harness.client.get_schedule_handle(schedule_id)
    await ensure_schedules(harness.client, old)
    try:
        by_old, by_new = await started(old), await started(new)
        by_writer = await started(new, ensure_schedule=True)  # writes it, and is its config
        after = await started(new)
        by_regional = await started(regional)
        await handle.update(rewritten({"targets": [{"name": "t1"}]}))  # by hand, not a pass's
        garbled = await started(new)
    finally:
        await handle.delete()

    assert by_old == []
    assert by_new == [
        f"schedule {schedule_id} starts passes that are not this config's: it sends some of "
        "this pass's targets to other task queues (another config's). They sweep by the config "
        "that wrote it, and a target routed to its queues fails NoPurgeWorker once no worker of "
        "that config runs: `pg-purge schedule` (or a worker started with --schedule) writes "
        "this config's; where another config owns that schedule, give this one another `id` "
        "under [schedule]"
    ]
    assert (by_writer, after, by_regional, garbled) == ([], [], [], [])


# Real worker processes, 7 s: the slow suite (tests/README.md), as the fleet tests are.
@pytest.mark.slow
async def test_a_pattern_only_the_new_config_has_is_expanded_and_swept_by_the_new_worker(
    harness: Harness, fleet: Fleet, pg_url: str
) -> None:
    """The new config adds a table pattern: its expansion and every match's sweep are taken
    by the new worker; the old one, which has no such pattern, takes none of them."""
    make_tables(harness.db, ["t1"], harness.now_ms)
    prefix = tenant_prefix()
    pattern = (
        f'[[targets]]\nkind = "expiring"\nname = "sessions"\ntable = "{prefix}_*.sessions"\n'
        'column = "expires_at"\n'
    )
    fleet.config("old", tables_toml(["t1"]))
    new = load_config(fleet.config("new", tables_toml(["t1"], pattern)))
    old_worker = fleet.start("old")
    new_worker = fleet.start("new")
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(3), harness.now_ms)
        workflow_id = f"purge-deploy-{uuid.uuid4()}"
        result = await run_pass(harness.client, harness.task_queue, new.pass_input(), workflow_id)

    assert result["targets"] == 4  # t1 and three tenants
    assert result["statuses"] == {"ok": 4}
    [line] = result["patterns"]
    assert line["tables"] == 3
    # The expansion in the parent, the matches in a child workflow: every activity of both.
    children = child_ids(await events(harness.client, workflow_id))
    assert children
    histories = [workflow_id, *children]
    who = {w for h in histories for tries in (await attempts(harness.client, h)).values()
           for _, w in tries}  # fmt: skip
    assert who == {new_worker}
    assert old_worker not in who


def _queues(target: dict[str, Any]) -> tuple[str | None, str]:
    """(own queue, eu's queue) of a config with `target` on the default database and on eu."""
    config = parse_config(
        {
            "task_queue": "purge",
            "databases": {"eu": {"url_env": "EU_URL", "task_queue": "purge-eu"}},
            "targets": [target, {**target, "name": "t1@eu", "database": "eu"}],
        },
        env={},
    )
    return config.own_queue, config.routed_queues["eu"]


@pytest.mark.parametrize(
    "changed",
    [{"max_age": "2h"}, {"column": "other_at"}, {"match": {"state": "done"}}],
    ids=["max_age", "column", "match"],
)
def test_a_changed_rule_moves_the_queues_and_a_changed_setting_does_not(
    changed: dict[str, Any],
) -> None:
    """What an entry says of the rows it deletes is in the digest of its queue: a worker of a
    config that would delete other rows never shares a queue with it. How it deletes (batch
    sizes, timeouts) is not, so a tuning change keeps old and new workers on one queue."""
    before = {"kind": "expiring", "name": "t1", "table": "t1", "column": "at"}
    own, eu = _queues(before)
    assert own is not None
    assert own.startswith("purge:")
    assert eu.startswith("purge-eu:")
    moved_own, moved_eu = _queues(before | changed)
    assert moved_own != own
    assert moved_eu != eu
    assert _queues(before | {"batch_target": "40ms", "lock_timeout": "5s"}) == (own, eu)


# Real worker processes, 7 s: the slow suite (tests/README.md), as the fleet tests are.
@pytest.mark.slow
async def test_a_longer_max_age_is_never_swept_by_an_old_worker_of_the_shorter_one(
    harness: Harness, fleet: Fleet
) -> None:
    """The new config keeps t1's rows two hours longer. Old workers (rows expire at `at`) and a
    new one side by side; passes of the new config: rows that expired an hour ago are kept by
    every pass, since only the new worker takes them. Sharing one queue, as when the digest
    named targets only, half the passes landed on the old worker and deleted them."""
    make_tables(harness.db, ["t1"], harness.now_ms)
    fleet.config("old", tables_toml(["t1"]))
    new_toml = tables_toml(["t1"]).replace('column = "at"\n', 'column = "at"\nmax_age = "2h"\n')
    new = load_config(fleet.config("new", new_toml))
    old_worker = fleet.start("old")
    new_worker = fleet.start("new")

    ids = []
    for _ in range(PASSES):
        add_expired(harness.db, "t1", harness.now_ms)  # an hour past `at`: kept by the new rule
        ids.append(f"purge-deploy-{uuid.uuid4()}")
    await asyncio.gather(
        *(run_pass(harness.client, harness.task_queue, new.pass_input(), i) for i in ids)
    )

    [(kept,)] = harness.db.execute(
        "SELECT count(*) FROM t1 WHERE at <= %s", (harness.now_ms,)
    ).fetchall()
    assert kept == 2 * (PASSES + 1)  # make_tables' two and each pass's two
    for workflow_id in ids:
        runs = await attempts(harness.client, workflow_id)
        assert runs["t1"] == [(new.own_queue, new_worker)], runs
        assert old_worker not in {who for tries in runs.values() for _, who in tries}


def test_sweep_joins_a_running_pass_only_where_it_sweeps_the_same_targets_the_same_way() -> None:
    """`sweep` waits on a running pass's result only where that pass sweeps each of its
    targets on the same queues (so by the same rule); its limits may differ."""
    from purge_ops.passes import not_this_pass

    t1 = {"kind": "expiring", "name": "t1", "table": "t1", "column": "at"}
    t2 = t1 | {"name": "t2", "table": "t2"}
    old = parse_config({"targets": [t1, t2]}, env={})
    new = parse_config({"targets": [t1 | {"max_age": "2h"}, t2]}, env={})
    budget = old.pass_input(budget_ms=60_000)

    assert not_this_pass(old.pass_input(), old.pass_input()) == ""
    assert not_this_pass(budget, old.pass_input()) == ""  # a schedule's budget: same tables
    assert not_this_pass(old.pass_input(), old.pass_input(["t1"])) == ""
    assert not_this_pass(old.pass_input(), new.pass_input()).startswith(
        "it sends some of this pass's targets to other task queues"
    )
    assert not_this_pass(old.pass_input(["t1"]), old.pass_input()) == "it does not sweep t2"
    assert not_this_pass(old.pass_input(dry_run=True), old.pass_input()) == "it is a dry run"
    assert not_this_pass({"targets": ["t1", "t2"]}, old.pass_input()).startswith(
        "it sends some"
    )  # typed by hand: its activities on the config's queue, not the config's own
    assert not_this_pass(None, old.pass_input()) == "its input is not a pass's"


@pytest.mark.waits
@pytest.mark.parametrize("removed", [1200, 0], ids=["after-rows", "before-rows"])
async def test_a_target_whose_worker_left_mid_sweep_fails_saying_what_it_had_removed(
    harness: Harness, removed: int
) -> None:
    """The only worker of a config's queue begins a target, reports its batches, fails it (a
    lost connection), and leaves: after `worker_wait` the target fails as `NoPurgeWorker`,
    saying how its attempt ended and what its heartbeats had reported removing, not that no
    worker ever took it. (A test of the workflow's report: the activity is a stand-in that
    heartbeats as a sweep does.)"""
    own = f"{harness.task_queue}:0123456789ab"
    began = asyncio.Event()

    @activity.defn(name="purge_target")
    async def leaves_after_its_heartbeat(step: Any) -> None:
        activity.heartbeat({"removed": removed, "batches": 3})
        began.set()
        raise ApplicationError("the connection was lost")  # retried, on a queue with no worker

    request = {
        "targets": ["t1"],
        "databases": {"t1": "_default"},
        "queues": {"_default": own},
        # The first attempt's schedule-to-start timeout too: three seconds for a task handed
        # to a poll already waiting (tens of milliseconds), however loaded the server.
        "worker_wait_ms": 3000,
    }
    workflow_id = f"purge-deploy-{uuid.uuid4()}"
    async with harness.run_worker([]):
        async with Worker(harness.client, task_queue=own, activities=[leaves_after_its_heartbeat]):
            # Its poll waiting on the server before the pass schedules: the first attempt is
            # taken at once, not left to a slow worker's start within worker_wait.
            await until_polled(harness.client, own, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)
            failing = asyncio.create_task(
                failed_pass(harness.client, harness.task_queue, request, workflow_id)
            )
            beginning = asyncio.ensure_future(began.wait())
            await asyncio.wait([beginning, failing], return_when=asyncio.FIRST_COMPLETED)
            assert began.is_set(), f"the pass ended before its attempt began: {failing.result()}"
        error = await failing

    [failed] = error.details[0]["failed"]
    assert failed["type"] == "NoPurgeWorker"
    said = (
        "having removed at least 1200 rows (its last heartbeat)"
        if removed
        else "before its heartbeats had reported removing any rows"
    )
    assert failed["message"].startswith(
        "an attempt failed (ApplicationError: the connection was lost), "
    )
    assert said in failed["message"]
    assert (
        f"no worker whose config names this target took its retry from task queue {own!r}"
        in (failed["message"])
    )
    assert failed["message"].endswith(
        "run a worker with the config that scheduled this pass, or, where the workers now run "
        "another config, write the schedule from it (`pg-purge schedule`)"
    )


def two_at_once_on(own: str, targets: list[str]) -> dict[str, Any]:
    """A pass of `targets`, two at once, every one's activity on the config's own queue `own`,
    with a `worker_wait` of 3 s."""
    return {
        "targets": targets,
        "databases": dict.fromkeys(targets, "_default"),
        "queues": {"_default": own},
        "max_concurrent": 2,
        "max_per_database": 2,
        "worker_wait_ms": 3000,
        "budget_ms": 600_000,
    }


@pytest.mark.waits
async def test_a_stopping_worker_s_target_whose_retry_waits_behind_busy_ones_fails_alone(
    harness: Harness,
) -> None:
    """A deploy's dip: the queue's one worker has begun t1 and t2 and begins to stop. t1 ends
    after its batch (retried, as `WorkerStopping` is), t2's sweep goes on, and no worker takes
    t1's retry within `worker_wait`. Once t2 completes (the queue's workers were busy, not
    gone), t1 fails alone as `WorkersBusy`, saying what it had removed, and t3 is swept by the
    new worker, where before BEGUN_HELD t1 failed as `NoPurgeWorker` and took its queue with
    it: t3 `not tried`. (A test of the workflow: the activities are stand-ins.)"""
    own = f"{harness.task_queue}:0123456789ab"
    started: list[str] = []
    t2_may_end = asyncio.Event()

    @activity.defn(name="purge_target")
    async def stand_in(step: Any) -> dict[str, Any]:
        started.append(step["name"])
        if step["name"] == "t1" and activity.info().attempt == 1:
            activity.heartbeat({"removed": 700, "batches": 2})
            await activity.wait_for_worker_shutdown()
            raise WorkerStopping("its worker is stopping")  # retried, as a sweep's is
        if step["name"] == "t2":
            await t2_may_end.wait()
        return {"name": step["name"], "removed": 1}

    request = two_at_once_on(own, ["t1", "t2", "t3"])
    workflow_id = f"purge-deploy-{uuid.uuid4()}"
    old = Worker(
        harness.client,
        task_queue=own,
        activities=[stand_in],
        max_concurrent_activities=2,
        graceful_shutdown_timeout=timedelta(minutes=5),  # t2's sweep runs on while it stops
    )
    async with harness.run_worker([]), contextlib.AsyncExitStack() as stack:
        old_running = asyncio.create_task(old.run())
        stack.push_async_callback(lambda: asyncio.wait_for(old_running, 60))
        stack.callback(t2_may_end.set)
        await until_polled(harness.client, own, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)
        failing = asyncio.create_task(
            failed_pass(harness.client, harness.task_queue, request, workflow_id)
        )
        async with asyncio.timeout(60):
            while sorted(started) != ["t1", "t2"]:
                assert not failing.done(), failing.result()
                await asyncio.sleep(0.05)
        stopping = asyncio.create_task(old.shutdown())
        # The moment: t1's retry timed out unstarted while t2's sweep is still out.
        async with asyncio.timeout(60):
            while "ACTIVITY_TASK_TIMED_OUT" not in event_kinds(
                await events(harness.client, workflow_id)
            ):
                await asyncio.sleep(0.05)
        new = f"new-{uuid.uuid4()}"
        await stack.enter_async_context(
            Worker(harness.client, task_queue=own, activities=[stand_in], identity=new)
        )
        await until_polled_by(harness.client, own, new)
        t2_may_end.set()
        error = await failing
        await stopping

    report = error.details[0]
    assert [s["name"] for s in report["swept"]] == ["t2", "t3"]
    [failed] = report["failed"]
    assert (failed["name"], failed["type"]) == ("t1", "WorkersBusy")
    assert failed["message"].startswith(
        "an attempt began on a worker that then stopped, having removed at least 700 "
        f"rows (its last heartbeat); then its retry waited in task queue {own!r} longer than "
        "worker_wait (3 s) while that queue's workers took this pass's other sweeps: not sent "
        "again, the queue's other targets still sent"
    )
    assert started.count("t1") == 1  # its retry was never taken
    recorded = await harness.client.get_workflow_handle(workflow_id).fetch_history()
    await Replayer(workflows=[PurgeWorkflow, PurgeChunkWorkflow]).replay_workflow(recorded)


@pytest.mark.waits
async def test_a_stopped_worker_s_target_is_no_worker_s_when_nothing_came_back_since(
    harness: Harness,
) -> None:
    """The queue's one worker sweeps t1 and t2; t2 comes back, then the worker stops (for good:
    none replaces it) and t1's retry is not taken. t2's sweep came back before the retry was
    even sent, so it says nothing of the workers since: t1 fails as `NoPurgeWorker`, saying
    that its worker stopped, not `WorkersBusy` with advice on slots no worker fills."""
    own = f"{harness.task_queue}:0123456789ab"
    started: list[str] = []
    t1_may_end = asyncio.Event()

    @activity.defn(name="purge_target")
    async def stand_in(step: Any) -> dict[str, Any]:
        started.append(step["name"])
        if step["name"] == "t1":
            activity.heartbeat({"removed": 700, "batches": 2})
            await t1_may_end.wait()  # let go once its worker stops polling
            raise WorkerStopping("its worker is stopping")  # retried, as a sweep's is
        return {"name": step["name"], "removed": 1}

    request = two_at_once_on(own, ["t1", "t2"])
    workflow_id = f"purge-deploy-{uuid.uuid4()}"
    only = Worker(harness.client, task_queue=own, activities=[stand_in])
    async with harness.run_worker([]):
        running = asyncio.create_task(only.run())
        try:
            await until_polled(harness.client, own, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)
            failing = asyncio.create_task(
                failed_pass(harness.client, harness.task_queue, request, workflow_id)
            )
            # The moment: t2's sweep came back while t1's runs.
            async with asyncio.timeout(60):
                while "t1" not in started or "ACTIVITY_TASK_COMPLETED" not in event_kinds(
                    await events(harness.client, workflow_id)
                ):
                    assert not failing.done(), failing.result()
                    await asyncio.sleep(0.05)
            stopping = asyncio.create_task(only.shutdown())
            await asyncio.sleep(0)  # the shutdown begun: the worker polls no more
        finally:
            t1_may_end.set()  # t1 fails, retried once 2 s have passed, with no worker polling
            async with asyncio.timeout(60):
                await only.shutdown()
                await running
        await stopping
        error = await failing

    report = error.details[0]
    assert [s["name"] for s in report["swept"]] == ["t2"]
    [failed] = report["failed"]
    assert (failed["name"], failed["type"]) == ("t1", "NoPurgeWorker")
    assert failed["message"].startswith(
        "an attempt began on a worker that then stopped, having removed at least 700 "
        "rows (its last heartbeat); no worker whose config names this target took its retry"
    )


async def beside_a_dead_queue(
    harness: Harness, routing: dict[str, Any]
) -> tuple[dict[str, list[str]], list[str], str]:
    """A failed pass of `routing` (its targets, databases and queues) and `x_idempotency` on the
    pass's own queue, one target at a time with a `worker_wait` of a second, run by a worker of
    that queue alone: each failed target's message by its name, the targets swept, and the
    pass's workflow id."""
    request = {
        "worker_wait_ms": 1000,
        "max_concurrent": 1,
        "budget_ms": 600_000,
        **routing,
        "targets": [*routing["targets"], "x_idempotency"],
    }
    workflow_id = f"purge-deploy-{uuid.uuid4()}"
    async with harness.run_worker([kinds.idempotency(harness.pool)]):
        error = await failed_pass(harness.client, harness.task_queue, request, workflow_id)
    report = error.details[0]
    assert {f["type"] for f in report["failed"]} == {"NoPurgeWorker"}
    failed = {f["name"]: f["message"] for f in report["failed"]}
    return failed, [s["name"] for s in report["swept"]], workflow_id


def waited_for(queue: str) -> str:
    """How the message of a target whose activity no worker of `queue` took begins."""
    return f"no worker whose config names this target took it from task queue {queue!r}"


def not_tried_on(queue: str) -> str:
    """How the message of a target failed at once, after another of `queue` waited, begins."""
    return f"not tried: no worker took an activity from task queue {queue!r}"


@pytest.mark.waits
async def test_a_queue_no_worker_polls_costs_a_pass_one_worker_wait_not_one_per_target(
    harness: Harness,
) -> None:
    """Three targets on a queue no worker polls, one at a time: the first waits `worker_wait`
    and fails; the other two fail at once, without an activity of their own; the target on
    the pass's own queue is swept."""
    nowhere = f"{harness.task_queue}:0123456789ab"
    on_nowhere = ["t1", "t2", "t3"]
    failed, swept, workflow_id = await beside_a_dead_queue(
        harness,
        {
            "targets": on_nowhere,
            "databases": dict.fromkeys(on_nowhere, "_default"),
            "queues": {"_default": nowhere},
            "max_per_database": 4,
        },
    )

    assert list(failed) == on_nowhere
    assert failed["t1"].startswith(waited_for(nowhere))
    assert all(failed[name].startswith(not_tried_on(nowhere)) for name in ("t2", "t3"))
    assert swept == ["x_idempotency"]
    runs = await attempts(harness.client, workflow_id)
    assert set(runs) == {"x_idempotency"}  # t1's activity never started; t2, t3 had none
    scheduled = [
        e for e in await events(harness.client, workflow_id)
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]  # fmt: skip
    assert len(scheduled) == 2


@pytest.mark.waits
@pytest.mark.parametrize("told", [True, False], ids=["told", "before"])
async def test_a_child_on_the_config_s_own_queue_says_so_of_a_target_no_worker_took(
    harness: Harness, told: bool
) -> None:
    """A child of a spread pass placed on the config's own queue (`PurgeChunk`, started here by
    itself) cannot tell that queue from a region's by its own task queue: the pass tells it
    (`Route.own_config`), and a target whose activity no worker took there fails with the
    advice for a config's own queue (mid-deploy), not a region's. A child from a release
    before that (`before`: not told) says it as a region's, as it did. The queue's worker runs
    the child and takes no activity. (A test of the workflow's report: no table.)"""
    own = f"{harness.task_queue}:0123456789ab"
    route = Route(own, "_default", 1000, own_config=True) if told else Route(own, "_default", 1000)
    chunk = ChunkInput(
        targets=["t1"],
        now_ms=harness.now_ms,
        deadline_ms=harness.now_ms + 600_000,
        budget_ms=600_000,
        route=route,
    )
    async with Worker(harness.client, task_queue=own, workflows=[PurgeChunkWorkflow]):
        raw = await harness.client.execute_workflow(
            "PurgeChunk", chunk, id=f"purge-chunk-{uuid.uuid4()}", task_queue=own, result_type=dict
        )

    [failed] = raw["failures"]
    assert failed["failure"]["type"] == "NoPurgeWorker"
    said = failed["failure"]["message"]
    if told:
        assert said.startswith(waited_for(own)), said
    else:
        assert said.startswith(f"no worker polled task queue {own!r} (database '_default')"), said


@pytest.mark.waits
async def test_a_region_s_queue_named_under_the_pass_s_is_said_to_be_the_region_s(
    harness: Harness,
) -> None:
    """A database's own queue may be named under the pass's (`task_queue = "purge:eu"` beside
    `purge`: its activities go to `purge:eu:` and a digest). No worker polls it: its target
    fails naming the database whose worker is missing, not as a config's own queue mid-deploy
    (which only `purge:` and a digest is)."""
    eu = f"{harness.task_queue}:eu:0123456789ab"
    failed, swept, _ = await beside_a_dead_queue(
        harness, {"targets": ["t1"], "databases": {"t1": "eu"}, "queues": {"eu": eu}}
    )

    assert failed["t1"].startswith(f"no worker polled task queue {eu!r} (database 'eu')")
    assert swept == ["x_idempotency"]


@pytest.mark.waits
async def test_a_queue_no_worker_polls_costs_a_spread_pass_one_worker_wait(
    harness: Harness,
) -> None:
    """A pass spread over children (it has patterns): two patterns and a plain target on a
    queue no worker polls. The first pattern's expansion waits `worker_wait` and fails; the
    second pattern fails at once, with no expansion of its own, and the plain target with no
    child of its own; the target on the pass's own queue is swept by a child."""
    nowhere = f"{harness.task_queue}:0123456789ab"
    on_nowhere = ["p1", "p2", "t1"]
    failed, swept, workflow_id = await beside_a_dead_queue(
        harness,
        {
            "targets": on_nowhere,
            "patterns": ["p1", "p2"],
            "databases": dict.fromkeys(on_nowhere, "far"),
            "queues": {"far": nowhere},
            "max_per_database": 1,
        },
    )

    assert sorted(failed) == on_nowhere
    assert failed["p1"].startswith(waited_for(nowhere))
    for name in ("p2", "t1"):
        assert failed[name].startswith(not_tried_on(nowhere)), name
    assert swept == ["x_idempotency"]
    history = await events(harness.client, workflow_id)
    scheduled = [
        e.activity_task_scheduled_event_attributes.task_queue.name for e in history
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]  # fmt: skip
    assert scheduled == [nowhere]  # p1's expansion alone: p2 had none
    assert len(child_ids(history)) == 1  # x_idempotency's: t1 had none


@pytest.mark.waits
async def test_a_child_that_met_no_worker_spares_the_next_children_of_its_queue_the_wait(
    harness: Harness,
) -> None:
    """Four targets on a queue no worker polls, two to a child, in a pass spread over children
    (a pattern on another such queue makes it one). The first child's first target waits
    `worker_wait`; the second child is never started: its targets fail at once."""
    nowhere = f"{harness.task_queue}:0123456789ab"
    on_nowhere = ["t1", "t2", "t3", "t4"]
    failed, swept, workflow_id = await beside_a_dead_queue(
        harness,
        {
            "targets": ["p0", *on_nowhere],
            "patterns": ["p0"],
            "databases": {"p0": "elsewhere", **dict.fromkeys(on_nowhere, "far")},
            "queues": {"far": nowhere, "elsewhere": f"{harness.task_queue}:ba9876543210"},
            "max_per_database": 1,
            "child_size": 2,
        },
    )

    assert sorted(failed) == ["p0", *on_nowhere]
    assert failed["t1"].startswith(waited_for(nowhere))
    for name in ("t2", "t3", "t4"):
        assert failed[name].startswith(not_tried_on(nowhere)), name
    assert swept == ["x_idempotency"]
    # t1 and t2's child, and x_idempotency's: none for t3 and t4.
    assert len(child_ids(await events(harness.client, workflow_id))) == 2


#: The heartbeat a worker sends as it moves to a target's second table, as `Progress` writes it.
def moved_to_second(tables: list[str] | None) -> dict[str, Any]:
    progress = Progress(table=1, tables=tables or [])
    details = progress.details()
    if tables is None:
        del details["tables"]  # a release before the key
    return details


@pytest.mark.parametrize(
    ("resumed", "swept_first"),
    [
        (["x_auth_failures", "x_auth_lockouts"], True),  # listed otherwise: from the first
        (None, False),  # an older release's: unchecked, resumed as before
        (["x_deploy_failures", "x_auth_lockouts"], False),  # listed alike: resumed
    ],
    ids=["listed-otherwise", "release-before", "listed-alike"],
)
async def test_a_retry_on_a_worker_listing_the_tables_otherwise_starts_from_the_first(
    harness: Harness, resumed: list[str] | None, swept_first: bool
) -> None:
    """Mid-deploy, a target's retry lands on a worker whose config lists its tables otherwise
    (its first table renamed, here): the earlier attempt's position (its second table) would
    skip a table it never swept. A progress listing the tables otherwise starts again from the
    first; one listing them alike resumes where it stood (its first table not swept again)."""
    harness.db.execute(
        "CREATE TABLE x_deploy_failures (LIKE x_auth_failures INCLUDING ALL);"
        "INSERT INTO x_deploy_failures (key, at_ms, expires_at_ms) VALUES"
        f" ('old', 0, {harness.now_ms - HOUR}), ('new', 0, {harness.now_ms + HOUR})"
    )
    auth_rows(harness.db, {}, {"old": harness.now_ms - HOUR, "new": harness.now_ms + HOUR})
    target = kinds.auth(harness.pool, failures=TableName("x_deploy_failures"))
    env = activity_env(attempt=2, heartbeat_details=[moved_to_second(resumed)])
    result = await env.run(
        PurgeActivities(TargetRegistry([target])).purge_target,
        PurgeStep(name="x_auth", now_ms=harness.now_ms),
    )

    assert keys(harness.db, "x_auth_lockouts") == {"new"}
    left = {"new"} if swept_first else {"old", "new"}
    assert keys(harness.db, "x_deploy_failures") == left
    assert result.removed == (2 if swept_first else 1)


async def test_a_retry_starting_again_on_tables_listed_otherwise_counts_its_guards_first(
    harness: Harness,
) -> None:
    """The earlier attempt passed its guards on another config's tables and swept some: its
    heartbeat has batches. On this worker's list the retry starts again from the first table,
    which no guard of this config has counted: the guards count before its first delete (here
    max_rows 1 refuses two expired rows), where a retry resumed in place would skip them."""
    harness.db.execute(
        "CREATE TABLE x_deploy_failures (LIKE x_auth_failures INCLUDING ALL);"
        "INSERT INTO x_deploy_failures (key, at_ms, expires_at_ms) VALUES"
        f" ('old-1', 0, {harness.now_ms - HOUR}), ('old-2', 0, {harness.now_ms - HOUR})"
    )
    guarded = kinds.auth(
        harness.pool, failures=TableName("x_deploy_failures"), guards=Guards(max_rows=1)
    )
    elsewhere = Progress(table=1, tables=["x_auth_failures", "x_auth_lockouts"], batches=3)
    env = activity_env(attempt=2, heartbeat_details=[elsewhere.details()])
    with pytest.raises(ApplicationError) as refused:
        await env.run(
            PurgeActivities(TargetRegistry([guarded])).purge_target,
            PurgeStep(name="x_auth", now_ms=harness.now_ms),
        )

    assert refused.value.type == "PurgeGuardRefused"
    assert keys(harness.db, "x_deploy_failures") == {"old-1", "old-2"}
