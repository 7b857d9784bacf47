"""One live pass per schedule, whatever starts it: `sweep` starts the schedule's pass through the
schedule, so the schedule's overlap policy (SKIP) covers a firing while it runs. (Two `sweep`s:
tests/test_operate.py; a pass typed by hand beside another, kept apart per table by the
advisory lock: tests/test_fleet.py.)"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from purge_config.file import load_config
from purge_ops.passes import sweep
from purge_ops.schedule import ensure_schedules
from tests.conftest import Harness
from tests.support.passes import listed
from tests.support.procs import worker_config


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
    assert any(line.startswith(f"started pass {schedule_id}") for line in said), said
