"""Least privilege, no secret anywhere, and bad steps sent straight to the activity."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import re
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from temporalio.client import Client
from temporalio.worker import Worker

from activities import builtin_kinds as kinds
from activities.registry import TargetRegistry
from activities.results import PurgeReport
from activities.sweep import PurgeActivities
from purge_config.errors import DETAIL_LEFT_OUT
from purge_config.names import TableName
from purge_ops import logs
from purge_ops.connect import open_pool
from purge_ops.ports import free_ports
from tests.conftest import Harness
from tests.support.direct_caller import DirectCaller
from tests.support.history import first_failure, history
from tests.support.passes import failed_pass, listed, run_pass
from tests.support.procs import clean_env, run_main, start_worker, stop, wait_for, worker_config
from tests.support.rows import HOUR, auth_rows, bucket_rows, idempotency_rows, keys
from tests.support.servers import RunningTemporal

ALL_KINDS = ["x_idempotency", "x_rate_limit", "x_auth", "sessions"]


def seed_every_kind(db: psycopg.Connection[Any], now: int) -> None:
    idempotency_rows(db, {"old": now - HOUR, "new": now + 24 * HOUR})
    bucket_rows(db, {"full": (4.0, 4.0, 1.0, now - HOUR), "empty": (0.0, 4.0, 1e-9, now)})
    auth_rows(db, {"f-old": now - HOUR, "f-new": now + 24 * HOUR}, {"l-old": now - HOUR})
    db.execute("CREATE TABLE sessions (key text PRIMARY KEY, expires_at timestamptz NOT NULL)")
    db.execute(
        "INSERT INTO sessions VALUES ('s-old', now() - interval '1 day'),"
        " ('s-new', now() + interval '1 day')"
    )


async def test_a_role_with_only_select_and_delete_sweeps_every_kind(
    harness: Harness,
    role: str,
) -> None:
    """The GRANTs the README gives are enough: SELECT and DELETE on the target tables."""
    seed_every_kind(harness.db, harness.now_ms)
    tables = "x_idempotency, x_rate_limit, x_auth_failures, x_auth_lockouts, sessions"
    harness.db.execute(f'GRANT SELECT, DELETE ON {tables} TO "{role}"')
    pool = await open_pool(make_conninfo(harness.url, user=role))
    try:
        targets = [
            kinds.idempotency(pool),
            kinds.rate_limit(pool),
            kinds.auth(pool),
            kinds.expiring(pool, "sessions", TableName("sessions"), "expires_at"),
        ]
        async with harness.run_worker(targets):
            result = await run_pass(harness.client, harness.task_queue, {"targets": ALL_KINDS})
            dry = await run_pass(
                harness.client, harness.task_queue, {"targets": ALL_KINDS, "dry_run": True}
            )
    finally:
        await pool.close()

    assert [(s["name"], s["removed"]) for s in result["swept"]] == [
        ("x_idempotency", 1), ("x_rate_limit", 1), ("x_auth", 2), ("sessions", 1),
    ]  # fmt: skip
    assert dry["removed"] == 0
    assert keys(harness.db, "x_idempotency") == {"new"}
    assert keys(harness.db, "sessions") == {"s-new"}


async def test_a_role_without_delete_fails_that_target_saying_what_it_needs(
    harness: Harness,
    role: str,
) -> None:
    seed_every_kind(harness.db, harness.now_ms)
    harness.db.execute(f'GRANT SELECT ON x_idempotency TO "{role}"')
    harness.db.execute(f'GRANT SELECT, DELETE ON x_auth_failures, x_auth_lockouts TO "{role}"')
    pool = await open_pool(make_conninfo(harness.url, user=role))
    try:
        async with harness.run_worker([kinds.idempotency(pool), kinds.auth(pool)]):
            error = await failed_pass(
                harness.client,
                harness.task_queue,
                {"targets": ["x_idempotency", "x_auth"]},
                f"p-{uuid.uuid4()}",
            )
    finally:
        await pool.close()
    report = PurgeReport.from_json(error.details[0])
    [failure] = report.failed
    assert failure.type == "BadPurgeTarget"
    assert "permission denied for table x_idempotency" in failure.message
    assert "needs SELECT and DELETE" in failure.message
    assert [s.name for s in report.swept] == ["x_auth"]
    assert keys(harness.db, "x_idempotency") == {"old", "new"}


# -- no secrets ------------------------------------------------------------------------------

SECRET = "hunter2-purge-s3cret"


@pytest.mark.waits
def test_the_database_password_appears_in_no_log_input_result_error_or_history(
    tmp_path: Path,
    temporal_server: RunningTemporal,
    harness: Harness,
) -> None:
    """A worker and every command run with a password-bearing URL (trust authentication
    ignores the password; the point is where the string goes). Everything a person or a
    system could read afterwards is searched for it.

    The worker is a process of its own (its log is what an operator reads); the commands run
    in this process (`worker.main`), from this synchronous test's main thread, since `run`
    installs signal handlers."""
    seed_every_kind(harness.db, harness.now_ms)
    parts = conninfo_to_dict(harness.url)
    secret_url = (
        f"postgresql://{parts['user']}:{SECRET}@{parts['host']}:{parts['port']}/{parts['dbname']}"
        f"?options={parts['options'].replace(' ', '%20').replace('=', '%3D')}"
    )
    targets = (
        '[[targets]]\nkind = "idempotency"\n[[targets]]\nkind = "auth"\n'
        '[[targets]]\nkind = "expiring"\nname = "gone"\ntable = "no_such_table"\n'
        'column = "expires_at"\n'
    )
    placeholder = "postgresql://placeholder@localhost/none"
    config = worker_config(tmp_path / "purge.toml", placeholder, harness.task_queue, targets)
    # The unreachable database is given up on after database_wait, not the default 30 s.
    impatient = worker_config(
        tmp_path / "impatient.toml",
        placeholder,
        harness.task_queue,
        f'database_wait = "1s"\n{targets}',
    )
    [metrics_port] = free_ports(1)
    env = clean_env(TEMPORAL_ADDRESS=temporal_server.address, PURGE_DATABASE_URL=secret_url)
    log = tmp_path / "worker.log"
    worker = start_worker(config, env, log, "--metrics", f"127.0.0.1:{metrics_port}")
    texts: dict[str, str] = {}
    try:
        wait_for(lambda: "worker on task queue" in log.read_text(), 60, "the worker")

        def command(*args: str, extra_env: dict[str, str] | None = None) -> str:
            done = run_main(*args, env={**env, **(extra_env or {})})
            return done.stdout + done.stderr

        texts["sweep"] = command("sweep", "--config", str(config))
        # `report` reads what visibility lists.
        asyncio.run(passes_listed(temporal_server.address, harness.task_queue))
        texts["report"] = command("report", "--config", str(config))
        texts["bad url"] = command(
            "run", "--config", str(config),
            extra_env={"PURGE_DATABASE_URL": f"host=db password={SECRET} sslrootcert=file:///x"
                       " bogus"},
        )  # fmt: skip
        texts["unreachable"] = command(
            "run", "--config", str(impatient),
            extra_env={"PURGE_DATABASE_URL": f"postgresql://app:{SECRET}@127.0.0.1:1/app"},
        )  # fmt: skip
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics") as page:
            texts["metrics"] = page.read().decode()
        texts.update(asyncio.run(histories(temporal_server.address, harness.task_queue)))
    finally:
        stop(worker)
    texts["worker log"] = log.read_text()

    assert "FAILED BadPurgeTarget" in texts["sweep"]  # the failing target's error is in there
    assert "x_idempotency" in texts["report"]
    assert (
        "cannot connect to postgresql://app:***@127.0.0.1:1/app within 1 s" in texts["unreachable"]
    )
    assert "config error" in texts["bad url"]
    assert f"postgresql://postgres:***@{parts['host']}" in texts["worker log"]
    assert any(name.startswith("history") for name in texts)
    leaks = [name for name, text in texts.items() if SECRET in text]
    assert leaks == []


async def passes_listed(temporal_address: str, task_queue: str) -> None:
    await listed(await Client.connect(temporal_address), f'TaskQueue = "{task_queue}"')


async def histories(temporal_address: str, task_queue: str) -> dict[str, str]:
    """Every history of `task_queue`'s passes, as JSON, by workflow id."""
    client = await Client.connect(temporal_address)
    return {
        f"history {execution.id}": (await history(client, execution.id)).to_json()
        async for execution in client.list_workflows(f'TaskQueue = "{task_queue}"')
    }


# -- bad steps sent to the activity directly -------------------------------------------------


async def sent_straight(harness: Harness, step: Any) -> dict[str, Any]:
    """`step` sent to the `purge_target` activity by another caller's workflow (`DirectCaller`),
    on a worker with the idempotency target: what the activity's last attempt ended with."""
    activities = PurgeActivities(TargetRegistry([kinds.idempotency(harness.pool)]))
    async with Worker(
        harness.client, task_queue=harness.task_queue, workflows=[DirectCaller],
        activities=[activities.purge_target],
    ):  # fmt: skip
        outcome: dict[str, Any] = await harness.client.execute_workflow(
            "DirectCaller", step, id=f"direct-{uuid.uuid4()}", task_queue=harness.task_queue
        )
    return outcome


@pytest.mark.parametrize(
    ("step", "complaint"),
    [
        ({"name": "x_idempotency", "now_ms": -5}, "before 2000-01-01"),
        ({"name": "x_idempotency", "now_ms": 1_700_000_000}, "seconds sent where milliseconds"),
        ({"name": "x_idempotency", "now_ms": 1_700_000_000_000_000}, "microseconds sent"),
        ({"name": "x_idempotency", "now_ms": 1_700_000_000_000.5}, "must be an integer"),
        ({"name": "x_idempotency", "now_ms": "1700000000000"}, "must be an integer"),
        ({"name": "x_idempotency", "now_ms": True}, "must be an integer"),
        ({"name": "x_idempotency"}, "must be an integer of epoch milliseconds, got None"),
        ({"name": 7, "now_ms": 1_700_000_000_000}, "not a target name"),
        ({"name": "x_idempotency", "now_ms": 1_700_000_000_000, "force": 1}, "unknown keys"),
        ({"name": "x_idempotency", "now_ms": 1_700_000_000_000, "format": 1.5}, "'format' must"),
        (["x_idempotency", 1_700_000_000_000], "step must be an object"),
    ],
    ids=["negative", "seconds", "microseconds", "fraction", "string", "bool", "missing",
         "name-not-string", "unknown-key", "bad-format", "not-an-object"],
)  # fmt: skip
async def test_a_bad_step_sent_straight_to_the_activity_is_refused_and_deletes_nothing(
    harness: Harness,
    step: Any,
    complaint: str,
) -> None:
    idempotency_rows(harness.db, {"a": 1, "b": 2})  # expired at any plausible instant
    outcome = await sent_straight(harness, step)

    assert outcome["type"] == "BadPurgeInput", outcome
    assert outcome["retryable"] is False
    assert complaint in outcome["message"]
    assert "\n" not in outcome["message"]
    assert keys(harness.db, "x_idempotency") == {"a", "b"}


@pytest.mark.waits
async def test_a_step_of_a_later_release_s_format_is_retried_not_refused_and_deletes_nothing(
    harness: Harness,
) -> None:
    """A step a later release sent (`format` 2, a key this release does not know) reaching a
    worker of this release mid-deploy: a retried failure that names the format, so a worker of
    that release may take a retry; never a refusal that fails the target, nor a sweep that
    ignores what it does not know. (The caller here stops after three attempts.)"""
    idempotency_rows(harness.db, {"a": 1, "b": 2})
    step = {"name": "x_idempotency", "now_ms": 1_700_000_000_000, "format": 2, "new_key": 1}
    outcome = await sent_straight(harness, step)

    assert outcome == {
        "type": "NewerPurgeFormat",
        "message": "step of format 2, from a later release (this worker reads format 1; keys "
        "new to it: ['new_key']): left to a worker of that release",
        "retryable": True,
    }
    assert keys(harness.db, "x_idempotency") == {"a", "b"}


def test_redacted_forms_keep_the_rest_of_the_url() -> None:
    from purge_config.dsn import redact

    assert redact(f"postgresql://app:{SECRET}@db:5432/app?sslmode=require") == (
        "postgresql://app:***@db:5432/app?sslmode=require"
    )
    masked = conninfo_to_dict(redact(f"host=db user=app password={SECRET}"))
    assert masked == {"host": "db", "user": "app", "password": "***"}
    assert SECRET not in redact(f"postgresql://app@db/app?password={SECRET}")
    assert re.fullmatch(r"<unparseable connection string>", redact(f"password={SECRET} '"))
    assert json.dumps(redact("postgresql://db/app")) == '"postgresql://db/app"'
    # A URL libpq takes whole, whose password holds a "#", a "?" or an "@" (a URL parser ends
    # the host at the first two, and never found the password).
    for mark in "#?@":
        shown = redact(f"postgresql://app:pw{mark}{SECRET}@db:5432/app?sslmode=require")
        assert shown == "postgresql://app:***@db:5432/app?sslmode=require", mark
    # libpq's keywords are lower case: it refuses `Password`, so where the value ends cannot
    # be told (an `&` in it would read as another parameter), and the parameters go whole.
    assert redact(f"postgresql://app@db/app?Password={SECRET}") == "postgresql://app@db/app?***"
    # An "@" past the path is not user info.
    assert redact("postgresql://db:5432/app?application_name=a@b") == (
        "postgresql://db:5432/app?application_name=a@b"
    )


#: A key the server quotes in its errors' DETAIL (a session token, say).
TOKEN = "tok-8f3a1c0e5b"


@contextlib.contextmanager
def worker_log() -> Iterator[io.StringIO]:
    """What the package's own log handler (`purge_ops.logs.handler`) writes while inside."""
    out = io.StringIO()
    written = logs.handler(out)
    root = logging.getLogger()
    root.addHandler(written)
    try:
        yield out
    finally:
        root.removeHandler(written)


async def test_a_key_the_server_quotes_reaches_no_history_and_no_log_line(
    harness: Harness,
) -> None:
    """PostgreSQL quotes a row's values in an error's DETAIL (`Key (key)=(...) is still
    referenced`, `already exists`). Neither a raw error Temporal retries (a DELETE a foreign key
    without a cascade stops) nor one of this package's own refusals chained from one (an
    archive that already holds a key) carries it into the history or the worker's log: the
    message keeps its first line, the DETAIL is left out."""
    idempotency_rows(harness.db, {TOKEN: harness.now_ms - HOUR})
    harness.db.execute("CREATE TABLE uses (key text REFERENCES x_idempotency (key))")
    harness.db.execute("INSERT INTO uses VALUES (%s)", (TOKEN,))
    held = f"purge-{uuid.uuid4()}"
    handle = await harness.client.start_workflow(
        "Purge", {"targets": ["x_idempotency"]}, id=held, task_queue=harness.task_queue
    )
    with worker_log() as log:
        async with harness.run_worker([kinds.idempotency(harness.pool)]):
            failure = await first_failure(handle)
            await handle.terminate("the failure was read")
    assert "violates foreign key constraint" in failure.message
    assert DETAIL_LEFT_OUT in failure.message
    assert "violates foreign key constraint" in log.getvalue()
    assert DETAIL_LEFT_OUT in log.getvalue()
    assert TOKEN not in log.getvalue()
    assert TOKEN not in (await history(harness.client, held)).to_json()

    # The archive's unique key already holds the row's: BadPurgeTarget, chained from the
    # server's error (its DETAIL quoting the key) and non-retryable, so in the history at once.
    harness.db.execute("DROP TABLE uses")
    harness.db.execute("CREATE TABLE kept (LIKE x_idempotency INCLUDING ALL)")
    harness.db.execute("INSERT INTO kept SELECT * FROM x_idempotency")
    archived = kinds.expiring(
        harness.pool,
        "archived",
        TableName("x_idempotency"),
        "expires_at_ms",
        archive=TableName("kept"),
    )
    refused = f"purge-{uuid.uuid4()}"
    with worker_log() as log:
        async with harness.run_worker([archived]):
            error = await failed_pass(
                harness.client, harness.task_queue, {"targets": ["archived"]}, refused
            )
    [failed] = PurgeReport.from_json(error.details[0]).failed
    assert failed.type == "BadPurgeTarget"
    assert "archive kept already holds a row" in failed.message
    assert "archive kept already holds a row" in log.getvalue()  # the refusal was logged
    assert TOKEN not in log.getvalue()
    shown = (await history(harness.client, refused)).to_json()
    # The server's error is there, as the cause, its DETAIL left out.
    assert 'violates unique constraint \\"kept_pkey\\"' in shown
    assert DETAIL_LEFT_OUT.replace('"', '\\"') in shown
    assert TOKEN not in shown
    assert keys(harness.db, "x_idempotency") == {TOKEN}
