"""An application's own targets: `kind = "python"` in the config, or a registry built in code.
The factory is called when a step needs it, so a store built after the worker started is found."""

from __future__ import annotations

import logging
import os
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
from tests.support.passes import failed_pass, run_pass, started_and_stopped
from tests.support.procs import clean_env, use_env
from tests.support.rows import HOUR, idempotency_rows, keys
from tests.support.servers import RunningTemporal


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
    # Said to be the factory's: asked, it gave nothing (its store is not built in this process).
    assert before.failed[0].message.endswith(
        "(tests.support.apptargets:targets, asked now, gave no target)"
    )
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


def factory_of_an_unset_setting() -> list[Any]:
    """A factory whose module reads a setting the worker's environment lacks."""
    return [{"url": os.environ["PURGE_TEST_UNSET_SETTING"]}]


async def test_a_factory_that_raises_fails_its_names_alone_and_is_named(
    harness: Harness,
) -> None:
    """Every step asks the factories, but one that raises fails only the names no fixed target
    gives: the built-in target beside it is swept, and the failure names the factory (its own
    KeyError did not), at once, not after five attempts."""
    from activities import builtin_kinds as kinds

    idempotency_rows(harness.db, {"old": harness.now_ms - HOUR})
    registry = TargetRegistry([kinds.idempotency(harness.pool)], [factory_of_an_unset_setting])
    workflow_id = f"purge-{uuid.uuid4()}"
    async with harness.run_worker(registry):
        error = await failed_pass(
            harness.client,
            harness.task_queue,
            {"targets": ["x_idempotency", "tmp_uploads"]},
            workflow_id,
        )
    report = PurgeReport.from_json(error.details[0])
    history = await harness.client.get_workflow_handle(workflow_id).fetch_history()
    attempts = [
        e.activity_task_started_event_attributes.attempt
        for e in history.events
        if e.HasField("activity_task_started_event_attributes")
    ]

    assert [(s.name, s.removed) for s in report.swept] == [("x_idempotency", 1)]
    [failure] = report.failed
    assert (failure.name, failure.type) == ("tmp_uploads", "TargetFactoryFailed")
    assert failure.message == (
        "target factory tests.test_python_targets:factory_of_an_unset_setting raised "
        "KeyError: 'PURGE_TEST_UNSET_SETTING'"
    )
    assert keys(harness.db, "x_idempotency") == set()
    assert attempts == [1, 1]  # each activity's last attempt its first: failed once, not retried


async def test_the_docs_factory_builds_its_own_pool_under_a_worker_of_its_config(
    tmp_path: Path, harness: Harness, uploads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/own-targets.md's factory (`tests/support/ownpool_targets.py`), under a worker built
    from its config as `pg-purge run` builds one, where no application code runs: it opens its
    own pool from its setting and sweeps, a dry run first."""
    from tests.support import ownpool_targets

    assert ownpool_targets._built == [], "a target built by an earlier test of this process"
    monkeypatch.setenv("APP_DATABASE_URL", harness.url)
    config_file = tmp_path / "purge.toml"
    config_file.write_text(
        '[[targets]]\nkind = "python"\n'
        'factory = "tests.support.ownpool_targets:targets"\nnames = ["tmp_uploads"]\n'
    )
    config = load_config(config_file, env={})
    try:
        async with harness.run_worker(build_registry(config, harness.pool)):
            dry = await run_pass(
                harness.client, harness.task_queue, {"targets": ["tmp_uploads"], "dry_run": True}
            )
            swept = await run_pass(harness.client, harness.task_queue, {"targets": ["tmp_uploads"]})
    finally:
        for built in ownpool_targets._built:
            await built.pool.close()
        ownpool_targets._built.clear()

    assert [(s["name"], s["removed"]) for s in dry["swept"]] == [("tmp_uploads", 1)]
    assert [(s["name"], s["removed"]) for s in swept["swept"]] == [("tmp_uploads", 1)]
    assert keys(harness.db, "tmp_uploads") == {"open"}


async def test_a_worker_of_python_targets_alone_names_no_database_of_its_own(
    tmp_path: Path,
    temporal_server: RunningTemporal,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A config of python targets alone: its worker says at start that its targets sweep on
    their factories' own connections, where it said `database none` and then polled its own
    queue `on databases default (database_url)`, a database it has no URL for."""
    config_file = tmp_path / "purge.toml"
    config_file.write_text(
        f'task_queue = "py-{uuid.uuid4().hex[:8]}"\n[[targets]]\nkind = "python"\n'
        'factory = "tests.support.checked_factories:uncounted"\nnames = ["no_count"]\n'
    )
    config = load_config(config_file, env={})
    use_env(monkeypatch, clean_env())  # Temporal's client settings come from the test alone

    with caplog.at_level(logging.INFO, logger="purge"):
        await started_and_stopped(config, temporal_server.address)

    said = caplog.text
    assert "database none (no target of a built-in kind sweeps the default database)" in said
    assert (
        f"polling task queue {config.own_queue!r} for the activities of its own targets "
        "(no_count), python targets on their factories' own connections; only workers"
    ) in said
    assert "database_url" not in said


class Named:
    """A target as an application writes one: a name and purge_expired. The registry's own
    tests need no more, since none of them deletes."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def purge_expired(self, now_ms: int) -> int:
        raise AssertionError("found, never run here")


def raising_factory() -> list[Any]:
    raise KeyError("PURGE_TEST_UNSET_SETTING")


def stray_factory() -> list[Any]:
    return [Named("strays_neighbour"), {"name": "not a target"}]


def test_a_broken_factory_leaves_the_other_factories_targets_found(
    pool: AsyncConnectionPool[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """One factory raises, one returns what is not a target: the names they alone could give
    fail, naming both, and every other factory's target and every fixed one is still found,
    the factories' errors logged with the raising one's traceback."""
    from activities import builtin_kinds as kinds
    from activities.errors import TargetFactoryFailed

    fixed = kinds.idempotency(pool)
    mine = Named("tmp_uploads")
    registry = TargetRegistry([fixed], [raising_factory, stray_factory, lambda: [mine]])

    with caplog.at_level(logging.WARNING, logger="purge.targets"):
        assert registry.resolve("tmp_uploads") is mine
    [logged] = caplog.records
    assert "raising_factory raised KeyError" in logged.getMessage()
    assert "stray_factory returned" in logged.getMessage()
    assert logged.exc_info is not None
    assert logged.exc_info[0] is KeyError
    assert registry.resolve("x_idempotency") is fixed
    with pytest.raises(TargetFactoryFailed) as failed:
        registry.resolve("strays_neighbour")
    assert failed.value.message == (
        "target factory tests.test_python_targets:raising_factory raised KeyError: "
        "'PURGE_TEST_UNSET_SETTING'; target factory tests.test_python_targets:stray_factory "
        "returned {'name': 'not a target'}, which has no name and purge_expired"
    )


def test_a_name_two_targets_give_fails_alone_and_each_factory_says_what_it_gave(
    pool: AsyncConnectionPool[Any],
) -> None:
    """A factory's target under a fixed target's name: that name is refused (neither runs), the
    factory's other names are found; a name none gives lists what each factory gave."""
    from activities import builtin_kinds as kinds
    from activities.errors import DuplicatePurgeTarget, UnknownPurgeTarget

    mine = Named("tmp_uploads")

    def shadowing() -> list[Any]:
        return [Named("x_idempotency"), mine]

    registry = TargetRegistry([kinds.idempotency(pool)], [shadowing, list])

    with pytest.raises(DuplicatePurgeTarget, match="two targets are named 'x_idempotency'"):
        registry.resolve("x_idempotency")
    assert registry.resolve("tmp_uploads") is mine
    with pytest.raises(UnknownPurgeTarget) as unknown:
        registry.resolve("nobody")
    assert unknown.value.message.endswith(
        "(tests.test_python_targets:test_a_name_two_targets_give_fails_alone_and_each_factory_"
        "says_what_it_gave.<locals>.shadowing, asked now, gave tmp_uploads, x_idempotency; "
        "builtins:list, asked now, gave no target)"
    )
