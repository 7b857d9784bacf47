"""What a real worker's /metrics shows before and after passes: every series an alert rule needs
exists from the worker's start or its first sweep, at 0 until something happens."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import psycopg
import pytest
from temporalio.client import Client

from purge_ops.ports import free_ports
from tests.support.passes import run_pass
from tests.support.probes import scrape, worker
from tests.support.procs import worker_config
from tests.support.rows import HOUR, idempotency_rows
from tests.support.servers import RunningTemporal

TARGETS = '[[targets]]\nkind = "idempotency"\n\n[[targets]]\nkind = "auth"\n'


def value(page: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    """The one sample of `name` whose labels include `labels`."""
    found = [v for have, v in page.get(name, []) if labels.items() <= have.items()]
    assert len(found) == 1, f"{name}{labels}: {found} in {page.get(name)}"
    return found[0]


async def test_pass_counters_and_target_series_start_at_zero_and_count_passes(
    tmp_path: Path,
    temporal_server: RunningTemporal,
    client: Client,
    schema_url: str,
    task_queue: str,
    db: psycopg.Connection[Any],
    real_now: int,
) -> None:
    idempotency_rows(db, {"a": real_now - HOUR, "b": real_now + HOUR})
    [port] = free_ports(1)
    config = worker_config(tmp_path / "purge.toml", schema_url, task_queue, TARGETS)
    async with worker(config, temporal_server, port):
        at_start = await scrape(port)
        await run_pass(client, task_queue, {"targets": ["x_idempotency", "x_auth"]})
        after_one = await scrape(port)
        with pytest.raises(Exception, match="Workflow execution failed"):
            await run_pass(client, task_queue, {"targets": ["x_auth", "nope"]})
        after_two = await scrape(port)

    queue = {"task_queue": task_queue, "workflow_type": "Purge"}
    # Every series names the worker that served it (pid@host, Temporal's identity for it).
    workers = {labels.get("worker") for series in after_one.values() for labels, _ in series}
    assert len(workers) == 1
    assert re.fullmatch(r"\d+@.+", str(workers.pop()))
    assert value(at_start, "purge_passes_completed", **queue) == 0
    assert value(at_start, "purge_passes_failed", **queue) == 0

    assert value(after_one, "purge_passes_completed", **queue) == 1
    assert value(after_one, "purge_pass_seconds_count", **queue) == 1
    for target in ("x_idempotency", "x_auth"):
        assert value(after_one, "purge_target_failures", target=target) == 0
        assert value(after_one, "purge_paused_seconds", target=target) == 0
        assert value(after_one, "purge_partitions_removed", target=target) == 0
        assert value(after_one, "purge_backlog_rows", target=target) == 0
        assert value(after_one, "purge_oldest_expired_age_seconds", target=target) == 0
        assert value(after_one, "purge_batch_p95_seconds", target=target) >= 0
        assert value(after_one, "purge_target_last_sweep_timestamp_seconds", target=target) > (
            real_now / 1000 - 60
        )
    assert value(after_one, "purge_rows_removed", target="x_idempotency") == 1
    # Buckets fit for seconds-long sweeps (the SDK's default would start at 50 s).
    assert value(after_one, "purge_target_seconds_bucket", target="x_auth", le="0.5") >= 0
    assert value(after_one, "purge_pass_seconds_bucket", le="14400", **queue) == 1

    # The failure lands on the series that was at 0 (one series per target, not two), so an
    # `increase()` over it sees the first failure.
    assert value(after_two, "purge_passes_failed", **queue) == 1
    assert value(after_two, "purge_passes_completed", **queue) == 1
    assert value(after_two, "purge_target_failures", target="nope") == 1
    assert value(after_two, "purge_target_failures", target="x_auth") == 0
    assert value(after_two, "purge_pass_seconds_count", **queue) == 2
