"""A pass's outcome recorded as search attributes, when it was started with them."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.results import PurgeReport
    from activities.search_attributes import ROWS_REMOVED, at_end

#: The patch that marks a pass recording its outcome as search attributes. A pass recorded
#: before it was started without them, so never reaches it.
SEARCHABLE_PATCH = "searchable-pass"


def record_outcome(report: PurgeReport) -> None:
    """Upsert the pass's failed targets and rows removed, if the pass was started with
    `activities.search_attributes.at_start()`. Decided by the start event alone (the starter
    asked the namespace), so a replay on any worker decides the same; a namespace without the
    keys never gets an upsert that would fail the workflow task."""
    if workflow.info().typed_search_attributes.get(ROWS_REMOVED) is None:
        return
    if workflow.patched(SEARCHABLE_PATCH):
        workflow.upsert_search_attributes(at_end(report))
