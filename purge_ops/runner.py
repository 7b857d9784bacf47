"""A worker process: the Purge workflow and its activity on one task queue, until told to stop."""

from __future__ import annotations

import asyncio
import logging
import signal
from datetime import timedelta

from temporalio.client import Client
from temporalio.worker import Worker

from activities.builtin_targets import build_registry
from activities.sweep import PurgeActivities
from activities.targets import TargetRegistry
from purge_config.dsn import redact
from purge_config.file import PurgeConfig
from purge_ops import schedule
from purge_ops.connect import connect_temporal, lazy_pools, open_pool
from workflows.chunk import PurgeChunkWorkflow
from workflows.purge import PurgeWorkflow

log = logging.getLogger("purge.worker")

#: How long a stopping worker lets a running sweep finish its current statement and report.
GRACEFUL_SHUTDOWN = timedelta(seconds=20)
#: Send a sweep's progress to the server at least this often (the SDK's default, 0.8 of the
#: 15 s heartbeat timeout, is 12 s). A retry resumes from the last progress the server got, so
#: a worker killed now leaves at most a second of deleted rows out of the report's count.
HEARTBEAT_THROTTLE = timedelta(seconds=1)


def new_worker(
    client: Client,
    registry: TargetRegistry,
    task_queue: str = "purge",
    **options: object,
) -> Worker:
    """A worker that runs `Purge` with the targets of `registry`; for teams wiring it in code.

    `options` go to `temporalio.worker.Worker` (identity, max_concurrent_activities, ...).
    """
    settings: dict[str, object] = {
        "graceful_shutdown_timeout": GRACEFUL_SHUTDOWN,
        "max_heartbeat_throttle_interval": HEARTBEAT_THROTTLE,
        **options,
    }
    activities = PurgeActivities(registry)
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[PurgeWorkflow, PurgeChunkWorkflow],
        activities=[activities.purge_target, activities.expand_pattern],
        **settings,  # type: ignore[arg-type]
    )


async def run_worker(
    config: PurgeConfig,
    *,
    stop: asyncio.Event | None = None,
    temporal_address: str | None = None,
    ensure_schedule: bool = False,
    metrics: str | None = None,
) -> None:
    """Connect, then run a worker for `config` until SIGINT/SIGTERM (or `stop` is set).

    With `ensure_schedule`, create or update the config's schedule first, so a deployment needs
    no separate step; with `metrics` (HOST:PORT), serve Prometheus metrics there.
    """
    url = config.require_database_url()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        pool = await open_pool(url, wait_seconds=config.database_wait_ms / 1000)
        try:
            named = lazy_pools(config.databases)
            registry = build_registry(config, pool, named)
            client = await connect_temporal(temporal_address, metrics=metrics)
            if ensure_schedule:
                outcome = await schedule.ensure_schedule(client, config)
                log.info("%s %s", outcome.action, outcome.summary.replace("\n", "; "))
            if metrics:
                log.info("Prometheus metrics at http://%s/metrics", metrics)
            worker = new_worker(client, registry, config.task_queue)
            async with worker:
                log.info(
                    "worker on task queue %r of %s, database %s, targets: %s",
                    config.task_queue,
                    client.service_client.config.target_host,
                    redact(url),
                    registry.describe(),
                )
                await stop.wait()
                log.info("stopping: letting running sweeps finish (up to %s)", GRACEFUL_SHUTDOWN)
        finally:
            await pool.close()
            for opened in named.values():
                await opened.close()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
