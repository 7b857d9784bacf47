"""Connections to the two servers a worker needs, configured the way each one's users expect."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import re
import select
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from temporalio.api.failure.v1 import Failure
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.converter import DataConverter, DefaultFailureConverter, PayloadConverter
from temporalio.envconfig import ClientConfig, ClientConnectConfig
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.service import RPCError, RPCStatusCode, TLSConfig

from activities.metrics import PASS_SECONDS, TARGET_SECONDS
from purge_config.dsn import redact
from purge_config.errors import ConfigError, first_line, server_details, without_row_values
from purge_config.values import hidden, masked

log = logging.getLogger("purge.connect")

DEFAULT_TEMPORAL_ADDRESS = "localhost:7233"
APPLICATION_NAME = "temporal-pg-purge"

#: Bucket bounds (seconds) of our histograms: the SDK's default for a float histogram starts at
#: 50, which puts every sweep and most passes in the first bucket and makes any p95 read 50.
SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
HISTOGRAM_BUCKETS = {
    TARGET_SECONDS.name: SECONDS_BUCKETS,
    PASS_SECONDS.name: (*SECONDS_BUCKETS, 7200, 14400),
}


#: Characters of a failure's stack trace kept, its innermost frames (where it was raised). The
#: server keeps a retrying activity's last failure only up to 4 KB, stack trace and causes
#: included, and past that shows "Failure exceeds size limit." instead of the message: a deep
#: stack (the SDK's frames, interceptors, long install paths) must not hide why a sweep failed.
STACK_TRACE_KEPT = 800


class TrimmedStackFailures(DefaultFailureConverter):
    """Failures as Temporal's default converter makes them, each stack trace in the cause
    chain cut to its last STACK_TRACE_KEPT characters, and each message without a server
    error's DETAIL (`without_row_values`: it may quote a row's values, which must not reach a
    history); types untouched."""

    def to_failure(
        self, exception: BaseException, payload_converter: PayloadConverter, failure: Failure
    ) -> None:
        super().to_failure(exception, payload_converter, failure)
        details = server_details(exception)
        current: Failure | None = failure
        while current is not None:
            if len(current.stack_trace) > STACK_TRACE_KEPT:
                current.stack_trace = "...\n" + current.stack_trace[-STACK_TRACE_KEPT:]
            current.message = without_row_values(current.message, details)
            current = current.cause if current.HasField("cause") else None


#: The data converter of every client this package connects: the default one, stack traces
#: trimmed (see TrimmedStackFailures).
DATA_CONVERTER = dataclasses.replace(
    DataConverter.default, failure_converter_class=TrimmedStackFailures
)


def trimming_failures(client: Client) -> Client:
    """`client` when its failures' stack traces are trimmed (`connect_temporal`'s are), else a
    client on the same connection, its converter the same but for that: what every worker this
    package starts reports failures through, whoever connected the client it was given."""
    converter = client.data_converter
    if issubclass(converter.failure_converter_class, TrimmedStackFailures):
        return client
    config = client.config()
    config["data_converter"] = dataclasses.replace(
        converter, failure_converter_class=TrimmedStackFailures
    )
    return Client(**config)


def temporal_settings(address: str | None = None, namespace: str | None = None) -> Any:
    """The client's settings from Temporal's own conventions (`connect_temporal`), or a
    ConfigError for what is wrong in them: read before anything connects (`run` opens its
    database pools first), so that a bad TEMPORAL_ADDRESS is said as such."""
    try:
        # Temporal's variables as Python holds them (the same as the process's, but where a
        # caller in this process set `os.environ` alone: tests/support/procs.use_env); only
        # theirs, as the SDK would read (any other may not be UTF-8, which it refuses). The
        # default temporal.toml is still found by the process's HOME.
        settings = ClientConfig.load_client_connect_config(
            override_env_vars={k: v for k, v in os.environ.items() if k.startswith("TEMPORAL_")}
        )
    except Exception as err:
        # An unknown TEMPORAL_PROFILE or a malformed temporal.toml: the operator's to fix.
        # The SDK's TOML errors quote the line with a caret under it: its first line says it.
        raise ConfigError(f"Temporal environment configuration: {first_line(err)}") from None
    if address:
        settings["target_host"] = address
    if namespace:
        settings["namespace"] = namespace
    settings.setdefault("target_host", DEFAULT_TEMPORAL_ADDRESS)
    check_temporal_address(settings["target_host"])
    return settings


def check_temporal_address(address: str) -> None:
    """A ConfigError unless `address` is a HOST:PORT the way Temporal's settings give one."""
    if "://" in address:
        # The SDK takes `http://host:port` with a warning (an error in its future versions)
        # and does not read `https://` as TLS: say what it wants instead of either.
        raise ConfigError(
            f"Temporal address {_address(address)}: give HOST:PORT, without a scheme "
            "(TLS is set by TEMPORAL_TLS or a profile in temporal.toml)"
        )
    if "@" in address:
        # No user info goes in Temporal's address (its key has a variable of its own): most
        # likely a database's URL without its scheme, said by its length and refused here.
        raise ConfigError(
            f"Temporal address {_address(address)} (TEMPORAL_ADDRESS, or a profile's address) "
            "holds an @: give HOST:PORT (an API key is TEMPORAL_API_KEY)"
        )
    if not _has_port(address):
        # The SDK would take `host` as port 80 (443 with TLS) and fail only at connect time,
        # a status-1 "cannot reach" for what is a setting to fix.
        raise ConfigError(
            f"Temporal address {_address(address)} (TEMPORAL_ADDRESS, or a profile's address) "
            f"has no port from 1 to 65535: give HOST:PORT, like {DEFAULT_TEMPORAL_ADDRESS!r}"
        )


def _address(address: str, quote: bool = True) -> str:
    """`address` as a message says it (quoted, with `quote`): whole, but where it may hold a
    password (user info's `@`, a secret's keyword: a database's URL pasted into
    TEMPORAL_ADDRESS), only its length."""
    schemeless = address.replace("://", "", 1)
    if "@" in address or masked(schemeless) != schemeless:
        return hidden(address)
    return repr(address) if quote else address


def _has_port(address: str) -> bool:
    """Whether `address` ends in `:PORT`, a port from 1 to 65535, after the brackets of an IPv6
    literal (`[::1]:7233`). Out of range, the SDK refused it only as it connected: for `run`,
    after its database pool had waited to connect."""
    host, colon, port = address.rpartition(":")
    return bool(host and colon and port.isdigit() and port.isascii() and 0 < int(port) < 65536)


async def connect_temporal(
    address: str | None = None,
    namespace: str | None = None,
    metrics: str | None = None,
) -> Client:
    """A client from Temporal's own conventions (TEMPORAL_ADDRESS, profiles in temporal.toml, TLS,
    API key), `address` and `namespace` overriding them, `localhost:7233` when nothing is set.

    With `metrics` (HOST:PORT), the client's runtime serves Prometheus metrics there: the SDK's
    own and those the activities record (`purge_rows_removed`, `purge_target_seconds`).
    """
    settings = temporal_settings(address, namespace)
    runtime: Runtime | None = None
    if metrics is not None:
        prometheus = PrometheusConfig(
            bind_address=metrics, histogram_bucket_overrides=HISTOGRAM_BUCKETS
        )
        # Every series names the worker that served it, as Temporal knows it (the SDK's default
        # identity, pid@host): with workers next to several databases, one query tells them apart.
        worker = f"{os.getpid()}@{socket.gethostname()}"
        runtime = Runtime(
            telemetry=TelemetryConfig(metrics=prometheus, global_tags={"worker": worker})
        )
    try:
        client = await Client.connect(**settings, runtime=runtime, data_converter=DATA_CONVERTER)
    except ValueError as err:
        # An address the SDK cannot make a URL of (`[::1`): the setting is wrong.
        raise ConfigError(
            f"Temporal address {_address(settings['target_host'])}: not a HOST:PORT the client "
            f"takes ({str(err).splitlines()[0] if str(err) else 'invalid'})"
        ) from None
    except RuntimeError as err:
        # The SDK reports every failed connect as a RuntimeError holding the Rust client's
        # debug text (a tonic Status with its HTTP headers); the operator needs the setting.
        raise ConnectionError(why_unreachable(settings, str(err))) from err
    return client


async def require_namespace(client: Client) -> None:
    """The server's NOT_FOUND RPCError when it has no namespace of `client`'s name, said as
    each command says a refusal. Asked by `run` before its workers start: they find the
    namespace missing only as they start, each raising it as a RuntimeError (a traceback) and
    cancelling the others; every other command meets the NOT_FOUND in its own first call. Any
    other refusal of the question (a key not allowed it) is left to the calls that follow,
    which meet it only if it matters to them."""
    try:
        await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=client.namespace)
        )
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise
        log.debug("describing namespace %r was refused: %s", client.namespace, err.message)


#: A gRPC status inside the SDK's connect error: `Status { code: Unauthenticated, message: "..."`.
_STATUS = re.compile(r'Status \{ code: (\w+), message: "((?:[^"\\]|\\.)*)"')


def why_unreachable(settings: ClientConnectConfig, error: str) -> str:
    """One line saying why Temporal at `settings`' address did not take the connection, from
    the SDK's connect error, and which of Temporal's variables sets what was missing."""
    address = settings.get("target_host", DEFAULT_TEMPORAL_ADDRESS)
    where = f"cannot reach Temporal at {_address(address, quote=False)}"
    tls = settings.get("tls")
    status = _STATUS.search(error)
    code, message = (status.group(1), status.group(2)) if status else ("", "")
    if "UnknownIssuer" in error:
        return (
            f"{where}: its TLS certificate is signed by a CA this client does not trust; "
            "set TEMPORAL_TLS_SERVER_CA_CERT_PATH to that CA's certificate"
        )
    if code == "Unauthenticated":
        sent = (
            "the API key it was sent (TEMPORAL_API_KEY, or a profile's api_key) was refused"
            if settings.get("api_key")
            else "no API key is set (TEMPORAL_API_KEY)"
        )
        return f"{where}: unauthenticated ({message}): {sent}"
    if "400 Bad Request" in error and not (isinstance(tls, TLSConfig) and tls.client_cert):
        # How nginx verifying clients (ssl_verify_client) answers a call without a certificate.
        return (
            f"{where}: it answered HTTP 400 Bad Request, not gRPC, and this client sent no "
            "certificate; if it requires mTLS, set TEMPORAL_TLS_CLIENT_CERT_PATH and "
            "TEMPORAL_TLS_CLIENT_KEY_PATH"
        )
    if status:
        return f"{where}: {code}: {message}"
    return f"{where}: {' '.join(error.split())}"


async def check_unless_quiet(conn: AsyncConnection[Any]) -> None:
    """The pool's check of a connection before it lends it: a round trip only when the server
    has said something since the connection went idle. A server that restarted, or that ended
    the session (pg_terminate_backend, idle_session_timeout), sent its last message and closed
    the socket: the socket is then readable, the check's empty query fails, and the pool opens
    another connection. A quiet socket is lent as it is: the check's round trip was one of the
    sweep's own (docs/decisions/round-trips.md). A peer gone without a word (a cable cut) is
    found once the socket's keepalive probes go unanswered (CLIENT_KEEPALIVES, about a minute),
    which makes it readable; before that, neither finds it."""
    if conn.closed or _readable(conn.fileno()):
        await AsyncConnectionPool.check_connection(conn)


def _readable(fd: int) -> bool:
    """Whether the socket `fd` holds something to read (data, the peer's close, an error), now.
    poll, not select: a worker with many pools may hold descriptors past select's 1024."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


#: The server's TCP settings for a sweep's session, where the server, the role and the URL
#: leave them at their defaults (pg_settings.source): the server probes a silent client after
#: 30 s, every 10 s, and drops it after 3 unanswered probes or 60 s of unacknowledged data.
#: A sweep holds its table's advisory lock in its session: a worker whose host vanished
#: (powered off, cut off) would hold it until the operating system's defaults gave up, about
#: 2 h 11 min on Linux, every pass reporting the table busy meanwhile.
SERVER_KEEPALIVES = {
    "tcp_keepalives_idle": "30",
    "tcp_keepalives_interval": "10",
    "tcp_keepalives_count": "3",
    "tcp_user_timeout": "60000",
}
#: And, the same way, while a statement runs the server looks every 5 s whether its client is
#: still there: a killed worker's lock goes with its socket at once between statements, but
#: mid-statement (a batch waiting for a row) only as the statement ended, up to its
#: statement_timeout. Set apart (PostgreSQL 14 on): a server whose platform cannot look refuses
#: any value but 0 (Windows), and that refusal must not cost the keepalives.
CLIENT_CHECK = {"client_connection_check_interval": "5000"}
#: libpq's own, the same way round: the worker finds a database server that vanished mid-sweep
#: in about a minute, not two hours. A URL's own `keepalives*` parameters are kept.
CLIENT_KEEPALIVES = {"keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}


def _set_where_default(settings: dict[str, str]) -> str:
    """The statement that sets each of `settings` in the session where it is at its default
    (a setting this server does not have is skipped)."""
    return (
        "SELECT set_config(s.name, v.value, false) FROM pg_settings s JOIN (VALUES "
        + ", ".join(f"('{name}', '{value}')" for name, value in settings.items())
        + ") AS v (name, value) USING (name) WHERE s.source = 'default'"
    )


_SET_SERVER_KEEPALIVES = _set_where_default(SERVER_KEEPALIVES)
_SET_CLIENT_CHECK = _set_where_default(CLIENT_CHECK)


def pool_kwargs(url: str) -> dict[str, Any]:
    """The connection parameters a pool adds to `url`: autocommit, the application's name and
    CLIENT_KEEPALIVES where the URL sets none of its own."""
    try:
        given = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        given = {}  # libpq refuses it as the pool connects, said there as before
    keep = {k: v for k, v in CLIENT_KEEPALIVES.items() if k not in given}
    return {"autocommit": True, "application_name": APPLICATION_NAME, **keep}


async def keep_alive(conn: AsyncConnection[Any]) -> None:
    """A new session's SERVER_KEEPALIVES and CLIENT_CHECK (the pool's `configure`): two round
    trips a session, which the pool keeps a day. The keepalives are ignored by the server on a
    Unix socket. A server that refuses either (a proxy's own rules, a platform that cannot look
    at a client) leaves the session as it was for it, said in the log: the sweep needs the
    session more than the probes."""
    for statement, what in (
        (_SET_SERVER_KEEPALIVES, "TCP keepalives were left as the server has them"),
        (_SET_CLIENT_CHECK, "client_connection_check_interval was left as the server has it"),
    ):
        try:
            await conn.execute(statement)
        except psycopg.DatabaseError as err:
            if conn.broken:
                raise  # the connection itself failed: the pool makes another
            log.warning("the session's %s: %s", what, err)


#: How long a pool keeps a session (psycopg_pool takes up to 5% off it). psycopg_pool's own
#: default is an hour, which the hourly pass a schedule fires always outlived: each pass went
#: on a session the pool had just opened to replace the last, and paid again for what a warm
#: one keeps (its prepared catalog reads, its caches): 7 ms more of a steady hour's 62
#: (bench/README.md, case 12 on a new session). A day keeps 23 passes of 24 warm; a server
#: restart or a dropped socket is still found before lending (`check_unless_quiet`).
SESSION_LIFETIME_S = 24 * 3600.0


async def open_pool(
    url: str, *, max_size: int = 4, wait_seconds: float = 30.0
) -> AsyncConnectionPool[Any]:
    """An open pool whose first connection has been made, or an error naming the (redacted) URL.

    Connections are autocommit: every sweep statement runs in a transaction of its own making.
    """
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        url,
        open=False,
        min_size=1,
        max_size=max_size,
        name="purge",
        max_lifetime=SESSION_LIFETIME_S,
        kwargs=pool_kwargs(url),
        configure=keep_alive,
        # A server restarted under us leaves dead sockets in the pool: test before lending.
        check=check_unless_quiet,
    )
    await pool.open()
    held = _HeldAttempts()
    _POOL_LOG.addFilter(held)
    try:
        await pool.wait(timeout=wait_seconds)
    except Exception as err:
        await pool.close()
        why = f": {held.last}" if held.last else ""
        raise ConnectionError(
            f"cannot connect to {redact(url)} within {wait_seconds:g} s{why}"
        ) from err
    except BaseException:  # cancelled while it waits (a worker stopped as it starts)
        await pool.close()
        raise
    finally:
        _POOL_LOG.removeFilter(held)
    return pool


#: psycopg_pool's logger: it warns, in two lines, at each failed attempt to connect.
_POOL_LOG = logging.getLogger("psycopg.pool")


class _HeldAttempts(logging.Filter):
    """Holds back the pool's warnings while a worker waits for its first connection (the wait's
    end says in one line whether it came), keeping the last reason libpq gave."""

    def __init__(self) -> None:
        super().__init__()
        self.last = ""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        # "error connecting in 'purge': connection failed: <libpq's first line>"
        self.last = message.splitlines()[0].rpartition("connection failed: ")[2] if message else ""
        return False


class LazyPool:
    """A pool for a `[databases.NAME]`: opened when a sweep first needs it, so a worker starts
    (and sweeps every other database) while this one is down; the sweep that needs it fails
    alone, and Temporal retries it."""

    def __init__(self, name: str, url: str, *, max_size: int = 4, wait_seconds: float = 10.0):
        self.name, self.url, self.wait_seconds = name, url, wait_seconds
        self._pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            url,
            open=False,
            min_size=1,
            max_size=max_size,
            name=f"purge-{name}",
            max_lifetime=SESSION_LIFETIME_S,
            kwargs=pool_kwargs(url),
            configure=keep_alive,
            check=check_unless_quiet,
            timeout=wait_seconds,
        )
        self._opening = asyncio.Lock()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A connection from the pool, opening the pool first if this is its first use."""
        async with self._opening:
            if self._pool.closed:
                await self._pool.open(wait=False)
        try:
            async with self._pool.connection() as conn:
                yield conn
        except PoolTimeout as err:
            # The pool's message names no URL; ours names it, without its password.
            raise ConnectionError(
                f"database {self.name} ({redact(self.url)}) gave no connection within "
                f"{self.wait_seconds:.0f} s"
            ) from err

    async def close(self) -> None:
        if not self._pool.closed:
            await self._pool.close()


def lazy_pools(
    urls: Mapping[str, str], wait_seconds: float = 10.0, max_size: int = 4
) -> dict[str, LazyPool]:
    """One lazily opened pool per named database, each waiting at most `wait_seconds` for a
    connection: a database that is down fails its sweep's attempt then, and Temporal retries."""
    return {
        name: LazyPool(name, url, wait_seconds=wait_seconds, max_size=max_size)
        for name, url in urls.items()
    }
