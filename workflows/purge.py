"""The `Purge` workflow: one pass over a list of targets, one activity per target.

Temporal's event history is the step ledger: a worker that dies mid-pass is replaced by another that
replays the completed activities from history and carries on at the target it stopped on.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    # Passed through so the sandbox does not re-execute these (and psycopg) on every run.
    from activities.errors import DuplicatePurgeTarget, PurgeTargetsFailed, failure_of
    from activities.payloads import (
        FailedTarget,
        PurgeInput,
        PurgeReport,
        PurgeStep,
        duplicate_names,
        epoch_ms,
    )
    from activities.sweep import PurgeActivities

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


@workflow.defn(name="Purge")
class PurgeWorkflow:
    """Sweep every named target as of one instant, in order, and report what each removed."""

    @workflow.run
    async def run(self, request: Any) -> PurgeReport:
        # `Any`, not PurgeInput: input sent by hand that does not decode must fail the workflow
        # with a clear error, not fail its task forever, which is what a decoding error does.
        order = PurgeInput.parse(request)
        # The one clock of the pass. Every target measures expiry against this same instant.
        now_ms = epoch_ms(workflow.now())
        repeated = duplicate_names(order.targets)
        if repeated:
            raise DuplicatePurgeTarget(
                f"target names repeated in one pass: {', '.join(repeated)}; "
                "each target is swept once per pass"
            )

        report = PurgeReport(now_ms=now_ms, dry_run=order.dry_run)
        for name in order.targets:
            try:
                sweep = await workflow.execute_activity_method(
                    PurgeActivities.purge_target,
                    PurgeStep(name=name, now_ms=now_ms, dry_run=order.dry_run),
                    start_to_close_timeout=TARGET_START_TO_CLOSE,
                    heartbeat_timeout=TARGET_HEARTBEAT,
                    retry_policy=TARGET_RETRY,
                    summary=name,
                )
            except ActivityError as err:
                # One target failing must not keep the others from being swept.
                failure = failure_of(err)
                report.failed.append(
                    FailedTarget(name=name, type=failure.type, message=failure.message)
                )
                # Once per pass and target, for an alert on a target failing pass after pass.
                # Metrics issue no command (and are skipped on replay): histories are unchanged.
                workflow.metric_meter().create_counter(
                    "purge_target_failures", "targets that failed a pass after their retries"
                ).add(1, {"target": name})
                continue
            report.swept.append(sweep)
            report.removed += sweep.removed

        if report.removed:
            verb = "would remove" if order.dry_run else "removed"
            workflow.logger.info(
                "purge pass %s %d rows: %s",
                verb,
                report.removed,
                ", ".join(f"{s.name}={s.removed}" for s in report.swept),
            )
        if report.failed:
            raise PurgeTargetsFailed(
                "purge targets failed: "
                + "; ".join(f"{f.name} ({f.type}: {f.message})" for f in report.failed),
                report,
            )
        return report
