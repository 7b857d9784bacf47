"""What an operator runs after the first pass works: the schedule (ours and the `temporal` CLI's),
`sweep`, `report`, `replay` and the metrics endpoint, against the real dev server and PostgreSQL.

Each command has a test that runs it as a user does, `python worker.py ...` (`cli_process`); the
others call the same `worker.main` in this process (`cli`), which saves starting an interpreter.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
import shlex
import signal
import subprocess
import urllib.request
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionExecutionStartWorkflow,
    ScheduleActionStartWorkflow,
    ScheduleCalendarSpec,
    ScheduleOverlapPolicy,
    ScheduleRange,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
    WorkflowExecutionStatus,
    WorkflowHandle,
)
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

from activities import builtin_kinds as kinds
from activities.builtin_kinds import build_registry
from activities.registry import TargetRegistry
from activities.sweep import PurgeActivities
from purge_config.file import load_config
from purge_dev.servers import venv_executable
from purge_ops import passes
from purge_ops import schedule as schedules
from purge_ops.passes import summarize, sweeps_any
from purge_ops.ports import free_ports
from purge_ops.runner import new_worker
from purge_ops.schedule import desired, ensure_schedules
from tests.conftest import Harness
from tests.support.history import history
from tests.support.old_workflows import PurgeWithoutDuplicateCheck
from tests.support.passes import (
    listed,
    listed_pollers,
    quiet_cron,
    run_pass,
    until_described,
    until_polled,
)
from tests.support.procs import (
    REPO,
    Done,
    clean_env,
    run_main,
    run_process,
    start,
    start_worker,
    stop,
    wait_for,
    worker_config,
)
from tests.support.rows import HOUR, auth_rows, idempotency_rows, keys
from tests.support.servers import RunningTemporal

BUILTINS = '[[targets]]\nkind = "idempotency"\n\n[[targets]]\nkind = "auth"\n'
#: A target an edit adds (its table need not exist: no worker of the edited config is up).
TOKENS = '\n[[targets]]\nkind = "expiring"\nname = "tokens"\ntable = "tokens"\ncolumn = "at"\n'


def cli(temporal: RunningTemporal, *args: str) -> Done:
    """`pg-purge ARGS` against the test's Temporal server, in this process (`worker.main`); from
    an async test, in a thread: `await asyncio.to_thread(cli, ...)`."""
    return run_main(*args, env=clean_env(TEMPORAL_ADDRESS=temporal.address))


def cli_process(temporal: RunningTemporal, *args: str) -> Done:
    """`python worker.py ARGS` as a user runs it, against the test's Temporal server."""
    return run_process(*args, env=clean_env(TEMPORAL_ADDRESS=temporal.address))


def config_file(
    tmp_path: Path, schema_url: str, task_queue: str, schedule: str = "", targets: str = BUILTINS
) -> Path:
    return worker_config(tmp_path / "purge.toml", schema_url, task_queue, f"{schedule}\n{targets}")


def spans(ranges: Sequence[ScheduleRange]) -> list[tuple[int, int]]:
    """A calendar field as (start, end) pairs: what the server made of the cron."""
    return [(r.start, r.end or r.start) for r in ranges]


@pytest.fixture
def schedule_id() -> str:
    return f"purge-hourly-{uuid.uuid4().hex[:8]}"


async def test_schedule_is_created_with_the_cron_and_retention_policies(
    tmp_path: Path,
    temporal_server: RunningTemporal,
    harness: Harness,
    schedule_id: str,
) -> None:
    config = config_file(
        tmp_path, harness.url, harness.task_queue, f'[schedule]\nid = "{schedule_id}"\n'
    )

    done = cli_process(temporal_server, "schedule", "--config", str(config))

    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"created schedule {schedule_id}: cron '23 * * * *' in UTC")
    assert re.search(r"next runs: \d{4}-\d\d-\d\d \d\d:23:\d\d UTC", done.stdout), done.stdout
    described = await harness.client.get_schedule_handle(schedule_id).describe()
    schedule = described.schedule
    action = schedule.action
    assert action.workflow == "Purge"  # type: ignore[union-attr]
    assert action.task_queue == harness.task_queue  # type: ignore[union-attr]
    assert action.id == schedule_id  # type: ignore[union-attr]
    converter = harness.client.data_converter.payload_converter
    [args] = [converter.from_payload(p) for p in action.args]  # type: ignore[union-attr]
    # The pass's limits travel in its input, the config's defaults here: 4 at once, 1 per
    # database, a budget of 50 minutes (below the hourly period).
    own = load_config(config).own_queue
    assert own is not None
    assert own.startswith(f"{harness.task_queue}:")
    assert args == {
        "targets": ["x_idempotency", "x_auth"],
        "max_concurrent": 4,
        "max_per_database": 1,
        "budget_ms": 3_000_000,
        # The activities go to the queue of this config's own targets (PurgeConfig.own_queue).
        "databases": {"x_idempotency": "_default", "x_auth": "_default"},
        "queues": {"_default": own},
        "worker_wait_ms": 300_000,
    }
    [calendar] = schedule.spec.calendars
    assert spans(calendar.minute) == [(23, 23)]
    assert spans(calendar.hour) == [(0, 23)]
    assert schedule.spec.time_zone_name == "UTC"
    assert schedule.spec.jitter == timedelta(seconds=30)
    assert schedule.policy.overlap == ScheduleOverlapPolicy.SKIP
    assert schedule.policy.catchup_window == timedelta(hours=1)
    # Each pass ends by itself 45 minutes past its budget, its worker_wait and 40 (a pass that
    # cannot go on: test_a_pass_that_cannot_go_on_times_out_and_the_next_firing_runs).
    assert action.execution_timeout == timedelta(minutes=95)  # type: ignore[union-attr]
    assert "jitter 0:00:30, a pass runs at most 1:35:00\n" in done.stdout
    assert described.info.next_action_times
    assert all(t.minute == 23 for t in described.info.next_action_times)
    await harness.client.get_schedule_handle(schedule_id).delete()


async def test_a_schedule_made_before_the_pass_timeout_is_updated_once_to_carry_it(
    tmp_path: Path, temporal_server: RunningTemporal, harness: Harness, schedule_id: str
) -> None:
    """A schedule as an earlier release made it (the same digest, its passes with no execution
    timeout), or a hand edit that dropped the timeout, is updated to carry it, then left
    unchanged."""
    path = config_file(
        tmp_path, harness.url, harness.task_queue, f'[schedule]\nid = "{schedule_id}"\n'
    )
    config = load_config(path)
    (spec,) = config.schedules
    before = desired(config, spec)
    assert isinstance(before.action, ScheduleActionStartWorkflow)
    before.action.execution_timeout = None
    handle = await harness.client.create_schedule(schedule_id, before)
    try:
        updated = await asyncio.to_thread(cli, temporal_server, "schedule", "--config", str(path))
        assert updated.stdout.startswith(f"updated schedule {schedule_id}:"), updated.stdout
        action = (await handle.describe()).schedule.action
        assert isinstance(action, ScheduleActionStartWorkflow)
        assert action.execution_timeout == timedelta(minutes=95)
        again = await asyncio.to_thread(cli, temporal_server, "schedule", "--config", str(path))
        assert again.stdout.startswith(f"unchanged schedule {schedule_id}:"), again.stdout
    finally:
        await handle.delete()


@pytest.mark.slow  # 12 s of waiting for the timeout: .ci/run's slow suite runs it
async def test_a_pass_that_cannot_go_on_times_out_and_the_next_firing_runs(
    tmp_path: Path, harness: Harness, schedule_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No worker polls the schedule's task queue, so its pass cannot go on, as one whose
    workflow task no worker of the release running can run: a firing while it runs is skipped
    (overlap SKIP); the pass, whose execution timeout is its budget, worker_wait and
    PASS_GRACE, times out; and the next firing starts a pass.

    The skip is seen beside a pass that cannot end while the test looks (PASS_GRACE an hour,
    that pass then terminated): with its timeout 12 s on, a machine slow to take the second
    firing saw the first pass time out first, and no skip (CI's slow suite, once). Then, with
    PASS_GRACE a second and the budget and worker_wait the least they may be (10 s and 1 s),
    the schedule rewritten, a pass times out 12 s on and the next firing starts one. The cron
    is `quiet_cron`'s."""
    nobody = f"{harness.task_queue}-unpolled"
    short = (
        f'[schedule]\nid = "{schedule_id}"\ncron = "{quiet_cron()}"\n'
        '[pass]\nbudget = "10s"\nworker_wait = "1s"\n'
    )
    config = load_config(config_file(tmp_path, harness.url, nobody, short))
    monkeypatch.setattr(schedules, "PASS_GRACE", timedelta(hours=1))
    await ensure_schedules(harness.client, config)
    handle = harness.client.get_schedule_handle(schedule_id)

    def started(action: object) -> WorkflowHandle[Any, Any]:
        assert isinstance(action, ScheduleActionExecutionStartWorkflow)
        return harness.client.get_workflow_handle(
            action.workflow_id, run_id=action.first_execution_run_id
        )

    last: WorkflowHandle[Any, Any] | None = None
    try:
        await handle.trigger()
        running = await until_described(handle, lambda d: len(d.info.running_actions) == 1)
        held = started(running.info.running_actions[0])
        await handle.trigger()
        await until_described(handle, lambda d: d.info.num_actions_skipped_overlap == 1)
        await held.terminate("its firing behind it was skipped")
        await until_described(handle, lambda d: not d.info.running_actions)

        monkeypatch.setattr(schedules, "PASS_GRACE", timedelta(seconds=1))
        [rewritten] = await ensure_schedules(harness.client, config)
        assert rewritten.action == "updated"
        await handle.trigger()
        fired = await until_described(handle, lambda d: len(d.info.recent_actions) == 2)
        stuck = started(fired.info.recent_actions[1].action)
        timeout = (await stuck.describe()).raw_description.execution_config
        assert timeout.workflow_execution_timeout.ToTimedelta() == timedelta(seconds=12)
        async with asyncio.timeout(120):
            while (await stuck.describe()).status == WorkflowExecutionStatus.RUNNING:
                await asyncio.sleep(0.2)
        assert (await stuck.describe()).status == WorkflowExecutionStatus.TIMED_OUT
        # Once the schedule knows its pass ended, the next firing starts one.
        await until_described(handle, lambda d: not d.info.running_actions)
        await handle.trigger()
        fired = await until_described(handle, lambda d: len(d.info.recent_actions) == 3)
        last = started(fired.info.recent_actions[2].action)
        assert last.id != stuck.id
    finally:
        await handle.delete()
        if last is not None:
            with contextlib.suppress(RPCError):  # it times out by itself 12 s on
                await last.terminate("done")


async def test_schedule_again_is_unchanged_and_a_changed_cron_updates_it_in_place(
    tmp_path: Path,
    temporal_server: RunningTemporal,
    harness: Harness,
    schedule_id: str,
) -> None:
    config = config_file(
        tmp_path, harness.url, harness.task_queue, f'[schedule]\nid = "{schedule_id}"\n'
    )
    created = await asyncio.to_thread(cli, temporal_server, "schedule", "--config", str(config))
    assert created.returncode == 0, created.stderr
    handle = harness.client.get_schedule_handle(schedule_id)
    await handle.pause(note="paused by the on-call")
    # An operator's freeze window and end, which no config says.
    freeze = ScheduleCalendarSpec(month=[ScheduleRange(12)], day_of_month=[ScheduleRange(24, 26)])
    end_at = datetime(2030, 1, 1, tzinfo=UTC)

    def frozen(given: ScheduleUpdateInput) -> ScheduleUpdate:
        schedule = given.description.schedule
        schedule.spec.skip, schedule.spec.end_at = [freeze], end_at
        return ScheduleUpdate(schedule=schedule)

    await handle.update(frozen)

    again = await asyncio.to_thread(cli, temporal_server, "schedule", "--config", str(config))
    assert again.stdout.startswith(f"unchanged schedule {schedule_id} (PAUSED)"), again.stdout
    assert (
        f"next runs: none while paused (`temporal schedule toggle --schedule-id {schedule_id} "
        "--unpause` resumes it)"
    ) in again.stdout

    config_file(
        tmp_path,
        harness.url,
        harness.task_queue,
        f'[schedule]\nid = "{schedule_id}"\ncron = "47 3 * * *"\ntime_zone = "Europe/Paris"\n',
    )
    changed = await asyncio.to_thread(cli, temporal_server, "schedule", "--config", str(config))
    assert changed.returncode == 0, changed.stderr
    assert changed.stdout.startswith(f"updated schedule {schedule_id} (PAUSED): cron '47 3 * * *'")

    described = await handle.describe()
    [calendar] = described.schedule.spec.calendars
    assert (spans(calendar.minute), spans(calendar.hour)) == ([(47, 47)], [(3, 3)])
    assert described.schedule.spec.time_zone_name == "Europe/Paris"
    assert described.schedule.policy.catchup_window == timedelta(days=1)  # daily: one period
    assert described.schedule.state.paused  # an operator's pause survives a config update
    [skipped] = described.schedule.spec.skip  # and the freeze window, and the end
    assert (spans(skipped.month), spans(skipped.day_of_month)) == ([(12, 12)], [(24, 26)])
    assert described.schedule.spec.end_at == end_at
    await handle.delete()


async def test_schedule_leaves_another_workflow_s_schedule_and_says_when_it_moves_one(
    tmp_path: Path, temporal_server: RunningTemporal, harness: Harness, schedule_id: str
) -> None:
    """A schedule of the config's id that starts another workflow is someone else's: refused in
    one line, status 1, left as it was. A Purge schedule on another task queue (this config's
    before its task_queue changed, or another config's of the same id) is updated, saying so."""
    other = f"{schedule_id}-other"
    await harness.client.create_schedule(
        other,
        Schedule(
            action=ScheduleActionStartWorkflow("Invoice", id="invoices", task_queue="billing"),
            spec=ScheduleSpec(cron_expressions=["0 * * * *"]),
        ),
    )
    theirs = config_file(tmp_path, harness.url, harness.task_queue, f'[schedule]\nid = "{other}"\n')
    try:
        refused = await asyncio.to_thread(cli, temporal_server, "schedule", "--config", str(theirs))
        kept = (await harness.client.get_schedule_handle(other).describe()).schedule.action
    finally:
        await harness.client.get_schedule_handle(other).delete()
    assert refused.returncode == 1
    assert refused.stderr == (
        f"pg-purge: schedule {other} exists and starts Invoice, not Purge: left as it is; give "
        "this config's schedule another id (`id` under [schedule])\n"
    )
    assert isinstance(kept, ScheduleActionStartWorkflow)
    assert (kept.workflow, kept.task_queue) == ("Invoice", "billing")

    ours = config_file(tmp_path, harness.url, "elsewhere", f'[schedule]\nid = "{schedule_id}"\n')
    first = await asyncio.to_thread(cli, temporal_server, "schedule", "--config", str(ours))
    assert first.returncode == 0, first.stderr
    config_file(tmp_path, harness.url, harness.task_queue, f'[schedule]\nid = "{schedule_id}"\n')
    try:
        moved = await asyncio.to_thread(cli, temporal_server, "schedule", "--config", str(ours))
    finally:
        await harness.client.get_schedule_handle(schedule_id).delete()
    assert moved.returncode == 0, moved.stderr
    assert moved.stdout.startswith(f"updated schedule {schedule_id}:")
    assert "moved from task queue 'elsewhere': if another config's schedule has this id" in (
        moved.stdout
    )


# In the slow suite with the other multi-process fleet tests (tests/test_fleet_workers.py).
@pytest.mark.slow
async def test_workers_starting_together_with_run_schedule_leave_one_schedule(
    tmp_path: Path,
    temporal_server: RunningTemporal,
    harness: Harness,
    schedule_id: str,
) -> None:
    config = config_file(
        tmp_path,
        harness.url,
        harness.task_queue,
        f'[schedule]\nid = "{schedule_id}"\nensure = true\n',
    )
    env = clean_env(TEMPORAL_ADDRESS=temporal_server.address)
    logs = [tmp_path / f"worker-{i}.log" for i in range(3)]
    workers = [start_worker(config, env, log) for log in logs]
    try:
        for log in logs:
            wait_for(lambda log=log: "worker on task queue" in log.read_text(), 60, "a worker")
        assert all(w.poll() is None for w in workers)
    finally:
        for w in workers:
            stop(w)

    actions = [re.search(r"(created|updated|unchanged) schedule", log.read_text()) for log in logs]
    assert sorted(a.group(1) for a in actions if a) == ["created", "unchanged", "unchanged"]
    # Described, not listed: the list of schedules is a visibility read and lags.
    schedule = harness.client.get_schedule_handle(schedule_id)
    assert (await schedule.describe()).id == schedule_id
    await schedule.delete()


def readme_command(prefix: str) -> list[str]:
    """The README's shell command that starts with `prefix` (continuation lines joined)."""
    text = (REPO / "README.md").read_text(encoding="utf-8").replace("\\\n", " ")
    [line] = [ln for ln in text.splitlines() if ln.strip().startswith(prefix)]
    return shlex.split(line)


async def test_readme_temporal_cli_schedule_fires_a_pass_when_triggered(
    temporal_server: RunningTemporal,
    harness: Harness,
) -> None:
    """The exact `temporal schedule create` of the README, then `temporal schedule trigger`:
    a pass runs on the worker and sweeps the tables."""
    idempotency_rows(harness.db, {"old": harness.now_ms - HOUR, "new": harness.now_ms + HOUR})
    auth_rows(harness.db, {"f-old": harness.now_ms - HOUR}, {"l-new": harness.now_ms + HOUR})
    create = readme_command("temporal schedule create")
    assert create[create.index("--task-queue") + 1] == "purge"
    schedule_id = create[create.index("--schedule-id") + 1]
    temporal = venv_executable("temporal")
    address = ["--address", temporal_server.address]

    subprocess.run([temporal, *create[1:], *address], check=True, capture_output=True)
    try:
        subprocess.run(
            [temporal, "schedule", "trigger", "--schedule-id", schedule_id, *address],
            check=True,
            capture_output=True,
        )
        handle = harness.client.get_schedule_handle(schedule_id)
        registry = TargetRegistry(
            [
                kinds.idempotency(harness.pool),
                kinds.rate_limit(harness.pool),
                kinds.auth(harness.pool),
            ]
        )
        # The README's schedule starts passes on the `purge` queue, not the test's own.
        async with new_worker(harness.client, registry, "purge"):
            described = await until_described(handle, lambda d: bool(d.info.recent_actions))
            # The trigger's pass, or one the README's `23 * * * *` started on its own first
            # (a test run over minute 23): either is the README's schedule firing a pass.
            started = described.info.recent_actions[0].action
            fired = harness.client.get_workflow_handle(
                started.workflow_id,  # type: ignore[attr-defined]
                run_id=started.first_execution_run_id,  # type: ignore[attr-defined]
            )
            result = await fired.result()
            ran = (await fired.describe()).raw_description.execution_config
    finally:
        subprocess.run(
            [temporal, "schedule", "delete", "--schedule-id", schedule_id, *address],
            check=True,
            capture_output=True,
        )

    assert started.workflow_id.startswith(f"{schedule_id}-")  # type: ignore[attr-defined]
    assert ran.workflow_execution_timeout.ToTimedelta() == timedelta(minutes=95)
    assert [s["name"] for s in result["swept"]] == ["x_idempotency", "x_rate_limit", "x_auth"]
    assert keys(harness.db, "x_idempotency") == {"new"}
    assert keys(harness.db, "x_auth_failures") == set()


async def test_sweep_prints_the_report_and_exits_nonzero_naming_failed_targets(
    tmp_path: Path,
    temporal_server: RunningTemporal,
    harness: Harness,
) -> None:
    """A pass of the config's targets prints the report and exits 0; one of a target the config
    names but the worker cannot sweep (its registry lacks it) exits 1, the last line naming it.
    (A target the config does not name is refused before Temporal: test_cli_bad_input.py.)"""
    idempotency_rows(harness.db, {"old": harness.now_ms - HOUR, "new": harness.now_ms + HOUR})
    nobody = (
        '\n[[targets]]\nkind = "expiring"\nname = "nobody"\ntable = "nobody"\n'
        'column = "expires_ms"\nmax_age = "1h"\n'
    )
    config = config_file(tmp_path, harness.url, harness.task_queue, targets=BUILTINS + nobody)
    builtins = ["--target", "x_idempotency", "--target", "x_auth"]
    targets = [kinds.idempotency(harness.pool), kinds.auth(harness.pool)]
    async with harness.run_worker(targets, config=load_config(config)):
        dry = await asyncio.to_thread(
            cli, temporal_server, "sweep", "--config", str(config), "--dry-run", *builtins
        )
        assert keys(harness.db, "x_idempotency") == {"old", "new"}
        ok = await asyncio.to_thread(
            cli, temporal_server, "sweep", "--config", str(config), *builtins
        )
        bad = await asyncio.to_thread(
            cli, temporal_server, "sweep", "--config", str(config),
            "--target", "x_auth", "--target", "nobody",
        )  # fmt: skip

    assert dry.returncode == 0, dry.stderr
    assert "(dry run)" in dry.stdout
    assert re.search(r"^x_idempotency\s+1\s", dry.stdout, re.MULTILINE)
    assert ok.returncode == 0, ok.stderr
    assert re.search(r"^x_idempotency\s+1\s", ok.stdout, re.MULTILINE)
    assert re.search(r"^total\s+1", ok.stdout, re.MULTILINE)
    assert keys(harness.db, "x_idempotency") == {"new"}
    assert bad.returncode == 1
    assert "FAILED UnknownPurgeTarget" in bad.stdout
    assert bad.stdout.rstrip().endswith("failed targets: nobody")


async def sweep_beside(
    temporal: RunningTemporal,
    config: Path,
    log: Path,
    says: str,
    release: asyncio.Event,
    *args: str,
) -> int:
    """`sweep --config ARGS` started beside a held pass: once its output `says` so, and while
    it still waits, the pass is released; its exit status."""
    sweeping = start(
        ["sweep", "--config", str(config), *args],
        clean_env(TEMPORAL_ADDRESS=temporal.address),
        log,
    )
    try:
        await asyncio.to_thread(wait_for, lambda: says in log.read_text(), 60, f"sweep: {says}")
        assert sweeping.poll() is None
        release.set()
        return await asyncio.to_thread(sweeping.wait, 60)
    finally:
        release.set()
        stop(sweeping)


class Held:
    """A target that sweeps once `release` is set: a pass that runs as long as a test needs."""

    def __init__(self, name: str, release: asyncio.Event) -> None:
        self.name, self.release = name, release
        self.runs: list[int] = []

    async def purge_expired(self, now_ms: int) -> int:
        self.runs.append(now_ms)
        await self.release.wait()
        return 3

    async def count_expired(self, now_ms: int) -> int:  # a dry run's
        return await self.purge_expired(now_ms)


async def held_pass(
    harness: Harness, held: Held, request: dict[str, Any], workflow_id: str
) -> WorkflowHandle[Any, Any]:
    """A pass of `request` started by hand, once `held` runs in it and visibility lists it as
    running: `sweep` finds running passes there, and it lags the history."""
    handle: WorkflowHandle[Any, Any] = await harness.client.start_workflow(
        "Purge", request, id=workflow_id, task_queue=harness.task_queue
    )
    while not held.runs:
        await asyncio.sleep(0.05)
    await listed(
        harness.client, f'TaskQueue = "{harness.task_queue}" AND ExecutionStatus = "Running"'
    )
    return handle


async def test_sweep_waits_for_the_pass_already_running_instead_of_starting_another(
    tmp_path: Path,
    temporal_server: RunningTemporal,
    harness: Harness,
) -> None:
    """A pass of the config's very input is running (the schedule's, say): `sweep` waits for
    it and prints its report."""
    release = asyncio.Event()
    held = Held("x_idempotency", release)
    config = config_file(
        tmp_path, harness.url, harness.task_queue, targets='[[targets]]\nkind = "idempotency"\n'
    )
    log = tmp_path / "sweep.log"
    async with harness.run_worker([held], config=load_config(config)):
        request = load_config(config).pass_input()
        first = await held_pass(harness, held, request, f"purge-hourly-{uuid.uuid4()}")
        # It finds the pass and says it waits on it; it is still there, waiting.
        status = await sweep_beside(temporal_server, config, log, "waiting for it", release)

    out = log.read_text()
    assert status == 0, out
    assert f"a pass is already running on task queue {harness.task_queue!r}: {first.id}" in out
    assert "waiting for it instead of starting a second" in out
    assert re.search(r"^x_idempotency\s+3\s", out, re.MULTILINE)  # the pass it waited on
    assert len(held.runs) == 1
    passes = await listed(harness.client, f'TaskQueue = "{harness.task_queue}"')
    assert [w.id for w in passes] == [first.id]


async def test_a_sweep_that_meets_this_very_pass_just_started_by_another_says_it_joined(
    temporal_server: RunningTemporal, harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two `sweep`s of one pass at once, the second before Temporal's visibility lists the
    first's (made so: its look at the running passes finds none): it meets the pass under the
    fixed id, joins it, and says who started it, not that it started one; one pass, its report
    printed. (`tests/test_live_pass.py` has a pass this client started: `started pass`.)"""
    release = asyncio.Event()
    held = Held("x_idempotency", release)
    request = {"targets": ["x_idempotency"]}
    other = await Client.connect(
        temporal_server.address, namespace=harness.client.namespace, identity="4242@other-host"
    )

    async def not_listed_yet(*_: Any) -> None:
        return None

    monkeypatch.setattr(passes, "_this_pass_running", not_listed_yet)
    pass_id = f"purge-sweep-{harness.task_queue}"
    said: list[str] = []
    async with harness.run_worker([held]):
        await other.start_workflow("Purge", request, id=pass_id, task_queue=harness.task_queue)
        sweeping = asyncio.create_task(
            passes.sweep(harness.client, harness.task_queue, request, said.append)
        )
        async with asyncio.timeout(60):
            while not said:
                assert not sweeping.done(), sweeping.result()
                await asyncio.sleep(0.05)
        release.set()
        status = await sweeping

    assert status == 0, said
    assert said[0] == (
        f"joined pass {pass_id} on task queue {harness.task_queue!r}, started a moment before "
        "by 4242@other-host with this same input"
    )
    assert re.search(r"^x_idempotency\s+3\s", said[1], re.MULTILINE)
    assert len(held.runs) == 1


async def test_a_temporal_cli_schedule_of_the_printed_input_routes_as_the_config_does(
    tmp_path: Path, temporal_server: RunningTemporal, harness: Harness
) -> None:
    """`schedule --print-input` prints the input the config's own schedule starts passes with;
    a `temporal schedule create --input` of it fires passes whose activities go to the queue of
    the config's own targets (so mid-deploy only workers of this config take them), where the
    README's literal input sends them to the pass's queue."""
    idempotency_rows(harness.db, {"old": harness.now_ms - HOUR, "new": harness.now_ms + HOUR})
    config = config_file(
        tmp_path, harness.url, harness.task_queue, targets='[[targets]]\nkind = "idempotency"\n'
    )
    cfg = load_config(config)
    printed = await asyncio.to_thread(
        cli, temporal_server, "schedule", "--config", str(config), "--print-input"
    )
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout) == cfg.scheduled_input(cfg.schedule)
    assert printed.stdout.count("\n") == 1

    schedule_id = f"purge-cli-{uuid.uuid4().hex[:8]}"
    temporal = venv_executable("temporal")
    address = ["--address", temporal_server.address]
    create = ["schedule", "create", "--schedule-id", schedule_id, "--cron", "23 * * * *"]
    create += ["--type", "Purge", "--task-queue", harness.task_queue, "--workflow-id", "p"]
    subprocess.run([temporal, *create, "--input", printed.stdout, *address], check=True)
    try:
        subprocess.run([temporal, "schedule", "trigger", "--schedule-id", schedule_id, *address],
                       check=True)  # fmt: skip
        handle = harness.client.get_schedule_handle(schedule_id)
        async with harness.run_worker([kinds.idempotency(harness.pool)], config=cfg):
            described = await until_described(handle, lambda d: bool(d.info.recent_actions))
            started: Any = described.info.recent_actions[0].action
            result = await harness.client.get_workflow_handle(started.workflow_id).result()
    finally:
        await harness.client.get_schedule_handle(schedule_id).delete()

    assert [s["name"] for s in result["swept"]] == ["x_idempotency"]
    assert keys(harness.db, "x_idempotency") == {"new"}
    queues = {
        e.activity_task_scheduled_event_attributes.task_queue.name
        for e in (
            await harness.client.get_workflow_handle(started.workflow_id).fetch_history()
        ).events
        if e.HasField("activity_task_scheduled_event_attributes")
    }
    assert queues == {cfg.own_queue}


@pytest.mark.parametrize("running", ["dry run", "old config"])
async def test_sweep_waits_out_a_running_pass_that_is_not_this_one_then_sweeps(
    tmp_path: Path,
    temporal_server: RunningTemporal,
    harness: Harness,
    running: str,
) -> None:
    """A dry run of the config, or a pass of an older config without its `x_idempotency`, is
    running: its report is not this sweep's. `sweep` says why, waits for it to end, then runs
    its own pass, which deletes the expired keys."""
    idempotency_rows(
        harness.db,
        {"a": harness.now_ms - HOUR, "b": harness.now_ms - HOUR, "c": harness.now_ms + HOUR},
    )
    release = asyncio.Event()
    held = Held("x_auth", release)
    config = config_file(tmp_path, harness.url, harness.task_queue)
    cfg = load_config(config)
    registry = TargetRegistry([kinds.idempotency(harness.pool), held])
    request = cfg.pass_input(dry_run=True) if running == "dry run" else {"targets": [held.name]}
    log = tmp_path / "sweep.log"
    async with harness.run_worker(registry, config=cfg):
        first = await held_pass(harness, held, request, f"purge-hourly-{uuid.uuid4()}")
        status = await sweep_beside(temporal_server, config, log, "waiting for it to end", release)

    out = log.read_text()
    assert status == 0, out
    why = "it is a dry run" if running == "dry run" else "it does not sweep x_idempotency"
    assert f"{first.id} (started " in out
    assert f", not this pass ({why}); waiting for it to end, then starting this one" in out
    assert re.search(r"^x_idempotency\s+2\s", out, re.MULTILINE), out  # its own pass's
    assert keys(harness.db, "x_idempotency") == {"c"}
    passes = await listed(harness.client, f'TaskQueue = "{harness.task_queue}"', 2)
    assert len(passes) == 2
    await started_once_it_ended(harness, first)


async def started_once_it_ended(harness: Harness, first: WorkflowHandle[Any, Any]) -> None:
    """`sweep`'s own pass started only once `first` had ended: it waited, as it said."""
    ended = await first.describe()
    own = await harness.client.get_workflow_handle(f"purge-sweep-{harness.task_queue}").describe()
    assert ended.close_time is not None
    assert own.start_time >= ended.close_time, (own.start_time, ended.close_time)


async def test_sweep_waits_out_another_schedule_s_pass_of_some_of_its_targets(
    tmp_path: Path, temporal_server: RunningTemporal, harness: Harness
) -> None:
    """Under named schedules, `hot`'s pass sweeps x_auth: a `sweep` of every target is not that
    pass, and would find x_auth held; it says so, waits for it to end, then sweeps its own."""
    idempotency_rows(harness.db, {"a": harness.now_ms - HOUR, "c": harness.now_ms + HOUR})
    release = asyncio.Event()
    held = Held("x_auth", release)
    schedules = (
        '[schedules.hot]\ncron = "*/5 * * * *"\ntargets = ["x_auth"]\n'
        '[schedules.daily]\ncron = "23 3 * * *"\ntargets = ["x_idempotency"]\n'
    )
    config = config_file(tmp_path, harness.url, harness.task_queue, schedules)
    cfg = load_config(config)
    [hot] = [s for s in cfg.named_schedules if s.name == "hot"]
    log = tmp_path / "sweep.log"
    registry = TargetRegistry([kinds.idempotency(harness.pool), held])
    async with harness.run_worker(registry, config=cfg):
        first = await held_pass(harness, held, cfg.scheduled_input(hot), f"{hot.id}-{uuid.uuid4()}")
        status = await sweep_beside(temporal_server, config, log, "waiting for it to end", release)

    out = log.read_text()
    assert status == 0, out
    assert f"{first.id} (started " in out
    assert "not this pass (it does not sweep x_idempotency); waiting for it to end" in out
    assert re.search(r"^x_idempotency\s+1\s", out, re.MULTILINE), out
    assert keys(harness.db, "x_idempotency") == {"c"}
    assert len(held.runs) == 2  # hot's pass, then this sweep's
    await started_once_it_ended(harness, first)  # one after the other


@pytest.mark.parametrize("held_as", ["another schedule's", "by hand"])
async def test_sweep_beside_a_pass_of_none_of_its_targets(
    tmp_path: Path, temporal_server: RunningTemporal, harness: Harness, held_as: str
) -> None:
    """A running pass of x_auth only, and `sweep --target x_idempotency`. Another schedule's
    pass runs on beside it: the sweep ends while that pass still runs. A pass by hand holds the
    one id of passes by hand: the sweep says so, waits for it to end, then starts its own,
    rather than print that pass's report as its own."""
    idempotency_rows(harness.db, {"a": harness.now_ms - HOUR, "c": harness.now_ms + HOUR})
    release = asyncio.Event()
    held = Held("x_auth", release)
    config = config_file(tmp_path, harness.url, harness.task_queue)
    cfg = load_config(config)
    log = tmp_path / "sweep.log"
    by_hand = held_as == "by hand"
    workflow_id = f"purge-sweep-{harness.task_queue}" if by_hand else f"purge-daily-{uuid.uuid4()}"
    registry = TargetRegistry([kinds.idempotency(harness.pool), held])
    env = clean_env(TEMPORAL_ADDRESS=temporal_server.address)
    async with harness.run_worker(registry, config=cfg):
        first = await held_pass(harness, held, cfg.pass_input(["x_auth"]), workflow_id)
        try:
            if by_hand:
                status = await sweep_beside(
                    temporal_server, config, log, "waiting for it to end", release,
                    "--target", "x_idempotency",
                )  # fmt: skip
            else:
                sweeping = start(
                    ["sweep", "--config", str(config), "--target", "x_idempotency"], env, log
                )
                try:
                    status = await asyncio.to_thread(sweeping.wait, 60)
                finally:
                    stop(sweeping)
                assert (await first.describe()).status == WorkflowExecutionStatus.RUNNING
        finally:
            release.set()
        await first.result()

    out = log.read_text()
    assert status == 0, out
    assert re.search(r"^x_idempotency\s+1\s", out, re.MULTILINE), out
    assert keys(harness.db, "x_idempotency") == {"c"}
    if by_hand:
        assert (
            f"a pass is already running under {workflow_id}, not this pass (it does not sweep "
            "x_idempotency); waiting for it to end, then starting this one"
        ) in out
    else:
        assert "waiting" not in out, out


@pytest.mark.parametrize(
    ("theirs", "ours", "overlap"),
    [
        (["sessions"], ["sessions@tenant_0042"], True),
        (["sessions@tenant_0042"], ["sessions"], True),
        (["sessions@tenant_0042"], ["sessions@tenant_0042"], True),
        (["sessions@tenant_0001"], ["sessions@tenant_0042"], False),
        (["x_auth"], ["sessions@tenant_0042"], False),
    ],
)
def test_a_pattern_overlaps_each_of_its_tables_named_by_hand(
    theirs: list[str], ours: list[str], overlap: bool
) -> None:
    """A running pass of the pattern `sessions` sweeps `sessions@tenant_0042` too: a sweep of
    that one table waits it out rather than run beside it (and find its table busy); two
    different tables of one pattern do not overlap."""
    assert sweeps_any({"targets": theirs}, {"targets": ours}) is overlap


async def ctrl_c_once_said(
    config: Path, temporal_server: RunningTemporal, tmp_path: Path, *said: str
) -> tuple[int, str]:
    """`sweep` of `config` as a process, Ctrl-C (SIGINT) once it has said each of `said`
    while still running: its exit status and all it printed."""
    log = tmp_path / "sweep.log"
    sweeping = start(
        ["sweep", "--config", str(config)], clean_env(TEMPORAL_ADDRESS=temporal_server.address), log
    )
    try:
        await asyncio.to_thread(
            wait_for, lambda: all(map(log.read_text().__contains__, said)), 60, f"sweep: {said}"
        )
        assert sweeping.poll() is None
        sweeping.send_signal(signal.SIGINT)
        status = await asyncio.to_thread(sweeping.wait, 30)
    finally:
        stop(sweeping)
    return status, log.read_text()


@pytest.mark.waits
async def test_sweep_with_no_worker_says_so_and_ctrl_c_leaves_the_pass_running(
    tmp_path: Path, temporal_server: RunningTemporal, harness: Harness
) -> None:
    """No worker is up: after a few seconds `sweep` names the queues no worker polls, and
    keeps waiting; Ctrl-C then stops the command in one line, no traceback, status 130, and
    the pass it started is still there for a worker to run."""
    config = config_file(tmp_path, harness.url, harness.task_queue)
    own = load_config(config).own_queue
    pass_id = f"purge-sweep-{harness.task_queue}"

    # The notice may come before the pass is started (`sweep` looks from its start): Ctrl-C
    # once both are said, else the pass would not yet be one that goes on.
    status, out = await ctrl_c_once_said(
        config, temporal_server, tmp_path, "no worker polls", f"started pass {pass_id}"
    )

    assert status == 130, out
    assert (
        f"no worker polls task queue {harness.task_queue!r} (passes), {own!r} (activities): "
        "the pass waits until one does"
    ) in out
    assert out.rstrip().endswith(
        f"interrupted; pass {pass_id} goes on in Temporal (`report` shows it)"
    )
    assert "Traceback" not in out
    handle = harness.client.get_workflow_handle(pass_id)
    described = await handle.describe()
    assert described.status == WorkflowExecutionStatus.RUNNING
    # Bounded as the schedule's passes are: one no worker can go on with does not hold every
    # later `sweep` of its targets behind it.
    ends_by = described.raw_description.execution_config.workflow_execution_timeout
    assert ends_by.ToTimedelta() == timedelta(minutes=95)  # budget 50 + worker_wait 5 + 40
    await handle.terminate()


@pytest.mark.waits
async def test_ctrl_c_while_sweep_waits_out_another_pass_says_it_started_none(
    tmp_path: Path, temporal_server: RunningTemporal, harness: Harness
) -> None:
    """A dry run holds the pass id (no worker runs it): `sweep` says it waits for that pass
    to end, and Ctrl-C then says no pass of its own was started, and none was: the dry run
    is the only run under the id, untouched."""
    config = config_file(tmp_path, harness.url, harness.task_queue)
    dry = {**load_config(config).pass_input(), "dry_run": True}
    pass_id = f"purge-sweep-{harness.task_queue}"
    theirs = await harness.client.start_workflow(
        "Purge", dry, id=pass_id, task_queue=harness.task_queue
    )

    status, out = await ctrl_c_once_said(config, temporal_server, tmp_path, "waiting for it to end")

    assert status == 130, out
    assert "(it is a dry run); waiting for it to end, then starting this one" in out
    assert out.rstrip().endswith("interrupted; this sweep had started no pass; none runs for it")
    assert "goes on" not in out
    latest = await harness.client.get_workflow_handle(pass_id).describe()
    assert latest.run_id == theirs.result_run_id
    assert latest.status == WorkflowExecutionStatus.RUNNING
    await theirs.terminate()


async def test_ctrl_c_as_sweep_s_start_returns_says_the_pass_goes_on(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C that lands while `sweep` asks Temporal to start its pass (the server took the
    start; the reply never reached the command) says the pass goes on, not that none runs."""
    start = harness.client.start_workflow

    async def started_then_interrupted(*args: Any, **kwargs: Any) -> Any:
        await start(*args, **kwargs)
        raise asyncio.CancelledError  # Ctrl-C as the reply comes back

    monkeypatch.setattr(harness.client, "start_workflow", started_then_interrupted)
    pass_id = f"purge-sweep-{harness.task_queue}"
    try:
        with pytest.raises(passes.SweepInterrupted) as said:
            await passes.sweep(
                harness.client, harness.task_queue, {"targets": ["x_idempotency"]}, lambda _: None
            )
        running = await harness.client.get_workflow_handle(pass_id).describe()
    finally:
        await harness.client.get_workflow_handle(pass_id).terminate()

    assert running.status == WorkflowExecutionStatus.RUNNING
    assert str(said.value) == (
        f"the pass {pass_id} this sweep asked Temporal to start goes on in Temporal "
        "(`report` shows it)"
    )


async def test_the_unpolled_notice_outlives_a_look_temporal_does_not_answer(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A look at the pass's queues that Temporal does not answer (a moment's outage while
    `sweep` waits) is skipped, and the next look still says what no worker polls: before, the
    notice ended there for good, its error logged as never retrieved after the report."""
    looks: list[str] = []
    unpolled = passes._unpolled

    async def once_unanswered(*args: Any) -> list[tuple[str, int]]:
        looks.append("look")
        if len(looks) == 1:
            raise RPCError("unavailable", RPCStatusCode.UNAVAILABLE, b"")
        return await unpolled(*args)

    monkeypatch.setattr(passes, "_unpolled", once_unanswered)
    monkeypatch.setattr(passes, "UNPOLLED_NOTICE_S", 0.0)
    monkeypatch.setattr(passes, "UNPOLLED_AGAIN_S", 0.05)
    notices = await unpolled_notices(harness, {"targets": ["x_idempotency"]})

    assert len(looks) >= 2
    assert notices
    assert notices[0].startswith("no worker polls task queue")


async def test_sweep_waiting_out_another_pass_with_no_worker_says_no_worker_polls(
    tmp_path: Path, harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No worker is up and a dry run holds the pass id: `sweep` waits for it to end, and says
    that no worker polls the queues, as it does of its own pass, rather than wait in silence
    until the dry run times out."""
    monkeypatch.setattr(passes, "UNPOLLED_NOTICE_S", 0.0)
    config = config_file(tmp_path, harness.url, harness.task_queue)
    request = load_config(config).pass_input()
    await harness.client.start_workflow(
        "Purge",
        {**request, "dry_run": True},
        id=f"purge-sweep-{harness.task_queue}",
        task_queue=harness.task_queue,
    )
    notices = await unpolled_notices(harness, request)

    assert notices
    assert notices[0].startswith(f"no worker polls task queue {harness.task_queue!r} (passes)")


async def unpolled_notices(harness: Harness, request: dict[str, Any]) -> list[str]:
    """`sweep` of `request` until it says a queue has no worker and that it started its pass
    or waits out another under its id (each within a minute), then stopped and the pass under
    `purge-sweep-{task_queue}` terminated: the lines it said a queue has no worker in. (A sweep
    that joins a running pass or starts one through a schedule says other lines: not for this
    helper.) The notice may come before the pass is started (`sweep` looks from its start), so
    stopping at the notice alone could leave no pass to terminate, or one started as the sweep
    was cancelled."""
    said: list[str] = []
    noticed, begun = asyncio.Event(), asyncio.Event()

    def say(line: str) -> None:
        said.append(line)
        if "no worker polls" in line:
            noticed.set()
        if line.startswith("started pass") or "waiting for it to end" in line:
            begun.set()

    sweeping = asyncio.create_task(passes.sweep(harness.client, harness.task_queue, request, say))
    try:
        await asyncio.wait_for(noticed.wait(), 60)
        await asyncio.wait_for(begun.wait(), 60)
    finally:
        sweeping.cancel()
        await asyncio.wait([sweeping])
        await harness.client.get_workflow_handle(f"purge-sweep-{harness.task_queue}").terminate()
    return [line for line in said if "no worker polls" in line]


async def test_sweep_of_an_edited_config_beside_the_old_worker_says_its_targets_will_fail(
    tmp_path: Path,
    temporal_server: RunningTemporal,
    harness: Harness,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker of the config before an edit runs the pass but polls its own targets' queue,
    not the edited config's: `sweep` says that queue has no worker, that its targets fail
    after `worker_wait` (not that the pass waits), and to restart `run` with this config. (That
    they then fail `NoPurgeWorker`: tests/test_deploys.py.)"""
    old = load_config(config_file(tmp_path, harness.url, harness.task_queue))
    edited_path = worker_config(
        tmp_path / "edited.toml",
        harness.url,
        harness.task_queue,
        '[pass]\nworker_wait = "1m"\n' + BUILTINS + TOKENS,
    )
    edited = load_config(edited_path)
    assert edited.own_queue != old.own_queue
    # The notice after a tenth of a second, not five; the pass waits a minute for a worker,
    # so the notice comes while it waits whatever the machine's pace.
    monkeypatch.setattr(passes, "UNPOLLED_NOTICE_S", 0.1)
    async with harness.run_worker(build_registry(old, harness.pool), config=old):
        # The old worker's polls reach the server first: the notice then names only the
        # edited config's queue, however slowly the worker started.
        await until_polled(
            harness.client, harness.task_queue, TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW
        )
        [notice] = await unpolled_notices(harness, edited.pass_input())
    assert notice == (
        f"no worker polls task queue {edited.own_queue!r} (activities): those targets fail as "
        "not taken unless one does within 60 s ([pass] worker_wait); a worker polls only the "
        "queue of its own config's targets: start (or restart) `pg-purge run` with this config"
    )


async def test_sweep_says_so_when_the_worker_stopped_a_moment_ago_though_temporal_lists_it(
    tmp_path: Path,
    temporal_server: RunningTemporal,
    harness: Harness,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Temporal lists a stopped worker among a queue's pollers for minutes: `sweep` judges a
    poller by its last poll, and says the queues have no worker once it is older than a live
    worker's long poll ever is (POLLER_GONE_S; a second here, so the moment comes at once)."""
    config = load_config(config_file(tmp_path, harness.url, harness.task_queue))
    workflow = TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW
    activity = TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY
    async with harness.run_worker(build_registry(config, harness.pool), config=config):
        await until_polled(harness.client, harness.task_queue, workflow)
        await until_polled(harness.client, config.own_queue, activity)
    # The worker has stopped; Temporal still lists it: the queue looks polled.
    assert await listed_pollers(harness.client, harness.task_queue, workflow) > 0
    monkeypatch.setattr(passes, "UNPOLLED_NOTICE_S", 0.1)
    monkeypatch.setattr(passes, "UNPOLLED_AGAIN_S", 0.2)
    monkeypatch.setattr(passes, "POLLER_GONE_S", 1.0)
    # Each queue's last poll a second old before the pass starts, not one crossing that age
    # while the other has not yet: the first notice names both.
    async with asyncio.timeout(60):
        while (
            len(await passes._unpolled(harness.client, harness.task_queue, config.pass_input())) < 2
        ):
            await asyncio.sleep(0.1)
    assert await unpolled_notices(harness, config.pass_input()) == [
        f"no worker polls task queue {harness.task_queue!r} (passes), {config.own_queue!r} "
        "(activities): the pass waits until one does; start `pg-purge run` with this config "
        "(Ctrl-C leaves the pass to it)"
    ]


def test_a_routed_databases_idle_queue_names_the_worker_that_would_poll_it() -> None:
    """The scheduler's config often has no URL for a region's database: a worker started
    from it would not poll that database's queue, so the fix names where its URL is set."""
    request = {"queues": {"eu": "purge-eu:1", "_default": "purge:2"}, "worker_wait_ms": 30_000}
    activity = int(TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)

    eu_only = passes.unpolled_line([("purge-eu:1", activity)], "purge", request)
    both = passes.unpolled_line([("purge:2", activity), ("purge-eu:1", activity)], "purge", request)

    assert eu_only == (
        "no worker polls task queue 'purge-eu:1' (activities): those targets fail as not taken "
        "unless one does within 30 s ([pass] worker_wait); start `pg-purge run` where database "
        "'eu''s URL is set (a config with this one's targets there, its url_env in the "
        "environment)"
    )
    assert "start `pg-purge run` with this config; start `pg-purge run` where database 'eu'" in (
        both
    )


def test_a_named_database_on_the_config_s_own_queue_is_not_taken_for_a_region() -> None:
    """A database named in `[databases]` with no queue of its own has the config's own queue
    (as the shipped Kubernetes config's `app` has): with that queue idle after a config edit,
    the fix is the restart with this config, not a URL set somewhere. Databases that share a
    queue of their own are each named."""
    own = "purge:8a0f2d493aa3"
    request = {
        "queues": {"app": own, "eu": "purge-x:0123456789ab", "fr": "purge-x:0123456789ab"},
        "worker_wait_ms": 30_000,
    }
    activity = int(TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)

    app_only = passes.unpolled_line([(own, activity)], "purge", request)
    shared = passes.unpolled_line([("purge-x:0123456789ab", activity)], "purge", request)

    assert app_only == (
        f"no worker polls task queue {own!r} (activities): those targets fail as not taken "
        "unless one does within 30 s ([pass] worker_wait); a worker polls only the queue of its "
        "own config's targets: start (or restart) `pg-purge run` with this config"
    )
    assert "start `pg-purge run` where database 'eu', 'fr''s URL is set" in shared


@pytest.mark.parametrize("command", ["schedule", "sweep", "report", "run"])
async def test_a_namespace_the_server_does_not_have_is_one_line(
    tmp_path: Path, temporal_server: RunningTemporal, harness: Harness, command: str
) -> None:
    """`run` as a process: a worker's start needs the main thread (its signal handlers). Its
    workers, were they started, would each find the namespace missing (a traceback); it stops
    before them."""
    config = config_file(tmp_path, harness.url, harness.task_queue)
    env = clean_env(TEMPORAL_ADDRESS=temporal_server.address, TEMPORAL_NAMESPACE="no-such-ns")
    call = run_process if command == "run" else run_main

    done = await asyncio.to_thread(call, command, "--config", str(config), env=env)

    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        "pg-purge: Temporal refused: Namespace no-such-ns is not found. (set TEMPORAL_NAMESPACE, "
        "or create it: temporal operator namespace create)\n"
    )
    assert done.stdout == ""


async def test_report_shows_recent_passes_with_removed_per_target(
    tmp_path: Path,
    temporal_server: RunningTemporal,
    harness: Harness,
) -> None:
    idempotency_rows(
        harness.db,
        {"a": harness.now_ms - HOUR, "b": harness.now_ms - HOUR, "c": harness.now_ms + HOUR},
    )
    async with harness.run_worker([kinds.idempotency(harness.pool), kinds.auth(harness.pool)]):
        await run_pass(harness.client, harness.task_queue, {"targets": ["x_idempotency", "x_auth"]})
        with pytest.raises(Exception, match="failed"):
            await run_pass(
                harness.client, harness.task_queue, {"targets": ["x_idempotency", "missing"]}
            )
        await run_pass(harness.client, harness.task_queue, {"targets": ["x_auth"], "dry_run": True})
    config = config_file(tmp_path, harness.url, harness.task_queue)
    # `report` shows the passes visibility lists: all three first (a status it lags on is
    # read from the pass's own description, tested below).
    await listed(harness.client, f'TaskQueue = "{harness.task_queue}"', 3)

    done = await asyncio.to_thread(cli, temporal_server, "report", "--config", str(config))

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = lines[0].split()
    assert header[:4] == ["started", "(UTC)", "took", "status"]
    assert {"x_idempotency", "x_auth", "missing", "total"} <= set(header)
    rows = [ln for ln in lines[2:] if re.match(r"\d{4}-", ln)]
    assert len(rows) == 3
    assert "completed (dry run)" in rows[0]
    assert "failed" in rows[1]
    assert "FAILED" in rows[1]  # the missing target's cell
    assert re.search(r"completed\s+2\s+0\s+2\s", rows[2]), rows[2]  # idempotency 2, auth 0
    assert "PurgeTargetsFailed" in done.stdout  # the failed pass's error, under the table

    last_one = await asyncio.to_thread(
        cli, temporal_server, "report", "--config", str(config), "--last", "1"
    )
    assert len([ln for ln in last_one.stdout.splitlines() if re.match(r"\d{4}-", ln)]) == 1, (
        last_one.stdout + last_one.stderr
    )


async def test_report_reads_the_status_of_a_pass_visibility_still_lists_as_running(
    harness: Harness,
) -> None:
    """Visibility lags the history: right after a pass closes, it may still list it as running.
    `report` then asks the pass itself, and shows it closed, with what it removed."""
    idempotency_rows(harness.db, {"a": harness.now_ms - HOUR, "c": harness.now_ms + HOUR})
    async with harness.run_worker([kinds.idempotency(harness.pool)]):
        await run_pass(harness.client, harness.task_queue, {"targets": ["x_idempotency"]})
    [closed] = await listed(
        harness.client, f'TaskQueue = "{harness.task_queue}" AND ExecutionStatus = "Completed"'
    )
    # The listing as a lagging visibility store gives it: the same run, still running.
    lagging = dataclasses.replace(closed, status=WorkflowExecutionStatus.RUNNING, close_time=None)

    summary = await summarize(harness.client, lagging)

    assert (summary.status, summary.removed) == ("completed", {"x_idempotency": "1"})
    assert summary.seconds is not None


async def test_worker_serves_rows_removed_per_target_as_prometheus_metrics(
    tmp_path: Path,
    temporal_server: RunningTemporal,
    harness: Harness,
) -> None:
    idempotency_rows(
        harness.db,
        {"a": harness.now_ms - HOUR, "b": harness.now_ms - HOUR, "c": harness.now_ms + HOUR},
    )
    [port] = free_ports(1)
    config = config_file(tmp_path, harness.url, harness.task_queue)
    log = tmp_path / "worker.log"
    env = clean_env(TEMPORAL_ADDRESS=temporal_server.address)
    worker = start_worker(config, env, log, "--metrics", f"127.0.0.1:{port}")
    try:
        wait_for(lambda: "worker on task queue" in log.read_text(), 60, "the worker")
        await run_pass(harness.client, harness.task_queue, {"targets": ["x_idempotency", "x_auth"]})
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
            metrics = page.read().decode()
    finally:
        stop(worker)

    removed = {
        m.group(1): int(float(m.group(2)))
        for m in re.finditer(
            r'^purge_rows_removed\{[^}]*target="([^"]+)"[^}]*\} (\S+)', metrics, re.M
        )
    }
    assert removed == {"x_idempotency": 2, "x_auth": 0}
    assert re.search(r'^purge_target_seconds_count\{[^}]*target="x_auth"', metrics, re.M)
    assert "temporal_activity_execution_latency" in metrics  # the SDK's own, beside ours
    assert f"Prometheus metrics at http://127.0.0.1:{port}/metrics" in log.read_text()
    # One structured line per target's result.
    assert re.search(r"purge_target=x_idempotency purge_removed=2 ", log.read_text())


async def test_replay_checks_recent_passes_and_history_files(
    tmp_path: Path,
    temporal_server: RunningTemporal,
    harness: Harness,
) -> None:
    async with harness.run_worker([kinds.idempotency(harness.pool)]):
        await run_pass(harness.client, harness.task_queue, {"targets": ["x_idempotency"]})
        await run_pass(harness.client, harness.task_queue, {"targets": []})
    # Visibility lags the histories: the command reads the passes it lists, so both first.
    await listed(
        harness.client, f'TaskQueue = "{harness.task_queue}" AND ExecutionStatus = "Completed"', 2
    )
    config = config_file(tmp_path, harness.url, harness.task_queue)
    from_cluster = await asyncio.to_thread(
        cli, temporal_server, "replay", "--config", str(config), "--last", "5"
    )
    assert from_cluster.returncode == 0, from_cluster.stdout + from_cluster.stderr
    assert "2 of 2 histories replay" in from_cluster.stdout

    old_queue = f"tq-old-{uuid.uuid4()}"
    activities = PurgeActivities(TargetRegistry([kinds.idempotency(harness.pool)]))
    async with Worker(
        harness.client, task_queue=old_queue, workflows=[PurgeWithoutDuplicateCheck],
        activities=[activities.purge_target],
    ):  # fmt: skip
        handle = await harness.client.start_workflow(
            "Purge", {"targets": ["x_idempotency", "x_idempotency"]},
            id=f"purge-old-{uuid.uuid4()}", task_queue=old_queue,
        )  # fmt: skip
        await handle.result()
    old = tmp_path / "old.json"
    old.write_text((await history(harness.client, handle.id)).to_json())
    # Two of the committed histories beside it: tests/test_replay.py replays every one, and
    # each costs this command about 0.1 s more.
    shipped = sorted((REPO / "tests" / "histories").glob("*.json"))[-2:]

    files = cli_process(temporal_server, "replay", str(old), *(str(p) for p in shipped))
    assert files.returncode == 1
    assert "FAILED   old: " in files.stdout
    assert f"{len(shipped)} of {len(shipped) + 1} histories replay" in files.stdout


def test_replay_of_another_workflow_s_history_fails_it_in_one_line(tmp_path: Path) -> None:
    """A history whose workflow is not Purge (nor PurgeChunk) is not this package's: `replay`
    fails it in one line, exit 1, and replays the others."""
    shipped = REPO / "tests" / "histories" / "v1-pass.json"
    foreign = json.loads(shipped.read_text(encoding="utf-8"))
    foreign["events"][0]["workflowExecutionStartedEventAttributes"]["workflowType"]["name"] = (
        "Invoice"
    )
    path = tmp_path / "invoice.json"
    path.write_text(json.dumps(foreign), encoding="utf-8")

    done = run_main("replay", str(path), str(shipped), env=clean_env())

    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "FAILED   invoice: a history of Invoice, not of Purge or PurgeChunk",
        "ok       v1-pass",
        "1 of 2 histories replay",
    ]
    assert "Traceback" not in done.stderr


def test_commands_connect_through_a_temporal_toml_profile(
    tmp_path: Path, temporal_server: RunningTemporal, schema_url: str, task_queue: str
) -> None:
    """Temporal's environment configuration is honoured: a profile in a temporal.toml chosen with
    TEMPORAL_PROFILE, with no TEMPORAL_ADDRESS anywhere."""
    profiles = tmp_path / "temporal.toml"
    profiles.write_text(
        f'[profile.staging]\naddress = "{temporal_server.address}"\nnamespace = "default"\n'
    )
    config = config_file(tmp_path, schema_url, task_queue)
    env = clean_env(TEMPORAL_CONFIG_FILE=str(profiles), TEMPORAL_PROFILE="staging")

    done = run_process("report", "--config", str(config), env=env)
    unreachable = run_main(
        "report", "--config", str(config), env={**env, "TEMPORAL_PROFILE": "nowhere"}
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"no passes on task queue {task_queue!r} yet"
    assert unreachable.returncode == 2
    assert unreachable.stderr == (
        "pg-purge: config error: Temporal environment configuration: Profile 'nowhere' not found\n"
    )
