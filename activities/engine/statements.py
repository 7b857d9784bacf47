"""Every statement a sweep runs against a target's table, in one place to read whole.

Each is composed with `psycopg.sql` from a bound `Predicate` (the rule's WHERE clause and its
parameters: the caller's instant, never the server's clock). Names are `sql.Identifier`s; no
text from a config is ever spliced into SQL. Every transaction of a sweep starts with
`local_bounds`, and every DELETE repeats the predicate on the row it deletes, so a row renewed
while the batch waited for its lock is kept.
"""

from __future__ import annotations

from psycopg import sql

from activities.engine.rules import Predicate, ident


def local_bounds(walk: bool = False) -> sql.Composed:
    """The statement that bounds the current transaction: its parameters are the lock and the
    statement timeout in ms. Every transaction of a sweep starts with it."""
    # set_config(..., true) is SET LOCAL as a function: it can take parameters and share one
    # statement, which the pipeline (one statement per execute) needs.
    parts = [
        sql.SQL(
            "SELECT set_config('lock_timeout', %s::text, true),"
            " set_config('statement_timeout', %s::text, true)"
        )
    ]
    if walk:
        # A walk must read its page range, never the whole index: with a large share expired
        # the planner might otherwise pick an index scan filtered by ctid for every batch.
        parts.append(
            sql.SQL(
                ", set_config('enable_indexscan', 'off', true),"
                " set_config('enable_bitmapscan', 'off', true)"
            )
        )
    return sql.Composed(parts)


def index_batch(pred: Predicate, limit: int) -> sql.Composed:
    """The index-ordered batch: the oldest `limit` expired rows, the predicate checked again on
    the row itself so that one renewed while this waited for its lock is kept. It returns how
    many rows it found and how many it deleted: fewer found than `limit` means the last batch,
    without a final empty one to find that out."""
    assert pred.column is not None
    return sql.SQL(
        "WITH found AS MATERIALIZED ("
        "SELECT ctid FROM {table} WHERE {where} ORDER BY {column} LIMIT {limit}"
        "), deleted AS ("
        "DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM found)) AND {where}"
        " RETURNING 1"
        ") SELECT (SELECT count(*) FROM found), (SELECT count(*) FROM deleted)"
    ).format(
        table=ident(pred.table),
        where=pred.where,
        column=sql.Identifier(pred.column),
        limit=sql.Literal(limit),
    )


def range_batch(pred: Predicate) -> sql.Composed:
    """The range batch: every expired row in pages [lo, hi), checked on the row itself."""
    return sql.SQL(
        "DELETE FROM {table} WHERE ctid >= %(lo)s::tid AND ctid < %(hi)s::tid AND {where}"
    ).format(table=ident(pred.table), where=pred.where)


def count_expired(pred: Predicate, cap: int | None = None) -> sql.Composed:
    """One row, (expired rows, 0): for a dry run; with `cap`, counted only up to `cap` (the
    backlog a sweep that ran out of time leaves, read through the index)."""
    if cap is None:
        return sql.SQL("SELECT count(*), 0 FROM {} WHERE {}").format(ident(pred.table), pred.where)
    return sql.SQL("SELECT count(*), 0 FROM (SELECT 1 FROM {} WHERE {} LIMIT {}) expired").format(
        ident(pred.table), pred.where, sql.Literal(cap)
    )


def count_expired_and_all(pred: Predicate) -> sql.Composed:
    """One row, (expired rows, all rows), in one read of the table: for the guards."""
    return sql.SQL("SELECT count(*) FILTER (WHERE {}), count(*) FROM {}").format(
        pred.where, ident(pred.table)
    )
