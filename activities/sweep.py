"""The one activity: sweep one named target as of the instant the workflow hands it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from temporalio import activity

from activities.batching import Progress
from activities.errors import BadPurgeTarget, DryRunUnsupported
from activities.payloads import PurgeStep, PurgeSweep, check_now_ms
from activities.sqltarget import SqlTarget
from activities.targets import CountingTarget, TargetRegistry

#: Heartbeat this often even while one statement runs, so a worker that dies mid-statement is
#: noticed within the workflow's heartbeat timeout (15 s) rather than its start-to-close (30 min).
HEARTBEAT_EVERY_S = 3.0


class PurgeActivities:
    """The activities a purge worker runs, bound to the targets that worker may sweep."""

    def __init__(self, registry: TargetRegistry) -> None:
        self.registry = registry

    @activity.defn(name="purge_target")
    async def purge_target(self, step: PurgeStep) -> PurgeSweep:
        """Delete (or, in a dry run, count) one target's rows expired at `step.now_ms`."""
        now_ms = check_now_ms(step.now_ms)
        # Resolved now, not at worker start: a factory's target built since is found.
        target = self.registry.resolve(step.name)
        if step.dry_run and not isinstance(target, CountingTarget):
            raise DryRunUnsupported(
                f"target {step.name!r} has no count_expired, so a dry run cannot ask it"
            )
        started = time.monotonic()
        sweep = PurgeSweep(name=step.name, removed=0, dry_run=step.dry_run, strategy="custom")
        if isinstance(target, SqlTarget) and not step.dry_run:
            beat = _Beat(step.name, Progress.resume(activity.info().heartbeat_details))
            async with _heartbeating(beat):
                stats = await target.sweep(now_ms, resume=beat.progress, on_batch=beat.after_batch)
            removed = stats.removed
            sweep.strategy, sweep.batches = stats.strategy, stats.batches
            sweep.p95_batch_ms, sweep.backlog = stats.p95_batch_ms, stats.backlog
            sweep.advice = " ".join(stats.advice)
            for advice in stats.advice:
                activity.logger.warning(advice, extra={"purge_target": step.name})
        else:
            async with _heartbeating(_Beat(step.name)):
                if step.dry_run:
                    assert isinstance(target, CountingTarget)
                    removed = await target.count_expired(now_ms)
                else:
                    removed = await target.purge_expired(now_ms)
            if isinstance(target, SqlTarget):
                sweep.strategy = "count"
        if isinstance(removed, bool) or not isinstance(removed, int) or removed < 0:
            raise BadPurgeTarget(
                f"target {step.name!r} returned {removed!r}, want a count of rows (an int >= 0)"
            )
        sweep.removed = removed
        sweep.seconds = round(time.monotonic() - started, 6)
        _record_metrics(step, removed, sweep.seconds)
        activity.logger.info(
            "purge target %s %s %d rows in %.3f s",
            step.name,
            "would remove" if step.dry_run else "removed",
            removed,
            sweep.seconds,
            extra={
                "purge_target": step.name,
                "purge_removed": removed,
                "purge_dry_run": step.dry_run,
                "purge_seconds": sweep.seconds,
                "purge_strategy": sweep.strategy,
                "purge_batches": sweep.batches,
                "purge_p95_batch_ms": sweep.p95_batch_ms,
                "purge_backlog": sweep.backlog,
            },
        )
        return sweep


def _record_metrics(step: PurgeStep, removed: int, seconds: float) -> None:
    """Rows removed per target (counter) and each target's sweep duration (histogram), on the
    worker's Prometheus endpoint beside the SDK's own metrics."""
    meter = activity.metric_meter()
    labels = {"target": step.name}
    if not step.dry_run:
        meter.create_counter("purge_rows_removed", "rows deleted by retention sweeps", "rows").add(
            removed, labels
        )
    meter.create_histogram_float(
        "purge_target_seconds", "wall time of one target's sweep", "s"
    ).record(seconds, labels)


class _Beat:
    """The heartbeat of one sweep: after every batch, and every few seconds in between."""

    def __init__(self, name: str, progress: Progress | None = None) -> None:
        self.name = name
        self.progress = progress

    def after_batch(self, progress: Progress) -> None:
        # Every batch's progress, so a retried attempt resumes after the last one that reached
        # the server (the SDK throttles what it sends, never what it keeps).
        activity.heartbeat(progress.details())

    def between(self) -> None:
        if self.progress is None:
            activity.heartbeat({"target": self.name})
            return
        # Without batch_ms: that belongs to the heartbeat of the batch that took it.
        details = self.progress.details()
        del details["batch_ms"]
        activity.heartbeat(details)


@asynccontextmanager
async def _heartbeating(beat: _Beat) -> AsyncIterator[None]:
    """Heartbeat in the background for as long as the body runs, even inside one statement."""

    async def every_few_seconds() -> None:
        while True:
            beat.between()
            await asyncio.sleep(HEARTBEAT_EVERY_S)

    task = asyncio.create_task(every_few_seconds())
    try:
        yield
    finally:
        task.cancel()
        # gather, not a bare await: a cancellation of this activity itself must still propagate.
        await asyncio.gather(task, return_exceptions=True)
