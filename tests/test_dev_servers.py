"""The servers the tests, the bench and `worker.py dev` start (`purge_dev.servers`): what they
do when the machine is busy beside them."""

from __future__ import annotations

import contextlib
import shutil
import socket
import urllib.request
from collections.abc import Iterator

import psycopg

from purge_dev.servers import EmbeddedPostgres, TemporalDevServer
from tests.support.servers import scratch_dir


@contextlib.contextmanager
def bound(port: int) -> Iterator[int]:
    """`port` bound and listened on meanwhile, as another server beside the test would: yields
    it, so the test can tell the server chose another."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        yield port


def test_a_dev_server_whose_chosen_port_was_bound_meanwhile_starts_on_others() -> None:
    """Its four ports are chosen free, then bound by the server a moment later: a server of a
    test beside it can bind one in between (seen in a default run: `can't set metrics port ...:
    address already in use`, the test failing at its fixture). The first start chooses again."""
    base = scratch_dir("purge-test-ports-")
    server = TemporalDevServer(base)
    try:
        with bound(server.metrics_port) as blocked:
            server.start()
        assert server.metrics_port != blocked
        url = f"http://127.0.0.1:{server.http_port}/api/v1/namespaces/default"
        with urllib.request.urlopen(url, timeout=5) as reply:
            assert reply.status == 200
    finally:
        server.stop(immediate=True)
        shutil.rmtree(base, ignore_errors=True)


def test_an_embedded_postgres_whose_chosen_port_was_bound_meanwhile_starts_on_another() -> None:
    """Its port is chosen free when it is made and bound only once its cluster is there (a copy,
    initdb, pg_basebackup): another server can bind it in between. The first start chooses
    again; a restart keeps the port it started on."""
    base = scratch_dir("purge-test-ports-")
    server = EmbeddedPostgres(base)
    try:
        with bound(server.port) as blocked:
            server.start()
        assert server.port != blocked
        with psycopg.connect(server.url()) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        started_on = server.port
        server.stop()
        server.start()
        assert server.port == started_on
    finally:
        server.remove()
        shutil.rmtree(base, ignore_errors=True)
