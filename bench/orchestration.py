"""Case 5: what Temporal adds per target, from one `Purge` pass over many empty targets."""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from psycopg import sql
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment

from activities import builtin_targets as kinds
from activities.payloads import PurgeStep
from activities.sweep import PurgeActivities
from activities.targets import TargetRegistry
from bench.cases import Bench
from purge_config.names import TableName
from purge_dev.servers import TemporalDevServer
from purge_ops.runner import new_worker

log = logging.getLogger("bench")

TARGETS = 50
PASSES = 3


@dataclass
class OrchestrationResult:
    targets: int
    pass_seconds: list[float] = field(default_factory=list)
    """Measured passes through Temporal, after one warm-up pass."""
    warmup_seconds: float = 0.0
    direct_seconds: float = 0.0
    """The same targets swept one after another through ActivityEnvironment, no Temporal."""

    @property
    def median_pass(self) -> float:
        return statistics.median(self.pass_seconds) if self.pass_seconds else 0.0

    @property
    def per_target_ms(self) -> float:
        return 1000 * self.median_pass / self.targets

    @property
    def direct_per_target_ms(self) -> float:
        return 1000 * self.direct_seconds / self.targets


async def run_orchestration(bench: Bench, scratch: Path) -> OrchestrationResult:
    """One warm-up and PASSES measured passes over TARGETS empty `expiring` targets."""
    names = [f"empty_{n}" for n in range(TARGETS)]
    for name in names:
        await bench.conn.execute(
            sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING ALL)").format(
                sql.Identifier(bench.schema, name), sql.Identifier(bench.schema, "x_auth_lockouts")
            )
        )
    targets = [
        kinds.expiring(bench.pool, f"bench_{name}", TableName(name, bench.schema), "until_ms")
        for name in names
    ]
    registry = TargetRegistry(targets)
    result = OrchestrationResult(targets=TARGETS)

    # The floor: the activity's own work per empty target (catalog check, one DELETE).
    activities = PurgeActivities(registry)
    env = ActivityEnvironment()
    started = time.perf_counter()
    for target in targets:
        await env.run(activities.purge_target, PurgeStep(name=target.name, now_ms=bench.now_ms))
    result.direct_seconds = time.perf_counter() - started

    server = TemporalDevServer(scratch / "temporal")
    # start() blocks while it polls for readiness; off the loop, which holds open connections.
    await asyncio.to_thread(server.start)
    try:
        client = await Client.connect(server.address)
        task_queue = f"bench-{uuid.uuid4()}"
        request = {"targets": [t.name for t in targets]}
        async with new_worker(client, registry, task_queue):
            for n in range(PASSES + 1):
                started = time.perf_counter()
                report = await client.execute_workflow(
                    "Purge", request, id=f"bench-{uuid.uuid4()}", task_queue=task_queue
                )
                seconds = time.perf_counter() - started
                swept = len(report.get("swept", [])) if isinstance(report, dict) else 0
                if swept != TARGETS:
                    raise RuntimeError(f"a pass swept {swept} targets, want {TARGETS}")
                if n == 0:
                    # The first pass pays the workflow sandbox's imports and the worker's polls.
                    result.warmup_seconds = seconds
                else:
                    result.pass_seconds.append(seconds)
                log.info("orchestration: pass %d over %d targets in %.3f s", n, TARGETS, seconds)
    finally:
        await asyncio.to_thread(server.stop)
    return result
