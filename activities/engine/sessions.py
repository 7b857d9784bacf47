"""What a worker's memories between passes are keyed by: a connection's view of a database."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection


def session_key(conn: AsyncConnection[Any]) -> tuple[object, ...]:
    """The connection's host, port, database, user and options (such as a search_path):
    connections alike in these see the same tables, by the same names, with the same rights.
    (Not `info.dsn`, which is built anew at each call: a tenth of a millisecond.)"""
    info = conn.info
    return (info.host, info.port, info.dbname, info.user, info.options)
