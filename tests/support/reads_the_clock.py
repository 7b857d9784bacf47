"""A workflow that reads the machine's clock, which Temporal's sandbox refuses a workflow
(tests/test_plain_payloads.py: the package's runner keeps the sandbox)."""

from __future__ import annotations

import datetime

from temporalio import workflow


@workflow.defn(name="ReadsTheClock")
class ReadsTheClock:
    @workflow.run
    async def run(self) -> str:
        return datetime.date.today().isoformat()
