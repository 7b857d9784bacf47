"""`[schedules.NAME]`: a cadence per group of targets, each its own Temporal schedule with the
single `[schedule]`'s overlap rules; a target in two schedules or in none is refused at start; a
pass goes through its schedule; `report` shows each schedule's passes. The single `[schedule]`
keeps meaning what it meant (its pass input and fingerprint unchanged)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import tomllib
import uuid
from pathlib import Path

import pytest
from temporalio.client import ScheduleActionStartWorkflow, ScheduleOverlapPolicy
from temporalio.service import RPCError, RPCStatusCode

from activities import builtin_kinds as kinds
from purge_config import parse_config
from purge_config.errors import ConfigError
from purge_config.file import load_config
from purge_ops.schedule import fingerprint
from tests.conftest import Harness
from tests.support.passes import LISTING_WAIT_S, listed, quiet_cron, run_pass
from tests.support.procs import clean_env, run_main, start_worker, stop, wait_for, worker_config
from tests.support.rows import HOUR, auth_rows, idempotency_rows, keys
from tests.support.servers import RunningTemporal

TARGETS = '[[targets]]\nkind = "idempotency"\n\n[[targets]]\nkind = "auth"\n'
ENV = {"PURGE_DATABASE_URL": "postgresql://x@y/z"}


def _schedules(
    hot: str = "purge-hot",
    daily: str = "purge-daily",
    hot_cron: str = "*/5 * * * *",
    daily_cron: str = "23 3 * * *",
) -> str:
    return (
        f'[schedules.hot]\nid = "{hot}"\ncron = "{hot_cron}"\ntargets = ["x_idempotency"]\n'
        f'[schedules.daily]\nid = "{daily}"\ncron = "{daily_cron}"\n'
        'time_zone = "Europe/Paris"\ntargets = ["x_auth"]\n'
    )


def test_each_named_schedule_passes_its_own_targets_with_a_budget_of_its_own_period() -> None:
    config = parse_config(tomllib.loads(_schedules() + TARGETS), env=ENV)

    hot, daily = config.schedules
    assert (hot.name, hot.id, hot.cron, hot.targets) == (
        "hot",
        "purge-hot",
        "*/5 * * * *",
        ("x_idempotency",),
    )
    assert (daily.name, daily.time_zone, daily.targets) == ("daily", "Europe/Paris", ("x_auth",))
    assert config.scheduled_input(hot)["targets"] == ["x_idempotency"]
    assert config.scheduled_input(daily)["targets"] == ["x_auth"]
    # Five sixths of five minutes; the daily one keeps the 50 minutes of an hourly pass.
    assert config.scheduled_input(hot)["budget_ms"] == 250_000
    assert config.scheduled_input(daily)["budget_ms"] == 3_000_000
    # A pass by hand of every target ends before the most frequent schedule fires again.
    assert config.pass_input()["budget_ms"] == 250_000


def test_the_single_schedule_keeps_its_input_and_its_fingerprint() -> None:
    """A config with `[schedule]` makes the schedule it made before: same input, same digest,
    so a deployed schedule stays `unchanged`."""
    config = parse_config(tomllib.loads('[schedule]\ncron = "23 * * * *"\n' + TARGETS), env=ENV)

    (only,) = config.schedules
    assert config.scheduled_input(only) == config.pass_input()
    # The digest as the single-schedule code computed it before named schedules existed.
    before = {
        "cron": "23 * * * *",
        "time_zone": "UTC",
        "jitter_ms": 30_000,
        "catchup_window_ms": 3_600_000,
        "task_queue": "purge",
        "targets": ["x_idempotency", "x_auth"],
        "input": config.pass_input(),
        "workflow": "Purge",
        "overlap": "skip",
    }
    digest = hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()[:16]
    assert fingerprint(config, only) == digest
    assert config.named_schedules == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[schedules.a]\ntargets = ["x_idempotency", "x_auth"]\n'
            '[schedules.b]\ntargets = ["x_auth"]\n',
            "schedules.b.targets: 'x_auth' is in schedules.a too; a target belongs to one schedule",
        ),
        (
            '[schedules.a]\ntargets = ["x_idempotency"]\n',
            "targets: 'x_auth' is in no schedule; with [schedules.NAME] every target is in "
            "exactly one (its targets list)",
        ),
        (
            '[schedules.a]\ntargets = ["x_idempotency", "x_auth", "sessions"]\n',
            "schedules.a.targets: 'sessions' is not a target of this config",
        ),
        (
            '[schedule]\ncron = "23 * * * *"\n[schedules.a]\ntargets = ["x_auth"]\n',
            "schedules: give [schedule] (every target, one cron) or [schedules.NAME] tables, "
            "not both",
        ),
        ("[schedules.a]\ntargets = []\n", "schedules.a.targets: want a list of target names"),
        (
            '[schedules."a b"]\ntargets = ["x_auth", "x_idempotency"]\n',
            "schedules.a b: not a schedule name (letters, digits and _ . : @ -, starting with a "
            "letter, digit or _)",
        ),
        (
            '[schedules."a@b"]\ntargets = ["x_auth", "x_idempotency"]\n',
            "schedules.a@b.id: not a schedule id (letters, digits and _ . : / -), got "
            "'purge-a@b' (purge- and the schedule's name: give it an id)",
        ),
        (
            '[schedules.a]\nid = "x y"\ntargets = ["x_auth", "x_idempotency"]\n',
            "schedules.a.id: not a schedule id (letters, digits and _ . : / -), got 'x y'",
        ),
        (
            '[schedules.a]\nid = "same"\ntargets = ["x_auth"]\n'
            '[schedules.b]\nid = "same"\ntargets = ["x_idempotency"]\n',
            "schedules.a.id: 'same' is the id of another schedule too",
        ),
        (
            '[schedules.a]\ncron = "*/5 * * * *"\ntargets = ["x_auth", "x_idempotency"]\n'
            '[pass]\nbudget = "10m"\n',
            "pass.budget: must end before the schedule fires again (every 5m)",
        ),
    ],
)
def test_a_target_in_two_schedules_or_in_none_is_refused_in_one_line(
    text: str, message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(tomllib.loads(text + TARGETS), env=ENV)

    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


def two_schedules(
    tmp_path: Path, harness: Harness, daily: str = "purge-daily-{suffix}"
) -> tuple[Path, str, str]:
    """A config of `_schedules` with ids of the test's own (`daily` formatted with hot's id and
    the suffix), on the dev server every test shares, each at a `quiet_cron`, so no pass starts
    on its own while the test runs: its path, hot's id and daily's."""
    suffix = uuid.uuid4().hex[:8]
    hot_id = f"purge-hot-{suffix}"
    daily_id = daily.format(hot=hot_id, suffix=suffix)
    targets = _schedules(hot_id, daily_id, quiet_cron(), quiet_cron()) + TARGETS
    path = worker_config(tmp_path / "purge.toml", harness.url, harness.task_queue, targets)
    return path, hot_id, daily_id


async def test_each_schedule_is_its_own_temporal_schedule_and_report_shows_each_ones_passes(
    tmp_path: Path, temporal_server: RunningTemporal, harness: Harness
) -> None:
    """`schedule` makes both, each with its cron, time zone, overlap SKIP and only its targets;
    `sweep --schedule hot` runs the hot targets through that schedule and touches nothing else;
    `report` shows the hot pass under its schedule and none yet under the daily one."""
    path, hot_id, daily_id = two_schedules(tmp_path, harness)
    config = load_config(path)
    hot, daily = config.named_schedules
    idempotency_rows(harness.db, {"old": harness.now_ms - HOUR, "new": harness.now_ms + HOUR})
    auth_rows(harness.db, {"f-old": harness.now_ms - HOUR}, {})
    env = clean_env(TEMPORAL_ADDRESS=temporal_server.address)
    try:
        made = await asyncio.to_thread(run_main, "schedule", "--config", str(path), env=env)
        assert made.returncode == 0, made.stderr
        assert f"created schedule {hot_id}: cron '{hot.cron}' in UTC" in made.stdout
        assert f"created schedule {daily_id}: cron '{daily.cron}' in Europe/Paris" in made.stdout
        for schedule_id, targets in ((hot_id, ["x_idempotency"]), (daily_id, ["x_auth"])):
            described = await harness.client.get_schedule_handle(schedule_id).describe()
            action = described.schedule.action
            assert isinstance(action, ScheduleActionStartWorkflow)
            converter = harness.client.data_converter.payload_converter
            assert converter.from_payload(action.args[0])["targets"] == targets
            assert described.schedule.policy.overlap == ScheduleOverlapPolicy.SKIP

        builtins = [kinds.idempotency(harness.pool), kinds.auth(harness.pool)]
        async with harness.run_worker(builtins, config=config):
            swept = await asyncio.to_thread(
                run_main, "sweep", "--config", str(path), "--schedule", "hot", env=env
            )
        await listed(harness.client, f'TaskQueue = "{harness.task_queue}"')  # what `report` reads
        report = await asyncio.to_thread(run_main, "report", "--config", str(path), env=env)
    finally:
        for schedule_id in (hot_id, daily_id):
            await harness.client.get_schedule_handle(schedule_id).delete()

    assert swept.returncode == 0, swept.stderr
    assert f"through schedule {hot_id}" in swept.stdout
    assert keys(harness.db, "x_idempotency") == {"new"}
    assert keys(harness.db, "x_auth_failures") == {"f-old"}  # the daily target's, untouched
    assert report.returncode == 0, report.stderr
    hot_part, _, daily_part = report.stdout.partition(f"schedule daily ({daily_id}")
    assert f"schedule hot ({hot_id}, cron '{hot.cron}' in UTC): x_idempotency" in hot_part
    assert re.search(rf"{hot_id}-\S+", hot_part), report.stdout
    assert "no passes yet" in daily_part


async def test_report_reads_each_schedule_s_passes_by_its_id_beside_a_busier_one(
    tmp_path: Path, temporal_server: RunningTemporal, harness: Harness
) -> None:
    """A daily pass and one by hand, then three of the five-minute schedule's: `report --last 1`
    still shows the daily pass under its schedule and the pass by hand under its heading, not
    "no passes yet" because the busier schedule's passes are the newest."""
    path, hot_id, daily_id = two_schedules(tmp_path, harness)
    config = load_config(path)
    hot, daily = config.named_schedules
    by_hand = f"purge-sweep-{harness.task_queue}"
    builtins = [kinds.idempotency(harness.pool), kinds.auth(harness.pool)]
    async with harness.run_worker(builtins, config=config):
        tq = harness.task_queue
        await run_pass(harness.client, tq, config.scheduled_input(daily), f"{daily_id}-1")
        await run_pass(harness.client, tq, config.pass_input(), by_hand)
        for n in range(3):
            await run_pass(harness.client, tq, config.scheduled_input(hot), f"{hot_id}-{n}")
    await listed(harness.client, f'TaskQueue = "{harness.task_queue}"', 5)  # what it reads
    env = clean_env(TEMPORAL_ADDRESS=temporal_server.address)
    report = await asyncio.to_thread(
        run_main, "report", "--config", str(path), "--last", "1", env=env
    )

    assert report.returncode == 0, report.stderr
    hot_part, _, rest = report.stdout.partition(f"schedule daily ({daily_id}")
    daily_part, _, hand_part = rest.partition("passes started by hand")
    assert re.findall(rf"{hot_id}-\d", hot_part) == [f"{hot_id}-2"], report.stdout
    assert f"{daily_id}-1" in daily_part, report.stdout
    assert "no passes yet" not in report.stdout
    assert by_hand in hand_part, report.stdout


async def test_report_keeps_apart_two_schedules_whose_ids_prefix_each_other(
    tmp_path: Path, temporal_server: RunningTemporal, harness: Harness
) -> None:
    """`purge-hot-…` and `purge-hot-…-eu`: the eu schedule's passes start with hot's id and a
    dash too, yet `report` shows each pass under its own schedule only."""
    path, hot_id, eu_id = two_schedules(tmp_path, harness, daily="{hot}-eu")
    config = load_config(path)
    hot, eu = config.named_schedules
    builtins = [kinds.idempotency(harness.pool), kinds.auth(harness.pool)]
    async with harness.run_worker(builtins, config=config):
        tq = harness.task_queue
        await run_pass(harness.client, tq, config.scheduled_input(hot), f"{hot_id}-1")
        await run_pass(harness.client, tq, config.scheduled_input(eu), f"{eu_id}-1")
    await listed(harness.client, f'TaskQueue = "{harness.task_queue}"', 2)  # what it reads
    env = clean_env(TEMPORAL_ADDRESS=temporal_server.address)
    report = await asyncio.to_thread(run_main, "report", "--config", str(path), env=env)

    assert report.returncode == 0, report.stderr
    hot_part, _, eu_part = report.stdout.partition(f"schedule daily ({eu_id}")
    assert re.findall(r"purge-hot-\S+-1\b", hot_part) == [f"{hot_id}-1"], report.stdout
    assert re.findall(r"purge-hot-\S+-1\b", eu_part) == [f"{eu_id}-1"], report.stdout


@pytest.mark.waits
@pytest.mark.parametrize("flag", [False, True])
async def test_run_writes_the_schedules_that_say_ensure_and_with_schedule_every_one(
    tmp_path: Path, temporal_server: RunningTemporal, harness: Harness, flag: bool
) -> None:
    """`ensure = true` under one `[schedules.NAME]` is that schedule's: `run` writes it and
    leaves the other be; `run --schedule` writes both."""
    path, hot_id, daily_id = two_schedules(tmp_path, harness)
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace("[schedules.hot]\n", "[schedules.hot]\nensure = true\n"))
    env = clean_env(TEMPORAL_ADDRESS=temporal_server.address)
    log = tmp_path / "worker.log"
    worker = start_worker(path, env, log, *(["--schedule"] if flag else []))
    try:
        wait_for(lambda: "worker on task queue" in log.read_text(), 60, "the worker's start")
        written: dict[str, object] = {}
        for schedule_id in (hot_id, daily_id):
            try:
                await harness.client.get_schedule_handle(schedule_id).describe()
                written[schedule_id] = "written"
            except RPCError as err:
                written[schedule_id] = err.status
    finally:
        stop(worker)
        for schedule_id in (hot_id, daily_id):
            with contextlib.suppress(RPCError):
                await harness.client.get_schedule_handle(schedule_id).delete()

    assert written == {hot_id: "written", daily_id: "written" if flag else RPCStatusCode.NOT_FOUND}
    assert f"created schedule {hot_id}" in log.read_text()


async def test_a_schedule_dropped_from_the_config_is_said_to_be_left_behind(
    tmp_path: Path, temporal_server: RunningTemporal, harness: Harness
) -> None:
    """Renamed or removed, a schedule keeps firing on the server: `schedule` says so and how to
    delete it, and deletes nothing itself."""
    suffix = uuid.uuid4().hex[:8]
    hot_id, daily_id, old_id = (f"purge-{n}-{suffix}" for n in ("hot", "daily", "old"))
    path = tmp_path / "purge.toml"
    env = clean_env(TEMPORAL_ADDRESS=temporal_server.address)
    old = f'[schedule]\nid = "{old_id}"\n' + TARGETS
    try:
        worker_config(path, harness.url, harness.task_queue, old)
        first = await asyncio.to_thread(run_main, "schedule", "--config", str(path), env=env)
        worker_config(path, harness.url, harness.task_queue, _schedules(hot_id, daily_id) + TARGETS)
        # The list of schedules is a visibility read: it lags, seconds on a loaded machine.
        # Asked again until it lists the old one, as `listed` waits (LISTING_WAIT_S), not a
        # number of tries whatever they take.
        deadline = asyncio.get_running_loop().time() + LISTING_WAIT_S
        while True:
            second = await asyncio.to_thread(run_main, "schedule", "--config", str(path), env=env)
            said = second.stdout
            if "left behind" in said or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.1)
        described = await harness.client.get_schedule_handle(old_id).describe()
    finally:
        for schedule_id in (hot_id, daily_id, old_id):
            await harness.client.get_schedule_handle(schedule_id).delete()

    assert first.returncode == 0, first.stderr
    assert (
        f"left behind schedule {old_id}: not in the config but still firing on task queue "
        f"'{harness.task_queue}'; delete it with `temporal schedule delete --schedule-id {old_id}`"
    ) in said
    assert described.schedule.state.paused is False
