"""A later release's `Purge`, for the tests of a fleet mid-deploy: it reads input of format 2,
whose `new_key` this release does not know, and otherwise runs as this release's pass.

Its own module with few imports: the workflow sandbox re-imports the module a workflow is defined
in, and a test module's imports are not allowed there.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.results import PurgeReport
    from workflows.purge import PurgeWorkflow

#: The key the later release added, and the format it sends beside it.
NEW_KEY = "new_key"
LATER_FORMAT = 2


@workflow.defn(name="Purge")
class LaterPurge:
    @workflow.run
    async def run(self, raw: Any) -> PurgeReport:
        assert raw.get("format") == LATER_FORMAT
        assert NEW_KEY in raw
        known = {k: v for k, v in raw.items() if k not in ("format", NEW_KEY)}
        return await PurgeWorkflow().run(known)
