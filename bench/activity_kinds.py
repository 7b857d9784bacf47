"""What one target costs Temporal, by the kind of activity that sweeps it: side by side, on one
dev server, a workflow runs N targets one after the other (as a spread pass's child does at the
default `max_per_database = 1`) and N at a time, each target a no-op activity, either as an
activity task (dispatched eagerly) or as a local activity (run by the workflow's own worker,
recorded as a marker): the package ships both, the second for a pattern's small tables in a
child on their database's queue. The activity does nothing, so what is
measured is Temporal's and the SDK's share of a small table's sweep: the floor under case 11.

    python -m bench.activity_kinds --targets 200

This is a measurement for a decision (docs/decisions/spread-passes.md): local activities cannot
heartbeat, and run wherever the workflow task runs, so the package keeps them to small tables.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

from bench.services import scratch_dir, temporal_dev_server

#: Rounds of each form; the median of their ms a target is shown.
ROUNDS = 3


@dataclass(frozen=True)
class Order:
    targets: int
    at_once: int
    local: bool


@activity.defn
async def sweep_nothing(name: str) -> int:
    return 0


@workflow.defn
class Targets:
    """N no-op targets, at most `at_once` at a time, each a regular or a local activity."""

    @workflow.run
    async def run(self, order: Order) -> int:
        names = [f"t{i}" for i in range(order.targets)]
        done = 0
        for first in range(0, len(names), order.at_once):
            group = names[first : first + order.at_once]
            if order.local:
                calls = [
                    workflow.execute_local_activity(
                        sweep_nothing, n, start_to_close_timeout=timedelta(seconds=30)
                    )
                    for n in group
                ]
            else:
                calls = [
                    workflow.execute_activity(
                        sweep_nothing, n, start_to_close_timeout=timedelta(seconds=30)
                    )
                    for n in group
                ]
            done += len(await asyncio.gather(*calls))
        return done


async def ms_a_target(client: Client, queue: str, order: Order) -> float:
    started = time.perf_counter()
    await client.execute_workflow(Targets.run, order, id=f"kinds-{uuid.uuid4()}", task_queue=queue)
    return (time.perf_counter() - started) * 1000 / order.targets


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=int, default=200)
    args = parser.parse_args()
    with scratch_dir("purge-bench-kinds-") as scratch:
        async with temporal_dev_server(scratch) as (client, _):
            queue = f"kinds-{uuid.uuid4()}"
            async with Worker(
                client, task_queue=queue, workflows=[Targets], activities=[sweep_nothing]
            ):
                await ms_a_target(client, queue, Order(20, 1, False))  # warm-up
                await ms_a_target(client, queue, Order(20, 1, True))
                print(
                    f"{args.targets} no-op targets a workflow, median of {ROUNDS} rounds,"
                    " ms a target:"
                )
                for at_once in (1, 8):
                    row = []
                    for local in (False, True):
                        runs = []
                        for _ in range(ROUNDS):
                            order = Order(args.targets, at_once, local)
                            runs.append(await ms_a_target(client, queue, order))
                        row.append(statistics.median(runs))
                    print(
                        f"  {at_once} at a time: activity {row[0]:.2f}, local activity "
                        f"{row[1]:.2f} ({row[0] / row[1]:.1f}x)"
                    )


if __name__ == "__main__":
    asyncio.run(main())
