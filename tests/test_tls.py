"""Temporal over TLS, mTLS and an API key, configured only through Temporal's own variables
(`temporalio.envconfig`): the session's dev server behind a real TLS endpoint (nginx with
certificates of a private CA, tests/support/tls.py), and the worker, `schedule`, `sweep` and
`report` pointed at it. Each door works with what it asks for, and without it a command exits 1
with one line naming the variable to set, having started no pass and deleted nothing."""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import psycopg
import pytest
from temporalio.client import Client, ScheduleActionStartWorkflow
from temporalio.service import RPCError

from activities import builtin_kinds as kinds
from tests.conftest import Harness
from tests.support.passes import listed, quiet_cron
from tests.support.procs import (
    Done,
    clean_env,
    run_main,
    run_process,
    start_worker,
    stop,
    wait_for,
    worker_config,
)
from tests.support.rows import HOUR, idempotency_rows, keys
from tests.support.servers import RunningTemporal
from tests.support.tls import TlsFront, running_tls_front

IDEMPOTENCY = '[[targets]]\nkind = "idempotency"\n'


@pytest.fixture(scope="module")
def front(
    temporal_server: RunningTemporal, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TlsFront]:
    """nginx in front of the dev server: its TLS, mTLS and API-key doors."""
    with running_tls_front(temporal_server.address, tmp_path_factory.mktemp("tls")) as started:
        yield started


Door = Literal["tls", "mtls", "api_key"]


def door(front: TlsFront, name: Door) -> dict[str, str]:
    """Everything a user sets to go through door `name`: Temporal's variables only."""
    certs = front.certificates
    ca = {"TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(certs.ca)}
    if name == "tls":
        return {"TEMPORAL_ADDRESS": front.tls, "TEMPORAL_TLS": "true", **ca}
    if name == "mtls":
        # No TEMPORAL_TLS: any TEMPORAL_TLS_* variable turns TLS on.
        return {
            "TEMPORAL_ADDRESS": front.mtls,
            **ca,
            "TEMPORAL_TLS_CLIENT_CERT_PATH": str(certs.client_cert),
            "TEMPORAL_TLS_CLIENT_KEY_PATH": str(certs.client_key),
        }
    # An API key turns TLS on by itself (api-key-alone-speaks-tls below); the CA is needed only
    # because this one is private.
    return {"TEMPORAL_ADDRESS": front.api_key, "TEMPORAL_API_KEY": front.key, **ca}


def without(env: dict[str, str], *names: str) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in names}


def expired_and_live(db: psycopg.Connection[Any], now_ms: int) -> None:
    idempotency_rows(db, {"old": now_ms - HOUR, "new": now_ms + HOUR})


async def passes_on(client: Client, task_queue: str) -> list[str]:
    return [w.id async for w in client.list_workflows(f'TaskQueue = "{task_queue}"')]


@pytest.mark.parametrize("name", get_args(Door))
async def test_worker_schedule_sweep_and_report_work_through_the_door(
    tmp_path: Path, front: TlsFront, harness: Harness, name: Door
) -> None:
    """A worker process, `schedule`, `sweep` and `report`, each configured by the door's
    variables alone: the schedule is made, the pass runs on that worker and deletes the
    expired row, and the report lists the pass."""
    expired_and_live(harness.db, harness.now_ms)
    schedule_id = f"purge-tls-{uuid.uuid4().hex[:8]}"
    cron = quiet_cron()  # not the default `23 * * * *`: a pass of its own would take the row
    config = worker_config(
        tmp_path / "purge.toml",
        harness.url,
        harness.task_queue,
        f'[schedule]\nid = "{schedule_id}"\ncron = "{cron}"\n\n{IDEMPOTENCY}',
    )
    env = clean_env(**door(front, name))
    log = tmp_path / "worker.log"
    worker = start_worker(config, env, log)
    try:
        await asyncio.to_thread(
            wait_for, lambda: "worker on task queue" in log.read_text(), 60, "the worker"
        )
        scheduled = await asyncio.to_thread(run_main, "schedule", "--config", str(config), env=env)
        made = await harness.client.get_schedule_handle(schedule_id).describe()
        swept = await asyncio.to_thread(run_main, "sweep", "--config", str(config), env=env)
        await listed(harness.client, f'TaskQueue = "{harness.task_queue}"')  # what `report` reads
        reported = await asyncio.to_thread(run_main, "report", "--config", str(config), env=env)
    finally:
        stop(worker)
        with contextlib.suppress(RPCError):
            await harness.client.get_schedule_handle(schedule_id).delete()

    assert scheduled.returncode == 0, scheduled.stderr
    assert scheduled.stdout.startswith(f"created schedule {schedule_id}: cron '{cron}'")
    action = made.schedule.action
    assert isinstance(action, ScheduleActionStartWorkflow)
    assert action.task_queue == harness.task_queue
    assert swept.returncode == 0, swept.stderr + log.read_text()
    assert re.search(r"^x_idempotency\s+1\s", swept.stdout, re.MULTILINE), swept.stdout
    assert keys(harness.db, "x_idempotency") == {"new"}
    # The pass ran on the worker process that polls through the door (the queue has no other).
    assert re.search(r"purge_target=x_idempotency purge_removed=1 ", log.read_text())
    assert reported.returncode == 0, reported.stderr
    [row] = [ln for ln in reported.stdout.splitlines() if re.match(r"\d{4}-", ln)]
    assert re.search(r"completed\s+1\s", row), reported.stdout
    assert "Traceback" not in log.read_text()


@dataclass(frozen=True)
class Refusal:
    """A door's variables with some of them missing or wrong, and the line that says so."""

    door: Door
    unset: tuple[str, ...]
    changed: dict[str, str]
    reason: str
    """What follows `pg-purge: cannot reach Temporal at ADDRESS: `."""
    entry: Callable[..., Done]
    """`run_process` (`python worker.py`) or `run_main` (the same `worker.main` in-process)."""


CLIENT_CERT = ("TEMPORAL_TLS_CLIENT_CERT_PATH", "TEMPORAL_TLS_CLIENT_KEY_PATH")
NO_CLIENT_CERT = (
    "it answered HTTP 400 Bad Request, not gRPC, and this client sent no certificate; if it "
    "requires mTLS, set TEMPORAL_TLS_CLIENT_CERT_PATH and TEMPORAL_TLS_CLIENT_KEY_PATH"
)
UNTRUSTED_CA = (
    "its TLS certificate is signed by a CA this client does not trust; "
    "set TEMPORAL_TLS_SERVER_CA_CERT_PATH to that CA's certificate"
)
REFUSALS = {
    "mtls-without-client-certificate": Refusal(
        "mtls", CLIENT_CERT, {}, NO_CLIENT_CERT, run_process
    ),
    "api-key-missing": Refusal(
        "api_key",
        ("TEMPORAL_API_KEY",),
        {},
        "unauthenticated (missing or wrong API key): no API key is set (TEMPORAL_API_KEY)",
        run_main,
    ),
    "api-key-wrong": Refusal(
        "api_key",
        (),
        {"TEMPORAL_API_KEY": "not-the-key"},
        "unauthenticated (missing or wrong API key): the API key it was sent "
        "(TEMPORAL_API_KEY, or a profile's api_key) was refused",
        run_main,
    ),
    "private-ca-not-trusted": Refusal(
        "tls", ("TEMPORAL_TLS_SERVER_CA_CERT_PATH",), {}, UNTRUSTED_CA, run_main
    ),
    # With TEMPORAL_API_KEY and no TEMPORAL_TLS* at all, the certificate is still checked: the
    # key alone turned TLS on, as Temporal Cloud needs.
    "api-key-alone-speaks-tls": Refusal(
        "api_key", ("TEMPORAL_TLS_SERVER_CA_CERT_PATH",), {}, UNTRUSTED_CA, run_main
    ),
}


@pytest.mark.parametrize("refusal", REFUSALS.values(), ids=REFUSALS.keys())
async def test_sweep_refused_at_the_door_says_why_in_one_line_and_deletes_nothing(
    tmp_path: Path, front: TlsFront, harness: Harness, refusal: Refusal
) -> None:
    """`sweep` without what the door asks for: exit 1, one line on stderr naming the address
    and the variable to set, no traceback; no pass started, so the worker polling the task
    queue deletes nothing."""
    expired_and_live(harness.db, harness.now_ms)
    config = worker_config(tmp_path / "purge.toml", harness.url, harness.task_queue, IDEMPOTENCY)
    wanted = door(front, refusal.door)
    env = clean_env(**{**without(wanted, *refusal.unset), **refusal.changed})

    async with harness.run_worker([kinds.idempotency(harness.pool)]):
        done = await asyncio.to_thread(refusal.entry, "sweep", "--config", str(config), env=env)

    address = wanted["TEMPORAL_ADDRESS"]
    assert done.stderr == f"pg-purge: cannot reach Temporal at {address}: {refusal.reason}\n"
    assert done.returncode == 1
    assert done.stdout == ""
    assert await passes_on(harness.client, harness.task_queue) == []
    assert keys(harness.db, "x_idempotency") == {"old", "new"}


def test_worker_without_its_client_certificate_exits_with_one_line(
    tmp_path: Path, front: TlsFront, schema_url: str, task_queue: str
) -> None:
    """The worker (`run`) at the mTLS door without a client certificate stops at start, exit 1,
    with the same one line, instead of running a worker that can never poll."""
    config = worker_config(tmp_path / "purge.toml", schema_url, task_queue, IDEMPOTENCY)
    env = clean_env(**without(door(front, "mtls"), *CLIENT_CERT))

    done = run_main("run", "--config", str(config), env=env)

    assert done.stderr == f"pg-purge: cannot reach Temporal at {front.mtls}: {NO_CLIENT_CERT}\n"
    assert done.returncode == 1
