"""The one activity: sweep one named target as of the instant the workflow hands it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from temporalio import activity

from activities.errors import BadPurgeTarget, DryRunUnsupported
from activities.payloads import PurgeStep, PurgeSweep, check_now_ms
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
        async with _heartbeating(step.name):
            if step.dry_run:
                assert isinstance(target, CountingTarget)
                removed = await target.count_expired(now_ms)
            else:
                removed = await target.purge_expired(now_ms)
        if isinstance(removed, bool) or not isinstance(removed, int) or removed < 0:
            raise BadPurgeTarget(
                f"target {step.name!r} returned {removed!r}, want a count of rows (an int >= 0)"
            )
        seconds = round(time.monotonic() - started, 6)
        _record_metrics(step, removed, seconds)
        activity.logger.info(
            "purge target %s %s %d rows in %.3f s",
            step.name,
            "would remove" if step.dry_run else "removed",
            removed,
            seconds,
            extra={
                "purge_target": step.name,
                "purge_removed": removed,
                "purge_dry_run": step.dry_run,
                "purge_seconds": seconds,
            },
        )
        return PurgeSweep(name=step.name, removed=removed, dry_run=step.dry_run, seconds=seconds)


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


@asynccontextmanager
async def _heartbeating(name: str) -> AsyncIterator[None]:
    """Heartbeat in the background for as long as the body runs."""

    async def beat() -> None:
        while True:
            activity.heartbeat(name)
            await asyncio.sleep(HEARTBEAT_EVERY_S)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        # gather, not a bare await: a cancellation of this activity itself must still propagate.
        await asyncio.gather(task, return_exceptions=True)
