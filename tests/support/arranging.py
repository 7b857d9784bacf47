"""The connection a test arranges rows with, whose VACUUM and ANALYZE count them once."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from activities.engine.batch_sql import flush_statistics, flushes_statistics

#: The statements that set a table's live and dead tuples in the statistics views from the
#: table itself.
SETS_COUNTS = ("VACUUM", "ANALYZE", "ANALYSE")


class ArrangingConnection(psycopg.Connection[Any]):
    """An autocommit connection whose VACUUM or ANALYZE first flushes its own statistics.

    On PostgreSQL 15+ a session flushes its counts of the rows it inserted and deleted to the
    statistics views as it goes idle, at most once a second: counts made within a second of its
    last flush wait, up to ten seconds while it stays idle. A VACUUM or ANALYZE sets the table's
    live rows from the table itself, and counts flushed after it are added again: 40,000 rows
    read as 80,250 on CI's machine, where the flush came after the VACUUM and before the test's
    read. Asked to flush (`pg_stat_force_next_flush()`), the session does so as it goes idle,
    before the VACUUM or ANALYZE is sent. Only a statement that begins with one is seen: not one
    later in a string of statements, nor one sent through a cursor.
    """

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        if flushes_statistics(self) and _sets_counts(self, query):
            super().execute(flush_statistics())
        return super().execute(query, params, **kwargs)


def _sets_counts(conn: psycopg.Connection[Any], query: Any) -> bool:
    if isinstance(query, sql.Composable):
        text = query.as_string(conn)
    elif isinstance(query, bytes):
        text = query.decode()
    else:
        text = str(query)
    return text.lstrip().upper().startswith(SETS_COUNTS)


def arranging(url: str) -> ArrangingConnection:
    """An autocommit `ArrangingConnection` to `url`, for `with`."""
    return ArrangingConnection.connect(url, autocommit=True)
