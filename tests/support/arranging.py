"""The connection a test arranges rows with, whose VACUUM and ANALYZE count them once."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

#: The statements that set a table's live and dead tuples in the statistics views from the
#: table itself.
SETS_COUNTS = ("VACUUM", "ANALYZE")


class ArrangingConnection(psycopg.Connection[Any]):
    """An autocommit connection whose VACUUM or ANALYZE first flushes its own statistics.

    PostgreSQL 15+ holds a session's counts of its inserts and deletes for up to a second before
    they reach the views (a session flushes at most once a second). A VACUUM or ANALYZE in that
    second sets the table's live rows from the table, and the counts flushed after it are then
    added again: 40,000 rows read as 80,000, but only on a machine quick enough to get from its
    INSERT to its ANALYZE within the second. Asked to flush (`pg_stat_force_next_flush`), the
    session does so as it goes idle, before the VACUUM or ANALYZE is sent.
    """

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:  # type: ignore[override]
        text = query.as_string(self) if isinstance(query, sql.Composable) else str(query)
        if text.lstrip().upper().startswith(SETS_COUNTS):
            super().execute("SELECT pg_stat_force_next_flush()")
        return super().execute(query, params, **kwargs)


def arranging(url: str) -> ArrangingConnection:
    """An autocommit `ArrangingConnection` to `url`, for `with`."""
    return ArrangingConnection.connect(url, autocommit=True)
