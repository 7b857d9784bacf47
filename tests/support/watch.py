"""Watching a pass while faults are injected into it, and reading its history as the ledger.

A `PassWatch` polls the pass's history and pending activities in the background. It records
every failed attempt the server shows, and writes a canary (an expired row) into a target's
tables as soon as the history says that target completed: a completed target is never run again,
so the pass must leave every canary in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError

from purge_ops.connect import APPLICATION_NAME
from tests.support.history import events
from tests.support.oracle import TARGET_NAMES, Oracle, add_canary

#: How long one wait of a fault test may take before it is called a hang: a killed attempt costs
#: the 15 s heartbeat timeout, a retry backoff of up to 18 s and a sticky queue's 10 s.
HANG = 120.0
_STARTED = PendingActivityState.PENDING_ACTIVITY_STATE_STARTED


@dataclass(frozen=True)
class Fault:
    """One fault injected into a pass."""

    kind: str
    target: str | None
    """The target whose running attempt the fault failed; None if it failed none (it fell
    between targets, or the target got past it)."""
    attempt: int | None
    """That attempt's number: the target must complete on a later one."""
    completed: Mapping[str, int]
    """The targets completed before the fault, each with its ActivityTaskCompleted event id."""


@dataclass(frozen=True)
class Pending:
    """A target's activity as the server last showed it."""

    target: str
    attempt: int
    state: int
    worker: str


class PassWatch:
    """One pass of every target, watched from start to close."""

    def __init__(
        self, client: Client, handle: WorkflowHandle[Any, Any], db_url: str, oracle: Oracle
    ) -> None:
        self.client, self.handle, self.db_url, self.oracle = client, handle, db_url, oracle
        self.names: dict[int, str] = {}
        """ActivityTaskScheduled event id -> target name."""
        self.ids: dict[str, str] = {}
        """activity id -> target name."""
        self.completed: dict[str, int] = {}
        """target -> its ActivityTaskCompleted event id."""
        self.pending: list[Pending] = []
        self.failures: dict[tuple[str, int], str] = {}
        """(target, the attempt that follows the failure) -> the failure's message."""
        self.faults: list[Fault] = []
        self.closed = False
        self._canaried: set[str] = set()
        # The background poll and a test's own refresh must not both write a target's canary.
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def start(
        cls, client: Client, task_queue: str, workflow_id: str, db_url: str, oracle: Oracle
    ) -> PassWatch:
        """Start a pass of every target on `task_queue`, and watch it."""
        handle = await client.start_workflow(
            "Purge", {"targets": TARGET_NAMES}, id=workflow_id, task_queue=task_queue
        )
        watch = cls(client, handle, db_url, oracle)
        watch._task = asyncio.create_task(watch._poll())
        return watch

    async def close(self) -> None:
        """Stop watching; a pass still running (a test failed) is terminated. Raises what broke
        the background poll, if anything did."""
        if not self.closed:
            with contextlib.suppress(RPCError):
                await self.handle.terminate("the test watching it ended")
        self.closed = True
        if self._task is not None:
            task, self._task = self._task, None
            # Awaited, not cancelled: a canary being written finishes before anyone checks rows.
            done, _ = await asyncio.wait([task], timeout=30)
            if not done:
                task.cancel()
            [outcome] = await asyncio.gather(task, return_exceptions=True)
            if isinstance(outcome, Exception):
                raise outcome

    async def _poll(self) -> None:
        while not self.closed:
            await self.refresh()
            await asyncio.sleep(0.1)

    async def refresh(self) -> bool:
        """One look at the server, then the canaries due; False while it cannot be reached."""
        async with self._lock:
            try:
                history = await events(self.client, self.handle.id)
                described = await self.handle.describe()
            except RPCError:
                return False
            self._read(history, described.raw_description.pending_activities)
            self.closed = self.closed or described.status != WorkflowExecutionStatus.RUNNING
            for name in self.completed.keys() - self._canaried:
                # Not yet written while PostgreSQL is down: the next look tries again.
                with contextlib.suppress(psycopg.OperationalError):
                    await asyncio.to_thread(self._canary, name)
                    self._canaried.add(name)
            return True

    def _read(self, history: list[Any], pending: Any) -> None:
        converter = self.client.data_converter.payload_converter
        for e in history:
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                attrs = e.activity_task_scheduled_event_attributes
                [step] = converter.from_payloads(attrs.input.payloads)
                self.names[e.event_id] = self.ids[attrs.activity_id] = step["name"]
            elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                scheduled = e.activity_task_completed_event_attributes.scheduled_event_id
                self.completed.setdefault(self.names[scheduled], e.event_id)
        self.pending = []
        for p in pending:
            name = self.ids.get(p.activity_id, f"activity {p.activity_id}")
            self.pending.append(Pending(name, p.attempt, p.state, p.last_worker_identity))
            if p.HasField("last_failure"):
                self.failures[(name, p.attempt)] = p.last_failure.message

    def _canary(self, name: str) -> None:
        with psycopg.connect(self.db_url, autocommit=True, connect_timeout=2) as db:
            add_canary(db, self.oracle, name, f"{self.handle.id}-{name}")

    async def fresh(self) -> None:
        """Refresh, waiting for the server if it is away."""
        deadline = time.monotonic() + HANG
        while not await self.refresh():
            assert time.monotonic() < deadline, f"Temporal unreachable for {HANG:.0f} s"
            await asyncio.sleep(0.2)

    @property
    def top_attempt(self) -> int:
        """The highest attempt of any pending target (0 when none is pending)."""
        return max((p.attempt for p in self.pending), default=0)

    async def record_kill(self, kind: str, worker: str) -> Fault:
        """Record a SIGKILL of `worker`: the attempt it failed is the one the server still shows
        STARTED under its identity, which nothing can complete any more."""
        await self.fresh()
        hit = next((p for p in self.pending if p.worker == worker and p.state == _STARTED), None)
        if hit is None:
            fault = Fault(kind, None, None, dict(self.completed))
        else:
            fault = Fault(kind, hit.target, hit.attempt, dict(self.completed))
        self.faults.append(fault)
        return fault

    async def record_failure(self, kind: str, seen: set[tuple[str, int]]) -> Fault:
        """Record a fault just injected, `seen` being the failures shown before it: the attempt
        it failed is the next failure the server shows; none if a target completes first."""
        await self.fresh()
        done = set(self.completed)
        deadline = time.monotonic() + HANG
        while not (new := sorted(self.failures.keys() - seen)):
            if self.completed.keys() - done or self.closed:
                fault = Fault(kind, None, None, dict(self.completed))
                self.faults.append(fault)
                return fault
            assert time.monotonic() < deadline, f"hang after {kind}: pending {self.pending}"
            await asyncio.sleep(0.05)
            await self.fresh()
        target, after = new[0]
        fault = Fault(kind, target, after - 1, dict(self.completed))
        self.faults.append(fault)
        return fault

    async def until_swept(self, table: str, share: float, probe: Probe) -> int | None:
        """Wait until at least `share` of `table`'s expired rows are gone: how many are left
        then (0 if the sweep got past the table first), or None if the pass closed."""
        total = len(self.oracle.expired[table])
        deadline = time.monotonic() + HANG
        while True:
            left = await probe.expired_left(table)
            if left is not None and left <= total * (1 - share):
                return left
            if self.closed:
                return None
            assert time.monotonic() < deadline, (
                f"hang: {table} still had {left} of {total} expired rows after {HANG:.0f} s; "
                f"pending {self.pending}"
            )
            await asyncio.sleep(0.003)

    async def result(self) -> dict[str, Any]:
        """The pass's result, riding through a Temporal server that restarts meanwhile."""
        deadline = time.monotonic() + 4 * HANG
        while True:
            try:
                remaining = max(deadline - time.monotonic(), 0.1)
                result: dict[str, Any] = await asyncio.wait_for(self.handle.result(), remaining)
                self.closed = True
                return result
            except RPCError:
                assert time.monotonic() < deadline, "Temporal unreachable"
                await asyncio.sleep(0.5)
            except TimeoutError:
                raise AssertionError(f"hang: the pass never completed; {self.pending}") from None


@contextlib.asynccontextmanager
async def watching(
    client: Client, task_queue: str, prefix: str, db_url: str, oracle: Oracle
) -> AsyncIterator[PassWatch]:
    """A pass of every target on `task_queue`, watched until the block ends."""
    watch = await PassWatch.start(client, task_queue, f"{prefix}-{uuid.uuid4()}", db_url, oracle)
    try:
        yield watch
    finally:
        await watch.close()


class Probe:
    """A connection of the test's own that watches a sweep's progress, reconnecting after its
    server restarts."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn: psycopg.AsyncConnection[Any] | None = None

    async def _one(self, query: sql.SQL | sql.Composed, params: tuple[Any, ...] = ()) -> int | None:
        try:
            if self.conn is None:
                self.conn = await psycopg.AsyncConnection.connect(
                    self.url, autocommit=True, connect_timeout=2
                )
            cur = await self.conn.execute(query, params)
            row = await cur.fetchone()
            return int(row[0]) if row else 0
        except psycopg.OperationalError:
            await self.close()
            return None

    async def expired_left(self, table: str) -> int | None:
        """`table`'s expired rows still there; None while the server cannot be reached."""
        return await self._one(
            sql.SQL("SELECT count(*) FROM {} WHERE key LIKE 'e%%'").format(sql.Identifier(table))
        )

    async def blocked_by(self, pid: int) -> bool:
        """Whether a sweep's statement waits for a lock that backend `pid` holds."""
        return bool(
            await self._one(
                sql.SQL(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                    " AND %s = ANY(pg_blocking_pids(pid))"
                ),
                (APPLICATION_NAME, pid),
            )
        )

    async def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(psycopg.Error):
                await self.conn.close()
            self.conn = None


@dataclass
class Run:
    """One target's activity in a pass's final history."""

    scheduled: int = 0
    started: int = 0
    completed: int = 0
    completed_event: int = 0
    attempt: int = 0
    """The attempt that completed it (the ActivityTaskStarted event records only that one)."""
    worker: str = ""


def ledger(client: Client, history: list[Any]) -> dict[str, Run]:
    """Per target: how often it was scheduled, started and completed, and on which attempt."""
    converter = client.data_converter.payload_converter
    names: dict[int, str] = {}
    started: dict[int, tuple[int, str]] = {}
    runs: dict[str, Run] = {}
    for e in history:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = e.activity_task_scheduled_event_attributes
            [step] = converter.from_payloads(attrs.input.payloads)
            names[e.event_id] = step["name"]
            runs.setdefault(step["name"], Run()).scheduled += 1
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs = e.activity_task_started_event_attributes
            started[e.event_id] = (attrs.attempt, attrs.identity)
            runs[names[attrs.scheduled_event_id]].started += 1
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            attrs = e.activity_task_completed_event_attributes
            run = runs[names[attrs.scheduled_event_id]]
            run.completed += 1
            run.completed_event = e.event_id
            run.attempt, run.worker = started[attrs.started_event_id]
    return runs


async def assert_ledger(watch: PassWatch, result: dict[str, Any]) -> dict[str, Run]:
    """The pass swept every target, in order, each scheduled and completed exactly once; each
    attempt a fault failed was retried; each target completed before a fault kept that very
    completion (and, see the canaries, was not run again)."""
    assert [s["name"] for s in result["swept"]] == TARGET_NAMES
    assert not result.get("failed")
    runs = ledger(watch.client, await events(watch.client, watch.handle.id))
    assert sorted(runs) == sorted(TARGET_NAMES)
    for name, run in runs.items():
        assert (run.scheduled, run.started, run.completed) == (1, 1, 1), (name, run)
    for fault in watch.faults:
        if fault.target is not None and fault.attempt is not None:
            assert runs[fault.target].attempt > fault.attempt, (
                f"{fault.kind} failed attempt {fault.attempt} of {fault.target}, yet attempt "
                f"{runs[fault.target].attempt} completed it"
            )
        for name, event_id in fault.completed.items():
            assert runs[name].completed_event == event_id, (name, fault, runs[name])
    for name, hits in Counter(f.target for f in watch.faults if f.target).items():
        assert runs[name].attempt > hits, (name, hits, runs[name])
    for swept in result["swept"]:
        # Every batch's count is in the purge_progress ledger, written by the batch's own
        # transaction: whatever died, each target's count is the rows that really went.
        assert swept["removed"] == watch.oracle.expired_of(swept["name"]), swept
        assert not swept["lower_bound"], swept
    return runs
