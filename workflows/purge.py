"""The `Purge` workflow: one pass over a list of targets, one activity per target.

Temporal's event history is the step ledger: a worker that dies mid-pass is replaced by another that
replays the completed activities from history and carries on at the target it stopped on.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    # Passed through so the sandbox does not re-execute these (and psycopg) on every run.
    # activities.spread_steps is imported here, not only through workflows.spread, so the sandbox
    # knows the module: decoding a child's report resolves its type hints there.
    import activities.spread_steps  # noqa: F401
    from activities.clock import epoch_ms
    from activities.errors import BadPurgeInput, DuplicatePurgeTarget, PurgeTargetsFailed
    from activities.input_checks import duplicate_names, parse_input
    from activities.inputs import PurgeInput
    from activities.results import FailedTarget, PurgeReport, PurgeSweep
    from purge_config.fleet import MAX_BUDGET_MS
    from workflows.outcome_attributes import record_outcome
    from workflows.spread import (
        DEFAULT_MAX_CONCURRENT,
        DEFAULT_MAX_PER_DATABASE,
        spread_pass,
        spreads,
    )
    from workflows.steps import sweep_limited, sweep_one

#: The patch that marks a pass run concurrently, under limits and a budget. A pass recorded
#: before it (or started without limits) takes the sequential path.
CONCURRENT_PATCH = "concurrent-pass"
#: The patch that marks a pass spread over child workflows: one with a table pattern, or with
#: more targets than one history holds well. No pass before it had either.
SPREAD_PATCH = "spread-pass"


@workflow.defn(name="Purge")
class PurgeWorkflow:
    """Sweep every named target as of one instant, in order, and report what each removed."""

    @workflow.run
    async def run(self, *args: Any) -> PurgeReport:
        # `Any`, not PurgeInput: input sent by hand that does not decode must fail the workflow
        # with a clear error, not fail its task forever, which is what a decoding error does.
        # And any number of them: a pass started with no input, or two, fails the same way
        # (one parameter made either a TypeError in the task, retried until terminated).
        if len(args) != 1:
            raise BadPurgeInput(
                f'a Purge pass takes one input, an object like {{"targets": ["x_idempotency"]}}, '
                f"got {len(args)}"
            )
        order = parse_input(args[0])
        # The one clock of the pass. Every target measures expiry against this same instant.
        now_ms = epoch_ms(workflow.now())
        repeated = duplicate_names(order.targets)
        if repeated:
            raise DuplicatePurgeTarget(
                f"target names repeated in one pass: {', '.join(repeated)}; "
                "each target is swept once per pass"
            )

        if spreads(order) and workflow.patched(SPREAD_PATCH):
            return await spread_pass(order, now_ms)

        # A pass with limits (from a config) runs its targets concurrently under a budget; one
        # without them (the temporal CLI, every pass recorded before) is the sequential pass,
        # its commands unchanged, so their histories replay.
        if order.limited and workflow.patched(CONCURRENT_PATCH):
            outcomes = await self._concurrently(order, now_ms)
        else:
            outcomes = [
                await sweep_one(name, now_ms, order.dry_run, route=order.route_of(name))
                for name in order.targets
            ]
        report = _collected(order, now_ms, outcomes)
        record_outcome(report)
        if report.failed:
            raise PurgeTargetsFailed(
                "purge targets failed: "
                + "; ".join(f"{f.name} ({f.type}: {f.message})" for f in report.failed),
                report,
            )
        return report

    async def _concurrently(
        self, order: PurgeInput, now_ms: int
    ) -> list[PurgeSweep | FailedTarget]:
        """Up to `max_concurrent` targets at once, at most `max_per_database` on one database,
        started in input order; each handed what is left of the pass's budget, and those not
        started when it is spent reported skipped. Outcomes in input order."""
        return await sweep_limited(
            order.targets,
            now_ms,
            order.dry_run,
            workflow.now() + timedelta(milliseconds=order.budget_ms or MAX_BUDGET_MS),
            order.budget_ms,
            most=order.max_concurrent or DEFAULT_MAX_CONCURRENT,
            per_database=order.max_per_database or DEFAULT_MAX_PER_DATABASE,
            database_of=order.database_of,
            route_of=order.route_of,
        )


def _collected(
    order: PurgeInput, now_ms: int, outcomes: list[PurgeSweep | FailedTarget]
) -> PurgeReport:
    """The pass's report from its targets' outcomes, in order; its rows logged."""
    report = PurgeReport(now_ms=now_ms, dry_run=order.dry_run)
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
    return report
