"""Passes as an operator meets them: start one now, read the recent ones, replay their histories."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import (
    Client,
    ScheduleActionExecutionStartWorkflow,
    ScheduleActionStartWorkflow,
    WorkflowExecution,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowHistory,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.converter import PayloadConverter
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Replayer

from activities.errors import failure_of
from activities.pass_records import current, pass_record, purge_query
from activities.results import FailedTarget, PurgeReport, PurgeSweep, known_fields
from activities.routing import is_own_queue
from purge_config.file import path_shown
from purge_config.fleet import DEFAULT_DATABASE_KEY
from purge_config.patterns import split_match_name
from purge_config.schedules import ScheduleConfig
from purge_ops.namespace_check import start_attributes
from purge_ops.render import (
    ESTIMATED_BACKLOG_NOTE,
    LOWER_BOUND_NOTE,
    backlog_text,
    dead_text,
    human_duration,
    oldest_text,
    partitions_text,
    patterns_table,
    removed_text,
    report_table,
    table,
)
from workflows.chunk import LOCAL_ACTIVITY_MARKER, PurgeChunkWorkflow
from workflows.purge import PurgeWorkflow

Say = Callable[[str], None]


#: At most this many running passes on a task queue are read for `sweep` (their inputs each).
RUNNING_READ = 50


async def running_passes(client: Client, task_queue: str) -> list[WorkflowExecution]:
    """Each `Purge` running on `task_queue` now (scheduled or by hand), newest first."""
    found = []
    async for execution in client.list_workflows(
        purge_query(task_queue, "Running"), limit=RUNNING_READ
    ):
        # Visibility lags the history: a pass that closed a moment ago may still be listed as
        # running, and waiting for it would print that pass's report (a dry run's, say) as this
        # sweep's. Its own description says whether it still runs.
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
            found.append(execution)
    return found


class SweepInterrupted(Exception):
    """`sweep` was stopped (Ctrl-C) while it waited: says what it leaves running in Temporal."""


@dataclass
class _Begun:
    """What a `sweep` has set going in Temporal so far, for the line Ctrl-C prints."""

    what: str = ""


async def sweep(
    client: Client,
    task_queue: str,
    request: dict[str, Any],
    say: Say,
    schedule_id: str | None = None,
    pass_ends_by: timedelta | None = None,
) -> int:
    """One pass now, through Temporal, or a wait for the one already running when it is this
    very pass; prints the report. A running pass that sweeps some of this pass's targets but
    is not this pass (a dry run, another config's, some targets only) is waited out first; one
    that sweeps none of them (another schedule's) runs on beside it.

    Where the schedule `schedule_id` exists and would start this very pass (`request` is its
    input), the pass is started through it: its overlap policy (SKIP) then keeps its own runs
    from starting beside this one. Any other pass (a dry run, some targets, no schedule) starts
    under one fixed id. The exit status: 0 when the pass completed, 1 when it (or any target)
    failed. Cancelled (Ctrl-C), it raises SweepInterrupted saying whether a pass it started or
    joined goes on, or none was started. A pass it starts itself ends by `pass_ends_by` at the
    latest (the schedule's passes', `schedule.pass_timeout`): one no worker of the release
    running can go on with (after a rollback) would otherwise hold every later `sweep` of its
    targets behind it.
    """
    begun = _Begun()
    try:
        return await _sweep(client, task_queue, request, say, schedule_id, begun, pass_ends_by)
    except asyncio.CancelledError:
        if begun.what:
            raise SweepInterrupted(
                f"{begun.what} goes on in Temporal (`report` shows it)"
            ) from None
        raise SweepInterrupted("this sweep had started no pass; none runs for it") from None


async def _sweep(
    client: Client,
    task_queue: str,
    request: dict[str, Any],
    say: Say,
    schedule_id: str | None,
    begun: _Begun,
    pass_ends_by: timedelta | None = None,
) -> int:
    # From the start: a pass it waits out first (a dry run, another config's) waits on the same
    # workers, and with none up the wait would be as silent as its own pass's.
    async with _noticing(client, task_queue, request, say):
        handle = await _this_pass_running(client, task_queue, request, say)
        if handle is None and schedule_id is not None:
            handle = await scheduled_pass(client, schedule_id, request, say, task_queue, begun)
        while handle is None:
            # One fixed id for passes by hand: two `sweep`s racing each other share one pass
            # (the visibility query above may not see a pass started a moment ago).
            pass_id = f"purge-sweep-{task_queue}"
            # Said before the call: one the server took as the call was cancelled starts the pass.
            begun.what = f"the pass {pass_id} this sweep asked Temporal to start"
            handle = await client.start_workflow(
                "Purge",
                request,
                id=pass_id,
                task_queue=task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                search_attributes=await start_attributes(client),
                execution_timeout=pass_ends_by,
            )
            # A pass by hand that visibility did not list yet holds that id: joined only where it
            # is this pass (a `sweep --dry-run` started a moment before would otherwise report
            # its dry run as this sweep's), else waited out and started again.
            theirs, starter = await _start_of(client, handle)
            differs = not_this_pass(theirs, request)
            if differs:
                begun.what = ""  # another's pass: none of this sweep's runs yet
                say(
                    f"a pass is already running under {handle.id}, not this pass ({differs}); "
                    "waiting for it to end, then starting this one"
                )
                await _ended(handle)
                handle = None
            elif starter == client.identity:
                say(f"started pass {handle.id} on task queue {task_queue!r}")
            else:
                # Another client started this very pass a moment before (a second `sweep`):
                # one pass, its report printed by both.
                say(
                    f"joined pass {handle.id} on task queue {task_queue!r}, started a moment "
                    f"before by {starter or 'another client'} with this same input"
                )
        begun.what = f"pass {handle.id}"
        try:
            result = await handle.result()
        except WorkflowFailureError as err:
            failure = failure_of(err)
            if failure.type == "PurgeTargetsFailed" and failure.details:
                report = PurgeReport.from_json(failure.details[0])
                say(report_table(report))
                say("failed targets: " + ", ".join(f.name for f in report.failed))
            else:
                say(f"pass {handle.id} failed: {failure.type}: {failure.message}")
            return 1
        report = PurgeReport.from_json(result)
        say(report_table(report))
        # A table named by hand that is not there is `gone` to the pass, which cannot tell it from
        # a tenant dropped mid-pass: here it is most likely a misspelt name.
        named = set(request.get("targets", []))
        missing = [s.name for s in report.swept if s.status == "gone" and s.name in named]
        if missing:
            say(
                f"no table for {', '.join(missing)}: named by hand and not there (a misspelt "
                "name?); nothing was swept for it"
            )
            return 1
        return 0


@contextlib.asynccontextmanager
async def _noticing(
    client: Client, task_queue: str, request: dict[str, Any], say: Say
) -> AsyncIterator[None]:
    """`_say_if_unpolled` while the block runs; its end read on the way out (not by asyncio
    after the report), an error of its own said."""
    task = asyncio.create_task(_say_if_unpolled(client, task_queue, request, say))
    try:
        yield
    finally:
        task.cancel()
        # gather, so that the notice's own cancellation is not taken for this sweep's.
        [ended] = await asyncio.gather(task, return_exceptions=True)
        if isinstance(ended, Exception):
            say(f"(the look for queues no worker polls failed: {type(ended).__name__}: {ended})")


async def _this_pass_running(
    client: Client, task_queue: str, request: dict[str, Any], say: Say
) -> WorkflowHandle[Any, Any] | None:
    """The running pass that sweeps what `request` asks, if one does, once every running pass
    that sweeps some of its targets without being it has ended (each said, and waited out)."""
    while True:
        overlapping: tuple[WorkflowHandle[Any, Any], str, str] | None = None
        for running in await running_passes(client, task_queue):
            found = f"a pass is already running on task queue {task_queue!r}: {running.id} "
            found += f"(started {running.start_time:%Y-%m-%d %H:%M:%S} UTC)"
            handle = client.get_workflow_handle(running.id, run_id=running.run_id)
            theirs = await _input_of(client, handle)
            differs = not_this_pass(theirs, request)
            if not differs:
                say(f"{found}; waiting for it instead of starting a second")
                return handle
            if overlapping is None and sweeps_any(theirs, request):
                overlapping = handle, found, differs
        if overlapping is None:
            return None
        # Beside it, this pass's tables it holds would mostly be reported busy (one sweep per
        # table), and its report is not this pass's: wait for it to end, then look again.
        handle, found, differs = overlapping
        say(f"{found}, not this pass ({differs}); waiting for it to end, then starting this one")
        await _ended(handle)


#: How long `sweep` waits on a pass before it first looks whether any worker polls its queues,
#: and how often it looks again while it waits.
UNPOLLED_NOTICE_S = 5.0
UNPOLLED_AGAIN_S = 30.0
#: A poller whose last poll is older than this has stopped. A live worker's long poll is renewed
#: at least every minute (the server's long-poll expiry), but Temporal goes on listing a worker
#: that stopped or died for minutes: the queue of a worker killed a moment ago looks polled.
POLLER_GONE_S = 90.0


async def _say_if_unpolled(
    client: Client, task_queue: str, request: dict[str, Any], say: Say
) -> None:
    """After UNPOLLED_NOTICE_S, and every UNPOLLED_AGAIN_S while the pass runs: one line naming
    the pass's queues no worker polls, each queue said once. A `sweep` with no worker up waits
    for one and would otherwise wait in silence; one whose worker just died, as long."""
    await asyncio.sleep(UNPOLLED_NOTICE_S)
    said: set[tuple[str, int]] = set()
    while True:
        try:
            unpolled = await _unpolled(client, task_queue, request)
        except RPCError:
            # Temporal out of reach a moment (the pass's own wait retries): looked again later.
            unpolled = []
        idle = [q for q in unpolled if q not in said]
        if idle:
            say(unpolled_line(idle, task_queue, request))
            said.update(idle)
        await asyncio.sleep(UNPOLLED_AGAIN_S)


async def _unpolled(
    client: Client, task_queue: str, request: dict[str, Any]
) -> list[tuple[str, int]]:
    """The pass's queues (name, TaskQueueType) no worker has polled in POLLER_GONE_S."""
    wanted = [(task_queue, TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW)]
    routes = request.get("queues")
    activity_queues = sorted(set(routes.values())) if isinstance(routes, dict) else [task_queue]
    wanted += [(queue, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY) for queue in activity_queues]
    gone_before = time.time() - POLLER_GONE_S
    idle = []
    for queue, kind in wanted:
        described = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace, task_queue=TaskQueue(name=queue), task_queue_type=kind
            )
        )
        if not any(p.last_access_time.seconds > gone_before for p in described.pollers):
            idle.append((queue, int(kind)))
    return idle


def unpolled_line(idle: list[tuple[str, int]], task_queue: str, request: dict[str, Any]) -> str:
    """What `sweep` says of `idle` queues: whether the pass waits or its targets there fail,
    and which worker would poll each: this config's, or for a routed database's queue one where
    that database's URL is set (the scheduler's config often has none for a region's)."""
    workflow = int(TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW)
    passes_idle = any(kind == workflow for _, kind in idle)
    named = ", ".join(
        f"{queue!r} ({'passes' if kind == workflow else 'activities'})" for queue, kind in idle
    )
    routes = request.get("queues")
    # A database without a queue of its own has the config's own queue, as the default one has;
    # databases that share a queue of their own are each named.
    routed: dict[str, list[str]] = {}
    for db, queue in routes.items() if isinstance(routes, dict) else []:
        own = db == DEFAULT_DATABASE_KEY or is_own_queue(queue, task_queue)
        if not own and queue != task_queue:
            routed.setdefault(queue, []).append(db)
    elsewhere = sorted({db for q, kind in idle if kind != workflow for db in routed.get(q, [])})
    waits = passes_idle or "worker_wait_ms" not in request
    fixes = []
    if any(kind == workflow or q not in routed for q, kind in idle):
        # With the pass run and only this config's own queue idle, most often a worker of
        # the config as it was before an edit polls another digest's queue.
        restart = not waits and not elsewhere
        fixes.append(
            "a worker polls only the queue of its own config's targets: start (or restart) "
            "`pg-purge run` with this config"
            if restart
            else "start `pg-purge run` with this config"
        )
    if elsewhere:
        where = ", ".join(repr(db) for db in elsewhere)
        fixes.append(
            f"start `pg-purge run` where database {where}'s URL is set (a config with this "
            "one's targets there, its url_env in the environment)"
        )
    fix = "; ".join(fixes)
    if waits:
        return (
            f"no worker polls task queue {named}: the pass waits until one does; {fix} "
            "(Ctrl-C leaves the pass to it)"
        )
    # A worker runs the pass, but none polls its targets' queue: a worker of another config
    # (an older one, before an edit of a target), or none next to a routed database.
    wait_s = int(request["worker_wait_ms"]) // 1000
    return (
        f"no worker polls task queue {named}: those targets fail as not taken unless one does "
        f"within {wait_s} s ([pass] worker_wait); {fix}"
    )


async def _input_of(client: Client, handle: WorkflowHandle[Any, Any]) -> object:
    """The one argument a running pass was started with (None where it had not one)."""
    return (await _start_of(client, handle))[0]


async def _start_of(client: Client, handle: WorkflowHandle[Any, Any]) -> tuple[object, str]:
    """The one argument a running pass was started with (None where it had not one), and the
    identity of the client that started it (pid@host, the SDK's default; empty if unknown)."""
    async for event in handle.fetch_history_events(page_size=1):
        started = event.workflow_execution_started_event_attributes
        payloads = started.input.payloads
        converter = client.data_converter.payload_converter
        given = converter.from_payload(payloads[0]) if len(payloads) == 1 else None
        return given, started.identity
    return None, ""


def not_this_pass(theirs: object, ours: dict[str, Any]) -> str:
    """Why a running pass whose input is `theirs` is not one that sweeps what `ours` asks
    (every one of its targets, routed to the same queues, dry run or not as it is); empty
    when it is. Limits may differ: a scheduled pass with a budget sweeps the same tables."""
    if not isinstance(theirs, dict) or not isinstance(theirs.get("targets"), list):
        return "its input is not a pass's"
    if bool(theirs.get("dry_run")) != bool(ours.get("dry_run")):
        return "it is a dry run" if theirs.get("dry_run") else "this one is a dry run"
    swept = set(theirs["targets"])
    missing = [name for name in ours["targets"] if name not in swept]
    if missing:
        shown = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        return f"it does not sweep {shown}"
    if not set(ours.get("patterns") or ()) <= set(theirs.get("patterns") or ()):
        return "it does not expand this pass's table patterns"
    routes, their_routes = _routes(ours), _routes(theirs)
    if any(routes[name] != their_routes.get(name) for name in ours["targets"]):
        return "it sends some of this pass's targets to other task queues (another config's)"
    return ""


def sweeps_any(theirs: object, ours: dict[str, Any]) -> bool:
    """Whether a running pass whose input is `theirs` sweeps any target `ours` asks for (one
    whose input is not a pass's is taken to)."""
    if not isinstance(theirs, dict) or not isinstance(theirs.get("targets"), list):
        return True
    their_names, our_names = set(map(str, theirs["targets"])), set(ours["targets"])
    if not their_names.isdisjoint(our_names):
        return True
    # A pattern (`sessions`) sweeps each of its tables named by hand (`sessions@tenant_0042`).
    return any(
        (split := split_match_name(name)) is not None and split[0] in other
        for names, other in ((our_names, their_names), (their_names, our_names))
        for name in names
    )


def _routes(request: dict[str, Any]) -> dict[str, tuple[str, str | None]]:
    """Each target of a pass input to (its database, the task queue of its activities)."""
    names: list[str] = [str(n) for n in request.get("targets") or ()]
    on: dict[str, str] = {}
    databases = request.get("databases")
    if isinstance(databases, dict):
        on = {str(k): str(v) for k, v in databases.items()}
    for database, start, stop in request.get("database_ranges") or ():
        on |= {name: str(database) for name in names[start:stop]}
    queues = request.get("queues")
    queues = queues if isinstance(queues, dict) else {}
    return {name: (on.get(name, ""), queues.get(on.get(name, ""))) for name in names}


async def _ended(handle: WorkflowHandle[Any, Any]) -> None:
    """Once the pass of `handle` has ended, however it ended."""
    with contextlib.suppress(WorkflowFailureError):
        await handle.result()


#: How long `sweep` looks for the run a trigger of the schedule started (or found running).
TRIGGER_WAIT_S = 30.0


def _another_pass(scheduled: object, request: dict[str, Any]) -> str:
    """Why the pass a schedule starts (its one argument, `scheduled`) is not `request`."""
    if request.get("dry_run"):
        return "this is a dry run"
    if not isinstance(scheduled, dict):
        return "the schedule does not start a Purge pass of one input"
    if scheduled.get("targets") != request.get("targets"):
        ours, theirs = set(request.get("targets") or ()), set(scheduled.get("targets") or ())
        if ours < theirs:
            return "this pass sweeps some of its targets"
        return "its targets are not the config's: `pg-purge schedule` updates it"
    return "its input differs from the config's: `pg-purge schedule` updates it"


async def scheduled_pass(
    client: Client,
    schedule_id: str,
    request: dict[str, Any],
    say: Say,
    task_queue: str,
    begun: _Begun,
) -> WorkflowHandle[Any, Any] | None:
    """The pass the schedule `schedule_id` starts now, triggered under its own overlap policy
    (or the one it has running); None where there is no such schedule or its input is not
    `request` (then `sweep` starts a pass of its own). `begun` says so from the trigger on."""
    schedule = client.get_schedule_handle(schedule_id)
    try:
        described = await schedule.describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    action = described.schedule.action
    convert = client.data_converter.payload_converter
    started = (
        [convert.from_payload(p) for p in action.args]
        if isinstance(action, ScheduleActionStartWorkflow)
        else None
    )
    if isinstance(action, ScheduleActionStartWorkflow) and action.task_queue != task_queue:
        # Another config's schedule of this id (or this one's before its task_queue changed):
        # `pg-purge schedule` would take it over, so that is not the advice.
        say(f"schedule {schedule_id} starts passes on task queue {action.task_queue!r}, not "
            f"{task_queue!r}: starting a pass of its own")  # fmt: skip
        return None
    if started != [request]:
        why = _another_pass(started[0] if started and len(started) == 1 else None, request)
        say(f"schedule {schedule_id} starts another pass than this one ({why}): starting a pass "
            "of its own")  # fmt: skip
        return None
    state = described.schedule.state
    if state.paused:
        # An operator's pause stops the firings, not an explicit sweep: said, so that whoever
        # paused it (their note quoted) is not surprised by a pass.
        note = f" ({state.note})" if state.note else ""
        say(f"schedule {schedule_id} is PAUSED{note}: this sweep runs one pass through it all "
            "the same; the pause stays")  # fmt: skip
    before = set(_started(described.info.recent_actions))
    # Said before the call: a trigger the server took as the call was cancelled starts one.
    begun.what = f"the pass schedule {schedule_id} was triggered to start"
    await schedule.trigger()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TRIGGER_WAIT_S
    while loop.time() < deadline:
        info = (await schedule.describe()).info
        started = [run for run in _started(info.recent_actions) if run not in before]
        # SKIP: with a run of its own under way the trigger starts none, and that run is it.
        found = started[-1:] or _started(info.running_actions)[-1:]
        if found:
            workflow_id, run_id = found[0]
            say(f"started pass {workflow_id} through schedule {schedule_id}")
            return client.get_workflow_handle(workflow_id, first_execution_run_id=run_id)
        await asyncio.sleep(0.1)
    raise TimeoutError(
        f"schedule {schedule_id} was triggered but started no pass within {TRIGGER_WAIT_S:.0f} s"
    )


def _started(actions: Sequence[Any]) -> list[tuple[str, str]]:
    """(workflow id, first run id) of each workflow a schedule's actions started."""
    runs = [getattr(a, "action", a) for a in actions]
    return [
        (run.workflow_id, run.first_execution_run_id)
        for run in runs
        if isinstance(run, ScheduleActionExecutionStartWorkflow)
    ]


@dataclass
class PassSummary:
    """One pass as `report` shows it."""

    workflow_id: str
    started: datetime
    seconds: float | None
    status: str
    report: PurgeReport | None = None
    error: str = ""
    removed: dict[str, int | str] = field(default_factory=dict)


async def recent_passes(
    client: Client,
    task_queue: str,
    last: int,
    id_prefix: str = "",
    not_prefixes: Sequence[str] = (),
) -> list[PassSummary]:
    """The last `last` passes on `task_queue` (with `id_prefix`, those of one schedule, less any
    whose id starts with one of `not_prefixes`), newest first, with what each removed."""
    query = purge_query(task_queue)
    if id_prefix:
        query += f" AND WorkflowId STARTS_WITH {json.dumps(id_prefix)}"
    for prefix in not_prefixes:
        query += f" AND WorkflowId NOT STARTS_WITH {json.dumps(prefix)}"
    found: list[PassSummary] = []
    async for execution in client.list_workflows(query, limit=last):
        found.append(await summarize(client, execution))
    found.sort(key=lambda s: s.started, reverse=True)
    return found[:last]


#: How many of a task queue's newest passes `report` looks through for passes by hand among
#: the named schedules' (each schedule's own are read by their id).
BY_HAND_SCAN = 1000


async def passes_by_hand(
    client: Client, task_queue: str, last: int, scheduled: tuple[str, ...]
) -> list[PassSummary]:
    """The last `last` passes on `task_queue` whose ids start with none of `scheduled` (the
    named schedules' `<schedule id>-`), among its newest BY_HAND_SCAN."""
    found: list[PassSummary] = []
    async for execution in client.list_workflows(purge_query(task_queue), limit=BY_HAND_SCAN):
        if not execution.id.startswith(scheduled):
            found.append(await summarize(client, execution))
            if len(found) == last:
                break
    found.sort(key=lambda s: s.started, reverse=True)
    return found


async def summarize(client: Client, execution: WorkflowExecution) -> PassSummary:
    """`execution` as `report` shows it: its status as it stands now (`current`), not as a
    lagging visibility store may still list it."""
    execution = await current(client, execution)
    seconds = (
        (execution.close_time - execution.start_time).total_seconds()
        if execution.close_time
        else None
    )
    status = execution.status.name.lower() if execution.status else "unknown"
    record = await pass_record(client, execution)
    summary = PassSummary(
        execution.id, execution.start_time, seconds, status, record.report, record.error
    )
    if summary.report is not None:
        if summary.report.dry_run:
            summary.status += " (dry run)"
        # A spread pass keeps only its largest sweeps: a pattern is one column, its matches none.
        wild = {p.name for p in summary.report.patterns}
        for sweep_ in summary.report.swept:
            if sweep_.name.rpartition("@")[0] not in wild:
                summary.removed[sweep_.name] = removed_text(sweep_)
        for line in summary.report.patterns:
            summary.removed[line.name] = (
                line.removed if not line.failed else (f"{line.removed} ({line.failed} FAILED)")
            )
        for failed in summary.report.failed:
            if failed.name.rpartition("@")[0] not in wild:
                summary.removed[failed.name] = "FAILED"
    return summary


async def schedules_report(
    client: Client,
    task_queue: str,
    schedules: Sequence[ScheduleConfig],
    names: Sequence[str],
    last: int,
) -> str:
    """Under `[schedules.NAME]`: each schedule's last `last` passes (told by the workflow id
    Temporal gives a scheduled run, `<schedule id>-<fire time>`), each read by that id, so a
    daily schedule's are there beside a five-minute one's; then any started by hand."""
    sections: list[str] = []
    prefixes = [f"{spec.id}-" for spec in schedules]
    for spec, mine_prefix in zip(schedules, prefixes, strict=True):
        # `purge-hot-eu-…` starts with `purge-hot-` too: another schedule's passes, not hot's.
        longer = [p for p in prefixes if p != mine_prefix and p.startswith(mine_prefix)]
        mine = await recent_passes(client, task_queue, last, mine_prefix, longer)
        title = (
            f"schedule {spec.name} ({spec.id}, cron {spec.cron!r} in {spec.time_zone}): "
            + ", ".join(spec.targets)
        )
        body = passes_table(mine, spec.targets) if mine else "no passes yet"
        sections.append(f"{title}\n{body}")
    others = await passes_by_hand(client, task_queue, last, tuple(prefixes))
    if others:
        sections.append(f"passes started by hand\n{passes_table(others, names)}")
    return "\n\n".join(sections)


def passes_table(passes: Sequence[PassSummary], order: Sequence[str] = ()) -> str:
    """Passes as rows, targets as columns (in `order` first, then as met): a target that removes
    much on every pass stands out."""
    names: list[str] = list(order)
    for summary in passes:
        names += [n for n in summary.removed if n not in names]
    # Only columns some pass has a value in: a configured target no pass swept yet adds nothing.
    names = [n for n in names if any(n in s.removed for s in passes)]
    rows: list[list[object]] = []
    for s in passes:
        total = s.report.removed if s.report else ""
        took = "" if s.seconds is None else human_duration(s.seconds * 1000)
        rows.append(
            [
                f"{s.started:%Y-%m-%d %H:%M:%S}",
                took,
                s.status,
                *(s.removed.get(n, "") for n in names),
                total,
                s.workflow_id,
            ]
        )
    header = ["started (UTC)", "took", "status", *names, "total", "workflow id"]
    right = set(range(3, 4 + len(names)))
    parts = [table(header, rows, right=right)]
    errors = [f"{s.workflow_id}: {s.error}" for s in passes if s.error]
    if errors:
        parts.append("\n".join(errors))
    latest = latest_table(passes, names)
    if latest:
        parts.append(latest)
    newest = next((s.report for s in passes if s.report and s.report.patterns), None)
    if newest is not None:
        parts.append(patterns_table(newest.patterns))
    if any(sweep.lower_bound for s in passes if s.report for sweep in s.report.swept):
        parts.append(LOWER_BOUND_NOTE)
    return "\n\n".join(parts)


def latest_table(passes: Sequence[PassSummary], names: Sequence[str]) -> str:
    """Each target's newest sweep (passes newest first): what it left and what it cost, and,
    when any took whole partitions out, how many, their rows and the rows deleted at the edge.
    """
    sweeps = []
    for name in names:
        sweep = next(
            (w for s in passes if s.report for w in s.report.swept if w.name == name), None
        )
        if sweep is not None and not sweep.dry_run:
            sweeps.append(sweep)
    if not sweeps:
        return ""
    whole = any(partitions_text(s) for s in sweeps)
    rows = [_last_sweep_row(sweep, whole) for sweep in sweeps]
    header = [
        "target (last sweep)", "removed", "strategy",
        *(["partitions", "their rows", "edge rows"] if whole else []),
        "backlog", "oldest expired", "dead", "analyzed", "count",
    ]  # fmt: skip
    extra = 3 if whole else 0
    right = {1, 3 + extra, 4 + extra, 5 + extra} | ({4, 5} if whole else set())
    by_worker: dict[str, list[str]] = {}
    for sweep in sweeps:
        by_worker.setdefault(sweep.worker or "?", []).append(sweep.name)
    swept_by = "swept by: " + "; ".join(
        f"{worker} ({', '.join(names)})" for worker, names in by_worker.items()
    )
    notes = [ESTIMATED_BACKLOG_NOTE] if any(s.backlog_estimated for s in sweeps) else []
    return "\n".join([table(header, rows, right=right), swept_by, *notes])


def _last_sweep_row(sweep: PurgeSweep, whole: bool) -> list[object]:
    parts: list[object] = (
        [
            partitions_text(sweep),
            sweep.partition_rows or "",
            sweep.edge_removed if sweep.partition_rows else "",
        ]
        if whole
        else []
    )
    if sweep.strategy == "custom":
        # An application's own target: its count is what it returned, and nothing of what it
        # left was measured (the entry's zeros are defaults, not readings), as `sweep` shows.
        return [sweep.name, sweep.removed, sweep.strategy, *parts, "", "", "", "", "its own"]
    return [
        sweep.name,
        removed_text(sweep),
        sweep.strategy,
        *parts,
        backlog_text(sweep),
        oldest_text(sweep.oldest_expired_age_s) or "0",
        dead_text(sweep),
        "yes" if sweep.analyzed else "",
        "lower bound" if sweep.lower_bound else "exact",
    ]


async def pattern_tables(
    client: Client, task_queue: str, name: str, last: int
) -> tuple[PassSummary, list[PurgeSweep | FailedTarget]] | None:
    """The newest of the last `last` passes that swept pattern target `name`, and the record of
    each of its matches, read from the histories of the children that swept them."""
    for summary in await recent_passes(client, task_queue, last):
        report = summary.report
        if report is None or not any(p.name == name for p in report.patterns):
            continue
        found: list[PurgeSweep | FailedTarget] = []
        for child in report.children:
            found += await child_records(client, child, f"{name}@")
        return summary, sorted(found, key=lambda r: r.name)
    return None


async def child_records(
    client: Client, workflow_id: str, prefix: str
) -> list[PurgeSweep | FailedTarget]:
    """Each target's outcome in a child's runs, for names that start with `prefix`: its
    activity's result, or how it failed. From the newest run back to the first, each run's
    start naming the run it continued."""
    records: list[PurgeSweep | FailedTarget] = []
    run_id: str | None = None
    while True:
        handle = client.get_workflow_handle(workflow_id, run_id=run_id)
        events = list((await handle.fetch_history()).events)
        records = _outcomes(client, events, prefix) + records
        started = events[0].workflow_execution_started_event_attributes
        run_id = started.continued_execution_run_id or None
        if run_id is None:
            return records


def _outcomes(client: Client, events: list[Any], prefix: str) -> list[PurgeSweep | FailedTarget]:
    converter = client.data_converter.payload_converter
    names: dict[int, str] = {}
    found: list[PurgeSweep | FailedTarget] = []
    for event in events:
        if event.HasField("marker_recorded_event_attributes"):
            local = _local_outcome(converter, event, prefix)
            if local is not None:
                found.append(local)
        elif event.HasField("activity_task_scheduled_event_attributes"):
            attrs = event.activity_task_scheduled_event_attributes
            [step] = converter.from_payloads(attrs.input.payloads)
            if isinstance(step, dict) and str(step.get("name", "")).startswith(prefix):
                names[event.event_id] = step["name"]
        elif event.HasField("activity_task_completed_event_attributes"):
            done = event.activity_task_completed_event_attributes
            if done.scheduled_event_id in names:
                [raw] = converter.from_payloads(done.result.payloads)
                found.append(PurgeSweep(**known_fields(PurgeSweep, raw)))
        else:
            for field_ in ("activity_task_failed", "activity_task_timed_out"):
                if event.HasField(f"{field_}_event_attributes"):
                    ended = getattr(event, f"{field_}_event_attributes")
                    name = names.get(ended.scheduled_event_id)
                    if name is not None:
                        failure = ended.failure
                        kind = failure.application_failure_info.type or field_
                        found.append(FailedTarget(name, kind, failure.message))
    return found


def _local_outcome(
    converter: PayloadConverter, event: Any, prefix: str
) -> PurgeSweep | FailedTarget | None:
    """A sweep run as a local activity (in a child of small tables, workflows.chunk): the
    result in its marker, or its failure, named by the summary the workflow gave it."""
    marker = event.marker_recorded_event_attributes
    if marker.marker_name != LOCAL_ACTIVITY_MARKER or not event.user_metadata.HasField("summary"):
        return None
    name = converter.from_payloads([event.user_metadata.summary])[0]
    if not isinstance(name, str) or not name.startswith(prefix):
        return None
    if marker.HasField("failure"):
        failure = marker.failure
        while not failure.application_failure_info.type and failure.HasField("cause"):
            failure = failure.cause
        kind = failure.application_failure_info.type or "local_activity_failed"
        return FailedTarget(name, kind, failure.message)
    [raw] = converter.from_payloads(marker.details["result"].payloads)
    return PurgeSweep(**known_fields(PurgeSweep, raw))


def tables_table(summary: PassSummary, records: Sequence[PurgeSweep | FailedTarget]) -> str:
    """A pattern's matches in one pass, one row each."""
    rows: list[list[object]] = []
    for r in records:
        if isinstance(r, FailedTarget):
            rows.append([r.name, "-", "", "", "", f"FAILED {r.type}: {r.message}", ""])
        else:
            rows.append(
                [
                    r.name,
                    removed_text(r),
                    f"{r.seconds:.3f}",
                    r.strategy,
                    backlog_text(r) if r.backlog else "",
                    r.status,
                    r.worker,
                ]
            )
    head = f"pass {summary.workflow_id} (started {summary.started:%Y-%m-%d %H:%M:%S} UTC)"
    header = ["table", "removed", "seconds", "strategy", "backlog", "status", "worker"]
    estimated = any(
        isinstance(r, PurgeSweep) and r.backlog and r.backlog_estimated for r in records
    )
    notes = [ESTIMATED_BACKLOG_NOTE] if estimated else []
    return "\n".join([head, table(header, rows, right={1, 2, 4}), *notes])


def tables_json(summary: PassSummary, records: Sequence[PurgeSweep | FailedTarget]) -> str:
    """The same matches for scripts: the pass, then each match's record as the pass's own report
    keeps a target's (`swept`, `failed`)."""
    return json.dumps(
        {
            "workflow_id": summary.workflow_id,
            "started": summary.started.isoformat(),
            "swept": [dataclasses.asdict(r) for r in records if isinstance(r, PurgeSweep)],
            "failed": [dataclasses.asdict(r) for r in records if isinstance(r, FailedTarget)],
        },
        indent=2,
    )


def passes_json(passes: Sequence[PassSummary]) -> str:
    """The same passes for scripts: one object each, the report as the workflow returned it."""
    return json.dumps(
        [
            {
                "workflow_id": s.workflow_id,
                "started": s.started.isoformat(),
                "seconds": s.seconds,
                "status": s.status,
                "error": s.error,
                "report": dataclasses.asdict(s.report) if s.report else None,
            }
            for s in passes
        ],
        indent=2,
    )


class UnreadableHistory(ValueError):
    """A history file that cannot be read as one: bad input, said in one line."""


def _workflow_type(history: WorkflowHistory) -> str:
    """The type of the workflow whose history it is (empty where it does not say)."""
    if not history.events:
        return ""
    return history.events[0].workflow_execution_started_event_attributes.workflow_type.name


def _history_file(path: Path) -> WorkflowHistory:
    """The history in `path`, as `temporal workflow show -o json` writes it."""
    shown = path_shown(path)  # a URL typed where the file goes is said by its length
    try:
        return WorkflowHistory.from_json(path.stem, path.read_text(encoding="utf-8"))
    except OSError as err:
        raise UnreadableHistory(f"{shown}: cannot read: {err.strerror or err}") from None
    except Exception as err:  # JSON, the SDK's checks and protobuf's parser each raise their own
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UnreadableHistory(f"{shown}: not a workflow history: {reason}") from None


async def replay(
    client: Client | None, task_queue: str, last: int, files: Sequence[Path], say: Say
) -> int:
    """Replay histories against this checkout's workflow code; 1 if any does not replay.
    UnreadableHistory, before any is replayed, for a file that is no history."""
    histories: list[WorkflowHistory] = [_history_file(path) for path in files]
    if client is not None and not files:
        async for execution in client.list_workflows(purge_query(task_queue), limit=last):
            handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
            histories.append(await handle.fetch_history())
    if not histories:
        say("no histories to replay")
        return 0
    replayer = Replayer(workflows=[PurgeWorkflow, PurgeChunkWorkflow])
    failures = 0
    ours = ("Purge", "PurgeChunk")  # the names workflows.purge and workflows.chunk define
    for history in histories:
        kind = _workflow_type(history)
        if kind not in ours:
            # Not this package's workflow: the replayer would fail it with a page of the SDK's
            # errors; one line says the same.
            failures += 1
            say(f"FAILED   {history.workflow_id}: a history of {kind or 'no workflow'}, not of "
                f"{' or '.join(ours)}")  # fmt: skip
            continue
        outcome = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        if outcome.replay_failure is None:
            say(f"ok       {history.workflow_id}")
        else:
            failures += 1
            say(f"FAILED   {history.workflow_id}: {outcome.replay_failure}")
    say(f"{len(histories) - failures} of {len(histories)} histories replay")
    return 1 if failures else 0
