"""Metrics the alert rules need that no activity or workflow records itself, recorded by the
worker around them (a Temporal interceptor), so the workflow code and its histories are
untouched: metrics issue no commands, and the workflow's meter records nothing on replay. Each
instrument is declared in `activities.metrics`, as the activity and the workflow use it too.

- `purge_passes_completed` / `purge_passes_failed` (counters) and `purge_pass_seconds`
  (histogram): each `Purge` pass's end, for "no pass completed within two periods" and the
  pass duration against the schedule's period; beside them, of the passes a schedule started
  that end with a report (not a dry run, nor an input refused), `purge_passes_skipping` for
  one whose report has targets `skipped` (its budget spent before they started: no worker
  swept them, so no sweep metric of theirs moves) and `purge_passes_whole` for one with none,
  for "every scheduled pass skips targets": a pass typed by hand, of one target say, stands
  for no scheduled one. The four counters start at 0 with the worker.
- `purge_target_failures` starts at 0 for a target when a pass first schedules its sweep, so an
  alert's `increase()` sees the first failure too (the workflow adds 1 per failed target).
- At each sweep's start (not a dry run's): `purge_rows_removed`, `purge_paused_seconds` and
  `purge_partitions_removed` at 0, so that a scrape while the sweep runs gives `increase()` the
  0 its first rows, pause or partition count from.
- After each sweep that ran (status `ok`): `purge_target_last_sweep_timestamp_seconds` (which
  worker's gauges are fresh) and `purge_batch_p95_seconds`, beside the gauges the activity
  sets. A `busy` or `gone` sweep measured nothing, so it leaves them as the last sweep that ran
  set them; a `skipped` target never reaches a worker.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import MetricMeter
from temporalio.exceptions import ApplicationError, FailureError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    ExecuteWorkflowInput,
    Interceptor,
    StartActivityInput,
    StartLocalActivityInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

from activities.metrics import (
    BATCH_P95,
    LAST_SWEEP_TIMESTAMP,
    PARTITIONS_REMOVED,
    PASS_SECONDS,
    PASSES_COMPLETED,
    PASSES_FAILED,
    PASSES_SKIPPING,
    PASSES_WHOLE,
    PAUSED_SECONDS,
    ROWS_REMOVED,
    TARGET_FAILURES,
    Counter,
)
from activities.results import PurgeReport, SweepStatus
from purge_ops.schedule import MEMO_KEY

PURGE_WORKFLOW = "Purge"
SWEEP_ACTIVITY = "purge_target"
#: The status of a sweep that ran; `busy`, `gone` and `skipped` ones did not (PurgeSweep.status).
RAN: SweepStatus = "ok"
#: The status of a target the pass's budget left unstarted.
SKIPPED: SweepStatus = "skipped"


class PassMetrics(Interceptor):
    """The worker interceptor that records them; `runner.new_worker` installs it."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Sweep(next)

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        return _Pass


def count_passes_from_zero(client: Client, task_queue: str) -> None:
    """Show both pass counters at 0 from the worker's start, with the labels the workflow's
    meter gives them, so they are the same series a pass then adds to."""
    runtime = client.service_client.config.runtime
    if runtime is None:
        return  # the default runtime, which serves no metrics
    labels = {"namespace": client.namespace, "task_queue": task_queue}
    labels["workflow_type"] = PURGE_WORKFLOW
    for counter in (PASSES_COMPLETED, PASSES_FAILED, PASSES_SKIPPING, PASSES_WHOLE):
        counter.on(runtime.metric_meter).add(0, labels)


class _Pass(WorkflowInboundInterceptor):
    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        super().init(_Scheduling(outbound))

    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        if workflow.info().workflow_type != PURGE_WORKFLOW:
            return await super().execute_workflow(input)
        try:
            result = await super().execute_workflow(input)
        except FailureError as err:
            # Only what fails the workflow: any other exception fails the workflow task, which
            # Temporal retries with the pass still running. A failed pass's partial report is
            # its error's detail (PurgeTargetsFailed).
            details = err.details if isinstance(err, ApplicationError) else ()
            _ended(workflow.metric_meter(), PASSES_FAILED, details[0] if details else None)
            raise
        _ended(workflow.metric_meter(), PASSES_COMPLETED, result)
        return result


def _ended(meter: MetricMeter, counter: Counter, report: object) -> None:
    counter.on(meter).add(1)
    # Only a scheduled pass that swept (a dry run deletes nothing, a refused input left no
    # report, and a pass typed by hand may name one target): no other may stand for the
    # schedule's passes. A schedule's passes carry its memo (`schedule.desired`).
    scheduled = MEMO_KEY in workflow.info().raw_memo  # not decoded: any other key may not
    if isinstance(report, PurgeReport) and not report.dry_run and scheduled:
        (PASSES_SKIPPING if _skipped_any(report) else PASSES_WHOLE).on(meter).add(1)
    took = workflow.now() - workflow.info().start_time
    PASS_SECONDS.on(meter).record(took.total_seconds())


def _skipped_any(report: PurgeReport) -> bool:
    """Whether a pass's report (its result, or a failed pass's partial one) has targets
    skipped: counted in a compact report's statuses, listed in a pass of few targets."""
    return report.statuses.get(SKIPPED, 0) > 0 or any(s.status == SKIPPED for s in report.swept)


class _Scheduling(WorkflowOutboundInterceptor):
    def start_activity(self, input: StartActivityInput) -> workflow.ActivityHandle[Any]:
        _scheduled(input.activity, input.args)
        return super().start_activity(input)

    def start_local_activity(self, input: StartLocalActivityInput) -> workflow.ActivityHandle[Any]:
        # A child of small tables sweeps them as local activities (workflows.chunk).
        _scheduled(input.activity, input.args)
        return super().start_local_activity(input)


def _scheduled(activity_type: str, args: Sequence[Any]) -> None:
    """A sweep's failure counter shown at 0 as it is scheduled, so an alert sees it rise."""
    if activity_type == SWEEP_ACTIVITY and args:
        name = _target_name(args[0])
        if name:
            TARGET_FAILURES.on(workflow.metric_meter()).add(0, {"target": name})


def _target_name(step: object) -> str | None:
    name = step.get("name") if isinstance(step, dict) else getattr(step, "name", None)
    return name if isinstance(name, str) else None


class _Sweep(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        if activity.info().activity_type == SWEEP_ACTIVITY and input.args:
            _sweeping(input.args[0])
        result = await super().execute_activity(input)
        if activity.info().activity_type == SWEEP_ACTIVITY:
            _swept(result)
        return result


def _sweeping(step: object) -> None:
    """A sweep's start (not a dry run's): the counters it adds to as it goes shown at 0 first,
    so that a scrape while it runs (its pauses, a batch waiting on a lock) gives `increase()`
    the 0 its first rows, pause or partition count from; where it adds within one scrape of
    its start the series is first scraped at that value (the dashboard counts it)."""
    name = _target_name(step)
    dry_run = step.get("dry_run") if isinstance(step, dict) else getattr(step, "dry_run", False)
    if name is None or dry_run:
        return
    meter, labels = activity.metric_meter(), {"target": name}
    for counter in (ROWS_REMOVED, PAUSED_SECONDS, PARTITIONS_REMOVED):
        counter.on(meter).add(0, labels)


def _swept(sweep: object) -> None:
    """A sweep's end, for a sweep that ran: when (so rules can tell a fresh gauge from a stale
    one) and its batches' p95. (Its counters were shown at 0 as it started: `_sweeping`.)"""
    name = getattr(sweep, "name", None)
    if not isinstance(name, str) or getattr(sweep, "dry_run", True):
        return
    meter, labels = activity.metric_meter(), {"target": name}
    if getattr(sweep, "status", RAN) != RAN:
        # Busy (another sweep held the table) or gone (its table was dropped): nothing was
        # measured. A p95 of 0 would read as a fast sweep, and a fresh timestamp would keep the
        # last real sweep's backlog and age alive in the rules' freshness window as if measured
        # now: both stay as that sweep left them, as the activity's own gauges do.
        return
    LAST_SWEEP_TIMESTAMP.on(meter).set(time.time(), labels)
    BATCH_P95.on(meter).set(float(getattr(sweep, "p95_batch_ms", 0.0)) / 1000, labels)
