"""Where a pass's time through Temporal goes, read from its own history.

A one-target pass over a target that deletes nothing, run again and again by an in-process
worker on Temporal's dev server: for each step of the history (the workflow task's dispatch to
a poller, its run on the worker, the activity, ...) the median gap between its events' server
timestamps, beside the median a client waits for the pass end to end. The worker as it ships and
one without the workflow sandbox side by side: what the sandbox costs of each workflow task.

    python -m bench.temporal_gaps --passes 30
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time
import uuid
from collections import defaultdict
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner

from activities.registry import TargetRegistry
from bench.services import scratch_dir, temporal_dev_server
from purge_ops.runner import new_worker

#: Passes run before the measured ones: the worker's first workflow and activity warm it up.
WARMUP = 5


class NothingToDelete:
    """A target whose sweep takes no time: what is left is Temporal's and the worker's."""

    name = "nothing"

    async def purge_expired(self, now_ms: int) -> int:
        return 0


async def measure(client: Client, passes: int, **worker: Any) -> tuple[float, dict[str, float]]:
    """(the client's median ms for a pass, the median ms of each step of its history)."""
    task_queue = f"gaps-{uuid.uuid4()}"
    gaps: dict[str, list[float]] = defaultdict(list)
    waited = []
    async with new_worker(client, TargetRegistry([NothingToDelete()]), task_queue, **worker):
        for n in range(WARMUP + passes):
            started = time.perf_counter()
            handle = await client.start_workflow(
                "Purge", {"targets": ["nothing"]}, id=f"gaps-{uuid.uuid4()}", task_queue=task_queue
            )
            await handle.result()
            ms = (time.perf_counter() - started) * 1000
            events = [event async for event in handle.fetch_history_events()]
            if n < WARMUP:
                continue
            waited.append(ms)
            for i, (a, b) in enumerate(itertools.pairwise(events)):
                step = f"{i + 1:2d}->{i + 2:2d} {_name(a.event_type)} -> {_name(b.event_type)}"
                gap = b.event_time.ToDatetime() - a.event_time.ToDatetime()
                gaps[step].append(gap.total_seconds() * 1000)
    return statistics.median(waited), {k: statistics.median(v) for k, v in gaps.items()}


def _name(event_type: int) -> str:
    return EventType.Name(event_type).removeprefix("EVENT_TYPE_")  # type: ignore[arg-type]


async def main_async(passes: int) -> None:
    with scratch_dir("purge-bench-gaps-") as scratch:
        async with temporal_dev_server(scratch) as (client, _):
            await _report(client, passes)


async def _report(client: Client, passes: int) -> None:
    runs: dict[str, dict[str, Any]] = {
        "the worker as it ships (sandboxed)": {},
        "without the workflow sandbox": {"workflow_runner": UnsandboxedWorkflowRunner()},
    }
    for label, worker in runs.items():
        waited, gaps = await measure(client, passes, **worker)
        print(f"{label}: a pass end to end {waited:.1f} ms (median of {passes})")
        for step, ms in gaps.items():
            print(f"  {ms:7.2f} ms  {step}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=30, help="measured passes (default 30)")
    args = parser.parse_args()
    asyncio.run(main_async(args.passes))


if __name__ == "__main__":
    main()
