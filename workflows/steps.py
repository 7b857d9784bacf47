"""Workflow code shared by the pass and its children: one target's activity, and many targets
under limits and a deadline. Deterministic, no I/O: called only from workflow code."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    FailureError,
    TimeoutError,
    TimeoutType,
    is_cancelled_exception,
)

with workflow.unsafe.imports_passed_through():
    from activities.errors import Failure, failure_of
    from activities.inputs import PurgeStep
    from activities.metrics import TARGET_FAILURES
    from activities.results import FailedTarget, PurgeSweep
    from activities.routing import Route, is_own_queue
    from activities.wire import read

#: One target's sweep, retries excluded. Targets end their own sweep at their time budget well
#: before this (see activities.sweep); this only bounds a worker that hangs without dying.
TARGET_START_TO_CLOSE = timedelta(minutes=30)
#: A worker killed mid-target is noticed after this long and the target moves to another worker.
#: The activity heartbeats every few seconds even inside one long statement.
TARGET_HEARTBEAT = timedelta(seconds=15)
#: Transient failures (a dropped connection, a lock or statement timeout) get five attempts over
#: about two minutes; after that the target is reported failed and the next pass tries again.
TARGET_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=2),
    backoff_coefficient=3.0,
    maximum_interval=timedelta(minutes=1),
    maximum_attempts=5,
)

Outcome = PurgeSweep | FailedTarget

#: The sweep activity, by its registered name (`activities.sweep.PurgeActivities.purge_target`):
#: called by name so that its result arrives as sent, to be read by `activities.wire`.
PURGE_TARGET = "purge_target"

#: The patch under which a pass (or a child) cancelled by request ends cancelled at the first
#: activity the cancellation reaches; a run before it took that activity's cancellation for a
#: failed target and went on, starting the targets, expansions and children after it.
CANCEL_PATCH = "cancel-ends-pass"


def ends_run(err: BaseException) -> bool:
    """Whether `err`, caught from an activity or a child, is this run's own cancellation (a
    `temporal workflow cancel`, or the parent's of a child) reaching it: then it must end the
    run cancelled, not stand for one target's failure. An activity or child cancelled while
    this run was not is a failure as any other. Read from the history (the cancel request is an
    event), so replay decides alike; behind CANCEL_PATCH, asked only once it applies."""
    return (
        is_cancelled_exception(err)
        and workflow.cancellation_reason() is not None
        and workflow.patched(CANCEL_PATCH)
    )


def routed(route: Route | None) -> dict[str, Any]:
    """The activity options that send an activity to its database's own task queue, and fail
    it there if no worker takes it in time; none for the pass's own queue, so the commands of
    every pass without routes stay as they were."""
    if route is None:
        return {}
    return {
        "task_queue": route.queue,
        "schedule_to_start_timeout": timedelta(milliseconds=route.worker_wait_ms),
    }


#: What to do where no worker of the config that started a pass is left.
_OWN_CONFIG = (
    "run a worker with the config that scheduled this pass, or, where the workers now run "
    "another config, write the schedule from it (`pg-purge schedule`)"
)


def unpolled(err: ActivityError, route: Route | None) -> Failure | None:
    """The failure of an activity no worker of its queue took in time, said plainly: whether
    no worker ever took it, or one began it and stopped or died, and then what it removed."""
    cause = err.cause
    if (
        route is None
        or not isinstance(cause, TimeoutError)
        or cause.type != TimeoutType.SCHEDULE_TO_START
    ):
        return None
    waited = f"within {route.worker_wait_ms // 1000} s"
    # The server keeps an attempt's last heartbeat for the attempts after it: a retry that no
    # worker took still carries what the attempt before it had done, and how it ended (its
    # failure, the timeout's cause).
    began = began_before(cause.last_heartbeat_details, cause.cause)
    if route.own_config or is_own_queue(route.queue, workflow.info().task_queue):
        # A config's own targets' queue (purge_config.file.PurgeConfig.own_queue).
        if began:
            return Failure(
                "NoPurgeWorker",
                f"{began}; no worker whose config names this target took its retry from task "
                f"queue {route.queue!r} {waited}; {_OWN_CONFIG}",
            )
        return Failure(
            "NoPurgeWorker",
            f"no worker whose config names this target took it from task queue "
            f"{route.queue!r} {waited}: a worker polls only the queue of its own config's "
            f"targets, so one whose config lacks it (mid-deploy) never takes it; {_OWN_CONFIG}",
        )
    took = f"{began}; then no worker took its retry from" if began else "no worker polled"
    return Failure(
        "NoPurgeWorker",
        f"{took} task queue {route.queue!r} (database {route.database!r}) {waited}; "
        "start a worker whose config names that database and says the same of its targets there "
        "as the config that started this pass (the queue's digest names them; each worker "
        "says at start which queues it polls)",
    )


def began_before(details: Sequence[Any], ended: BaseException | None = None) -> str:
    """What an earlier attempt had done, from its last heartbeat (activities.progress), and
    how it ended (`ended`, its failure where the server gave it): empty where no attempt had
    begun."""
    if not details:
        return ""
    last = details[0]
    removed = last.get("removed") if isinstance(last, dict) else None
    if isinstance(removed, int) and not isinstance(removed, bool) and removed > 0:
        return (
            f"{_attempt_ended(ended)}, having removed at least {removed} rows (its last heartbeat)"
        )
    return f"{_attempt_ended(ended)}, before its heartbeats had reported removing any rows"


def _attempt_ended(ended: BaseException | None) -> str:
    """How a begun attempt ended, from its failure: its worker stopping (`WorkerStopping`, a
    shutdown's cancellation), stopped or died (its heartbeats or its time ran out, the SDK's
    own "Worker shutting down", which comes as no application's failure, or not known), or a
    failure of its own on a worker that went on (an application's: a lock timeout, a lost
    connection), named as the report names any failure."""
    if isinstance(ended, CancelledError) or (
        isinstance(ended, ApplicationError) and ended.type == "WorkerStopping"
    ):
        return "an attempt began on a worker that then stopped"
    if not isinstance(ended, ApplicationError):  # a timeout, none given, the SDK's own
        return "an attempt began on a worker that then stopped or died"
    failure = failure_of(ended)
    said = failure.message if len(failure.message) <= 200 else failure.message[:199] + "…"
    return f"an attempt failed ({failure.type}: {said})"


@dataclass(frozen=True)
class Untaken:
    """A target whose activity no worker of its queue took within worker_wait: that queue's
    workers may be absent, or only busy (`sweep_limited` tells which)."""

    failed: FailedTarget
    began: str = ""
    """What an earlier attempt of it had done (`began_before`); empty where none had begun."""

    def behind_busy(self, route: Route) -> FailedTarget:
        """The failure of a begun target whose retry waited past worker_wait while its queue's
        workers took the pass's other sweeps: busy, most likely, not gone. Not sent again: a
        new activity would count from nothing where the target's database has no ledger."""
        return FailedTarget(
            name=self.failed.name,
            type="WorkersBusy",
            message=f"{self.began}; then its retry waited in task queue {route.queue!r} longer "
            f"than worker_wait ({route.worker_wait_ms // 1000} s) while that queue's workers "
            "took this pass's other sweeps: not sent again, the queue's other targets still "
            "sent, the next pass sweeps the rest. Where its workers are busy, keep the queue's "
            "slots (`--max-sweeps` times its workers) at or above `[pass] max_concurrent` "
            "through a deploy; where none is left (a stopping worker's last sweeps came back), "
            "start one",
        )


async def sweep_one(
    name: str,
    now_ms: int,
    dry_run: bool,
    budget_ms: int | None = None,
    route: Route | None = None,
    local: bool = False,
) -> Outcome:
    """One target's activity; its failure (after its retries) as the report names it. `local`:
    as a local activity, run by the worker that runs this workflow (see workflows.chunk)."""
    outcome = await _swept_or_untaken(name, now_ms, dry_run, budget_ms, route, local)
    return counted(outcome.failed) if isinstance(outcome, Untaken) else outcome


async def _swept_or_untaken(
    name: str,
    now_ms: int,
    dry_run: bool,
    budget_ms: int | None,
    route: Route | None,
    local: bool,
) -> Outcome | Untaken:
    """`sweep_one`'s outcome, or `Untaken` (its failure not yet counted) where no worker took
    the activity (its first attempt, or a retry of one that began) within worker_wait."""
    step = PurgeStep(name=name, now_ms=now_ms, dry_run=dry_run, budget_ms=budget_ms)
    try:
        if local:
            # No heartbeat timeout: the workflow task it runs in stands for it, and a worker
            # that dies is noticed when that task times out (its retry reads the ledger).
            raw = await workflow.execute_local_activity(
                PURGE_TARGET,
                step,
                start_to_close_timeout=TARGET_START_TO_CLOSE,
                retry_policy=TARGET_RETRY,
                summary=name,
                result_type=dict,
            )
        else:
            raw = await workflow.execute_activity(
                PURGE_TARGET,
                step,
                start_to_close_timeout=TARGET_START_TO_CLOSE,
                heartbeat_timeout=TARGET_HEARTBEAT,
                retry_policy=TARGET_RETRY,
                summary=name,
                result_type=dict,
                **routed(route),
            )
    except FailureError as err:
        if ends_run(err):
            raise
        # One target failing must not keep the others from being swept. An activity task's
        # failure comes wrapped in an ActivityError; a local activity's is its cause itself.
        failure = (isinstance(err, ActivityError) and unpolled(err, route)) or failure_of(err)
        failed = FailedTarget(name=name, type=failure.type, message=failure.message)
        untaken = _untaken(err, failed) if isinstance(err, ActivityError) else None
        return untaken or counted(failed)
    # Read leniently: a worker of a later release may send a status or a figure this release
    # does not know, mid-deploy (activities.wire).
    return read(PurgeSweep, raw)


def counted(failed: FailedTarget) -> FailedTarget:
    """`failed`, counted once per pass and target for an alert on a target failing pass after
    pass. Metrics issue no command (and are skipped on replay): histories are unchanged."""
    TARGET_FAILURES.on(workflow.metric_meter()).add(1, {"target": failed.name})
    return failed


def _untaken(err: ActivityError, failed: FailedTarget) -> Untaken | None:
    """`failed` as `Untaken` where `err` is an activity's schedule-to-start timeout (of its
    first attempt, or of a retry after one that began); None for any other failure."""
    cause = err.cause
    if not isinstance(cause, TimeoutError) or cause.type != TimeoutType.SCHEDULE_TO_START:
        return None
    return Untaken(failed, began=began_before(cause.last_heartbeat_details, cause.cause))


def skipped(name: str, dry_run: bool, budget_ms: int | None) -> PurgeSweep:
    """A target the pass's budget left no time to start."""
    return PurgeSweep(
        name=name,
        removed=0,
        dry_run=dry_run,
        strategy="",
        status="skipped",
        reason=f"the pass's budget ({budget_ms} ms) was spent before it started; the next "
        "pass sweeps it",
    )


def ms_until(deadline: datetime) -> int:
    return int((deadline - workflow.now()) / timedelta(milliseconds=1))


async def sweep_limited(
    names: list[str],
    now_ms: int,
    dry_run: bool,
    deadline: datetime,
    budget_ms: int | None,
    most: int,
    per_database: int,
    database_of: Callable[[str], str],
    route_of: Callable[[str], Route | None] = lambda _: None,
    local: bool = False,
) -> list[Outcome]:
    """Up to `most` targets at once, at most `per_database` on one database, started in input
    order; each handed what is left until `deadline`, and those not started by then reported
    skipped; as local activities where `local`. Outcomes in input order.

    A target no worker of its queue took within worker_wait failed as `NoPurgeWorker` in a run
    before BUSY_RESENT; under it, that wait tells busy workers from absent ones. Sent again if
    a worker took another activity of that queue after this one was sent (its workers are only
    busy: `--max-sweeps` below `max_concurrent`, two passes at once, a deploy's dip); held
    while others of that queue are still out; failed only once none of them was taken. One
    whose attempt began (its worker stopped) and whose retry was not taken is judged alike
    under BEGUN_HELD, but failed alone rather than sent again."""
    outcomes: dict[str, Outcome] = {}
    waiting = list(names)
    position = {name: i for i, name in enumerate(names)}
    running: dict[asyncio.Task[Outcome | Untaken], str] = {}
    busy: Counter[str] = Counter()
    # Task queues whose activity no worker took within worker_wait in this run: waiting that
    # long again for each of their other targets would spend the budget a worker_wait at a time.
    unpolled_queues: set[str] = set()
    # Per task queue, the activities of this run a worker took (their outcome came from one);
    # per target, that count when it was last sent.
    taken: Counter[str] = Counter()
    taken_when_sent: dict[str, int] = {}
    # Per task queue, when the last activity of this run a worker took came back: a begun
    # target's retry waited worker_wait up to now, and only what came back meanwhile shows a
    # worker of its queue alive then (its first attempt's worker may have stopped since).
    taken_at: dict[str, datetime] = {}
    held: defaultdict[str, list[Untaken]] = defaultdict(list)

    def failed_untaken(queue: str, untaken: list[Untaken]) -> None:
        unpolled_queues.add(queue)
        for each in [*held.pop(queue, []), *untaken]:
            outcomes[each.failed.name] = counted(each.failed)

    def released(route: Route) -> list[str]:
        """Its queue's workers took a sweep: the targets held for it are judged busy, those
        never begun to be sent again (returned), the begun ones failed alone."""
        again = []
        for each in held.pop(route.queue, []):
            if each.began:
                outcomes[each.failed.name] = counted(each.behind_busy(route))
            else:
                again.append(each.failed.name)
        return again

    while waiting or running:
        left_ms = ms_until(deadline)
        if left_ms <= 0:
            for name in waiting:
                outcomes[name] = skipped(name, dry_run, budget_ms)
            waiting = []
        for name in list(waiting):
            route = route_of(name)
            if (
                route is not None
                and route.queue in unpolled_queues
                and workflow.patched(UNPOLLED_ONCE)
            ):
                waiting.remove(name)
                outcomes[name] = not_tried(name, route)
                continue
            if len(running) >= most:
                break
            database = database_of(name)
            if busy[database] >= per_database:
                continue  # a later target on another database may start instead
            waiting.remove(name)
            busy[database] += 1
            taken_when_sent[name] = taken[route.queue] if route else 0
            task = asyncio.ensure_future(
                _swept_or_untaken(name, now_ms, dry_run, left_ms, route, local)
            )
            running[task] = name
        if not running:
            continue
        done, _ = await workflow.wait(list(running), return_when=asyncio.FIRST_COMPLETED)
        resend: list[str] = []
        # In input order, whatever order they finished in: replay sees the same.
        for task in sorted(done, key=lambda t: position[running[t]]):
            name = running.pop(task)
            busy[database_of(name)] -= 1
            outcome = task.result()
            route = route_of(name)
            if isinstance(outcome, Untaken) and outcome.began:
                assert route is not None  # only a routed activity has a schedule-to-start bound
                queue = route.queue
                waited_since = workflow.now() - timedelta(milliseconds=route.worker_wait_ms)
                if not workflow.patched(BEGUN_HELD):
                    outcomes[name] = counted(outcome.failed)
                    failed_untaken(queue, [])  # its worker gone, and (so it took) all of them
                elif taken_at.get(queue, waited_since) > waited_since:
                    # A sweep of its queue came back while its retry waited: most likely busy.
                    outcomes[name] = counted(outcome.behind_busy(route))
                    resend += released(route)
                elif any(_queue_of(route_of(other)) == queue for other in running.values()):
                    held[queue].append(outcome)  # its queue's others may yet be taken
                else:
                    failed_untaken(queue, [outcome])
                continue
            if isinstance(outcome, Untaken):
                assert route is not None  # only a routed activity has a schedule-to-start bound
                queue = route.queue
                if not workflow.patched(BUSY_RESENT):
                    failed_untaken(queue, [outcome])
                elif taken[queue] > taken_when_sent[name]:
                    resend.append(name)  # a worker took one of its queue's since: busy
                elif any(_queue_of(route_of(other)) == queue for other in running.values()):
                    held[queue].append(outcome)  # its queue's others may yet be taken
                else:
                    failed_untaken(queue, [outcome])
                continue
            outcomes[name] = outcome
            if route is None:
                continue
            taken[route.queue] += 1
            taken_at[route.queue] = workflow.now()
            resend += released(route)
        waiting[:0] = sorted(resend, key=position.__getitem__)
    # Held targets left at the end: nothing of their queue came back after they were held (its
    # last activity out failed otherwise, or was sent again and not started by the deadline).
    for queue in list(held):
        failed_untaken(queue, [])
    return [outcomes[name] for name in names]


def _queue_of(route: Route | None) -> str | None:
    return route.queue if route else None


#: The patch under which a target no worker took within worker_wait is sent again when its
#: queue's workers took another activity since (busy, not absent); a run before it failed it
#: as `NoPurgeWorker` at once. Asked only when such a timeout comes, so every other history is
#: unchanged.
BUSY_RESENT = "busy-queue-resent"


#: The patch under which a target whose attempt began and whose retry no worker took within
#: worker_wait is judged much as an untaken one is (`BUSY_RESENT`): failed alone as
#: `WorkersBusy` where a sweep of its queue came back while its retry waited (what came back
#: before, while its own first attempt ran, says nothing of the workers since its worker
#: stopped; one a stopping worker finishes still counts, the workflow cannot tell it from a
#: busy one's, and then the queue's next target waits worker_wait once more, as before this
#: patch), held while its queue's other sweeps are out and failed alone once one comes back,
#: and failed as `NoPurgeWorker` with its queue (the rest of the run's targets there not tried)
#: only when none does. A run before it failed it and its queue at once, though the queue's
#: workers were only busy (a deploy's stopped worker, its retry behind the others' full
#: slots). Asked only when such a timeout comes, so every other history is unchanged.
BEGUN_HELD = "begun-retry-held"


#: The patch that marks a run that fails at once the targets of a task queue no worker took an
#: activity from within worker_wait earlier in the run (a run before it waited for each).
UNPOLLED_ONCE = "unpolled-queue-once"


def not_tried(name: str, route: Route) -> FailedTarget:
    """A target of a task queue from which no worker took an activity earlier in this run."""
    return counted(
        FailedTarget(
            name=name,
            type="NoPurgeWorker",
            message=f"not tried: no worker took an activity from task queue {route.queue!r} "
            f"within {route.worker_wait_ms // 1000} s earlier in this pass, so this pass waits "
            "no longer for it; the next pass tries again",
        )
    )
