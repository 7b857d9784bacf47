"""A worker process: the Purge workflow and its activities on the queues its config names, until
told to stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any, Literal

from psycopg_pool import AsyncConnectionPool
from temporalio.client import Client
from temporalio.worker import Worker

from activities.builtin_kinds import build_registry
from activities.registry import TargetRegistry
from activities.sweep import PurgeActivities
from purge_config.dsn import redact
from purge_config.file import PurgeConfig
from purge_config.schedules import ScheduleConfig
from purge_ops import schedule
from purge_ops.connect import (
    LazyPool,
    connect_temporal,
    lazy_pools,
    open_pool,
    require_namespace,
    temporal_settings,
    trimming_failures,
)
from purge_ops.pass_metrics import PassMetrics, count_passes_from_zero
from purge_ops.plain_payloads import plain_runner
from purge_ops.probes import DEFAULT_DATABASE, Health, ProbeServer, loopback_port
from workflows.chunk import PurgeChunkWorkflow
from workflows.purge import PurgeWorkflow
from workflows.spread import SMALL_AT_ONCE

log = logging.getLogger("purge.worker")

#: How long a stopping worker waits for its running activities before the SDK cancels them. A
#: sweep does not wait for it: told the worker is stopping, it ends after the batch it is in and
#: hands the rest to another worker (activities.sweep, `WorkerStopping`); a local sweep's (a
#: child's small table) and a pattern's expansion run on, up to this.
GRACEFUL_SHUTDOWN = timedelta(seconds=20)
#: Send a sweep's progress to the server at least this often (the SDK's default, 0.8 of the
#: 15 s heartbeat timeout, is 12 s). A retry resumes from the last progress the server got, so
#: a worker killed now leaves at most a second of deleted rows out of the report's count.
HEARTBEAT_THROTTLE = timedelta(seconds=1)


def new_worker(
    client: Client,
    registry: TargetRegistry,
    task_queue: str = "purge",
    *,
    sweeps: bool = True,
    **options: object,
) -> Worker:
    """A worker that runs `Purge` with the targets of `registry`; for teams wiring it in code.

    With `sweeps=False` it runs the workflows only and takes no activity from `task_queue` (a
    worker whose targets all have queues of their own). `options` go to
    `temporalio.worker.Worker` (identity, max_concurrent_activities, ...); `interceptors`
    given there run beside the package's own, never instead of them.
    """
    settings = _worker_settings(client, options)
    activities = PurgeActivities(registry, runs_chunks=True)
    count_passes_from_zero(client, task_queue)
    return Worker(
        # Stack traces trimmed, whoever connected the client: a retried activity's failure
        # past 4 KB reaches the server as "Failure exceeds size limit." (connect.py).
        trimming_failures(client),
        task_queue=task_queue,
        workflows=[PurgeWorkflow, PurgeChunkWorkflow],
        activities=[activities.purge_target, activities.expand_pattern] if sweeps else [],
        **settings,  # type: ignore[arg-type]
    )


def _worker_settings(client: Client, options: dict[str, object]) -> dict[str, object]:
    """Every worker's settings: a 20 s graceful shutdown, heartbeats at most a second apart and,
    where no codec or external store would read a payload's context, a runner that does not ask
    the sandbox for it (plain_payloads.py), each unless `options` says otherwise; the interceptor
    that records the metrics the alert rules need (pass_metrics.py) before any given in
    `options`, never replaced by them; the rest of `options` as given."""
    given = options.get("interceptors") or ()
    if not isinstance(given, list | tuple):
        raise TypeError(f"interceptors must be a list, got {type(given).__name__}")
    plain = plain_runner(client.data_converter)
    return {
        "graceful_shutdown_timeout": GRACEFUL_SHUTDOWN,
        "max_heartbeat_throttle_interval": HEARTBEAT_THROTTLE,
        **({"workflow_runner": plain} if plain is not None else {}),
        **options,
        "interceptors": [PassMetrics(), *given],
    }


def activity_worker(
    client: Client, registry: TargetRegistry, task_queue: str, **options: object
) -> Worker:
    """A worker of a database's own task queue: its targets' activities, and the `PurgeChunk`
    children of a spread pass whose pattern it expanded there (`workflows.spread`), so that
    their activities are dispatched eagerly, with the workflow task that schedules them."""
    activities = PurgeActivities(registry, runs_chunks=True)
    settings = _worker_settings(client, options)
    return Worker(
        trimming_failures(client),  # as new_worker's
        task_queue=task_queue,
        workflows=[PurgeChunkWorkflow],
        activities=[activities.purge_target, activities.expand_pattern],
        **settings,  # type: ignore[arg-type]
    )


def polled_queues(config: PurgeConfig) -> dict[str, list[str]]:
    """The task queues a worker of `config` polls for activities besides the pass's, each with
    the databases whose targets' activities go there: its own targets' queue
    (`PurgeConfig.own_queue`) and, for every routed database it has the URL of, the queue of
    passes from a config that says the same of its targets there (`PurgeConfig.routed_queues`)
    and the configured queue itself, which passes typed by hand name (as do those started by a
    release before the digest), as the config's queue serves them for its own targets."""
    queues: dict[str, list[str]] = {}
    if config.own_queue is not None:
        # A python target's database is its factory's own business: none of this config's.
        on = {
            t.database
            for t in config.targets
            if t.database not in config.queues and t.kind != "python"
        }
        queues[config.own_queue] = sorted(db or "default (database_url)" for db in on)
    unreached = unreached_sharers(config)
    for database, queue in config.routed_queues.items():
        if database in config.databases and database not in unreached:
            queues.setdefault(queue, []).append(database)
            queues.setdefault(config.queues[database], []).append(database)
    return queues


def unreached_sharers(config: PurgeConfig) -> dict[str, list[str]]:
    """Each routed database this worker has the URL of whose task queue it shares with a
    database it has no URL for, with those databases: a worker polling that queue would take
    their activities too, and fail them as targets it does not know, so it polls none of it."""
    unreached: dict[str, list[str]] = {}
    for database, queue in config.queues.items():
        if database not in config.databases:
            continue
        missing = sorted(
            db for db, q in config.queues.items() if q == queue and db not in config.databases
        )
        if missing:
            unreached[database] = missing
    return unreached


async def run_worker(
    config: PurgeConfig,
    *,
    stop: asyncio.Event | None = None,
    temporal_address: str | None = None,
    ensure_schedule: bool | Literal["ensured"] = False,
    metrics: str | None = None,
    max_sweeps: int | None = None,
) -> None:
    """Connect, then run a worker for `config` until SIGINT/SIGTERM (or `stop` is set).

    It polls what `config_workers` names: the config's task queue for passes (and the
    activities of passes typed by hand), the queue of its own targets' activities, and the
    queue of every routed database whose URL it has. With `ensure_schedule`, create or update
    the config's schedules first (`"ensured"`: only those that say `ensure = true`), so a
    deployment needs no separate step; with `metrics` (HOST:PORT), serve Prometheus metrics
    there, and the probes `/livez` and `/readyz` (`purge_ops.probes`); with `max_sweeps`, run
    at most that many activities at once on each queue it polls (the SDK's
    `max_concurrent_activities`).
    """
    url = config.require_database_url() if config.needs_default_database else None
    url = url or config.database_url
    temporal_settings(temporal_address)  # a bad TEMPORAL_ADDRESS said before the pools connect
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    health = Health({**({DEFAULT_DATABASE: url} if url else {}), **config.databases})
    # The runtime's own metrics endpoint stays on loopback; the probe server passes it on.
    runtime_metrics = loopback_port() if metrics else None
    probes = ProbeServer(health, runtime_metrics) if runtime_metrics else None
    starting = _StopTheStart(stop)  # last before the try, whose finally ends its watch
    try:
        if metrics and probes:
            await probes.start(metrics)  # first: a taken port stops the start before any connect
        async with _pools(config, url) as (pool, named):
            registry = build_registry(config, pool, named)
            client = await connect_temporal(
                temporal_address,
                metrics=f"{runtime_metrics[0]}:{runtime_metrics[1]}" if runtime_metrics else None,
            )
            await require_namespace(client)
            health.client = client
            if ensure_schedule:
                only = ensure_schedule == "ensured"
                outcomes = await schedule.ensure_schedules(client, config, only, by_worker=True)
                for outcome in outcomes:
                    # Not this worker's to write, left firing, not checked, or a write that
                    # drops databases or moves the queue: said as a warning.
                    level = logging.WARNING if outcome.warns else logging.INFO
                    log.log(level, "%s %s", outcome.action, outcome.summary.replace("\n", "; "))
            # A schedule left unwritten that is still the old config's is said now, at the
            # deploy, not when its passes' targets fail for want of the old workers.
            for line in await schedule.behind(client, config, _unwritten(config, ensure_schedule)):
                log.warning("%s", line)
            if metrics:
                log.info("Prometheus metrics at http://%s/metrics, probes /livez /readyz", metrics)
            starting.done()
            await _poll(client, config, registry, health, stop, url, max_sweeps)
    except asyncio.CancelledError:
        if not starting.cut_short():
            raise
        log.info("stopped while starting: it polled no queue")
    finally:
        starting.done()
        if probes is not None:
            await probes.close()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


class _StopTheStart:
    """A stop (SIGINT, SIGTERM) while a worker starts ends the start where it stands: waiting
    up to `database_wait` for its database, connecting to Temporal, writing its schedules.
    Until `done`, `stop` cancels the task that made this; after, it is `_poll`'s to stop on.
    A pod stopped mid-start (a rollback's) then goes on to write no schedule (a write already
    on its way may have landed), takes no sweep, and exits 0 at once rather than when its
    database answers or the wait ends.
    A stop set before the start (no signal can be: its handler is not yet there; a caller's,
    as `tests/support/passes.started_and_stopped` sets one) lets it start, then stop at once.
    """

    def __init__(self, stop: asyncio.Event) -> None:
        self._task = asyncio.current_task()
        self._cancelled = False
        self._watch: asyncio.Task[None] | None = (
            None if stop.is_set() else asyncio.ensure_future(self._cancel_on(stop))
        )

    async def _cancel_on(self, stop: asyncio.Event) -> None:
        await stop.wait()
        if self._watch is not None and self._task is not None:
            self._cancelled = True
            self._task.cancel()

    def done(self) -> None:
        """The worker polls now (or is leaving): a stop is no longer the start's."""
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None

    def cut_short(self) -> bool:
        """Whether a CancelledError just caught is this stop's (then taken back: the worker
        returns as stopped), not a cancellation from outside, which goes on."""
        if not self._cancelled or self._task is None:
            return False
        # Another cancellation beside this stop's (a caller's timeout) still counts: raised.
        return self._task.uncancel() == 0


def _unwritten(
    config: PurgeConfig, ensure_schedule: bool | Literal["ensured"]
) -> list[ScheduleConfig]:
    """The config's schedules a worker's start does not write: every one without `--schedule`
    or `ensure = true`; with only `ensure = true` ("ensured"), those that do not say it."""
    if ensure_schedule is True:
        return []
    return [s for s in config.schedules if not (ensure_schedule and s.ensure)]


@contextlib.asynccontextmanager
async def _pools(
    config: PurgeConfig, url: str | None
) -> AsyncIterator[tuple[AsyncConnectionPool[Any] | None, dict[str, LazyPool]]]:
    """The default database's pool (opened now, waiting up to `database_wait`) and the named
    databases' (each opened on first use), all closed on the way out."""
    # A connection for each sweep `max_per_database` lets run at once on a database, and four
    # at least: a pattern's small matches sweep that many at once (`workflows.spread`).
    size = max(SMALL_AT_ONCE, config.limits.max_per_database)
    wait = config.database_wait_ms / 1000
    pool = await open_pool(url, wait_seconds=wait, max_size=size) if url else None
    named = lazy_pools(config.databases, max_size=size)
    try:
        yield pool, named
    finally:
        if pool is not None:
            await pool.close()
        for opened in named.values():
            await opened.close()


def config_workers(
    client: Client, config: PurgeConfig, registry: TargetRegistry, **options: object
) -> list[Worker]:
    """Every worker a process of `config` runs: the passes (and, for a config with targets of
    its own, the activities of passes typed by hand, which carry no routes) on the config's
    queue, and the activities of each queue of `polled_queues`. `options` as new_worker's."""
    # A regional worker, every target of whose config has its own queue, could run none of a
    # hand-typed pass's activities: it takes none.
    sweeps = config.own_queue is not None
    return [new_worker(client, registry, config.task_queue, sweeps=sweeps, **options)] + [
        activity_worker(client, registry, queue, **options) for queue in polled_queues(config)
    ]


async def _poll(
    client: Client,
    config: PurgeConfig,
    registry: TargetRegistry,
    health: Health,
    stop: asyncio.Event,
    url: str | None,
    max_sweeps: int | None,
) -> None:
    """Poll the config's queues until `stop`, then stop every worker at once (a running sweep
    ends after its batch and goes on elsewhere; the rest gets GRACEFUL_SHUTDOWN); at most
    `max_sweeps` activities at once on each queue, when given."""
    queues = polled_queues(config)
    options: dict[str, object] = {}
    if max_sweeps is not None:
        options["max_concurrent_activities"] = max_sweeps
        # A child of small tables sweeps them as local activities (workflows.chunk).
        options["max_concurrent_local_activities"] = max_sweeps
        log.info("at most %d sweeps at once on each queue (--max-sweeps)", max_sweeps)
    workers = config_workers(client, config, registry, **options)
    async with contextlib.AsyncExitStack() as running:
        for worker in workers:
            await running.enter_async_context(worker)
        health.workers = workers
        _say_what_it_polls(config, client, url, registry, queues)
        await stop.wait()
        health.stopping = True
        log.info(
            "stopping: no new work on any queue; running sweeps end after their batch and go "
            "on elsewhere (the rest waits up to %s)",
            GRACEFUL_SHUTDOWN,
        )
        # Every queue at once: one after another, the workers not yet told kept taking sweeps,
        # each worker with a grace of its own, past the pod's.
        await asyncio.gather(*(worker.shutdown() for worker in workers))


def _say_what_it_polls(
    config: PurgeConfig,
    client: Client,
    url: str | None,
    registry: TargetRegistry,
    queues: dict[str, list[str]],
) -> None:
    log.info(
        "worker on task queue %r of %s, database %s, targets: %s",
        config.task_queue,
        client.service_client.config.target_host,
        redact(url) if url else "none (no target of a built-in kind sweeps the default database)",
        registry.describe(),
    )
    for queue, databases in queues.items():
        if queue == config.own_queue:
            where = [f"on databases {', '.join(databases)}"] if databases else []
            if any(t.kind == "python" for t in config.targets):
                where.append("python targets on their factories' own connections")
            log.info(
                "polling task queue %r for the activities of its own targets (%s), %s; only "
                "workers whose config says the same of exactly these targets poll it",
                queue,
                ", ".join(sorted(set(config.own_names))),
                " and ".join(where),
            )
            continue
        log.info(
            "also polling task queue %r for the activities of database %s%s",
            queue,
            ", ".join(databases),
            " in passes typed by hand" if queue in config.queues.values() else "",
        )
    if config.own_queue is None:
        log.info(
            "taking no activity from task queue %r: every target of this config has a queue "
            "of its own",
            config.task_queue,
        )
    for database, missing in unreached_sharers(config).items():
        log.warning(
            "not polling task queue %r of database %s: databases %s share it, and this worker "
            "has no URL for them, so it would take their activities and fail them; a worker "
            "with every URL of that queue sweeps them (or give each database a queue of its own)",
            config.queues[database],
            database,
            ", ".join(missing),
        )
    elsewhere = sorted(set(config.queues) - set(config.databases))
    if elsewhere:
        log.info(
            "not polling the queues of %s: no URL here (their url_env is not set); the "
            "workers next to them sweep them",
            ", ".join(f"{db} ({config.routed_queues[db]})" for db in elsewhere),
        )
