"""The metrics port of a real worker (`run_worker` in this process, the dev server, PostgreSQL):
`/metrics`, `/livez` and `/readyz`, GET only, naming what is down and revealing nothing else."""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
import socket
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from temporalio.client import Client

from purge_config.file import load_config
from purge_ops import probes as probing
from purge_ops import runner
from purge_ops.connect import APPLICATION_NAME
from purge_ops.ports import free_ports
from purge_ops.probes import Health, ProbeServer, loopback_port
from purge_ops.runner import new_worker, run_worker
from tests.support.probes import http, worker
from tests.support.procs import worker_config
from tests.support.servers import RunningTemporal, running_temporal

SESSIONS = '[[targets]]\nkind = "idempotency"\n'
PASSWORD = "s3cret-never-shown"


#: The readiness limit of these tests' workers: they are about what /readyz names, not about
#: READY_WITHIN (2 s), which a new connection or describe_namespace on a loaded machine can
#: outlast. The limit itself is tested where the slowness is made to happen
#: (`test_readyz_names_a_database_that_answers_nothing_within_its_limit`).
PATIENT = 30.0


@pytest.fixture(autouse=True)
def patient_readiness(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every worker `run_worker` starts here checks its readiness within PATIENT seconds."""

    def patient(*args: Any, **kwargs: Any) -> Health:
        kwargs.setdefault("ready_within", PATIENT)
        return Health(*args, **kwargs)

    monkeypatch.setattr(runner, "Health", patient)


def closed_port() -> int:
    [port] = free_ports(1)
    return port


def eu_down(tmp_path: Path, schema_url: str, task_queue: str, port: int) -> Path:
    """A worker config whose database `eu` is `port`, where nothing listens."""
    eu = f"postgresql://purge:{PASSWORD}@127.0.0.1:{port}/app"
    return worker_config(
        tmp_path / "purge.toml",
        schema_url,
        task_queue,
        f'[databases.eu]\nurl = "{eu}"\n\n{SESSIONS}\n'
        '[[targets]]\nkind = "expiring"\nname = "eu_sessions"\ntable = "sessions"\n'
        'column = "expires_at"\ndatabase = "eu"\n',
    )


class TestProbes:
    async def test_a_healthy_worker_is_live_ready_and_serves_its_metrics(
        self, tmp_path: Path, temporal_server: RunningTemporal, schema_url: str, task_queue: str
    ) -> None:
        """/livez and /readyz say 200; /metrics is the SDK's Prometheus page, passed on whole."""
        [port] = free_ports(1)
        config = worker_config(tmp_path / "purge.toml", schema_url, task_queue, SESSIONS)
        async with worker(config, temporal_server, port):
            live, ready = await http(port, "/livez"), await http(port, "/readyz")
            metrics = await http(port, "/metrics")

        assert (live.status, ready.status) == (200, 200)
        assert ready.body == "ready\n"
        assert metrics.status == 200
        assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert int(metrics.headers["content-length"]) == len(metrics.body.encode())
        assert "# TYPE temporal_worker_task_slots_available gauge" in metrics.body

    async def test_readyz_names_the_database_that_is_down_and_nothing_of_its_url(
        self, tmp_path: Path, temporal_server: RunningTemporal, schema_url: str, task_queue: str
    ) -> None:
        """A database that does not answer: 503 naming it by its config name; still live."""
        [port] = free_ports(1)
        config = eu_down(tmp_path, schema_url, task_queue, closed_port())
        async with worker(config, temporal_server, port):
            ready, live = await http(port, "/readyz"), await http(port, "/livez")

        assert ready.status == 503
        assert ready.body == "not ready: database eu did not answer (OperationalError)\n"
        assert live.status == 200

    @pytest.mark.waits
    async def test_readyz_names_temporal_when_it_stops_answering(
        self, tmp_path: Path, schema_url: str, task_queue: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Temporal gone: 503 naming Temporal, and the databases still fine are not named. The
        probes' clock is the test's: the last answer stops being reused when the test says."""
        now = [1000.0]
        monkeypatch.setattr(probing, "time", SimpleNamespace(monotonic=lambda: now[0]))
        [port] = free_ports(1)
        config = worker_config(tmp_path / "purge.toml", schema_url, task_queue, SESSIONS)
        with running_temporal("purge-test-probe-temporal-") as temporal:
            async with worker(config, temporal, port):
                assert (await http(port, "/readyz")).status == 200
                await asyncio.to_thread(temporal.stop, immediate=True)  # as if it crashed
                # Still within the reuse of the last answer: that answer, not a new check.
                assert (await http(port, "/readyz")).status == 200
                now[0] += probing.READY_REUSE * 2  # past the reuse of the last answer
                ready = await http(port, "/readyz")

        assert ready.status == 503
        # Only the kind of the error or the bound: the client's message may carry the address.
        reason = r"not ready: Temporal did not answer( \(\w+\)| within \d+ s)\n"
        assert re.fullmatch(reason, ready.body), ready.body
        assert "database" not in ready.body

    @pytest.mark.waits
    async def test_readyz_names_the_namespace_when_the_server_no_longer_has_it(
        self, tmp_path: Path, schema_url: str, task_queue: str
    ) -> None:
        """The dev server restarted without the worker's namespace: the server answers, the
        worker polls on, and /readyz says the namespace is gone."""
        [port] = free_ports(1)
        config = worker_config(tmp_path / "purge.toml", schema_url, task_queue, SESSIONS)
        with running_temporal("purge-test-probe-ns-", namespaces=["vanishing"]) as temporal:
            async with worker(config, temporal, port, TEMPORAL_NAMESPACE="vanishing"):
                assert (await http(port, "/readyz")).status == 200
                temporal.stop(immediate=True)  # in memory: its namespaces go with it
                temporal.namespaces = ()
                await asyncio.to_thread(temporal.start)
                # Past the reuse of the answer from before the restart, and the client's
                # reconnection, however long that takes.
                async with asyncio.timeout(60):
                    while "namespace" not in (ready := await http(port, "/readyz")).body:
                        await asyncio.sleep(0.1)
                live = await http(port, "/livez")

        assert ready.status == 503
        assert ready.body == "not ready: namespace 'vanishing' not found on Temporal\n"
        assert live.status == 200


class TestRequests:
    """What the port accepts: GET of three paths, nothing read from the request but those."""

    @pytest.fixture
    def eu_port(self) -> int:
        """The port of the database `eu` of the worker `port` serves, where nothing listens."""
        return closed_port()

    @pytest.fixture
    async def port(
        self,
        tmp_path: Path,
        temporal_server: RunningTemporal,
        schema_url: str,
        task_queue: str,
        eu_port: int,
    ) -> AsyncIterator[int]:
        [port] = free_ports(1)
        config = eu_down(tmp_path, schema_url, task_queue, eu_port)
        async with worker(config, temporal_server, port):
            yield port

    async def test_only_get_is_answered(self, port: int) -> None:
        """POST, PUT, DELETE and HEAD get 405 with `Allow: GET`, on every path."""
        for method in ("POST", "PUT", "DELETE", "HEAD"):
            for path in ("/metrics", "/livez", "/readyz"):
                reply = await http(port, path, method)
                assert (reply.status, reply.headers["allow"]) == (405, "GET"), (method, path)

    async def test_other_paths_are_not_found_and_say_nothing(self, port: int) -> None:
        for path in ("/", "/config", "/readyz/../metrics", "/debug/pprof", "/READYZ"):
            reply = await http(port, path)
            assert (reply.status, reply.body) == (404, "not found\n"), path

    async def test_query_and_headers_change_nothing(self, port: int) -> None:
        """`?verbose`, credentials and cookies are not read: the answer is the same line."""
        plain = await http(port, "/readyz")
        dressed = await http(
            port,
            "",
            raw=b"GET /readyz?verbose=1&full=true HTTP/1.1\r\nHost: x\r\n"
            b"Authorization: Bearer t\r\nCookie: a=b\r\n\r\n",
        )
        assert (dressed.status, dressed.body) == (plain.status, plain.body)

    async def test_no_answer_reveals_a_url_password_or_port(self, port: int, eu_port: int) -> None:
        """Not the password, URL, host or port of `eu`, the database that is down (libpq's
        message says 'connection to server at "127.0.0.1", port N failed')."""
        bodies = [(await http(port, p)).body for p in ("/livez", "/readyz", "/nope")]
        metrics = (await http(port, "/metrics")).body
        assert "database eu did not answer" in bodies[1]  # the answer that could reveal it
        for text in [*bodies, metrics]:
            assert PASSWORD not in text
            assert "postgresql://" not in text
            assert "127.0.0.1" not in text
            assert f":{eu_port}" not in text
            assert f"port {eu_port}" not in text
        for text in bodies:
            assert str(eu_port) not in text
        # In /metrics, numbers are samples and bucket bounds (`le`), which may be any number:
        # the port is looked for in the other label values.
        labels = re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', metrics)
        assert labels  # the page has labels to look in
        assert not [(k, v) for k, v in labels if k != "le" and str(eu_port) in v]

    async def test_malformed_and_oversized_requests_are_refused(self, port: int) -> None:
        assert (await http(port, "", raw=b"nonsense\r\n\r\n")).status == 400
        huge = b"GET /livez HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n"
        assert (await http(port, "", raw=huge)).status == 431
        many = b"GET /livez HTTP/1.1\r\n" + b"X: a\r\n" * 200 + b"\r\n"
        assert (await http(port, "", raw=many)).status == 431


async def test_livez_fails_when_a_worker_has_stopped(client: Client, task_queue: str) -> None:
    """Pollers gone while the process lives on: /livez says which task queue's worker stopped."""
    from activities.registry import TargetRegistry

    real = new_worker(client, TargetRegistry([]), task_queue)
    health = Health(workers=[real])
    [port] = free_ports(1)
    probes = ProbeServer(health, loopback_port())
    await probes.start(f"127.0.0.1:{port}")
    try:
        async with real:
            assert (await http(port, "/livez")).status == 200
            await real.shutdown()
            dead = await http(port, "/livez")
            assert (dead.status, dead.body) == (503, f"worker of task queue {task_queue} stopped\n")
        health.stopping = True
        # A worker told to stop is shutting down, not dead.
        assert (await http(port, "/livez")).status == 200
    finally:
        await probes.close()


async def test_a_flood_of_readyz_probes_costs_a_database_one_connection_a_second(
    client: Client, task_queue: str, schema_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Probes at any rate cost each database at most one connection a second: callers at once
    share one check, and its answer is reused for READY_REUSE. The probes' clock is the test's,
    so the second passes when the test says, however slow the machine."""
    from activities.registry import TargetRegistry

    now = [1000.0]
    monkeypatch.setattr(probing, "time", SimpleNamespace(monotonic=lambda: now[0]))
    opened: list[str] = []
    connect = psycopg.AsyncConnection.connect

    async def counting(conninfo: str = "", **kwargs: Any) -> Any:
        if kwargs.get("application_name") == f"{APPLICATION_NAME}-probe":
            opened.append(conninfo)
        return await connect(conninfo, **kwargs)

    monkeypatch.setattr(psycopg.AsyncConnection, "connect", counting)
    real = new_worker(client, TargetRegistry([]), task_queue)
    health = Health(
        databases={"default": schema_url}, client=client, workers=[real], ready_within=PATIENT
    )
    async with real:
        async with asyncio.timeout(30):
            while await health.ready() == "starting":
                await asyncio.sleep(0.01)
        opened.clear()
        now[0] += probing.READY_REUSE * 2  # the answer of the wait above is stale

        assert await asyncio.gather(*(health.ready() for _ in range(20))) == [None] * 20
        assert len(opened) == 1
        now[0] += probing.READY_REUSE / 2
        assert await health.ready() is None
        assert len(opened) == 1
        now[0] += probing.READY_REUSE  # a second and a half after that check
        assert await health.ready() is None
        assert len(opened) == 2


async def test_readyz_names_a_database_that_answers_nothing_within_its_limit(
    client: Client, task_queue: str
) -> None:
    """A database that takes the connection and never says a word (a socket listening, never
    accepting: the kernel completes the handshake) is named with the limit it did not answer
    within, however quick or slow the machine: the silence is certain, not a slow server's."""
    from activities.registry import TargetRegistry

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"postgresql://purge:{PASSWORD}@127.0.0.1:{silent.getsockname()[1]}/app"
        real = new_worker(client, TargetRegistry([]), task_queue)
        # Half a second: psycopg's own connect_timeout (at least 1 s) cannot end it first.
        health = Health(databases={"eu": url}, client=client, workers=[real], ready_within=0.5)
        async with real:
            async with asyncio.timeout(30):
                while (reason := await health.ready()) == "starting":
                    await asyncio.sleep(0.01)

    # Temporal may or may not have answered within half a second: only the database is certain.
    assert reason is not None
    assert "database eu did not answer within 0.5 s" in reason.split("; "), reason
    assert PASSWORD not in reason


@pytest.mark.waits
async def test_livez_is_answered_by_the_worker_s_own_event_loop(
    tmp_path: Path, temporal_server: RunningTemporal, schema_url: str, task_queue: str
) -> None:
    """A loop stuck in a blocking call answers no probe, so the kubelet's timeout restarts the
    container: /livez is no thread of its own that would say 200 over a stuck worker."""
    [port] = free_ports(1)
    config = worker_config(tmp_path / "purge.toml", schema_url, task_queue, SESSIONS)
    async with worker(config, temporal_server, port):
        sent = threading.Event()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            probe = pool.submit(livez_from_a_thread, port, 1.0, sent)
            # The worker's loop (this test's too) stuck, as by a blocking call, from before the
            # probe is sent until its second of waiting for an answer has run out: blocked on
            # the probe itself, so no stall of the probe's thread can outlast the block.
            assert sent.wait(30), "the probe was never sent"
            assert probe.result(timeout=60) is None
        assert (await http(port, "/livez")).status == 200  # the loop free again


def livez_from_a_thread(port: int, within: float, sent: threading.Event) -> bytes | None:
    """The first bytes of /livez's answer, or None if none came `within` seconds of sending
    it (`sent` set then)."""
    with socket.create_connection(("127.0.0.1", port), timeout=within) as sock:
        sock.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        sent.set()
        try:
            return sock.recv(64)
        except TimeoutError:
            return None


async def test_a_taken_port_stops_the_worker_before_it_connects(
    tmp_path: Path, schema_url: str, task_queue: str
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = load_config(
            worker_config(tmp_path / "purge.toml", schema_url, task_queue, SESSIONS)
        )
        with pytest.raises(OSError, match=f"cannot serve metrics and probes at 127.0.0.1:{port}"):
            # 127.0.0.1:1 would refuse: the port's refusal must come first.
            await run_worker(config, temporal_address="127.0.0.1:1", metrics=f"127.0.0.1:{port}")
