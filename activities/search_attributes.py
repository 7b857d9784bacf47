"""The search attributes a pass records for operators, where the namespace defines them: the
targets that failed (`PurgeFailedTargets`, KeywordList) and the rows removed
(`PurgeRowsRemoved`, Int), so `PurgeFailedTargets = "tenant_0042"` finds the passes that failed
on it. Keys and values only, no side effects: the starters and the workflow both import it."""

from __future__ import annotations

from typing import Any

from temporalio.common import (
    SearchAttributeKey,
    SearchAttributePair,
    SearchAttributeUpdate,
    TypedSearchAttributes,
)

from activities.results import PurgeReport

FAILED_TARGETS = SearchAttributeKey.for_keyword_list("PurgeFailedTargets")
ROWS_REMOVED = SearchAttributeKey.for_int("PurgeRowsRemoved")
#: Both, as `temporal operator search-attribute create` must define them.
KEYS = (FAILED_TARGETS, ROWS_REMOVED)
#: Failed targets a pass names: a spread pass's report keeps its first 100 failures anyway, and
#: the server caps a workflow's attributes at 40 KB (100 names of 228 characters stay under it).
FAILED_NAMED = 100


def at_start() -> TypedSearchAttributes:
    """What a pass starts with when the namespace defines the keys: nothing removed yet. Its
    presence is the workflow's sign that it may record the outcome: a pass started without it
    (by hand, or on a namespace without the keys) records nothing and cannot fail for them."""
    return TypedSearchAttributes([SearchAttributePair(ROWS_REMOVED, 0)])


def at_end(report: PurgeReport) -> list[SearchAttributeUpdate[Any]]:
    """The outcome a pass records: its failed targets, if any, and (unless a dry run, which
    removes nothing) the rows it removed."""
    updates: list[SearchAttributeUpdate[Any]] = []
    if report.failed:
        updates.append(FAILED_TARGETS.value_set([f.name for f in report.failed[:FAILED_NAMED]]))
    if not report.dry_run:
        updates.append(ROWS_REMOVED.value_set(report.removed))
    return updates
