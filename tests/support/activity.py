"""The real activity in Temporal's activity test environment."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment

from activities.engine import commits


def activity_env(client: Client | None = None, **info: Any) -> ActivityEnvironment:
    """An ActivityEnvironment whose run is a pass of its own (a fresh workflow run id), as in
    Temporal: the sweep's ledger counts per pass, so two runs must not share one. `info`
    overrides fields of `activity.info()`; `client` is what `activity.client()` returns."""
    env = ActivityEnvironment(client=client)
    env.info = dataclasses.replace(env.info, **{"workflow_run_id": str(uuid.uuid4()), **info})
    return env


def report_often(monkeypatch: pytest.MonkeyPatch) -> None:
    """Durable points every 20 ms instead of every half second: lazily committed batches
    (activities.engine.commits) then report in small groups, so a sweep of a few thousand rows
    is cancelled (or resumed) in its middle, not after its last batch."""
    monkeypatch.setattr(commits, "DURABLE_EVERY_S", 0.02)
