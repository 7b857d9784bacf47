"""A child of small tables sweeps them as local activities (issue 37): on its database's queue,
the worker that runs the child's workflow task runs each sweep, and the child's history records
its result as a marker, with no activity task for Temporal to dispatch. What must hold while a
fleet changes: a child an earlier release began keeps its activity tasks when a worker of this
release takes it over; and a worker killed in the middle of a local sweep loses nothing (real
Temporal, real PostgreSQL; the kill with worker processes, in the slow suite), and a pass
cancelled mid local sweep lets its statement finish; a local sweep longer than a workflow task
keeps its child alive (slow suite); a worker of the release before, handed a child of local
sweeps, fails its task until one of this release takes it, and no target fails (slow suite);
`--max-sweeps` bounds local sweeps."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowFailureError, WorkflowHistory
from temporalio.exceptions import CancelledError
from temporalio.worker import (
    ExecuteWorkflowInput,
    Interceptor,
    Replayer,
    Worker,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)
from temporalio.workflow import NondeterminismError

from activities.builtin_kinds import build_registry
from activities.engine import small_tables
from activities.sweep import PurgeActivities
from purge_config.file import PurgeConfig, load_config, parse_config
from purge_ops.runner import new_worker, run_worker
from tests.conftest import Harness
from tests.support.dead_worker import notice_the_dead_worker_sooner
from tests.support.delete_log import (
    MEETING_S,
    a_second_sweep_s_chance,
    drop_log,
    log_each_delete,
    meet_first,
    one_at_a_time,
    took_to_meet,
)
from tests.support.history import (
    child_ids,
    child_runs,
    events,
    kinds,
    local_sweeps,
    scheduled_in,
)
from tests.support.old_workflows import PurgeChunkBeforeLocal
from tests.support.pace import until_a_sweep_waits, waiting_sweeps
from tests.support.passes import own_queue_worker, run_pass, run_pass_beside
from tests.support.procs import (
    clean_env,
    identity,
    start_worker,
    stop,
    use_env,
    wait_for,
    worker_config,
)
from tests.support.servers import RunningTemporal
from tests.support.tenants import (
    HOUR_MS,
    counts,
    create_tenants,
    expired_of,
    tenant_prefix,
    tenant_schemas,
)
from tests.test_small_together import config
from workflows.chunk import LOCAL_ACTIVITY_MARKER, PurgeChunkWorkflow
from workflows.purge import PurgeWorkflow

HISTORIES = Path(__file__).parent / "histories"
TENANTS = 6


async def test_a_child_an_earlier_release_began_keeps_its_activity_tasks(
    pg_url: str, harness: Harness
) -> None:
    """Mid-deploy, the small matches' child (its input saying `local`) is run by a worker of
    the release before: every match an activity task. A worker of this release that takes the
    child over replays that history without a nondeterminism error (no patch marker there, so
    it goes on with activity tasks): the replay below is what it does."""
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(TENANTS), harness.now_ms)
        cfg = harness.adopt(config(prefix))
        assert cfg.own_queue is not None
        registry = build_registry(cfg, harness.pool)
        acts = PurgeActivities(registry, runs_chunks=True)
        older = own_queue_worker(harness.client, cfg.own_queue, acts, [PurgeChunkBeforeLocal])
        workflow_id = f"purge-local-{uuid.uuid4()}"
        async with new_worker(harness.client, registry, harness.task_queue), older:
            result = await run_pass(
                harness.client, harness.task_queue, cfg.pass_input(), workflow_id
            )
        runs = await child_runs(harness.client, await events(harness.client, workflow_id))
        left = counts(conn, prefix, harness.now_ms)

    assert result["statuses"] == {"ok": TENANTS}
    assert set(left.values()) == {(0, 2)}
    [[child]] = runs.values()
    converter = harness.client.data_converter.payload_converter
    [chunk] = converter.from_payloads(
        child[0].workflow_execution_started_event_attributes.input.payloads
    )
    assert chunk["local"] is True
    assert len(scheduled_in(runs)) == TENANTS
    assert local_sweeps(child) == []
    history = WorkflowHistory(workflow_id="child", events=child)
    replayed = await Replayer(workflows=[PurgeWorkflow, PurgeChunkWorkflow]).replay_workflow(
        history, raise_on_replay_failure=False
    )
    assert replayed.replay_failure is None


@pytest.mark.parametrize("cut", ["whole", "before-any-sweep"])
async def test_a_worker_of_the_release_before_cannot_replay_a_child_of_local_sweeps(
    cut: str,
) -> None:
    """The other way round (what docs/fleets.md says of rolling deploys): a worker of the
    release before that takes over a child of local sweeps fails its workflow task with a
    nondeterminism error, and Temporal retries the task until a worker of this release takes
    it (with processes: the slow test below). The committed history is such a child's, whole
    or cut where a first workflow task completed before any of its sweeps did (one held past
    the task's timeout): even then the patch marker stops the older code, so no child can go
    on in the older shape after this release began it (a history of both shapes, which
    neither release could replay)."""
    path = HISTORIES / "v8-chunk-local.json"
    raw = json.loads(path.read_text(encoding="utf-8"))
    if cut == "before-any-sweep":
        first_sweep = next(
            i
            for i, e in enumerate(raw["events"])
            if e.get("markerRecordedEventAttributes", {}).get("markerName") == LOCAL_ACTIVITY_MARKER
        )
        raw["events"] = raw["events"][:first_sweep]
        assert "EVENT_TYPE_MARKER_RECORDED" in [e["eventType"] for e in raw["events"]]
    history = WorkflowHistory.from_json("child", json.dumps(raw))
    # This release replays the cut history: it is one this release could have written.
    ours = await Replayer(workflows=[PurgeChunkWorkflow]).replay_workflow(
        history, raise_on_replay_failure=False
    )
    assert ours.replay_failure is None
    with pytest.raises(NondeterminismError, match="patch marker"):
        await Replayer(workflows=[PurgeChunkBeforeLocal]).replay_workflow(history)


def waiting_config(prefix: str, lock_timeout: str) -> PurgeConfig:
    """A pattern over the tenants whose sweeps wait up to `lock_timeout` for a row lock."""
    target = {
        "kind": "expiring",
        "name": "sessions",
        "table": f"{prefix}_*.sessions",
        "column": "expires_at",
        "lock_timeout": lock_timeout,
    }
    return parse_config({"targets": [target]})


#: What a worker process logs once SIGTERM has stopped its polling (purge_ops.runner), before
#: its running sweeps end.
STOPPING = "stopping: no new work on any queue"


def _process_config(tmp_path: Path, database_url: str, task_queue: str, prefix: str) -> Path:
    """The config file of the tests' worker processes: the tenants' pattern, its sweeps
    waiting up to 60 s for a row lock."""
    return worker_config(
        tmp_path / "purge.toml",
        database_url,
        task_queue,
        f"""
[pass]
max_concurrent = 4
max_per_database = 1

[[targets]]
kind = "expiring"
name = "sessions"
table = "{prefix}_*.sessions"
column = "expires_at"
lock_timeout = "60s"
""",
    )


def _hold_an_expired_row(pg_url: str, schema: str, now_ms: int) -> psycopg.Connection[Any]:
    """A session holding `schema`'s expired row locked, in a transaction its caller commits
    (`holder.execute("COMMIT")`) to let the sweep waiting for it go on."""
    holder = psycopg.connect(pg_url, autocommit=True)
    holder.execute("BEGIN")
    holder.execute(
        f"SELECT 1 FROM {schema}.sessions WHERE expires_at < %s FOR UPDATE",
        (now_ms - HOUR_MS + 1,),
    )
    return holder


@pytest.mark.slow
@pytest.mark.parametrize("stop_with", [signal.SIGKILL, signal.SIGTERM], ids=["kill", "term"])
async def test_a_worker_stopped_mid_local_sweep_loses_nothing(
    tmp_path: Path,
    client: Client,
    temporal_server: RunningTemporal,
    task_queue: str,
    pg_url: str,
    schema_url: str,
    real_now: int,
    stop_with: signal.Signals,
) -> None:
    """A config's pass of small tables, its child's sweeps local activities. The first worker
    is stopped while one sweep waits for a row another session holds: SIGKILLed, or sent
    SIGTERM as a rolling deploy does (it lets the sweep finish once the row is let go). A second
    worker takes the child over and sweeps what is left: every expired row gone, every live one
    kept, each table's result recorded once, the pass's count exact (the ledger counts what the
    first worker's sweeps committed). After SIGKILL, the child's workflow task timed out and
    the held table's sweep is reported by the second worker."""
    prefix = tenant_prefix()
    held = f"{prefix}_0001"  # expired_of(1): one expired row
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(TENANTS), real_now)
        path = _process_config(tmp_path, schema_url, task_queue, prefix)
        cfg = load_config(path)
        env = clean_env(TEMPORAL_ADDRESS=temporal_server.address)
        holder = _hold_an_expired_row(pg_url, held, real_now)
        first = start_worker(path, env, tmp_path / "1.log")
        second = None
        workflow_id = f"purge-local-kill-{uuid.uuid4()}"
        try:
            handle = await client.start_workflow(
                "Purge", cfg.pass_input(), id=workflow_id, task_queue=task_queue
            )
            wait_for(
                lambda: waiting_sweeps(conn, holder=holder) == 1,
                60,
                "a local sweep to wait for the row",
            )
            os.kill(first.pid, stop_with)
            if stop_with == signal.SIGKILL:
                first.wait(10)
                holder.execute("COMMIT")
            else:
                # The row let go only once the worker is stopping, the sweep still waiting: a
                # COMMIT sent at once could end the sweep before the worker handled the signal.
                wait_for(
                    lambda: STOPPING in (tmp_path / "1.log").read_text(errors="replace"),
                    60,
                    "the worker to begin its graceful stop",
                )
                assert waiting_sweeps(conn, holder=holder) == 1
                holder.execute("COMMIT")
                first.wait(60)  # its graceful shutdown: the sweep ends, then the worker
                assert first.returncode == 0
            for child in child_ids(await events(client, workflow_id)):
                await notice_the_dead_worker_sooner(client, child)
            second = start_worker(path, env, tmp_path / "2.log")
            result = await asyncio.wait_for(handle.result(), 120)
        finally:
            holder.close()
            stop(first)
            if second is not None:
                stop(second)

        assert second is not None
        assert result["removed"] == sum(expired_of(i) for i in range(TENANTS))
        assert result["statuses"] == {"ok": TENANTS}
        assert set(counts(conn, prefix, real_now).values()) == {(0, 2)}

    runs = await child_runs(client, await events(client, workflow_id))
    [child] = [h for r in runs.values() for h in r]
    assert scheduled_in(runs) == []
    swept = local_sweeps(child)
    assert sorted(swept) == sorted(f"sessions@{prefix}_{i:04d}" for i in range(TENANTS))
    if stop_with != signal.SIGKILL:
        return
    assert "WORKFLOW_TASK_TIMED_OUT" in kinds(child) or "WORKFLOW_TASK_FAILED" in kinds(child)
    converter = client.data_converter.payload_converter
    for event in child:
        marker = event.marker_recorded_event_attributes
        if event.HasField("marker_recorded_event_attributes") and "result" in marker.details:
            [sweep] = converter.from_payloads(marker.details["result"].payloads)
            if sweep["name"] == f"sessions@{held}":
                assert sweep["worker"] == identity(second)


async def test_a_cancelled_pass_lets_a_local_sweep_finish_its_statement(
    pg_url: str, harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`temporal workflow cancel` while a local sweep's DELETE waits for a row an application
    holds: the pass ends cancelled, the statement still commits once the row is let go (its
    rows in the ledger), nothing is half done and no live row is touched. The row is let go
    only once the cancellation has reached the sweep's task (the child learns of it at its
    next workflow task, up to 8 s later), and its counts read once that task has ended."""
    prefix = tenant_prefix()
    held = f"{prefix}_0001"
    sweeping: list[asyncio.Task[Any]] = []
    transaction = small_tables._transaction

    def noted(*args: Any) -> Any:
        task = asyncio.current_task()
        assert task is not None
        sweeping.append(task)  # the local sweep's own task, which a cancellation reaches
        return transaction(*args)

    monkeypatch.setattr(small_tables, "_transaction", noted)
    with tenant_schemas(pg_url, prefix) as conn, psycopg.connect(pg_url) as holder:
        create_tenants(conn, prefix, range(TENANTS), harness.now_ms)
        holder.execute(
            f"SELECT 1 FROM {held}.sessions WHERE expires_at < %s FOR UPDATE", (harness.now_ms,)
        )
        cfg = harness.adopt(waiting_config(prefix, lock_timeout="30s"))
        async with harness.run_worker(build_registry(cfg, harness.pool), config=cfg):
            handle = await harness.client.start_workflow(
                "Purge",
                cfg.pass_input(),
                id=f"purge-local-cancel-{uuid.uuid4()}",
                task_queue=harness.task_queue,
            )
            running = asyncio.ensure_future(handle.result())
            await until_a_sweep_waits(conn, running, holder=holder)
            assert waiting_sweeps(conn, holder=holder) == 1
            await handle.cancel()
            async with asyncio.timeout(60):
                while not any(task.cancelling() for task in sweeping):
                    await asyncio.sleep(0.05)
            holder.rollback()
            with pytest.raises(WorkflowFailureError) as ended:
                await running
            async with asyncio.timeout(60):
                while not all(task.done() for task in sweeping):
                    await asyncio.sleep(0.05)
        left = counts(conn, prefix, harness.now_ms)
        done = harness.db.execute(
            "SELECT removed FROM purge_progress WHERE target = %s", (f"sessions@{held}",)
        ).fetchall()

    assert isinstance(ended.value.cause, CancelledError)
    assert left[held] == (0, 2)  # its statement committed after the cancellation
    assert done == [(expired_of(1),)]
    assert all(live == 2 and expired in (0, expired_of(int(schema[-4:])))
               for schema, (expired, live) in left.items())  # fmt: skip


#: Temporal's default workflow task timeout: a local sweep held longer than this outlasts it.
WORKFLOW_TASK_TIMEOUT_S = 10


# Alone (`.ci/run` runs these with no other test beside them): the SDK extends the task at
# about 8 s of its 10 s, so a stall of 2 s (this process, or the server, starved of the cores
# by another worker's fault injection) would time the task out, which no moment a test can make
# prevents; what this test holds is that with a machine to itself the extensions keep it alive.
@pytest.mark.slow
@pytest.mark.alone
async def test_a_local_sweep_longer_than_a_workflow_task_keeps_its_child_alive(
    pg_url: str, harness: Harness
) -> None:
    """A local sweep held past the workflow task's timeout (its DELETE waits for a row another
    session holds for longer): the SDK keeps extending the child's workflow task while it runs,
    so no task times out and nothing is swept twice; the pass completes, every count exact."""
    prefix = tenant_prefix()
    held = f"{prefix}_0001"
    with tenant_schemas(pg_url, prefix) as conn, psycopg.connect(pg_url) as holder:
        create_tenants(conn, prefix, range(TENANTS), harness.now_ms)
        holder.execute(
            f"SELECT 1 FROM {held}.sessions WHERE expires_at < %s FOR UPDATE", (harness.now_ms,)
        )
        cfg = harness.adopt(waiting_config(prefix, lock_timeout="60s"))
        workflow_id = f"purge-local-long-{uuid.uuid4()}"
        async with harness.run_worker(build_registry(cfg, harness.pool), config=cfg):
            handle = await harness.client.start_workflow(
                "Purge", cfg.pass_input(), id=workflow_id, task_queue=harness.task_queue
            )
            running = asyncio.ensure_future(handle.result())
            await until_a_sweep_waits(conn, running, holder=holder)
            assert waiting_sweeps(conn, holder=holder) == 1
            await asyncio.sleep(WORKFLOW_TASK_TIMEOUT_S * 1.5)
            holder.rollback()
            result = await running
        left = counts(conn, prefix, harness.now_ms)

    assert result["statuses"] == {"ok": TENANTS}
    assert result["removed"] == sum(expired_of(i) for i in range(TENANTS))
    assert set(left.values()) == {(0, 2)}
    runs = await child_runs(harness.client, await events(harness.client, workflow_id))
    [child] = [h for r in runs.values() for h in r]
    assert "WORKFLOW_TASK_TIMED_OUT" not in kinds(child)
    assert "WORKFLOW_TASK_FAILED" not in kinds(child)
    # The extensions: workflow tasks the worker completed while the sweep still ran.
    assert kinds(child).count("WORKFLOW_TASK_COMPLETED") >= 2
    assert sorted(local_sweeps(child)) == sorted(
        f"sessions@{prefix}_{i:04d}" for i in range(TENANTS)
    )


class _Entered(Interceptor):
    """Notes the ID of every workflow whose code a worker began to run (replaying or not)."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor] | None:
        ids = self.ids

        class Inbound(WorkflowInboundInterceptor):
            async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
                ids.append(workflow.info().workflow_id)
                return await super().execute_workflow(input)

        return Inbound


async def _until(condition: Callable[[], Any], seconds: float, what: str) -> None:
    """Poll `condition` (a bool, or an awaitable of one) without blocking this loop, where
    the in-process workers run; fail naming `what` after `seconds`."""
    try:
        async with asyncio.timeout(seconds):
            while True:
                met = condition()
                if await met if inspect.isawaitable(met) else met:
                    return
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"timed out after {seconds:.0f} s waiting for {what}") from None


class _Evictions(logging.Handler):
    """What a worker in this process logs as it drops a workflow run from its cache (the SDK's
    `temporalio.worker._workflow` logger, at DEBUG): the run's ID and why, a nondeterminism
    error among the reasons."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Evicting workflow"):
            self.messages.append(message)

    def failed(self, run_id: str) -> bool:
        """Whether run `run_id` was dropped for a nondeterminism error."""
        return any(run_id in m and "nondetermin" in m.lower() for m in self.messages)


@contextlib.contextmanager
def _evictions_logged() -> Iterator[_Evictions]:
    logger = logging.getLogger("temporalio.worker._workflow")
    handler, level = _Evictions(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


async def _polling(client: Client, queue: str) -> set[str]:
    """The identities of the workers the server lists polling `queue` for workflow tasks (a
    stopped or killed worker stays listed for minutes: only a newcomer's entry is news)."""
    described = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
    )
    return {poller.identity for poller in described.pollers}


@pytest.mark.slow
async def test_a_worker_of_the_release_before_beside_this_one_fails_no_target(
    tmp_path: Path,
    client: Client,
    temporal_server: RunningTemporal,
    task_queue: str,
    pg_url: str,
    schema_url: str,
    real_now: int,
) -> None:
    """A rolling deploy, as docs/fleets.md tells it: a worker of this release begins a child of
    local sweeps, its first workflow task completed (the patch marker recorded) while one sweep
    waits for a row another session holds; that worker is SIGKILLed, and a worker of the
    release before, polling the same queue, is handed the child's next workflow task. It fails
    it (nondeterminism) without completing any task of the child or scheduling an activity; a
    worker of this release starts beside it, and once both poll the queue the older one stops
    (a rolling deploy's end), and the pass completes: every target ok, counts exact, each
    table's sweep recorded once, every workflow task of the child completed by this release."""
    prefix = tenant_prefix()
    held = f"{prefix}_0001"
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(TENANTS), real_now)
        path = _process_config(tmp_path, schema_url, task_queue, prefix)
        cfg = load_config(path)
        assert cfg.own_queue is not None
        env = clean_env(TEMPORAL_ADDRESS=temporal_server.address)
        holder = _hold_an_expired_row(pg_url, held, real_now)
        entered = _Entered()
        # The release before: it polls the child's queue for workflow tasks and runs `PurgeChunk`
        # as it did. No activity either: were it to go on in its shape, the pass would wait for
        # one and the test time out.
        older = Worker(
            client,
            task_queue=cfg.own_queue,
            workflows=[PurgeChunkBeforeLocal],
            interceptors=[entered],
            identity="release-before",
        )
        first = start_worker(path, env, tmp_path / "1.log")
        second = None
        workflow_id = f"purge-local-mixed-{uuid.uuid4()}"
        try:
            handle = await client.start_workflow(
                "Purge", cfg.pass_input(), id=workflow_id, task_queue=task_queue
            )
            wait_for(
                lambda: waiting_sweeps(conn, holder=holder) == 1,
                60,
                "a local sweep to wait for the row",
            )

            async def child_started() -> bool:
                return bool(child_ids(await events(client, workflow_id)))

            await _until(child_started, 30, "the child to start")
            [child] = child_ids(await events(client, workflow_id))

            async def patch_recorded() -> bool:
                # The SDK completes a task running longer than about 8 s (of its 10 s timeout)
                # with what the workflow did so far: the patch marker, the sweeps that ended.
                return "WORKFLOW_TASK_COMPLETED" in kinds(await events(client, child))

            await _until(patch_recorded, 30, "the child's first workflow task to complete")
            run_id = (await client.get_workflow_handle(child).describe()).run_id
            os.kill(first.pid, signal.SIGKILL)
            first.wait(10)
            await notice_the_dead_worker_sooner(client, child)
            with _evictions_logged() as evictions:
                async with older:
                    # The dead worker's task times out (10 s), and the next goes to the only
                    # poller, which replays the child and meets the patch marker.
                    await _until(lambda: child in entered.ids, 60, "the older worker's turn")
                    await _until(
                        lambda: evictions.failed(run_id),
                        60,
                        "the older worker to fail the child's task (nondeterminism)",
                    )
                    # A worker of this release starts beside the older one, which still polls.
                    holder.execute("COMMIT")
                    second = start_worker(path, env, tmp_path / "2.log")
                    beside, queue = {"release-before", identity(second)}, cfg.own_queue

                    async def both_polling() -> bool:
                        return beside <= await _polling(client, queue)

                    await _until(both_polling, 60, "both workers to poll the child's queue")
                # The older worker stops once both poll: the task's retries go to this
                # release's alone. Polling on to the end, the older one could win each retry
                # again, each win costing more (the server gives a task's attempts after the
                # third a growing timeout); at most the one it holds as it stops is lost.
            result = await asyncio.wait_for(handle.result(), 120)
        finally:
            holder.close()
            stop(first)
            if second is not None:
                stop(second)

        assert result["statuses"] == {"ok": TENANTS}
        assert result["removed"] == sum(expired_of(i) for i in range(TENANTS))
        assert set(counts(conn, prefix, real_now).values()) == {(0, 2)}

    runs = await child_runs(client, await events(client, workflow_id))
    [history] = [h for r in runs.values() for h in r]
    assert scheduled_in(runs) == []
    assert sorted(local_sweeps(history)) == sorted(
        f"sessions@{prefix}_{i:04d}" for i in range(TENANTS)
    )
    completed_by = {
        e.workflow_task_completed_event_attributes.identity
        for e in history
        if e.HasField("workflow_task_completed_event_attributes")
    }
    # The older worker ran the child's task (`entered`) and failed it (nondeterminism, above);
    # the killed worker completed the child's first tasks, the worker started beside the older
    # one every task after them: the older one none.
    assert child in entered.ids
    assert evictions.failed(run_id)
    assert completed_by == {identity(first), identity(second)}


async def test_max_sweeps_bounds_local_sweeps(
    pg_url: str, harness: Harness, temporal_server: RunningTemporal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run --max-sweeps 1` (docs/tenants.md): a child of small tables that may sweep four at
    once (`max_per_database = 4`) runs its local sweeps one after another on that worker;
    every DELETE, as the database logged it, ends before the next begins.

    The control first: the same pass by a worker without `--max-sweeps`, its first two
    DELETEs made to meet, overlaps in the same log, and says how long this machine took to
    start the second sweep. The bounded run's first DELETE then waits ten times that for a
    second (`a_second_sweep_s_chance`): a bound that broke would let one start and meet it,
    however fast or slow the machine, where hoping 150 ms DELETEs overlap would not."""
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(TENANTS), harness.now_ms)
        tables = [f"{prefix}_{i:04d}.sessions" for i in range(TENANTS)]
        log_table = log_each_delete(conn, prefix, tables)
        try:
            cfg = parse_config(
                {"database_url": harness.url, "task_queue": harness.task_queue,
                 "pass": {"max_concurrent": 4, "max_per_database": 4},
                 # Past the wait to meet (MEETING_S at most), which ends no sweep itself.
                 "targets": [{"kind": "expiring", "name": "sessions",
                              "table": f"{prefix}_*.sessions", "column": "expires_at",
                              "statement_timeout": f"{2 * MEETING_S}s"}]},
                env={},
            )  # fmt: skip
            use_env(monkeypatch, clean_env())
            meet_first(conn, prefix, 2)
            control = await run_pass_beside(
                lambda stop: run_worker(cfg, stop=stop, temporal_address=temporal_server.address),
                harness.client,
                harness.task_queue,
                cfg.pass_input(),
            )
            unbounded = conn.execute(f"SELECT pid, edge FROM {log_table} ORDER BY at").fetchall()
            chance = a_second_sweep_s_chance(took_to_meet(conn, log_table))

            # The expired rows again, a fresh log, the worker with the bound.
            create_tenants_expired_again(conn, prefix, harness.now_ms)
            conn.execute(f"TRUNCATE {log_table}")
            meet_first(conn, prefix, 2, within_s=chance)
            workflow_id = f"purge-local-one-at-a-time-{uuid.uuid4()}"
            result = await run_pass_beside(
                lambda stop: run_worker(
                    cfg, stop=stop, temporal_address=temporal_server.address, max_sweeps=1
                ),
                harness.client,
                harness.task_queue,
                cfg.pass_input(),
                workflow_id,
            )
            log = conn.execute(f"SELECT pid, edge FROM {log_table} ORDER BY at").fetchall()
            left = counts(conn, prefix, harness.now_ms)
        finally:
            drop_log(conn, prefix)

    # Without the bound, the pass's DELETEs overlap.
    assert control["statuses"] == {"ok": TENANTS}
    assert control["removed"] == sum(expired_of(i) for i in range(TENANTS))
    assert len(unbounded) >= 2 * TENANTS
    assert not one_at_a_time(unbounded), unbounded
    assert result["statuses"] == {"ok": TENANTS}
    assert result["removed"] == control["removed"]
    assert set(left.values()) == {(0, 2)}
    runs = await child_runs(harness.client, await events(harness.client, workflow_id))
    [child] = [h for r in runs.values() for h in r]
    assert len(local_sweeps(child)) == TENANTS
    assert len(log) >= 2 * TENANTS
    # One at a time: each statement's BEFORE is followed by its own AFTER, never another's.
    assert one_at_a_time(log), log


def create_tenants_expired_again(conn: psycopg.Connection[Any], prefix: str, now_ms: int) -> None:
    """Each tenant's expired rows of `create_tenants`, given back after a pass took them."""
    for i in range(TENANTS):
        conn.execute(
            f"INSERT INTO {prefix}_{i:04d}.sessions (expires_at)"
            " SELECT %s FROM generate_series(1, %s)",
            (now_ms - HOUR_MS, expired_of(i)),
        )
