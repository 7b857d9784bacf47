"""The guards' checks (`purge_config.settings.Guards`), each refusing a sweep before its first
delete, naming the numbers, or saying that it had nothing to compare with. All are off unless
configured."""

from __future__ import annotations

from datetime import datetime, timedelta

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus

from activities.clock import iso_ms
from activities.errors import PurgeGuardRefused
from activities.pass_records import current, pass_of, pass_record, purge_query
from purge_config.settings import Guards

#: How many earlier passes to look through for the last one that recorded an instant.
PREVIOUS_PASSES_LOOKED_AT = 20


def check_counts(name: str, guards: Guards, expired: int, total: int) -> None:
    """Refuse when `expired` of `total` rows is more than the guards allow."""
    if guards.max_rows is not None and expired > guards.max_rows:
        raise PurgeGuardRefused(
            f"target {name!r} would remove {expired} rows, more than its max_rows "
            f"{guards.max_rows}; nothing was deleted"
        )
    if guards.max_fraction is not None and total and expired / total > guards.max_fraction:
        raise PurgeGuardRefused(
            f"target {name!r} would remove {expired} of {total} rows ({expired / total:.1%}), "
            f"more than its max_fraction {guards.max_fraction:.1%}; nothing was deleted"
        )


async def check_clock(
    name: str, guards: Guards, now_ms: int, client: Client, info: activity.Info
) -> str | None:
    """Refuse when `now_ms` went back from, or jumped ahead of, the previous pass's instant; or,
    when no previous pass recorded one, log it and return why the guard could not check.

    The previous pass is the last one on that pass's task queue that had finished when this
    activity's own pass started (a pass that overlapped it, started by hand or by another
    schedule while this one ran, is not its previous, whatever its instant). All those times
    are Temporal's clock, as the instants are: a clock that stepped back as a whole is not
    seen (a pass then deletes less, never more); one that jumped ahead is. That queue is the
    one of the `Purge` run that scheduled the activity (itself or through a child), not the
    activity's, which for a database with a queue of its own runs no pass. Its instant is the
    one it recorded in its result (or partial report): Temporal's history, never a server's
    clock.
    """
    if guards.max_clock_jump_ms is None:
        return None
    ours = await pass_of(client, info.workflow_id or "", info.workflow_run_id or "")
    # Not a pass Temporal knows (the activity run outside one, or by another workflow): the
    # passes on the activity's own queue are the nearest to compare with.
    queue = ours.task_queue if ours else info.task_queue
    previous = await previous_pass_instant(
        client,
        queue,
        ours.run_id if ours else info.workflow_run_id or "",
        finished_by=ours.started if ours else None,
    )
    if previous is None:
        why = (
            f"no previous pass to compare with: no pass on task queue {queue!r} finished before "
            f"this one started (of the last {PREVIOUS_PASSES_LOOKED_AT}) and recorded an "
            "instant, as on a first pass or once older passes are past the namespace's "
            "retention; the sweep went ahead unchecked"
        )
        activity.logger.warning(
            "purge target %s: max_clock_jump had %s",
            name,
            why,
            extra={"purge_target": name, "purge_unchecked_guard": "max_clock_jump"},
        )
        return why
    previous_id, previous_ms = previous
    if now_ms < previous_ms:
        raise PurgeGuardRefused(
            f"target {name!r}: this pass's clock {iso_ms(now_ms)} is earlier than the previous "
            f"pass's {iso_ms(previous_ms)} ({previous_id}); a clock that went back is not "
            "trusted to delete; nothing was deleted"
        )
    if now_ms - previous_ms > guards.max_clock_jump_ms:
        jump = timedelta(milliseconds=now_ms - previous_ms)
        limit = timedelta(milliseconds=guards.max_clock_jump_ms)
        raise PurgeGuardRefused(
            f"target {name!r}: this pass's clock {iso_ms(now_ms)} is {jump} after the previous "
            f"pass's {iso_ms(previous_ms)} ({previous_id}), more than its max_clock_jump "
            f"{limit}; nothing was deleted"
        )
    return None


async def previous_pass_instant(
    client: Client, task_queue: str, run_id: str, finished_by: datetime | None = None
) -> tuple[str, int] | None:
    """The id and `now_ms` of the most recent finished pass on `task_queue` other than the run
    `run_id`, if any recorded one; with `finished_by`, only a pass closed by then.

    Running passes are listed too, and each asked whether it still runs (`current`): the pass
    that closed a moment ago may still be listed as running, and passed over it would leave
    an older pass to compare with (or none). A pass that closed after `finished_by` (the start
    of the asking pass) ran beside it: a short pass started inside a long one records a later
    instant than the long one's, and taken for its previous it would refuse every guarded
    target the long one has left as a clock that went back. Both times are Temporal's."""
    async for listed in client.list_workflows(
        purge_query(task_queue), limit=PREVIOUS_PASSES_LOOKED_AT
    ):
        # By run, not id: passes started by `sweep` all share one id.
        if listed.run_id == run_id:
            continue
        execution = await current(client, listed)
        if execution.status == WorkflowExecutionStatus.RUNNING:
            continue
        if finished_by is not None and (
            execution.close_time is None or execution.close_time > finished_by
        ):
            continue
        record = await pass_record(client, execution)
        if record.report is not None and record.report.now_ms:
            return execution.id, record.report.now_ms
    return None
