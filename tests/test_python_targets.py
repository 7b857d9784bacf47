"""An application's own targets: `kind = "python"` in the config, or a registry built in code.
The factory is called when a step needs it, so a store built after the worker started is found."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from activities.builtin_kinds import build_registry
from activities.registry import TargetRegistry
from activities.results import PurgeReport
from purge_config.file import load_config
from tests.conftest import Harness
from tests.support import apptargets
from tests.support.passes import failed_pass, run_pass
from tests.support.rows import HOUR, idempotency_rows, keys


@pytest.fixture
def uploads(db: psycopg.Connection[Any], real_now: int) -> Iterator[None]:
    db.execute("CREATE TABLE tmp_uploads (key text PRIMARY KEY, expires_at_ms bigint NOT NULL)")
    db.execute(
        "INSERT INTO tmp_uploads VALUES ('stale', %s), ('open', %s)",
        (real_now - HOUR, real_now + HOUR),
    )
    yield
    apptargets.stop_app()


async def test_config_factory_finds_a_store_built_after_the_worker_started(
    tmp_path: Path,
    harness: Harness,
    uploads: None,
) -> None:
    idempotency_rows(harness.db, {"old": harness.now_ms - HOUR})
    config_file = tmp_path / "purge.toml"
    config_file.write_text(
        'database_url = "postgresql://unused@localhost/app"\n'
        '[[targets]]\nkind = "idempotency"\n'
        '[[targets]]\nkind = "python"\n'
        'factory = "tests.support.apptargets:targets"\n'
        'names = ["tmp_uploads"]\n'
    )
    config = load_config(config_file, env={})
    assert config.target_names == ["x_idempotency", "tmp_uploads"]
    request = {"targets": config.target_names}

    async with harness.run_worker(build_registry(config, harness.pool)):
        # The application has not built its store yet: that target fails alone.
        error = await failed_pass(
            harness.client, harness.task_queue, request, f"purge-{uuid.uuid4()}"
        )
        before = PurgeReport.from_json(error.details[0])
        apptargets.start_app(harness.pool)
        after = await run_pass(harness.client, harness.task_queue, request)

    assert [(f.name, f.type) for f in before.failed] == [("tmp_uploads", "UnknownPurgeTarget")]
    assert [s.name for s in before.swept] == ["x_idempotency"]
    assert [(s["name"], s["removed"]) for s in after["swept"]] == [
        ("x_idempotency", 0),
        ("tmp_uploads", 1),
    ]
    assert keys(harness.db, "tmp_uploads") == {"open"}


async def test_registry_built_in_code_sweeps_factory_targets_and_dry_runs_them(
    harness: Harness,
    uploads: None,
) -> None:
    apptargets.start_app(harness.pool)
    calls_before = apptargets.calls
    async with harness.run_worker(TargetRegistry(factories=[apptargets.targets])):
        dry = await run_pass(
            harness.client, harness.task_queue, {"targets": ["tmp_uploads"], "dry_run": True}
        )
        wet = await run_pass(harness.client, harness.task_queue, {"targets": ["tmp_uploads"]})

    assert dry["swept"][0]["removed"] == 1
    assert wet["swept"][0]["removed"] == 1
    assert keys(harness.db, "tmp_uploads") == {"open"}
    assert apptargets.calls - calls_before == 2  # asked once per step, never at start


async def test_factory_target_clashing_with_a_configured_name_is_refused(
    harness: Harness,
) -> None:
    class Impostor:
        name = "x_idempotency"

        async def purge_expired(self, now_ms: int) -> int:
            raise AssertionError("must never run")

    from activities import builtin_kinds as kinds

    registry = TargetRegistry([kinds.idempotency(harness.pool)], [lambda: [Impostor()]])
    async with harness.run_worker(registry):
        error = await failed_pass(
            harness.client,
            harness.task_queue,
            {"targets": ["x_idempotency"]},
            f"purge-{uuid.uuid4()}",
        )
    [failure] = PurgeReport.from_json(error.details[0]).failed
    assert failure.type == "DuplicatePurgeTarget"
    assert "two targets are named 'x_idempotency'" in failure.message


def test_two_fixed_targets_under_one_name_are_refused_at_start(
    pool: AsyncConnectionPool[Any],
) -> None:
    from activities import builtin_kinds as kinds
    from activities.errors import DuplicatePurgeTarget

    with pytest.raises(DuplicatePurgeTarget, match="two targets are named 'x_auth'"):
        TargetRegistry([kinds.auth(pool), kinds.auth(pool)])
