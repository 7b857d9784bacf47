"""The worker's HTTP port (`metrics = "HOST:PORT"`): Prometheus metrics and a supervisor's probes.

- `/metrics`: the Temporal runtime's Prometheus output (the SDK's metrics and ours), which the
  runtime serves on a loopback port of its own; this server passes it on.
- `/livez`: 200 while this event loop answers and every worker's pollers run.
- `/readyz`: 200 when Temporal (its namespace found) and every database this worker sweeps
  answered within `READY_WITHIN`; else 503 and one line naming what did not (a database by its
  config name, `default` for `database_url`; the namespace by name), never a URL.

A tiny HTTP/1.1 server on `asyncio.start_server`, so the port needs no dependency. It reads the
request line and skips the headers (bounded in size and time), acts on the method and the path
only, answers GET alone (405 otherwise) and closes every connection after one answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus

import psycopg
from temporalio.api.enums.v1 import NamespaceState
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest, GetSystemInfoRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

from purge_ops.connect import APPLICATION_NAME
from purge_ops.ports import free_ports

#: How long Temporal and each database get to answer a readiness check. Shorter than the probe
#: timeout of the shipped Deployment (5 s), so a slow database is reported by name rather than
#: as the kubelet's timeout.
READY_WITHIN = 2.0
#: A readiness answer is reused this long, so a flood of probes costs the databases one
#: connection a second at most.
READY_REUSE = 1.0
#: How long a client may take to send its request line and headers.
REQUEST_WITHIN = 5.0
#: Longest request line or header line read; longer gets 431 (real probes send ~100 bytes).
LINE_LIMIT = 8192
MAX_HEADER_LINES = 100
#: How long the runtime's own endpoint may take to render /metrics.
METRICS_WITHIN = 10.0

DEFAULT_DATABASE = "default"
"""The name `/readyz` gives the database of `database_url`."""


@dataclass
class Health:
    """What the probes report on: set up before the worker connects, filled in as it starts."""

    databases: Mapping[str, str] = field(default_factory=dict)
    """Each database this worker sweeps, by config name, with its URL (used, never shown)."""
    client: Client | None = None
    workers: Sequence[Worker] = ()
    stopping: bool = False
    ready_within: float = READY_WITHIN
    _answer: tuple[float, str | None] | None = None
    _checking: asyncio.Lock = field(default_factory=asyncio.Lock)

    def live(self) -> str | None:
        """Why the worker is not alive, or None when it is (also while it starts or stops)."""
        if self.stopping:
            return None
        # `is_shutdown`, not `not is_running`: a worker just entered still validates with the
        # server before it starts polling, and is starting, not dead.
        stopped = [w.task_queue for w in self.workers if w.is_shutdown]
        if stopped:
            return f"worker of task queue {', '.join(stopped)} stopped"
        return None

    async def ready(self) -> str | None:
        """Why the worker is not ready, or None when Temporal and every database answered."""
        if self.stopping:
            return "stopping"
        if dead := self.live():
            return dead
        if self.client is None or not self.workers or not all(w.is_running for w in self.workers):
            return "starting"
        async with self._checking:  # one check at a time; callers meanwhile share its answer
            if self._answer and time.monotonic() - self._answer[0] < READY_REUSE:
                return self._answer[1]
            checks = [self._temporal(self.client)] + [
                self._database(name, url) for name, url in self.databases.items()
            ]
            failed = [reason for reason in await asyncio.gather(*checks) if reason]
            reason = "; ".join(failed) or None
            self._answer = (time.monotonic(), reason)
            return reason

    async def _temporal(self, client: Client) -> str | None:
        # The namespace, not only the server: a worker whose namespace is gone (a dev server
        # restarted without it, a namespace deleted) polls on and logs only the SDK's retries.
        namespace = DescribeNamespaceRequest(namespace=client.namespace)
        try:
            async with asyncio.timeout(self.ready_within):
                try:
                    found = await client.workflow_service.describe_namespace(namespace)
                except RPCError as err:
                    if err.status == RPCStatusCode.NOT_FOUND:
                        return f"namespace {client.namespace!r} not found on Temporal"
                    if err.status != RPCStatusCode.PERMISSION_DENIED:
                        raise
                    # A key that may not describe its namespace: the server's answer will do.
                    await client.workflow_service.get_system_info(GetSystemInfoRequest())
                    return None
        except TimeoutError:
            return f"Temporal did not answer within {self.ready_within:g} s"
        except Exception as err:
            # The error's text may name the server's address: its kind says enough.
            return f"Temporal did not answer ({type(err).__name__})"
        if found.namespace_info.state == NamespaceState.NAMESPACE_STATE_DELETED:
            return f"namespace {client.namespace!r} is being deleted on Temporal"
        return None

    async def _database(self, name: str, url: str) -> str | None:
        # A connection of its own, not one of the sweeps' pools: a probe neither waits behind
        # a busy pool nor opens the lazy pool of a database no pass has needed yet.
        try:
            async with asyncio.timeout(self.ready_within):
                conn = await psycopg.AsyncConnection.connect(
                    url,
                    autocommit=True,
                    application_name=f"{APPLICATION_NAME}-probe",
                    connect_timeout=max(1, round(self.ready_within)),
                )
                async with conn:
                    await conn.execute("SELECT 1")
        except TimeoutError:
            return f"database {name} did not answer within {self.ready_within:g} s"
        except Exception as err:
            # psycopg's message names the host and port, sometimes the user: only its kind.
            return f"database {name} did not answer ({type(err).__name__})"
        return None


class ProbeServer:
    """The HTTP server on the configured address; `upstream` is the runtime's metrics port."""

    def __init__(self, health: Health, upstream: tuple[str, int]) -> None:
        self.health = health
        self.upstream = upstream
        self._server: asyncio.Server | None = None

    async def start(self, address: str) -> None:
        """Listen on `address` (HOST:PORT), or raise OSError saying which address is taken."""
        host, port = split_address(address)
        try:
            self._server = await asyncio.start_server(self._serve, host, port, limit=LINE_LIMIT)
        except OSError as err:
            raise OSError(
                err.errno, f"cannot serve metrics and probes at {address}: {err.strerror}"
            ) from None

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                async with asyncio.timeout(REQUEST_WITHIN):
                    method, path = await _read_request(reader)
            except _Refused as refused:
                await _answer(writer, refused.status, refused.status.phrase)
                return
            except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
                return
            await self._route(writer, method, path)
        except ConnectionError:
            pass  # the client left before its answer
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _route(self, writer: asyncio.StreamWriter, method: str, path: str) -> None:
        if path not in ("/metrics", "/livez", "/readyz"):
            await _answer(writer, HTTPStatus.NOT_FOUND, "not found")
        elif method != "GET":
            await _answer(writer, HTTPStatus.METHOD_NOT_ALLOWED, "GET only", allow="GET")
        elif path == "/livez":
            dead = self.health.live()
            await _answer(writer, HTTPStatus.SERVICE_UNAVAILABLE if dead else HTTPStatus.OK, dead)
        elif path == "/readyz":
            reason = await self.health.ready()
            status = HTTPStatus.SERVICE_UNAVAILABLE if reason else HTTPStatus.OK
            await _answer(writer, status, f"not ready: {reason}" if reason else "ready")
        else:
            await self._metrics(writer)

    async def _metrics(self, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(METRICS_WITHIN):
                content_type, body = await _fetch_metrics(*self.upstream)
        except (OSError, TimeoutError, ValueError):
            await _answer(writer, HTTPStatus.SERVICE_UNAVAILABLE, "metrics not available yet")
            return
        await _answer(writer, HTTPStatus.OK, body, content_type=content_type)


class _Refused(Exception):
    def __init__(self, status: HTTPStatus) -> None:
        self.status = status


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str]:
    """The method and the path (without its query) of a request; its headers read and dropped."""
    try:
        line = await reader.readuntil(b"\n")
        for _ in range(MAX_HEADER_LINES):
            if (await reader.readuntil(b"\n")).strip() == b"":
                break
        else:
            raise _Refused(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE)
    except asyncio.LimitOverrunError:
        raise _Refused(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE) from None
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _Refused(HTTPStatus.BAD_REQUEST)
    return parts[0], parts[1].split("?", 1)[0]


async def _answer(
    writer: asyncio.StreamWriter,
    status: HTTPStatus,
    body: str | bytes | None,
    *,
    content_type: str = "text/plain; charset=utf-8",
    allow: str | None = None,
) -> None:
    data = body if isinstance(body, bytes) else ((body or status.phrase) + "\n").encode()
    head = [
        f"HTTP/1.1 {status.value} {status.phrase}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(data)}",
        "Cache-Control: no-store",
        "Connection: close",
    ]
    if allow:
        head.append(f"Allow: {allow}")
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + data)
    await writer.drain()


async def _fetch_metrics(host: str, port: int) -> tuple[str, bytes]:
    """The runtime's Prometheus page: HTTP/1.0, so it comes whole (no chunks) and then closes."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        await writer.drain()
        raw = await reader.read()
    finally:
        writer.close()
    head, sep, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    if not sep or len(lines[0].split()) < 2 or lines[0].split()[1] != "200":
        raise ValueError(f"the runtime's metrics endpoint answered {lines[0]!r}")
    content_type = "text/plain; version=0.0.4"
    for line in lines[1:]:
        key, _, value = line.partition(":")
        if key.strip().lower() == "content-type":
            content_type = value.strip()
    return content_type, body


def split_address(address: str) -> tuple[str, int]:
    """`HOST:PORT` (`[::1]:9464` for IPv6) as a host and a port."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def loopback_port() -> tuple[str, int]:
    """A free port on 127.0.0.1 for the runtime's own metrics endpoint, which only this server
    reads (a port taken between here and the runtime's bind fails the worker's start: chosen
    where outgoing connections, the worker's own among them, are never given one)."""
    [port] = free_ports(1)
    return "127.0.0.1", port
