"""Table patterns end to end: `table = "PREFIX_*.sessions"` over hundreds of tenant schemas,
swept by a pass spread over child workflows (real Temporal, real PostgreSQL)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from temporalio.api.enums.v1 import EventType

from activities.builtin_kinds import build_registry
from activities.results import FailedTarget
from purge_config.file import PurgeConfig, load_config, parse_config
from purge_ops.passes import child_records
from purge_ops.table_check import check_config
from tests.conftest import Harness
from tests.support.history import child_runs, events, local_sweeps, scheduled_in
from tests.support.passes import failed_pass, listed, run_pass
from tests.support.procs import clean_env, run_main
from tests.support.servers import RunningTemporal
from tests.support.tenants import (
    HOUR_MS,
    counts,
    create_tenants,
    expired_of,
    gated_tenants,
    tenant_prefix,
    tenant_schemas,
)


def pattern_config(prefix: str, **extra: Any) -> PurgeConfig:
    return parse_config(
        {
            "pass": {"max_concurrent": 8, "max_per_database": 8},
            "targets": [
                {
                    "kind": "expiring",
                    "name": "sessions",
                    "table": f"{prefix}_*.sessions",
                    "column": "expires_at",
                    **extra,
                }
            ],
        }
    )


def pattern_file(tmp_path: Path, url: str, task_queue: str, prefix: str) -> Path:
    """A config file of one pattern target, `sessions` over `PREFIX_*.sessions`, for the
    commands that read one."""
    path = tmp_path / "purge.toml"
    path.write_text(
        f"database_url = {json.dumps(url)}\n"
        f"task_queue = {json.dumps(task_queue)}\n"
        "[[targets]]\n"
        'kind = "expiring"\nname = "sessions"\n'
        f'table = "{prefix}_*.sessions"\ncolumn = "expires_at"\n'
    )
    return path


@pytest.mark.parametrize(
    ("tenants", "child_size", "run_size"),
    [
        # Children of 8, 8 and 5 in runs of 3 continue as new as those of 120, 120 and 60 in
        # runs of 50 do (3, 3 and 2 runs); the 21 tenants' sweeps outnumber the report's cap of
        # 20.
        (21, 8, 3),
        pytest.param(300, 120, 50, marks=pytest.mark.slow),
    ],
)
async def test_a_pattern_sweeps_each_tenant_exactly_over_children_that_continue_as_new(
    pg_url: str, harness: Harness, tenants: int, child_size: int, run_size: int
) -> None:
    """Tenant schemas, one pattern target: every expired row goes, every live row stays, over 3
    children of `child_size` targets whose runs of `run_size` continue as new; a tenant created
    after the pass is swept by the next pass."""
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(tenants), harness.now_ms)
        config = harness.adopt(pattern_config(prefix))
        registry = build_registry(config, harness.pool)
        # Four tables at once, as the harness's pool has four connections: one at a time would
        # spend most of the test waiting on Temporal's round trip per table.
        limits = {"max_concurrent": 4, "max_per_database": 4}
        request = {**config.pass_input(), **limits, "child_size": child_size, "run_size": run_size}
        workflow_id = f"purge-tenants-{uuid.uuid4()}"
        async with harness.run_worker(registry, config=config):
            result = await run_pass(harness.client, harness.task_queue, request, workflow_id)
            parent = await events(harness.client, workflow_id)

            expected = sum(expired_of(i) for i in range(tenants))
            assert result["removed"] == expected
            assert result["compact"] is True
            assert result["targets"] == tenants
            assert result["statuses"] == {"ok": tenants}
            assert result["failed_total"] == 0
            [line] = result["patterns"]
            assert line == {
                "name": "sessions",
                "tables": tenants,
                "removed": expected,
                "failed": 0,
                "busy": 0,
                "gone": 0,
                "skipped": 0,
                "largest_backlog": 0,
            }
            # The largest sweeps, named as matches, as many as the cap.
            largest = sorted((expired_of(i) for i in range(tenants)), reverse=True)[:20]
            assert sorted((s["removed"] for s in result["swept"]), reverse=True) == largest
            assert all(s["name"].startswith(f"sessions@{prefix}_") for s in result["swept"])
            left = counts(conn, prefix, harness.now_ms)
            assert len(left) == tenants
            assert all(expired == 0 for expired, _ in left.values())
            assert all(live == 2 for _, live in left.values())

            runs = await child_runs(harness.client, parent)
            assert len(runs) == 3 == len(result["children"])
            assert [len(r) for r in runs.values()] == [3, 3, 2]
            # Small tables in children on the config's own queue: local activities there.
            assert scheduled_in(runs) == []
            swept = [name for r in runs.values() for h in r for name in local_sweeps(h)]
            assert sorted(swept) == sorted(f"sessions@{prefix}_{i:04d}" for i in range(tenants))

            # A tenant created since is matched by the next pass's own expansion.
            create_tenants(conn, prefix, range(tenants, tenants + 1), harness.now_ms + 10)
            # One child in one run: the spread's shape was checked above.
            again = await run_pass(
                harness.client, harness.task_queue, {**config.pass_input(), **limits}
            )
            assert again["targets"] == tenants + 1
            assert again["removed"] == expired_of(tenants)
            assert counts(conn, prefix, harness.now_ms)[f"{prefix}_{tenants:04d}"] == (0, 2)


async def test_a_matched_table_without_the_column_fails_alone(
    pg_url: str,
    harness: Harness,
) -> None:
    """One tenant's table lacks the column: that match fails with the line naming it, every
    other tenant is swept, and the pass fails for that one only."""
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(5), harness.now_ms)
        create_tenants(conn, prefix, range(5, 6), harness.now_ms, column="valid_until")
        config = harness.adopt(pattern_config(prefix))
        async with harness.run_worker(build_registry(config, harness.pool), config=config):
            error = await failed_pass(
                harness.client,
                harness.task_queue,
                config.pass_input(),
                f"purge-tenants-{uuid.uuid4()}",
            )
        assert error.type == "PurgeTargetsFailed"
        # The pass's own message says why, as a pass of listed targets does.
        assert f"sessions@{prefix}_0005 (BadPurgeTarget: " in error.message
        assert "expires_at" in error.message
        report = error.details[0]
        [failed] = report["failed"]
        assert failed["name"] == f"sessions@{prefix}_0005"
        assert failed["type"] == "BadPurgeTarget"
        assert "expires_at" in failed["message"]
        assert report["failed_total"] == 1
        assert report["removed"] == sum(expired_of(i) for i in range(5))
        assert report["patterns"][0]["failed"] == 1
        assert report["patterns"][0]["tables"] == 6
        left = counts(conn, prefix, harness.now_ms, range(5))
        assert all(left[f"{prefix}_{i:04d}"] == (0, 2) for i in range(5))
        # What `report --tables` reads from the children: each match's sweep, and the failed
        # one's error, from the markers of its local activities.
        records = [
            r
            for child in report["children"]
            for r in await child_records(harness.client, child, "sessions@")
        ]
        assert sorted(r.name for r in records) == [f"sessions@{prefix}_{i:04d}" for i in range(6)]
        failures = [r for r in records if isinstance(r, FailedTarget)]
        assert [(f.name, f.type) for f in failures] == [(failed["name"], "BadPurgeTarget")]
        assert "expires_at" in failures[0].message


async def test_a_tenant_dropped_mid_pass_is_reported_gone_and_the_pass_completes(
    pg_url: str,
    harness: Harness,
) -> None:
    """A tenant matched by the pass, then dropped before its sweep: reported `gone`, not a
    failure; the other tenants are swept."""
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(4), harness.now_ms)
        gate, registry = gated_tenants(prefix, harness.pool)
        # The gate first, one target at a time: the tenants wait behind it, matched already.
        request = {"targets": ["gate", "sessions"], "patterns": ["sessions"]}
        async with harness.run_worker(registry):
            handle = await harness.client.start_workflow(
                "Purge", request, id=f"purge-tenants-{uuid.uuid4()}", task_queue=harness.task_queue
            )
            await asyncio.wait_for(gate.reached.wait(), 30)
            conn.execute(f'DROP SCHEMA "{prefix}_0002" CASCADE')
            gate.release.set()
            result = await handle.result()
        assert result["statuses"] == {"ok": 4, "gone": 1}
        assert result["patterns"][0]["gone"] == 1
        assert result["removed"] == sum(expired_of(i) for i in (0, 1, 3))
        gone = [s for s in result["swept"] if s["status"] == "gone"]
        assert [s["name"] for s in gone] == [f"sessions@{prefix}_0002"]


async def test_a_pattern_matching_nothing_is_reported_not_failed(harness: Harness) -> None:
    config = harness.adopt(pattern_config(tenant_prefix()))
    async with harness.run_worker(build_registry(config, harness.pool), config=config):
        result = await run_pass(harness.client, harness.task_queue, config.pass_input())
    assert result["targets"] == 0
    assert result["removed"] == 0
    assert result["patterns"][0]["tables"] == 0


async def test_a_match_taking_an_explicit_targets_name_is_refused_before_any_sweep(
    pg_url: str,
    harness: Harness,
) -> None:
    """The pattern's expansion runs, and then the pass fails `DuplicatePurgeTarget` without
    scheduling a single sweep."""
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(3), harness.now_ms)
        config = harness.adopt(pattern_config(prefix))
        workflow_id = f"purge-tenants-{uuid.uuid4()}"
        request = {"targets": [f"sessions@{prefix}_0001", "sessions"], "patterns": ["sessions"]}
        async with harness.run_worker(build_registry(config, harness.pool), config=config):
            error = await failed_pass(harness.client, harness.task_queue, request, workflow_id)
        assert error.type == "DuplicatePurgeTarget"
        assert f"sessions@{prefix}_0001" in error.message
        history = await events(harness.client, workflow_id)
        scheduled = [
            e.activity_task_scheduled_event_attributes.activity_type.name
            for e in history
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        ]
        assert scheduled == ["expand_pattern"]
        assert not any(
            e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
            for e in history
        )
        assert counts(conn, prefix, harness.now_ms)[f"{prefix}_0001"] == (1, 2)


async def test_a_dry_run_counts_every_match_and_deletes_nothing(
    pg_url: str,
    harness: Harness,
) -> None:
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(8), harness.now_ms)
        config = harness.adopt(pattern_config(prefix))
        async with harness.run_worker(build_registry(config, harness.pool), config=config):
            result = await run_pass(
                harness.client, harness.task_queue, config.pass_input(dry_run=True)
            )
        assert result["dry_run"] is True
        assert result["removed"] == sum(expired_of(i) for i in range(8))
        left = counts(conn, prefix, harness.now_ms)
        assert all(left[f"{prefix}_{i:04d}"] == (expired_of(i), 2) for i in range(8))


async def test_an_archive_pattern_moves_each_tenants_rows_into_its_own_schema(
    pg_url: str,
    harness: Harness,
) -> None:
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(4), harness.now_ms)
        for i in range(4):
            conn.execute(
                f'CREATE TABLE "{prefix}_{i:04d}".sessions_archive '
                f'(LIKE "{prefix}_{i:04d}".sessions)'
            )
        config = harness.adopt(pattern_config(prefix, archive_table=f"{prefix}_*.sessions_archive"))
        async with harness.run_worker(build_registry(config, harness.pool), config=config):
            result = await run_pass(harness.client, harness.task_queue, config.pass_input())
        assert result["removed"] == sum(expired_of(i) for i in range(4))
        for i in range(4):
            [(archived,)] = conn.execute(
                f'SELECT count(*) FROM "{prefix}_{i:04d}".sessions_archive'
            ).fetchall()
            assert archived == expired_of(i)
            assert conn.execute(
                f'SELECT count(*) FILTER (WHERE expires_at > %s) FROM "{prefix}_{i:04d}".sessions',
                (harness.now_ms + HOUR_MS - 1,),
            ).fetchone() == (2,)


async def test_an_archive_name_postgresql_would_cut_is_refused_not_shared_by_two_tenants(
    pg_url: str,
    harness: Harness,
) -> None:
    """Two tenants whose schemas (62 bytes each) differ only in their last characters: their
    archives filled in from `ar_PREFIX_*` would be 65 bytes, which PostgreSQL cuts to the same
    63. Each match fails alone (`BadPurgeTarget`, naming the length) and nothing moves, where
    both tenants' rows went into the one cut archive."""
    prefix = tenant_prefix() + "x" * 47
    cut = f"ar_{prefix}_00"  # ar_PREFIX_0001 and ar_PREFIX_0002, as PostgreSQL keeps them
    assert len(f"{prefix}_0001") == 62
    assert len(cut) == 63
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(1, 3), harness.now_ms)
        conn.execute(
            f'CREATE SCHEMA "{cut}"; CREATE TABLE "{cut}".sessions (LIKE "{prefix}_0001".sessions)'
        )
        try:
            config = harness.adopt(pattern_config(prefix, archive_table=f"ar_{prefix}_*.sessions"))
            async with harness.run_worker(build_registry(config, harness.pool), config=config):
                error = await failed_pass(
                    harness.client, harness.task_queue, config.pass_input(), f"purge-{uuid.uuid4()}"
                )
            [(archived,)] = conn.execute(f'SELECT count(*) FROM "{cut}".sessions').fetchall()
            left = counts(conn, prefix, harness.now_ms)
            said: list[str] = []
            checked = await check_config(
                dataclasses.replace(config, database_url=harness.url), [], said.append
            )
        finally:
            conn.execute(f'DROP SCHEMA "{cut}" CASCADE')

    failed = error.details[0]["failed"]
    assert sorted(f["name"] for f in failed) == [
        f"sessions@{prefix}_0001",
        f"sessions@{prefix}_0002",
    ]
    for f in failed:
        assert f["type"] == "BadPurgeTarget", f
        assert "is 65 bytes, past the 63 PostgreSQL keeps" in f["message"], f
    assert archived == 0
    assert left == {f"{prefix}_{i:04d}": (expired_of(i), 2) for i in (1, 2)}
    # `check` says so of each match, as of any refused table (it was a traceback).
    assert checked == 1
    assert said[0].startswith("FAILED  sessions (2 tables): "), said
    assert said[0].count("past the 63 PostgreSQL keeps") == 2, said


async def test_sweep_report_and_report_tables_show_a_pattern_as_one_line_and_its_tables(
    tmp_path: Path,
    temporal_server: RunningTemporal,
    pg_url: str,
    schema_url: str,
    harness: Harness,
) -> None:
    """`pg-purge sweep` starts the spread pass and prints the pattern's line; `report` shows
    the pattern as one column and one line; `report --tables` lists every matched table."""
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix):
        with psycopg.connect(pg_url, autocommit=True) as conn:
            create_tenants(conn, prefix, range(6), harness.now_ms)
        path = pattern_file(tmp_path, schema_url, harness.task_queue, prefix)
        config = load_config(path)
        env = clean_env(TEMPORAL_ADDRESS=temporal_server.address)
        async with harness.run_worker(build_registry(config, harness.pool), config=config):
            swept = await asyncio.to_thread(run_main, "sweep", "--config", str(path), env=env)
        expected = sum(expired_of(i) for i in range(6))
        assert swept.returncode == 0, swept.stderr
        assert "6 targets in 1 child workflows: 6 ok" in swept.stdout
        assert re.search(rf"sessions\s+6\s+{expected}\s+0\s+0\s+0\s+0\s+0", swept.stdout)

        # Visibility lags the histories (most under load): `report` lists the passes it reads,
        # so the pass must be listed, closed, first.
        await listed(
            harness.client,
            f'WorkflowType = "Purge" AND TaskQueue = "{harness.task_queue}"'
            ' AND ExecutionStatus = "Completed"',
        )
        report = await asyncio.to_thread(run_main, "report", "--config", str(path), env=env)
        assert report.returncode == 0, report.stderr
        header = report.stdout.splitlines()[0].split()
        assert "sessions" in header
        assert not any(name.startswith("sessions@") for name in header)

        tables = await asyncio.to_thread(
            run_main, "report", "--config", str(path), "--tables", "sessions", env=env
        )
        assert tables.returncode == 0, tables.stderr
        rows = [ln.split() for ln in tables.stdout.splitlines() if ln.startswith("sessions@")]
        assert [r[0] for r in rows] == [f"sessions@{prefix}_{i:04d}" for i in range(6)]
        assert [int(r[1]) for r in rows] == [expired_of(i) for i in range(6)]
        # The same matches for scripts, as the pass's report keeps a target's record.
        as_json = await asyncio.to_thread(
            run_main, "report", "--config", str(path), "--tables", "sessions", "--json", env=env
        )
        assert as_json.returncode == 0, as_json.stderr
        matches = json.loads(as_json.stdout)
        assert [(m["name"], m["removed"]) for m in matches["swept"]] == [
            (f"sessions@{prefix}_{i:04d}", expired_of(i)) for i in range(6)
        ]
        assert matches["failed"] == []
        assert tables.stdout.splitlines()[0].startswith(f"pass {matches['workflow_id']} ")

        # A name the config gives no pattern target is a typo, not a pattern not swept yet.
        typo = await asyncio.to_thread(
            run_main, "report", "--config", str(path), "--tables", "session", env=env
        )
        assert typo.returncode == 2, typo.stdout
        assert typo.stderr.strip().splitlines() == [
            "pg-purge: report --tables: the config names no pattern target 'session' "
            "(its pattern targets: sessions)"
        ]


async def test_sweep_target_of_one_matched_table_sweeps_that_table_alone(
    tmp_path: Path,
    temporal_server: RunningTemporal,
    pg_url: str,
    schema_url: str,
    harness: Harness,
) -> None:
    """`pg-purge sweep --target sessions@PREFIX_0001` sweeps that tenant's table and no other:
    the name is checked against the pattern, not refused as a target the config does not
    list; a suffix the pattern cannot match is refused in one line."""
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(3), harness.now_ms)
        path = pattern_file(tmp_path, schema_url, harness.task_queue, prefix)
        config = load_config(path)
        env = clean_env(TEMPORAL_ADDRESS=temporal_server.address)
        one = f"sessions@{prefix}_0001"
        misfit = await asyncio.to_thread(
            run_main, "sweep", "--config", str(path), "--target", "sessions@other_0001", env=env
        )
        typo = f"sessions@{prefix}_9999"  # fits the pattern; no such tenant
        async with harness.run_worker(build_registry(config, harness.pool), config=config):
            swept = await asyncio.to_thread(
                run_main, "sweep", "--config", str(path), "--target", one, env=env
            )
            missing = await asyncio.to_thread(
                run_main, "sweep", "--config", str(path), "--target", typo, env=env
            )

        assert misfit.returncode == 2, misfit.stdout
        assert misfit.stderr.strip().splitlines() == [
            "pg-purge: sweep --target: 'sessions@other_0001' names no table the pattern "
            f"'sessions' ({prefix}_*.sessions) could match"
        ]
        assert swept.returncode == 0, swept.stderr
        line = rf"^{re.escape(one)}\s+{expired_of(1)}\s.*\sok$"
        assert re.search(line, swept.stdout, re.MULTILINE), swept.stdout
        assert counts(conn, prefix, harness.now_ms) == {
            f"{prefix}_0000": (expired_of(0), 2),
            f"{prefix}_0001": (0, 2),
            f"{prefix}_0002": (expired_of(2), 2),
        }
        # A table named by hand that is not there: the pass reports it gone, and `sweep`
        # says so and fails, where a tenant dropped mid-pass is no failure.
        assert missing.returncode == 1, missing.stdout + missing.stderr
        assert missing.stdout.rstrip().endswith(
            f"no table for {typo}: named by hand and not there (a misspelt name?); nothing "
            "was swept for it"
        ), missing.stdout


def test_one_matched_table_by_hand_goes_to_its_pattern_s_database_queue() -> None:
    """On a database with a task queue of its own, `sessions@tenant_0042` is routed as its
    pattern is: its activity goes to that database's queue, not the default one."""
    config = parse_config(
        {
            "databases": {"eu": {"url": "postgresql://u@eu/app", "task_queue": "purge-eu"}},
            "targets": [
                {
                    "kind": "expiring",
                    "name": "sessions",
                    "table": "tenant_*.sessions",
                    "column": "expires_at",
                    "database": "eu",
                }
            ],
        },
        env={"PURGE_DATABASE_URL": "postgresql://x@y/z"},
    )

    request = config.pass_input(["sessions@tenant_0042"])

    assert request["databases"] == {"sessions@tenant_0042": "eu"}
    assert request["queues"] == {"eu": config.routed_queues["eu"]}


async def test_a_spent_budget_skips_the_matches_and_deletes_nothing(
    pg_url: str,
    harness: Harness,
) -> None:
    """The pass's budget is the children's: spent before a child starts, its targets are
    reported `skipped` (not failed) and no child is started for them."""
    prefix = tenant_prefix()
    with tenant_schemas(pg_url, prefix) as conn:
        create_tenants(conn, prefix, range(5), harness.now_ms)
        config = harness.adopt(pattern_config(prefix))
        workflow_id = f"purge-tenants-{uuid.uuid4()}"
        request = {**config.pass_input(), "budget_ms": 1}
        async with harness.run_worker(build_registry(config, harness.pool), config=config):
            result = await run_pass(harness.client, harness.task_queue, request, workflow_id)
        assert result["statuses"] == {"skipped": 5}
        assert result["patterns"][0]["skipped"] == 5
        assert result["removed"] == 0
        assert result["children"] == []
        left = counts(conn, prefix, harness.now_ms)
        assert all(left[f"{prefix}_{i:04d}"] == (expired_of(i), 2) for i in range(5))
