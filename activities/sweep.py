"""The one activity: sweep one named target as of the instant the workflow hands it."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
from temporalio import activity
from temporalio.common import MetricCounter, MetricMeter

from activities import metrics
from activities.clock import check_now_ms
from activities.engine.context import ms_left
from activities.engine.errors import BadTable, EngineError, MissingRights, SweepRefused
from activities.errors import BadPurgeTarget, DryRunUnsupported, PurgeError, WorkerStopping
from activities.guards import check_clock, check_counts
from activities.input_checks import parse_step
from activities.inputs import PurgeStep
from activities.progress import LedgerKey, Progress, SweepStats
from activities.registry import (
    BatchedTarget,
    TargetRegistry,
    is_batched,
    is_counting,
    is_listed,
    is_timed,
)
from activities.results import PurgeSweep
from activities.spread_steps import PatternPage, PatternStep

#: Heartbeat this often even while one statement runs, so a worker that dies mid-statement is
#: noticed within the workflow's heartbeat timeout (15 s) rather than its start-to-close (30 min).
HEARTBEAT_EVERY_S = 3.0
#: A statement cancelled with at most this much of its step's deadline left was cancelled by the
#: statement timeout the deadline set (it fires at the deadline, the reply a moment later).
CANCELLED_AT_DEADLINE_MS = 100

#: The contract's error for each of the engine's: each names a table, a column, an archive or
#: a role the target's config does not fit, which no retry changes.
CONTRACT_ERRORS: dict[type[EngineError], type[PurgeError]] = {
    BadTable: BadPurgeTarget,
    MissingRights: BadPurgeTarget,
    SweepRefused: BadPurgeTarget,
}


@contextmanager
def contract_errors() -> Iterator[None]:
    """The edge between the engine and Temporal: an engine error leaves as the contract's
    `ApplicationError` (`CONTRACT_ERRORS`, non-retryable), its message unchanged."""
    try:
        yield
    except EngineError as err:
        raise CONTRACT_ERRORS.get(type(err), BadPurgeTarget)(str(err)) from err


class PurgeActivities:
    """The activities a purge worker runs, bound to the targets that worker may sweep."""

    def __init__(self, registry: TargetRegistry, *, runs_chunks: bool = False) -> None:
        self.registry = registry
        self.runs_chunks = runs_chunks
        """Whether the worker these activities run in also runs `PurgeChunk` on the same task
        queue (`purge_ops.runner`'s workers do): said in every pattern page it reads."""

    @activity.defn(name="expand_pattern")
    async def expand_pattern(self, step: PatternStep) -> PatternPage:
        """One page of a table pattern's matches in its database's catalog, as target names."""
        check_now_ms(step.now_ms)
        if self.registry.patterns is None:
            raise BadPurgeTarget(f"no table pattern named {step.name!r} on this worker")
        page = await self.registry.patterns.expand(step)
        page.runs_chunks = self.runs_chunks
        return page

    @activity.defn(name="purge_target")
    async def purge_target(self, step: Any) -> PurgeSweep:
        """Delete (or, in a dry run, count) one target's rows expired at `step.now_ms`."""
        # `Any`, checked by hand: a step sent straight to this activity by another caller must be
        # refused (a float, seconds for milliseconds) before anything, and not be retried.
        step = parse_step(step)
        try:
            # Engine errors leave as the contract's, here at the edge.
            with contract_errors():
                return await self._purge(step)
        except BadPurgeTarget as err:
            patterns = self.registry.patterns
            if patterns is None or not await patterns.gone(step.name):
                raise
            # A pattern's match dropped since the pass matched it (a tenant deleted): there is
            # nothing left to sweep, which is not a failure of the pass.
            activity.logger.info("purge target %s: its table is gone (%s)", step.name, err)
            return _gone(step)

    async def _purge(self, step: PurgeStep) -> PurgeSweep:
        """The step's target resolved, then swept (or, in a dry run, counted)."""
        # Resolved now, not at worker start: a factory's target built since is found.
        target = self.registry.resolve(step.name)
        if step.dry_run and not is_counting(target):
            raise DryRunUnsupported(
                f"target {step.name!r} has no count_expired, so a dry run cannot ask it"
            )
        started = time.monotonic()
        sweep = PurgeSweep(name=step.name, removed=0, dry_run=step.dry_run, strategy="custom")
        removed: object
        if is_batched(target) and not step.dry_run:
            removed = await self._sweep_tables(target, step, sweep)
        elif is_batched(target):
            removed = await self._count_tables(target, step, sweep)
        else:
            async with _heartbeating(_Beat(step.name)):
                if step.dry_run:
                    assert is_counting(target)
                    removed = await target.count_expired(step.now_ms)
                else:
                    removed = await target.purge_expired(step.now_ms)
        batched = is_batched(target) and not step.dry_run
        return _finished(step, sweep, removed, time.monotonic() - started, batched)

    async def _count_tables(self, target: BatchedTarget, step: PurgeStep, sweep: PurgeSweep) -> int:
        """A built-in target's dry run: refused where its sweep would be (a dry run that
        counted what a guard then refuses would promise a sweep that never comes), then
        counted; the guards' counts and its own end by the step's one deadline, as a sweep's
        do. One the deadline cancels is reported `skipped` with its reason, not failed (its
        retries would have less time still): the next pass counts again."""
        info = activity.info()
        deadline = _deadline(target, step, info)
        sweep.strategy = "count"  # what the report says however the count ends
        async with _heartbeating(_Beat(step.name)):
            try:
                sweep.unchecked_guards = await _guard(target, step, info, deadline)
                if deadline is not None and is_timed(target):
                    stats = await target.preview(step.now_ms, deadline=deadline)
                else:
                    stats = await target.preview(step.now_ms)
            except psycopg.errors.QueryCanceled:
                if not _cancelled_at(deadline):
                    raise  # not the step's deadline: a cancel of another's, retried
                sweep.status = "skipped"
                sweep.reason = (
                    "its time ran out while it counted the rows: no count; the next pass "
                    "counts again"
                )
                return 0
        sweep.take_figures(stats)
        sweep.strategy = "count"  # take_figures wrote the stats' own
        return stats.removed

    async def _sweep_tables(self, target: BatchedTarget, step: PurgeStep, sweep: PurgeSweep) -> int:
        """A built-in target's batched sweep: guards first, resumed from the ledger (exact) or
        the last heartbeat, every batch's count heartbeated and added to the metrics."""
        info = activity.info()
        resumed = Progress.resume(info.heartbeat_details)
        # As the earlier attempt left them (the sweep moves `resumed` on as it goes).
        left_cleanly, heartbeat_count = resumed.clean_exit, resumed.removed
        # This attempt's heartbeats speak for this attempt: not clean until it leaves so, and
        # short if any attempt before it died while counting from heartbeats.
        resumed.clean_exit = False
        resumed.short = resumed.short or (info.attempt > 1 and not left_cleanly)
        # A local activity (a small table's, workflows.chunk) run again after its worker died
        # starts as a first attempt with nothing heartbeated: only the ledger knows what the
        # dead one deleted. Without it, its count can only be a lower bound.
        resumed.short = resumed.short or info.is_local
        # Left cleanly, the earlier attempts put `heartbeat_count` rows of this pass into the
        # counter; a retry after a death starts from nothing it can know (`_Beat.counted`).
        beat = _Beat(step.name, resumed, counted=heartbeat_count if left_cleanly else None)
        ledger = LedgerKey(
            info.workflow_id or "", info.workflow_run_id or "", step.name, step.now_ms
        )
        # The guards' counts come out of the sweep's time: counted apart, they could take a
        # whole time budget before the sweep took another, past the activity's start-to-close.
        deadline = _deadline(target, step, info)
        counted_out = False
        # An earlier attempt's position among tables listed otherwise (a worker of another
        # config, mid-deploy): the sweep starts again from the first, so the guards count too.
        elsewhere = is_listed(target) and resumed.start_over_unless_on(target.tables_listed())
        async with _heartbeating(beat, at_once=info.attempt > 1):
            if not resumed.batches or elsewhere:
                # Before the first delete on these tables only: a resumed attempt on the same
                # list already passed them.
                try:
                    sweep.unchecked_guards = await _guard(target, step, info, deadline)
                except psycopg.errors.QueryCanceled:
                    if not _cancelled_at(deadline):
                        raise  # not the step's deadline: a cancel of another's, retried
                    # Out of time while the guards counted (a retry, or a pass's last
                    # minutes): the sweep below gets none, so it deletes nothing and reports
                    # the backlog, as one that starts out of time does.
                    counted_out = True
            if counted_out:
                budget_ms: int | None = 0  # its guards unchecked: no batch, whatever is left
            elif deadline is None:
                budget_ms = pass_budget_left(step.budget_ms, info)
            else:
                budget_ms = ms_left(deadline)
            # A worker that begins to stop (a deploy's SIGTERM) ends the sweep after its batch
            # and hands the rest to another worker, by the target's retries, rather than at the
            # end of its grace. Not a local activity's: its workflow task is this worker's until
            # the worker stops.
            listens = is_listed(target) and not info.is_local
            stop = activity.is_worker_shutdown if listens else None
            try:
                # By keyword, as a `BatchedTarget` written before has always been called.
                if is_listed(target):
                    stats = await target.sweep(
                        step.now_ms,
                        resume=resumed,
                        on_batch=beat.after_batch,
                        ledger=ledger,
                        budget_ms=budget_ms,
                        stop=stop,
                    )
                else:
                    stats = await target.sweep(
                        step.now_ms,
                        resume=resumed,
                        on_batch=beat.after_batch,
                        ledger=ledger,
                        budget_ms=budget_ms,
                    )
                if stop is not None and not stats.complete and stop():
                    _count_lost_replies(stats, beat, step.name)
                    raise WorkerStopping(
                        f"target {step.name!r}: its worker is stopping; swept "
                        f"{resumed.removed} rows so far, the rest on another worker"
                    )
            except BaseException:
                # Failing without dying (a timeout, a lost connection, a shutdown): say so in
                # the last heartbeat, so the next attempt knows this one's count is complete.
                resumed.clean_exit = True
                _heartbeat(resumed.details())
                raise
        _count_lost_replies(stats, beat, step.name)
        # Without the ledger, an earlier attempt that died (no clean exit) may have deleted rows
        # after the last heartbeat the server kept: the count is then only a lower bound.
        _sweep_fields(step, sweep, stats, lower_bound=not stats.ledger and resumed.short)
        if counted_out and sweep.status == "ok":
            sweep.reason = (
                "its time ran out while its guards counted the rows: no batch ran; the next "
                "pass counts again"
            )
        _record_gauges(step, sweep)
        return stats.removed


def _count_lost_replies(stats: SweepStats, beat: _Beat, name: str) -> None:
    """Rows of batches whose commit reply an earlier attempt lost, into the counter."""
    if stats.ledger and beat.counted is not None and stats.ledger_start > beat.counted:
        # The earlier attempt left cleanly, having added to the counter every batch it saw
        # commit; the ledger also holds any batch whose commit reply it lost (a server crash
        # after COMMIT). With no batch of this attempt to carry them (`after_batch`), they are
        # missing from the metric: add them now, once.
        _rows_removed().add(stats.ledger_start - beat.counted, {"target": name})
        beat.counted = stats.ledger_start


def pass_budget_left(budget_ms: int | None, info: activity.Info) -> int | None:
    """What this attempt may spend of the pass's budget. `budget_ms` is what was left of it when
    the pass scheduled the target, and every attempt gets the same: a retry, after an attempt
    that ran into its time budget's last minute and failed, would get it whole again, and five
    attempts could run a pass into the next one's. So it loses what passed from the target's
    first scheduling to this attempt's start, both the server's clock; for a local activity (a
    pattern's small table) the worker's, whose SDK gives every retry the first attempt's
    scheduled time as well. A small table can have grown past one statement since the pattern
    matched it, and is then swept in batches inside that local activity: its retries, too, must
    not run past the pass."""
    if budget_ms is None or info.scheduled_time.timestamp() <= 0:
        return budget_ms  # no scheduled time given (an unset field reads as the epoch)
    spent_ms = int((info.started_time - info.scheduled_time).total_seconds() * 1000)
    # None left: the sweep stops before its first batch, as out of time, reporting its backlog.
    return max(0, budget_ms - max(0, spent_ms))


def _sweep_fields(step: PurgeStep, sweep: PurgeSweep, stats: SweepStats, lower_bound: bool) -> None:
    """A batched sweep's figures into its report, and its warnings into the log."""
    sweep.take_figures(stats)
    sweep.lower_bound = lower_bound
    if not stats.ledger:
        activity.logger.warning(
            "purge target %s counted from heartbeats: its database has no purge_progress "
            "table this role may write (create it from activities/schema.sql); %s",
            step.name,
            "an earlier attempt died, so the count is a LOWER BOUND"
            if sweep.lower_bound
            else "exact unless a worker dies mid-sweep",
            extra={"purge_target": step.name, "purge_lower_bound": sweep.lower_bound},
        )
    for advice in stats.advice:
        activity.logger.warning(advice, extra={"purge_target": step.name})


def _identity() -> str:
    """This worker's identity, as Temporal knows it, for the report."""
    try:
        return activity.client().identity
    except RuntimeError:  # run without a client (ActivityEnvironment)
        return ""


def _meter() -> MetricMeter:
    return activity.metric_meter()


def _record_metrics(step: PurgeStep, removed: int, seconds: float, batched: bool) -> None:
    """Each target's sweep duration (histogram) and, for a target that does not count per batch,
    its rows removed (counter), on the worker's Prometheus endpoint beside the SDK's own."""
    labels = {"target": step.name}
    if step.dry_run:
        # A count is no sweep: the histogram is what PurgeTargetNotSwept reads as sweeps come
        # back, and a target only ever counted by hand would read as never swept.
        return
    # A batched target added its rows batch by batch; adding 0 still shows its series.
    _rows_removed().add(0 if batched else removed, labels)
    metrics.TARGET_SECONDS.on(_meter()).record(seconds, labels)


def _rows_removed() -> MetricCounter:
    return metrics.ROWS_REMOVED.on(_meter())


def _wall_s() -> float:
    """This worker's clock, as the sweep's end is stamped by (`purge_ops.pass_metrics`)."""
    return time.time()


def _record_gauges(step: PurgeStep, sweep: PurgeSweep) -> None:
    """What a sweep left, for alerts: expired rows left and how long the oldest has waited,
    at the sweep's end. The sweep reads that age as of the pass's instant, and the alert rules
    add to it only the time since the sweep ended (deploy/prometheus/purge-rules.yml): the
    time between the two (up to the sweep's time budget, or the pass's) is added here, or a
    row left by a sweep that ended late in its pass would page that much later. 0, nothing
    expired left, stays 0."""
    labels = {"target": step.name}
    if sweep.paused_s:
        metrics.PAUSED_SECONDS.on(_meter()).add(math.ceil(sweep.paused_s), labels)
    if sweep.status == "busy":
        # Another sweep held the table, so this one measured nothing: its zeros would clear an
        # alert firing on what the last sweep that ran left. The gauges keep that sweep's values.
        return
    metrics.BACKLOG_ROWS.on(_meter()).set(sweep.backlog, labels)
    age = sweep.oldest_expired_age_s
    if age is not None:
        if age > 0:
            age += max(0.0, _wall_s() - step.now_ms / 1000)
        metrics.OLDEST_EXPIRED_AGE.on(_meter()).set(age, labels)


class _Beat:
    """The heartbeat of one sweep: after every batch, and every few seconds in between."""

    def __init__(
        self, name: str, progress: Progress | None = None, counted: int | None = None
    ) -> None:
        self.name = name
        self.progress = progress
        self.counted = counted
        """The pass's rows the counter holds for this target, where that is known (a retry
        of an attempt that left cleanly): the counter then follows the pass's count, which
        the ledger may raise by rows an earlier attempt deleted and never reported. None: it
        adds each batch's rows."""

    def after_batch(self, progress: Progress) -> None:
        # Every batch's progress, so a retried attempt resumes after the last one that reached
        # the server (the SDK throttles what it sends, never what it keeps); and its rows into
        # the counter as they are deleted, so a failed or killed attempt's rows count too. Not
        # after a sweep's last word (`final`): the result follows at once, and an activity's
        # first heartbeat is a call to the server, half again a small table's own cost (a
        # retry after a death in between resumes from the ledger, or counts as short).
        if not progress.final:
            _heartbeat(progress.details())
        if self.counted is None:
            if progress.batch_removed:
                _rows_removed().add(progress.batch_removed, {"target": self.name})
        elif progress.removed > self.counted:
            # Seen in a retry whose first attempt lost a batch's commit reply, then whose second
            # failed after a batch: adding only each batch's rows left the lost batch's out for
            # good, since the second attempt's heartbeat already held the ledger's total.
            _rows_removed().add(progress.removed - self.counted, {"target": self.name})
            self.counted = progress.removed
        if progress.partition:
            metrics.PARTITIONS_REMOVED.on(_meter()).add(1, {"target": self.name})

    def between(self) -> None:
        if self.progress is None:
            _heartbeat({"target": self.name})
            return
        # Without batch_ms: that belongs to the heartbeat of the batch that took it.
        details = self.progress.details()
        del details["batch_ms"]
        _heartbeat(details)


def _heartbeat(details: object) -> None:
    """A sweep's progress to the server. Not from a local activity (a small table's, in a child
    of small tables: workflows.chunk): it has no heartbeat, the workflow task that runs it
    stands for it, and a retry after a worker's death counts from the ledger."""
    if not activity.info().is_local:
        activity.heartbeat(details)


@asynccontextmanager
async def _heartbeating(beat: _Beat, at_once: bool = False) -> AsyncIterator[None]:
    """Heartbeat in the background for as long as the body runs, even inside one statement:
    every few seconds, the first `at_once` or after the first interval.

    A first attempt need not beat at once: its heartbeat timeout counts from its start anyway,
    and a retry that finds no heartbeat already knows the attempt did not leave cleanly. Not
    beating at once spares most of a fleet's targets (done within a second) a call to the
    server each, a large share of an empty target's cost in a concurrent pass. A retried
    attempt beats at once, so the server holds this attempt's not-yet-clean progress, not the
    earlier attempt's clean exit, before it deletes anything.
    """

    async def every_few_seconds() -> None:
        if not at_once:
            await asyncio.sleep(HEARTBEAT_EVERY_S)
        while True:
            beat.between()
            await asyncio.sleep(HEARTBEAT_EVERY_S)

    if activity.info().is_local:
        yield
        return
    task = asyncio.create_task(every_few_seconds())
    try:
        yield
    finally:
        task.cancel()
        # gather, not a bare await: a cancellation of this activity itself must still propagate.
        await asyncio.gather(task, return_exceptions=True)


def _cancelled_at(deadline: float | None) -> bool:
    """Whether a statement just cancelled was cancelled by the statement timeout `deadline` set
    (at most CANCELLED_AT_DEADLINE_MS of it left)."""
    return deadline is not None and ms_left(deadline) <= CANCELLED_AT_DEADLINE_MS


def _deadline(target: BatchedTarget, step: PurgeStep, info: activity.Info) -> float | None:
    """The step's one deadline, which its guards' counts, its dry run and its sweep end by:
    its own time budget or what is left of the pass's, whichever is sooner. None for a
    `BatchedTarget` that is no `TimedTarget`: each of those then has a budget of its own."""
    if is_timed(target):
        return target.deadline(pass_budget_left(step.budget_ms, info))
    return None


async def _guard(
    target: BatchedTarget, step: PurgeStep, info: activity.Info, deadline: float | None
) -> dict[str, str]:
    """The target's guards: the clock against earlier passes', then its counts, ending by
    `deadline`. Those that had nothing to compare with, each with why."""
    guards = target.guards
    unchecked: dict[str, str] = {}
    if guards.max_clock_jump_ms is not None:
        why = await check_clock(step.name, guards, step.now_ms, activity.client(), info)
        if why is not None:
            unchecked["max_clock_jump"] = why
    if guards.counts:
        if deadline is not None and is_timed(target):
            expired, total = await target.measure(step.now_ms, deadline=deadline)
        else:
            expired, total = await target.measure(step.now_ms)
        check_counts(step.name, guards, expired, total)
    return unchecked


def _finished(
    step: PurgeStep, sweep: PurgeSweep, removed: object, seconds: float, batched: bool
) -> PurgeSweep:
    """The report of a sweep that returned `removed`, refused unless a count of rows; its
    metrics recorded and its line logged."""
    if isinstance(removed, bool) or not isinstance(removed, int) or removed < 0:
        raise BadPurgeTarget(
            f"target {step.name!r} returned {removed!r}, want a count of rows (an int >= 0)"
        )
    sweep.removed = removed
    sweep.seconds = round(seconds, 6)
    sweep.worker = _identity()
    _record_metrics(step, removed, sweep.seconds, batched)
    _log_done(step, sweep)
    return sweep


def _gone(step: PurgeStep) -> PurgeSweep:
    return PurgeSweep(
        name=step.name,
        removed=0,
        dry_run=step.dry_run,
        status="gone",
        reason="its table is not there: dropped since the pass matched it, or never there",
    )


def _log_done(step: PurgeStep, sweep: PurgeSweep) -> None:
    """One line a sweep, its figures as structured fields for a JSON log."""
    activity.logger.info(
        "purge target %s %s %d rows in %.3f s",
        step.name,
        "would remove" if step.dry_run else "removed",
        sweep.removed,
        sweep.seconds,
        extra={
            "purge_target": step.name,
            "purge_removed": sweep.removed,
            "purge_dry_run": step.dry_run,
            "purge_seconds": sweep.seconds,
            "purge_strategy": sweep.strategy,
            "purge_batches": sweep.batches,
            "purge_p95_batch_ms": sweep.p95_batch_ms,
            "purge_backlog": sweep.backlog,
            "purge_backlog_estimated": sweep.backlog_estimated,
            "purge_partitions": sweep.partitions_dropped + sweep.partitions_detached,
            "purge_partition_rows": sweep.partition_rows,
            "purge_edge_removed": sweep.edge_removed,
            "purge_archived": sweep.archived,
        },
    )
