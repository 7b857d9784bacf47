"""The arranging connection the tests' `db` is: its VACUUM and ANALYZE count its rows once."""

from __future__ import annotations

from typing import Any

import psycopg


def test_rows_inserted_just_before_a_vacuum_analyze_are_counted_once(
    db: psycopg.Connection[Any],
) -> None:
    """A session that has just flushed its statistics (so holds the next counts for a second)
    INSERTs 1,000 rows and sends VACUUM ANALYZE: on a plain connection the INSERT's counts reach
    the views after the VACUUM set the live rows from the table, and 1,000 rows read as 2,000.
    The `db` connection flushes them first."""
    db.execute("CREATE TABLE arranged (id int)")
    db.execute("SELECT pg_stat_force_next_flush()")  # flushed as it goes idle: the second starts
    db.execute("INSERT INTO arranged SELECT generate_series(1, 1000)")
    db.execute("VACUUM ANALYZE arranged")

    db.execute("SELECT pg_stat_force_next_flush()")  # anything still held, before the reply
    db.execute("SELECT pg_stat_clear_snapshot()")
    assert db.execute(
        "SELECT n_live_tup FROM pg_stat_all_tables WHERE relid = 'arranged'::regclass"
    ).fetchone() == (1_000,)
