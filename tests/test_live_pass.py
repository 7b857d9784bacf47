"""One live pass per schedule, whatever starts it: `sweep` starts the schedule's pass through the
schedule, so the schedule's overlap policy (SKIP) covers a firing while it runs. (Two `sweep`s:
tests/test_operate.py; a pass typed by hand beside another, kept apart per table by the
advisory lock: tests/test_fleet.py.)"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from temporalio.client import ScheduleDescription

from activities import builtin_kinds as kinds
from purge_config.file import PurgeConfig, load_config
from purge_ops.passes import sweep
from purge_ops.schedule import MEMO_KEY, ensure_schedules
from tests.conftest import Harness
from tests.support.passes import listed
from tests.support.procs import worker_config
from tests.support.rows import HOUR, idempotency_rows, keys


class Slow:
    """A target that runs until released; its runs counted."""

    name = "slow"

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.runs = 0

    async def purge_expired(self, now_ms: int) -> int:
        self.runs += 1
        await self.release.wait()
        return 3


async def test_the_schedule_firing_during_a_sweep_pass_starts_no_second_pass(
    tmp_path: Path, harness: Harness
) -> None:
    schedule_id = f"purge-live-{uuid.uuid4().hex[:8]}"
    path = worker_config(
        tmp_path / "purge.toml",
        harness.url,
        harness.task_queue,
        f'[schedule]\nid = "{schedule_id}"\ncron = "0 0 1 1 *"\n'
        '[[targets]]\nkind = "python"\nfactory = "tests.support.gate:targets"\nnames = ["slow"]\n',
    )
    config = load_config(path)
    slow = Slow()
    said: list[str] = []
    await ensure_schedules(harness.client, config)
    schedule = harness.client.get_schedule_handle(schedule_id)
    try:
        async with harness.run_worker([slow], config=config):
            sweeping = asyncio.create_task(
                sweep(harness.client, config.task_queue, config.pass_input(), said.append,
                      schedule_id)
            )  # fmt: skip
            while not slow.runs:
                assert not sweeping.done(), said
                await asyncio.sleep(0.02)
            # The schedule fires while the sweep's pass runs: its policy skips the firing.
            await schedule.trigger()
            # Until the schedule says it skipped: the slow target waits that long, whatever the
            # machine's pace (the two minutes only keep a broken schedule from hanging the run).
            async with asyncio.timeout(120):
                while not (await schedule.describe()).info.num_actions_skipped_overlap:
                    assert not sweeping.done(), said
                    await asyncio.sleep(0.05)
            slow.release.set()
            status = await sweeping
        described = await schedule.describe()
    finally:
        await schedule.delete()

    assert status == 0, said
    assert described.info.num_actions_skipped_overlap == 1
    assert slow.runs == 1
    query = f'TaskQueue = "{harness.task_queue}"'
    passes = await listed(harness.client, query)  # visibility lags the histories a moment
    assert len(passes) == 1
    assert passes[0].id.startswith(schedule_id)  # started by the schedule, for the sweep
    # With the schedule's memo, by which the worker tells a scheduled pass (pass_metrics).
    started = harness.client.get_workflow_handle(passes[0].id, run_id=passes[0].run_id)
    assert MEMO_KEY in await (await started.describe()).memo()
    assert any(line.startswith(f"started pass {schedule_id}") for line in said), said


async def swept_beside(
    harness: Harness, config: PurgeConfig, schedule_id: str
) -> tuple[int, list[str], ScheduleDescription]:
    """`sweep` of `config`'s pass with an idempotency worker up, beside the existing schedule
    `schedule_id`: its status, what it said, and the schedule after it (then deleted)."""
    said: list[str] = []
    schedule = harness.client.get_schedule_handle(schedule_id)
    try:
        async with harness.run_worker([kinds.idempotency(harness.pool)], config=config):
            status = await sweep(
                harness.client, config.task_queue, config.pass_input(), said.append, schedule_id
            )
        return status, said, await schedule.describe()
    finally:
        await schedule.delete()


async def test_a_schedule_of_this_id_on_another_task_queue_is_not_this_sweep_s(
    tmp_path: Path, harness: Harness
) -> None:
    """Another config's schedule under this config's id (it starts passes on another task
    queue): `sweep` neither triggers it nor advises taking it over; it starts a pass of its own,
    which sweeps."""
    schedule_id = f"purge-live-{uuid.uuid4().hex[:8]}"
    entries = (
        f'[schedule]\nid = "{schedule_id}"\ncron = "0 0 1 1 *"\n[[targets]]\nkind = "idempotency"\n'
    )
    theirs = load_config(worker_config(tmp_path / "theirs.toml", harness.url, "elsewhere", entries))
    ours = load_config(
        worker_config(tmp_path / "ours.toml", harness.url, harness.task_queue, entries)
    )
    idempotency_rows(harness.db, {"old": harness.now_ms - HOUR, "new": harness.now_ms + HOUR})
    await ensure_schedules(harness.client, theirs)
    status, said, described = await swept_beside(harness, ours, schedule_id)

    assert status == 0, said
    assert said[0] == (
        f"schedule {schedule_id} starts passes on task queue 'elsewhere', not "
        f"{harness.task_queue!r}: starting a pass of its own"
    )
    assert (
        said[1]
        == f"started pass purge-sweep-{harness.task_queue} on task queue {harness.task_queue!r}"
    )
    assert described.info.recent_actions == []  # not triggered
    assert keys(harness.db, "x_idempotency") == {"new"}


async def test_a_sweep_through_a_paused_schedule_says_so_and_keeps_the_pause(
    tmp_path: Path, harness: Harness
) -> None:
    schedule_id = f"purge-live-{uuid.uuid4().hex[:8]}"
    entries = f'[schedule]\nid = "{schedule_id}"\n[[targets]]\nkind = "idempotency"\n'
    config = load_config(
        worker_config(tmp_path / "purge.toml", harness.url, harness.task_queue, entries)
    )
    idempotency_rows(harness.db, {"old": harness.now_ms - HOUR, "new": harness.now_ms + HOUR})
    await ensure_schedules(harness.client, config)
    await harness.client.get_schedule_handle(schedule_id).pause(note="incident 42")
    status, said, described = await swept_beside(harness, config, schedule_id)

    assert status == 0, said
    assert said[0] == (
        f"schedule {schedule_id} is PAUSED (incident 42): this sweep runs one pass through it all "
        "the same; the pause stays"
    )
    assert said[1].startswith(f"started pass {schedule_id}-")
    assert described.schedule.state.paused
    assert keys(harness.db, "x_idempotency") == {"new"}
