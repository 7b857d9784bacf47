"""A sweep's session asks both ends to notice a silent peer within about a minute
(`purge_ops.connect.SERVER_KEEPALIVES`, `CLIENT_KEEPALIVES`): the server frees the advisory lock
of a worker whose host vanished, the worker stops waiting on a database server that vanished.
What the server, the role or the URL already set is kept."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool

from purge_ops import connect
from purge_ops.connect import (
    CLIENT_CHECK,
    CLIENT_KEEPALIVES,
    SERVER_KEEPALIVES,
    LazyPool,
    open_pool,
)


def test_both_ends_give_up_on_a_silent_peer_within_about_a_minute() -> None:
    """The module's promise, from its numbers (the tests below check that the session gets
    them): idle, then each unanswered probe, within 60 s; the server's writes time out at 60 s
    too, and it looks for a client gone every 5 s of a running statement."""
    for idle, interval, count in (
        (int(SERVER_KEEPALIVES[f"tcp_keepalives_{k}"]) for k in ("idle", "interval", "count")),
        (CLIENT_KEEPALIVES[f"keepalives_{k}"] for k in ("idle", "interval", "count")),
    ):
        assert idle + interval * count <= 60
    assert int(SERVER_KEEPALIVES["tcp_user_timeout"]) <= 60_000
    assert int(CLIENT_CHECK["client_connection_check_interval"]) <= 5_000


async def server_settings(conn: psycopg.AsyncConnection[Any]) -> dict[str, tuple[str, str]]:
    """Each of SERVER_KEEPALIVES and CLIENT_CHECK in this session: (its value, where it came
    from)."""
    cur = await conn.execute(
        "SELECT name, setting, source FROM pg_settings WHERE name = ANY(%s)",
        ([*SERVER_KEEPALIVES, *CLIENT_CHECK],),
    )
    return {name: (setting, source) for name, setting, source in await cur.fetchall()}


def on_tcp(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether the session came over TCP (the server reads its keepalives as 0 on a socket)."""
    return not conn.info.host.startswith("/")


async def session_of(
    pool: AsyncConnectionPool[Any] | LazyPool,
) -> tuple[dict[str, tuple[str, str]], dict[str, str], bool]:
    """A session of `pool`, closed after: its server settings, libpq's parameters and whether
    it came over TCP."""
    try:
        async with pool.connection() as conn:
            return await server_settings(conn), conn.info.get_parameters(), on_tcp(conn)
    finally:
        await pool.close()


async def test_a_pool_s_session_probes_a_silent_peer_at_both_ends(schema_url: str) -> None:
    server, client, tcp = await session_of(await open_pool(schema_url))

    assert {name: source for name, (_, source) in server.items()} == dict.fromkeys(
        [*SERVER_KEEPALIVES, *CLIENT_CHECK], "session"
    )
    values = {name: value for name, (value, _) in server.items()}
    assert {name: values[name] for name in CLIENT_CHECK} == CLIENT_CHECK
    if tcp:
        assert values == {**SERVER_KEEPALIVES, **CLIENT_CHECK}
    assert {k: client.get(k) for k in CLIENT_KEEPALIVES} == {
        k: str(v) for k, v in CLIENT_KEEPALIVES.items()
    }


async def test_what_the_url_or_the_role_sets_is_kept(
    schema_url: str, db: psycopg.Connection[Any], role: str
) -> None:
    """The URL's own `keepalives_idle` and its `options` (-c tcp_keepalives_idle), and the
    role's own tcp_user_timeout; the rest as the package sets them. A database routed by
    `[databases.NAME]` (LazyPool) the same."""
    db.execute(f'ALTER ROLE "{role}" SET tcp_user_timeout = 90000')
    url = make_conninfo(
        schema_url, user=role, keepalives_idle=45, options="-c tcp_keepalives_idle=50"
    )
    server, client, tcp = await session_of(LazyPool("eu", url))

    assert server["tcp_keepalives_idle"][1] == "client"
    assert server["tcp_user_timeout"][1] == "user"
    assert server["tcp_keepalives_count"][1] == "session"
    if tcp:
        assert server["tcp_keepalives_idle"][0] == "50"
        assert server["tcp_user_timeout"][0] == "90000"
    assert (client.get("keepalives_idle"), client.get("keepalives_count")) == ("45", "3")


async def test_a_server_refusing_the_client_check_keeps_the_keepalives(
    schema_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A server whose platform cannot look at a client mid-statement (Windows) refuses
    client_connection_check_interval above 0: played here by a statement the server refuses.
    The keepalives, set apart, are still set, and the refusal is one warning."""
    monkeypatch.setattr(
        connect,
        "_SET_CLIENT_CHECK",
        "SELECT set_config('client_connection_check_interval', 'no number', false)",
    )
    with caplog.at_level(logging.WARNING, logger=connect.log.name):
        server, _, _ = await session_of(await open_pool(schema_url))

    assert {name: server[name][1] for name in SERVER_KEEPALIVES} == dict.fromkeys(
        SERVER_KEEPALIVES, "session"
    )
    assert server["client_connection_check_interval"][1] == "default"
    [said] = [r.getMessage() for r in caplog.records if "client_connection_check" in r.getMessage()]
    assert said.startswith(
        "the session's client_connection_check_interval was left as the server has it: "
    )
