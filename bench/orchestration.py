"""Case 5: what a pass costs per target when there is nothing to delete, end to end.

200 `expiring` targets on empty tables, 50 in each of 4 databases, configured as a user would
(`[databases.NAME]`, `database = ...`, `[pass]`), swept by `Purge` passes through a Temporal dev
server and an in-process worker built from that config: the workflow started by a client and its
result awaited. Side by side in one run, each PASSES times after one warm-up, in alternating order:

- the sequential pass (the input without limits, as the `temporal` CLI sends it);
- the concurrent pass with `max_concurrent = 8`, `max_per_database = 2` and `= 8`;
- the direct-call floor: the same 200 sweeps called through ActivityEnvironment, one after
  another, and 8 at a time (at most 2 per database).

Each pass's history is read back to say where the time went: how long the activities ran (the
worker's own measure, from their started to their completed event) and how long they waited to
start, against the pass's wall time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psycopg import AsyncConnection, sql
from psycopg_pool import AsyncConnectionPool
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment

from activities.builtin_kinds import build_registry
from activities.inputs import PurgeStep
from activities.registry import TargetRegistry
from activities.sweep import PurgeActivities
from bench.cases import Bench
from bench.cpu import CpuMeter, postmaster_pid
from bench.services import (
    TargetEntry,
    fleet_config,
    running_workers,
    scratch_databases,
    temporal_dev_server,
)
from purge_config import PurgeConfig
from purge_ops.connect import lazy_pools, open_pool
from purge_ops.runner import config_workers

log = logging.getLogger("bench")

DATABASES = 4
TARGETS_PER_DATABASE = 50
PASSES = 3
CONCURRENT = 8

#: The forms, in report order: (key, label).
FORMS = (
    ("sequential", "pass, sequential (no limits)"),
    ("concurrent_8_2", "pass, max_concurrent 8, max_per_database 2"),
    ("concurrent_8_8", "pass, max_concurrent 8, max_per_database 8"),
    ("direct", "direct, one after another"),
    ("direct_8", "direct, 8 at a time (2 per database)"),
)


@dataclass
class HistoryTimes:
    """Read from one pass's history: the activities' own time against the pass's."""

    activities: int
    activity_ms_median: float
    """From each activity's started event to its completed one: the sweep itself on the worker."""
    activity_ms_sum: float
    schedule_to_start_ms_median: float
    workflow_tasks: int
    workflow_ms: float
    """From the workflow's started event to its completed one, as the server saw it."""


@dataclass
class OrchestrationResult:
    targets: int
    databases: int
    seconds: dict[str, list[float]] = field(default_factory=dict)
    """Each form's measured passes, after its warm-up."""
    warmup: dict[str, float] = field(default_factory=dict)
    histories: dict[str, HistoryTimes] = field(default_factory=dict)
    """The last measured pass of each Temporal form, read back."""
    cpu: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    """CPU seconds per process (bench, temporal, postgres) during each measured run."""

    def cpu_median(self, form: str) -> dict[str, float]:
        """Each process's median CPU seconds over the form's measured runs."""
        runs = self.cpu.get(form, [])
        names = sorted({name for run in runs for name in run})
        return {name: statistics.median(run.get(name, 0.0) for run in runs) for name in names}

    def median(self, form: str) -> float:
        runs = self.seconds.get(form) or [0.0]
        return statistics.median(runs)

    def per_target_ms(self, form: str) -> float:
        return 1000 * self.median(form) / self.targets


async def _fill(urls: list[str]) -> list[TargetEntry]:
    """50 empty tables per database, each shaped like the lockouts table (until_ms, indexed)."""
    entries: list[TargetEntry] = []
    for n, url in enumerate(urls):
        async with await AsyncConnection.connect(url, autocommit=True) as db:
            for t in range(TARGETS_PER_DATABASE):
                table = f"empty_{t}"
                await db.execute(
                    sql.SQL("CREATE TABLE {} (LIKE x_auth_lockouts INCLUDING ALL)").format(
                        sql.Identifier(table)
                    )
                )
                # Grouped by database, as a config listing shard after shard is written.
                database = "" if n == 0 else f"db{n}"
                entries.append(TargetEntry(f"e{t}@db{n}", table, "until_ms", database=database))
    return entries


def _configs(urls: list[str], entries: list[TargetEntry]) -> dict[str, PurgeConfig]:
    """One config per concurrent form, differing only in `[pass]`; one task queue for all."""
    named = {f"db{n}": url for n, url in enumerate(urls) if n}
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    return {
        f"concurrent_{CONCURRENT}_{per_db}": fleet_config(
            urls[0],
            named,
            entries,
            max_concurrent=CONCURRENT,
            max_per_database=per_db,
            task_queue=queue,
        )
        for per_db in (2, 8)
    }


async def _direct(
    activities: PurgeActivities,
    names: list[str],
    databases: dict[str, str],
    now_ms: int,
    at_once: int,
) -> None:
    """The same sweeps through ActivityEnvironment, `at_once` at a time, at most 2 per database
    when more than one (what the concurrent pass allows), each a pass of its own."""
    per_db = Counter[str]()
    freed = asyncio.Condition()

    async def one(name: str) -> None:
        database = databases.get(name, "")
        async with freed:
            await freed.wait_for(lambda: per_db[database] < (2 if at_once > 1 else 1))
            per_db[database] += 1
        try:
            env = ActivityEnvironment()
            env.info = dataclasses.replace(env.info, workflow_run_id=str(uuid.uuid4()))
            sweep = await env.run(activities.purge_target, PurgeStep(name=name, now_ms=now_ms))
            if sweep.removed:
                raise RuntimeError(f"{name} removed {sweep.removed} rows from an empty table")
        finally:
            async with freed:
                per_db[database] -= 1
                freed.notify_all()

    slots = asyncio.Semaphore(at_once)

    async def bounded(name: str) -> None:
        async with slots:
            await one(name)

    await asyncio.gather(*(bounded(name) for name in names))


async def _history_times(client: Client, workflow_id: str) -> HistoryTimes:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    scheduled: dict[int, float] = {}
    started: dict[int, float] = {}
    run_ms: list[float] = []
    waits: list[float] = []
    tasks = 0
    first = last = 0.0
    for event in history.events:
        at = event.event_time.ToMilliseconds() + event.event_time.nanos % 1_000_000 / 1e6
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            first = at
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
            last = at
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            tasks += 1
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[event.event_id] = at
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs = event.activity_task_started_event_attributes
            started[event.event_id] = at
            waits.append(at - scheduled[attrs.scheduled_event_id])
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            attrs_c = event.activity_task_completed_event_attributes
            run_ms.append(at - started[attrs_c.started_event_id])
    return HistoryTimes(
        activities=len(run_ms),
        activity_ms_median=statistics.median(run_ms) if run_ms else 0.0,
        activity_ms_sum=sum(run_ms),
        schedule_to_start_ms_median=statistics.median(waits) if waits else 0.0,
        workflow_tasks=tasks,
        workflow_ms=last - first,
    )


async def run_orchestration(bench: Bench, scratch: Path) -> OrchestrationResult:
    """One warm-up and PASSES measured runs of every form, in alternating order."""
    total = DATABASES * TARGETS_PER_DATABASE
    result = OrchestrationResult(targets=total, databases=DATABASES)
    async with scratch_databases(bench.conn, bench.url, DATABASES, "o") as urls:
        entries = await _fill(urls)
        configs = _configs(urls, entries)
        config = configs[f"concurrent_{CONCURRENT}_2"]
        names = config.target_names
        databases = config.pass_input()["databases"]
        pool: AsyncConnectionPool[Any] = await open_pool(urls[0])
        named = lazy_pools(config.databases)
        try:
            registry: TargetRegistry = build_registry(config, pool, named)
            activities = PurgeActivities(registry)
            async with (
                temporal_dev_server(scratch) as (client, temporal_pid),
                running_workers(config_workers(client, config, registry)),
            ):
                meter = CpuMeter()
                for name, pid in (
                    ("temporal", temporal_pid),
                    ("postgres", postmaster_pid(bench.data_dir)),
                ):
                    if pid is not None:
                        meter.pids[name] = pid
                inputs: dict[str, dict[str, Any]] = {
                    "sequential": {"targets": names},
                    **{form: c.pass_input() for form, c in configs.items()},
                }
                last_id: dict[str, str] = {}

                def through_temporal(form: str) -> Callable[[], Awaitable[None]]:
                    async def run() -> None:
                        workflow_id = f"bench-{form}-{uuid.uuid4().hex[:8]}"
                        report = await client.execute_workflow(
                            "Purge",
                            inputs[form],
                            id=workflow_id,
                            task_queue=config.task_queue,
                        )
                        swept = report.get("swept", []) if isinstance(report, dict) else []
                        ok = [s for s in swept if s.get("status", "ok") == "ok"]
                        if len(ok) != total:
                            raise RuntimeError(f"{form}: a pass swept {len(ok)} of {total} targets")
                        last_id[form] = workflow_id

                    return run

                def direct(at_once: int) -> Callable[[], Awaitable[None]]:
                    async def run() -> None:
                        await _direct(activities, names, databases, bench.now_ms, at_once)

                    return run

                runners: dict[str, Callable[[], Awaitable[None]]] = {
                    "sequential": through_temporal("sequential"),
                    "concurrent_8_2": through_temporal("concurrent_8_2"),
                    "concurrent_8_8": through_temporal("concurrent_8_8"),
                    "direct": direct(1),
                    "direct_8": direct(CONCURRENT),
                }
                order = [form for form, _ in FORMS]
                for n in range(PASSES + 1):
                    for form in order if n % 2 == 0 else list(reversed(order)):
                        cpu = meter.snapshot()
                        started = time.perf_counter()
                        await runners[form]()
                        seconds = time.perf_counter() - started
                        spent = meter.since(cpu)
                        if n == 0:
                            # The first run pays the sandbox's imports, the pools' first
                            # connections and the server's first task queue lookups.
                            result.warmup[form] = seconds
                        else:
                            result.seconds.setdefault(form, []).append(seconds)
                            result.cpu.setdefault(form, []).append(spent)
                        log.info(
                            "orchestration: %s over %d targets in %.3f s%s",
                            form,
                            total,
                            seconds,
                            " (warm-up)" if n == 0 else "",
                        )
                for form, workflow_id in last_id.items():
                    result.histories[form] = await _history_times(client, workflow_id)
        finally:
            await pool.close()
            for opened in named.values():
                await opened.close()
    return result
