"""A worker killed with SIGKILL in the middle of a spread pass: another worker finishes the
child it was running from its history, across the child's continue-as-new runs, every table
swept exactly once and every count exact."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

from tests.support.dead_worker import notice_the_dead_worker_sooner
from tests.support.history import child_ids, child_runs, events, target_runs
from tests.support.procs import clean_env, identity, start_worker, stop, wait_for, worker_config
from tests.support.servers import RunningTemporal
from tests.support.tenants import counts, create_tenants, expired_of, tenant_prefix, tenant_schemas

pytestmark = pytest.mark.slow


async def test_sigkill_mid_spread_pass_loses_nothing_and_sweeps_no_table_twice(
    tmp_path: Path,
    client: Client,
    temporal_server: RunningTemporal,
    task_queue: str,
    pg_url: str,
    schema_url: str,
    real_now: int,
) -> None:
    first_prefix, then_prefix = tenant_prefix(), tenant_prefix()
    with tenant_schemas(pg_url, first_prefix) as conn, tenant_schemas(pg_url, then_prefix):
        create_tenants(conn, first_prefix, range(20), real_now)
        create_tenants(conn, then_prefix, range(20), real_now)
        config = worker_config(
            tmp_path / "purge.toml",
            schema_url,
            task_queue,
            f"""
[[targets]]
kind = "expiring"
name = "first"
table = "{first_prefix}_*.sessions"
column = "expires_at"

[[targets]]
kind = "python"
factory = "tests.support.gate:targets"
names = ["gate"]

[[targets]]
kind = "expiring"
name = "then"
table = "{then_prefix}_*.sessions"
column = "expires_at"
""",
        )
        gate_dir = tmp_path / "gate"
        gate_dir.mkdir()
        env = clean_env(TEMPORAL_ADDRESS=temporal_server.address, PURGE_TEST_GATE_DIR=str(gate_dir))
        first = start_worker(config, {**env, "PURGE_TEST_GATE_HANG": "1"}, tmp_path / "1.log")
        second = None
        workflow_id = f"purge-kill-{uuid.uuid4()}"
        try:
            # One target at a time, in runs of 8: the gate is the 21st, in the child's third
            # run, after two runs that continued as new.
            handle = await client.start_workflow(
                "Purge",
                {
                    "targets": ["first", "gate", "then"],
                    "patterns": ["first", "then"],
                    "run_size": 8,
                },
                id=workflow_id,
                task_queue=task_queue,
            )
            wait_for((gate_dir / "hanging").exists, 60, "the first worker to reach the gate")
            assert all(e == 0 for e, _ in counts(conn, first_prefix, real_now).values())
            os.kill(first.pid, signal.SIGKILL)
            first.wait(10)
            parent = await events(client, workflow_id)
            [child] = child_ids(parent)
            await notice_the_dead_worker_sooner(client, child)
            second = start_worker(config, env, tmp_path / "2.log")
            result = await handle.result()
        finally:
            stop(first)
            if second is not None:
                stop(second)

        expected = 2 * sum(expired_of(i) for i in range(20))
        assert result["removed"] == expected
        assert result["targets"] == 41
        assert result["statuses"] == {"ok": 41}
        for prefix in (first_prefix, then_prefix):
            assert set(counts(conn, prefix, real_now).values()) == {(0, 2)}

        runs = await child_runs(client, await events(client, workflow_id))
        [child_histories] = runs.values()
        assert len(child_histories) == 6  # 41 targets in runs of 8
        done: dict[str, int] = {}
        by_target = {}
        for history in child_histories:
            for name, run in target_runs(client, history).items():
                done[name] = done.get(name, 0) + run.completions
                by_target[name] = run
        assert len(done) == 41
        assert set(done.values()) == {1}  # no target completed twice
        assert by_target["gate"].identity == identity(second)
        assert by_target["gate"].attempt == 2
        assert {by_target[f"first@{first_prefix}_{i:04d}"].identity for i in range(20)} == {
            identity(first)
        }
        assert {by_target[f"then@{then_prefix}_{i:04d}"].identity for i in range(20)} == {
            identity(second)
        }
