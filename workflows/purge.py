"""The `Purge` workflow: one pass over a list of targets, one activity per target.

Temporal's event history is the step ledger: a worker that dies mid-pass is replaced by another that
replays the completed activities from history and carries on at the target it stopped on.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    # Passed through so the sandbox does not re-execute these (and psycopg) on every run.
    from activities.errors import DuplicatePurgeTarget, PurgeTargetsFailed, failure_of
    from activities.payloads import (
        MAX_BUDGET_MS,
        FailedTarget,
        PurgeInput,
        PurgeReport,
        PurgeStep,
        PurgeSweep,
        duplicate_names,
        epoch_ms,
    )
    from activities.sweep import PurgeActivities

#: The patch that marks a pass run concurrently, under limits and a budget. A pass recorded
#: before it (or started without limits) takes the sequential path.
CONCURRENT_PATCH = "concurrent-pass"
#: Limits a pass with some but not all of them takes for the others (the config's defaults).
DEFAULT_MAX_CONCURRENT = 4
DEFAULT_MAX_PER_DATABASE = 1

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
        # A pass with limits (from a config) runs its targets concurrently under a budget; one
        # without them (the temporal CLI, every pass recorded before) is the sequential pass,
        # its commands unchanged, so their histories replay.
        if order.limited and workflow.patched(CONCURRENT_PATCH):
            outcomes = await self._concurrently(order, now_ms)
        else:
            outcomes = [await self._sweep(name, now_ms, order.dry_run) for name in order.targets]
        for outcome in outcomes:
            if isinstance(outcome, FailedTarget):
                report.failed.append(outcome)
            else:
                report.swept.append(outcome)
                report.removed += outcome.removed

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

    async def _sweep(
        self, name: str, now_ms: int, dry_run: bool, budget_ms: int | None = None
    ) -> PurgeSweep | FailedTarget:
        """One target's activity; its failure (after its retries) as the report names it."""
        try:
            return await workflow.execute_activity_method(
                PurgeActivities.purge_target,
                PurgeStep(name=name, now_ms=now_ms, dry_run=dry_run, budget_ms=budget_ms),
                start_to_close_timeout=TARGET_START_TO_CLOSE,
                heartbeat_timeout=TARGET_HEARTBEAT,
                retry_policy=TARGET_RETRY,
                summary=name,
            )
        except ActivityError as err:
            # One target failing must not keep the others from being swept.
            failure = failure_of(err)
            # Once per pass and target, for an alert on a target failing pass after pass.
            # Metrics issue no command (and are skipped on replay): histories are unchanged.
            workflow.metric_meter().create_counter(
                "purge_target_failures", "targets that failed a pass after their retries"
            ).add(1, {"target": name})
            return FailedTarget(name=name, type=failure.type, message=failure.message)

    async def _concurrently(
        self, order: PurgeInput, now_ms: int
    ) -> list[PurgeSweep | FailedTarget]:
        """Up to `max_concurrent` targets at once, at most `max_per_database` on one database,
        started in input order; each handed what is left of the pass's budget, and those not
        started when it is spent reported skipped. Outcomes in input order."""
        most = order.max_concurrent or DEFAULT_MAX_CONCURRENT
        per_database = order.max_per_database or DEFAULT_MAX_PER_DATABASE
        deadline = workflow.now() + timedelta(milliseconds=order.budget_ms or MAX_BUDGET_MS)
        outcomes: dict[str, PurgeSweep | FailedTarget] = {}
        waiting = list(order.targets)
        running: dict[asyncio.Task[PurgeSweep | FailedTarget], str] = {}
        busy: Counter[str] = Counter()
        while waiting or running:
            left_ms = int((deadline - workflow.now()) / timedelta(milliseconds=1))
            if left_ms <= 0:
                for name in waiting:
                    outcomes[name] = PurgeSweep(
                        name=name,
                        removed=0,
                        dry_run=order.dry_run,
                        strategy="",
                        status="skipped",
                        reason=f"the pass's budget ({order.budget_ms} ms) was spent before it "
                        "started; the next pass sweeps it",
                    )
                waiting = []
            for name in list(waiting):
                if len(running) >= most:
                    break
                database = order.database_of(name)
                if busy[database] >= per_database:
                    continue  # a later target on another database may start instead
                waiting.remove(name)
                busy[database] += 1
                task = asyncio.ensure_future(self._sweep(name, now_ms, order.dry_run, left_ms))
                running[task] = name
            if not running:
                continue
            done, _ = await workflow.wait(list(running), return_when=asyncio.FIRST_COMPLETED)
            # In input order, whatever order they finished in: replay sees the same.
            for task in sorted(done, key=lambda t: order.targets.index(running[t])):
                name = running.pop(task)
                busy[order.database_of(name)] -= 1
                outcomes[name] = task.result()
        return [outcomes[name] for name in order.targets]
