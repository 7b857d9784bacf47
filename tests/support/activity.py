"""The real activity in Temporal's activity test environment."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from temporalio.client import Client
from temporalio.testing import ActivityEnvironment


def activity_env(client: Client | None = None, **info: Any) -> ActivityEnvironment:
    """An ActivityEnvironment whose run is a pass of its own (a fresh workflow run id), as in
    Temporal: the sweep's ledger counts per pass, so two runs must not share one. `info`
    overrides fields of `activity.info()`; `client` is what `activity.client()` returns."""
    env = ActivityEnvironment(client=client)
    env.info = dataclasses.replace(env.info, **{"workflow_run_id": str(uuid.uuid4()), **info})
    return env
