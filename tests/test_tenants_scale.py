"""10,000 tables in one pass, on two databases, by a pattern and listed one by one: the pass
completes with exact counts, and no workflow of it holds more events or a larger payload than
Temporal warns about (10,240 events, 512 KB)."""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool
from temporalio.client import Client

from activities.builtin_kinds import build_registry
from activities.schema import reference_ddl
from purge_config.file import PurgeConfig, parse_config
from purge_dev.dev import epoch_ms_now
from purge_ops.checks import check_passes
from purge_ops.connect import open_pool
from tests.conftest import RunWorker
from tests.support.history import child_runs, events
from tests.support.passes import run_pass
from tests.support.tenants import HOUR_MS, create_tenants, expired_of

pytestmark = pytest.mark.slow

#: Temporal's warnings: a history's events, and any one payload.
EVENTS_WARNING = 10_240
PAYLOAD_WARNING = 512 * 1024
#: Tenants per database (PURGE_SCALE_TENANTS overrides, for a quicker look).
TENANTS = int(os.environ.get("PURGE_SCALE_TENANTS", "5000"))


@pytest.fixture(scope="module")
def scale_databases(pg_url: str) -> Iterator[dict[str, str]]:
    """Two scratch databases of 5,000 tenant schemas each, `tenant_NNNN.sessions`, made once
    for the module (each test puts its expired rows back: `two_databases`)."""
    names = {key: f"scale_{key}_{uuid.uuid4().hex[:6]}" for key in ("a", "b")}
    urls = {key: make_conninfo(pg_url, dbname=name) for key, name in names.items()}
    now = epoch_ms_now()
    with psycopg.connect(pg_url, autocommit=True) as admin:
        for name in names.values():
            admin.execute(f'CREATE DATABASE "{name}"')
        try:
            for url in urls.values():
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute(reference_ddl())
                    for start in range(0, TENANTS, 500):
                        create_tenants(
                            conn, "tenant", range(start, min(start + 500, TENANTS)), now, live=1
                        )
            yield urls
        finally:
            for name in names.values():
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


#: Tenants' tables emptied of expired rows, then given `expired_of(i)` of them again, an hour
#: before the test's clock: one statement per 500 tenants (one transaction over 5,000 tables
#: runs out of the lock table).
REARM = """
DO $$
DECLARE i int;
BEGIN
  FOR i IN {first} .. {last} LOOP
    EXECUTE format('DELETE FROM %I.sessions WHERE expires_at <= {now}',
                   'tenant_' || lpad(i::text, 4, '0'));
    EXECUTE format('INSERT INTO %I.sessions (expires_at) SELECT {old} '
                   'FROM generate_series(1, %s)',
                   'tenant_' || lpad(i::text, 4, '0'), (i % 4) * {rows});
  END LOOP;
END $$
"""


@pytest.fixture
def two_databases(scale_databases: dict[str, str], real_now: int) -> dict[str, str]:
    """The module's two databases, every tenant holding `expired_of(i)` expired rows."""
    rearm = (
        REARM.replace("{now}", str(real_now))
        .replace("{old}", str(real_now - HOUR_MS))
        .replace("{rows}", "1")
    )
    for url in scale_databases.values():
        with psycopg.connect(url, autocommit=True) as conn:
            for first in range(0, TENANTS, 500):
                last = min(first + 500, TENANTS) - 1
                conn.execute(rearm.replace("{first}", str(first)).replace("{last}", str(last)))
    return scale_databases


@pytest.fixture
async def pools(
    two_databases: dict[str, str],
) -> AsyncIterator[dict[str, AsyncConnectionPool[Any]]]:
    opened = {key: await open_pool(url, max_size=8) for key, url in two_databases.items()}
    try:
        yield opened
    finally:
        for pool in opened.values():
            await pool.close()


async def largest_of_every_workflow(client: Client, workflow_id: str) -> list[tuple[int, int]]:
    """(events, largest event in bytes) of the pass and of every run of every child. An event's
    size bounds every payload in it."""
    parent = await events(client, workflow_id)
    histories = [parent] + [
        history for runs in (await child_runs(client, parent)).values() for history in runs
    ]
    return [(len(h), max(e.ByteSize() for e in h)) for h in histories]


def expired_total() -> int:
    return 2 * sum(expired_of(i) for i in range(TENANTS))


async def sweep_all_inside_warnings(
    client: Client, task_queue: str, run_worker: RunWorker, config: PurgeConfig, pools: Any
) -> dict[str, Any]:
    """One pass of `config`: every table's expired rows counted, and every workflow of the
    pass (the parent, each run of each child) inside Temporal's warnings. Its result."""
    workflow_id = f"purge-scale-{uuid.uuid4()}"
    config = dataclasses.replace(config, task_queue=task_queue)  # its own targets' queue too
    async with run_worker(build_registry(config, pools["a"], pools), config=config):
        result = await run_pass(client, task_queue, config.pass_input(), workflow_id)
    assert result["targets"] == 2 * TENANTS
    assert result["removed"] == expired_total()
    assert result["statuses"] == {"ok": 2 * TENANTS}
    sizes = await largest_of_every_workflow(client, workflow_id)
    assert len(sizes) > 2 * TENANTS // 1000  # the pass and its children's runs
    assert max(n for n, _ in sizes) < EVENTS_WARNING, sizes
    assert max(b for _, b in sizes) < PAYLOAD_WARNING, sizes
    return result


async def test_ten_thousand_tables_by_a_pattern_and_listed_stay_inside_temporals_warnings(
    client: Client,
    task_queue: str,
    run_worker: RunWorker,
    two_databases: dict[str, str],
    pools: dict[str, AsyncConnectionPool[Any]],
) -> None:
    """One pass of 10,000 tables: database a's 5,000 tenants by one pattern, database b's 5,000
    listed one by one (the input maps them by position range). Both shapes at scale in one
    pass, since each table costs a pass tens of milliseconds: two passes of 10,000 were twelve
    minutes of CI. That 10,000 listed names fit one input is checked without servers
    (tests/test_patterns.py::TestPassCheck)."""
    pattern = {
        "kind": "expiring",
        "name": "sessions@a",
        "table": "tenant_*.sessions",
        "column": "expires_at",
        "database": "a",
    }
    listed = [
        {
            "kind": "expiring",
            "name": f"s_b_{i:04d}",
            "table": f"tenant_{i:04d}.sessions",
            "column": "expires_at",
            "database": "b",
        }
        for i in range(TENANTS)
    ]
    config = parse_config(
        {
            "databases": {key: {"url": url} for key, url in two_databases.items()},
            "pass": {"max_concurrent": 8, "max_per_database": 4},
            "targets": [pattern, *listed],
        }
    )
    check_passes(config)
    if TENANTS >= 500:  # below, the input names each target's database (the first round's form)
        assert config.pass_input()["database_ranges"] == [["a", 0, 1], ["b", 1, TENANTS + 1]]
    result = await sweep_all_inside_warnings(client, task_queue, run_worker, config, pools)
    [line] = result["patterns"]
    assert (line["name"], line["tables"], line["removed"]) == (
        "sessions@a",
        TENANTS,
        expired_total() // 2,
    )
