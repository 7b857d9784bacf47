"""The SQL of a batch, and the transaction settings it runs under.

- `local_timeouts`: the statement a sweep's transactions start with (its lock and
  statement timeouts; for a batch, the planner settings its strategy wants, and the mark the
  ledger counts a plain DELETE's rows from);
- each strategy's batch: `index_batch` (index order, counted in SQL), `key_boundary` and
  `key_delete` (a keyset batch; `key_rest` its last; `tie_delete` and `tie_walk` for a run of
  one key),
  `range_batch` and `range_delete` (a walk of a page range), each composed with `psycopg.sql`
  from a bound `Predicate` (the rule's WHERE clause and its parameters: the caller's instant,
  never the server's clock), names as `sql.Identifier`s;
- `flushes_statistics`: whether the server can flush the session's statistics on request, and
  `flush_statistics` the statement that asks;
- `pipeline_flush`, and `count_expired`: the expired rows a batch's sweep left (or a dry run
  would remove).

Every DELETE repeats the predicate on the row it deletes, so a row renewed while the batch
waited for its lock is kept. The ledger's part of a batch is `activities.engine.ledger`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from psycopg import BaseConnection, sql

from activities.engine.rules import Predicate, ident

#: The call that asks for the session's statistics to be flushed as it goes idle (PostgreSQL
#: 15+), in a statement of its own (`flush_statistics`) or beside a transaction's settings.
FLUSH_CALL = "pg_stat_force_next_flush()"


def flushes_statistics(conn: BaseConnection[Any]) -> bool:
    """Whether a transaction on `conn` can ask for the session's statistics to be flushed when
    it ends (`local_timeouts(flush=True)`, or a statement of its own): PostgreSQL 15 on."""
    return conn.info.server_version >= 150000


def flush_statistics() -> sql.SQL:
    """Make this session's table statistics (the dead tuples its batches left) visible to the
    views once it goes idle (PostgreSQL 15+)."""
    return sql.SQL("SELECT " + FLUSH_CALL)


def local_timeouts(
    walk: bool = False,
    generic: bool = False,
    mark: bool = False,
    lazy: bool = False,
    flush: bool = False,
    by_index: bool = False,
) -> sql.Composed:
    """The statement that sets the current transaction's lock and statement timeouts: its
    parameters are those in ms (and, with `mark`, the table). A sweep's transactions start
    with it; `walk` and `generic` add the planner settings those batches want, `lazy`
    a commit that does not wait for its WAL (a batch before a durable point: `LazyCommits`),
    `flush` the
    session's statistics made visible to the views once it commits (PostgreSQL 15+), and
    `by_index` what `tie_walk` sets (one statement fewer where it is known from the start)."""
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
        # the planner might otherwise pick an index scan filtered by ctid for every batch. Not
        # for a table foreign keys reference: the cascades and checks its deletes run on the
        # child tables are planned in this transaction too, and must keep their indexes
        # (why: docs/decisions/walks-and-foreign-keys.md).
        parts.append(
            sql.SQL(
                ", set_config('enable_indexscan', 'off', true),"
                " set_config('enable_bitmapscan', 'off', true)"
            )
        )
    if generic:
        # A keyset batch's prepared boundary read and DELETE run by their generic plan: planned
        # with its values, each batch's boundary read probed the expiry index's end for its
        # actual least value, over the entries of every row earlier batches had deleted (not
        # yet vacuumed; why: docs/decisions/keyset-batches.md). Their generic plan is the one
        # they are written for: the expiry index, in order, from a key on.
        parts.append(sql.SQL(", set_config('plan_cache_mode', 'force_generic_plan', true)"))
    if mark:
        # The rows this session has deleted from the table so far, as the statistics count
        # them, for the batch's `ledger_add_deleted` to subtract.
        parts.append(
            sql.SQL(
                ", set_config('purge.deleted_before',"
                " pg_stat_get_xact_tuples_deleted(%s::regclass)::text, true)"
            )
        )
    if lazy:
        parts.append(sql.SQL(", set_config('synchronous_commit', 'off', true)"))
    if flush:
        # For the table's last batch: the session's statistics are flushed as it goes idle,
        # before the batch's result reaches us, so the read of what the sweep left needs no
        # round trip of its own to flush them (`leftover.leftover`).
        parts.append(sql.SQL(", " + FLUSH_CALL))
    if by_index:
        parts.append(sql.SQL(", " + _BY_INDEX))
    return sql.Composed(parts)


#: A batch's closing select, given what it found: (rows found, rows deleted, the ledger's total
#: or NULL). The ledger's (`BatchTally.closing`) adds the batch's count to it in the statement.
Closing = Callable[[sql.Composable], sql.Composed]


def no_ledger(found: sql.Composable) -> sql.Composed:
    """The closing select of a batch without the ledger: its total NULL."""
    return sql.SQL(" SELECT {found}, (SELECT n FROM counted), NULL::bigint").format(found=found)


def _returning(pred: Predicate) -> sql.Composable:
    """What a batch's DELETE returns: the whole row when it moves to an archive."""
    if pred.archive is None:
        return sql.SQL("1")
    return sql.SQL(", ").join(sql.Identifier(column) for column in pred.archive.columns)


def _archived(pred: Predicate) -> sql.Composable:
    """With an archive, the CTE that inserts exactly the rows the batch's DELETE returned, in
    the same statement: each row is in one of the two tables whenever anything stops."""
    if pred.archive is None:
        return sql.SQL("")
    columns = sql.SQL(", ").join(sql.Identifier(column) for column in pred.archive.columns)
    return sql.SQL(
        ", archived AS ("
        "INSERT INTO {archive} ({columns}){overriding} SELECT {columns} FROM deleted)"
    ).format(
        archive=ident(pred.archive.table),
        columns=columns,
        overriding=sql.SQL(" OVERRIDING SYSTEM VALUE" if pred.archive.overriding else ""),
    )


def index_batch(
    pred: Predicate,
    limit: int,
    order: tuple[str, ...] = (),
    partitioned: bool = False,
    closing: Closing = no_ledger,
) -> sql.Composed:
    """The index-ordered batch: the oldest `limit` expired rows, the predicate checked again on
    the row itself so that one renewed while this waited for its lock is kept. It returns how
    many rows it found, how many it deleted and (by the ledger's `closing`) the pass's total: fewer
    found than `limit` means the last batch, without a final empty one to find that out.
    `order` is the serving index's key columns up to the expiry column (default: that column
    alone), so the read walks the index in its own order.

    Through a `partitioned` table, a ctid names a row only together with its partition
    (`tableoid`): the same ctid exists in every partition, so the pair is matched too."""
    assert pred.column is not None
    pick, pair = sql.SQL("ctid"), sql.SQL("")
    if partitioned:
        pick = sql.SQL("tableoid, ctid")
        pair = sql.SQL(" AND (tableoid, ctid) IN (SELECT tableoid, ctid FROM found)")
    return sql.SQL(
        "WITH found AS MATERIALIZED ("
        "SELECT {pick} FROM {table} WHERE {where} ORDER BY {order} LIMIT {limit}"
        "), deleted AS ("
        "DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM found)){pair} AND {where}"
        " RETURNING {returning}"
        "){archived}, counted AS (SELECT count(*) AS n FROM deleted){closing}"
    ).format(
        pick=pick,
        pair=pair,
        table=ident(pred.table),
        where=pred.where,
        order=sql.SQL(", ").join(sql.Identifier(c) for c in order or (pred.column,)),
        limit=sql.Literal(limit),
        returning=_returning(pred),
        archived=_archived(pred),
        closing=closing(sql.SQL("(SELECT count(*) FROM found)")),
    )


def key_boundary(pred: Predicate, after: bool, mid: bool = False) -> sql.Composed:
    """A keyset batch's boundary: the least key of the expired rows left (from `%(key_after)s`
    on, when `after`: where the last batch stopped), and the one `%(key_skip)s` entries past it
    (a batch's rows less one), NULL when fewer are left; with `mid`, a third: the key
    `%(key_mid)s` entries past the least, from which the span after the batch is sized (the
    density of the batch's upper half: a few old keys far below the rest, at its start, do not
    make it wide). The half-way probe starts from the least key found, and the n-th from the
    half-way key, so the batch's entries are walked once, not one and a half times. Rows with
    the half-way key below it move that start down by as many: the batch then ends below the
    n-th key, with more than half a batch of rows. Where the probe lands on the half-way key
    itself (one key runs on from there), the n-th is read again from the least key, as
    without `mid`, so a run of one key is walked only when a batch's worth share it. They read only
    index entries (an index-only scan where the heap is all-visible), so the DELETE that
    follows does the heap's work once; skipping entries to the last costs less than
    aggregating them (no count, min and max per row). The batch's size is a parameter, not part
    of the text, so the text is the same for every batch of a sweep and is prepared, not
    planned anew for each batch (why: docs/decisions/keyset-batches.md)."""
    assert pred.column is not None
    column = sql.Identifier(pred.column)
    table = ident(pred.table)

    def probe(start: str, offset: str) -> sql.Composed:
        # From a key found, by the index's descent, not from where the expired rows' entries
        # begin: a probe would otherwise walk again the entries of rows deleted since the
        # index was last vacuumed (an hour's, after a VACUUM that skipped the index).
        return sql.SQL(
            "(SELECT {column} FROM {table} WHERE {where} AND {column} >= {start}"
            " ORDER BY {column} OFFSET {offset} LIMIT 1)"
        ).format(
            column=column,
            table=table,
            where=pred.where,
            start=sql.SQL(start),
            offset=sql.SQL(offset),
        )

    least = sql.SQL(
        "(SELECT {column} FROM {table} WHERE {where}{after} ORDER BY {column} LIMIT 1)"
    ).format(column=column, table=table, where=pred.where, after=_from_key(column, after))
    # OFFSET 0 keeps each probe a subquery of its own: run once, before the ones that start
    # from its key.
    start = sql.SQL("(SELECT {least} AS least OFFSET 0) s").format(least=least)
    if not mid:
        return sql.SQL("SELECT s.least, {last} FROM {start}").format(
            last=probe("s.least", "%(key_skip)s"), start=start
        )
    # The read from the least key is a subplan of the CASE: it runs only where it is chosen.
    return sql.SQL(
        "SELECT h.least, CASE WHEN h.last = h.mid THEN {from_least} ELSE h.last END, h.mid"
        " FROM (SELECT m.least, m.mid, {from_mid} AS last"
        " FROM (SELECT s.least, {mid} AS mid FROM {start} OFFSET 0) m OFFSET 0) h"
    ).format(
        from_least=probe("h.least", "%(key_skip)s"),
        from_mid=probe("m.mid", "%(key_skip)s - %(key_mid)s"),
        mid=probe("s.least", "%(key_mid)s"),
        start=start,
    )


def key_delete(pred: Predicate, after: bool, below: bool) -> sql.Composed:
    """A keyset batch: the expired rows from `%(key_after)s` (when `after`) up to, not including,
    `%(key_below)s` (when `below`; without it, the rest: fewer than a batch remain). A range the
    expiry index serves, the predicate checked on each row, no RETURNING: counted by its
    command tag, as one DELETE typed by hand is."""
    assert pred.column is not None
    column = sql.Identifier(pred.column)
    upto = sql.SQL(" AND {} < %(key_below)s").format(column) if below else sql.SQL("")
    return sql.SQL("DELETE FROM {table} WHERE {where}{after}{upto}").format(
        table=ident(pred.table), where=pred.where, after=_from_key(column, after), upto=upto
    )


def key_rest(pred: Predicate, after: bool = True) -> sql.Composed:
    """A keyset sweep's last batch, with no boundary read: every expired row from
    `%(key_after)s` on (when `after`; without it, every expired row: a sweep whose first batch
    takes them all, `keyset.run_key_whole`), unless the greatest expired key left is shared by
    at least `%(key_rows)s` rows (a batch's worth, which a range cannot split): then it deletes
    nothing, and the boundary read that follows walks that run (`tie_delete`). The check is two
    probes of the index (the greatest key, then its rows up to a batch's count), evaluated once
    before the scan; `tie_walk` keeps the second an index scan. Counted by its command tag."""
    assert pred.column is not None
    column = sql.Identifier(pred.column)
    expired = sql.SQL("{table} WHERE {where}").format(table=ident(pred.table), where=pred.where)
    rest = sql.SQL("{expired}{after}").format(expired=expired, after=_from_key(column, after))
    return sql.SQL(
        "DELETE FROM {rest} AND (SELECT count(*) FROM (SELECT 1 FROM {expired} AND {column} ="
        " (SELECT max({column}) FROM {rest}) LIMIT %(key_rows)s) top) < %(key_rows)s"
    ).format(rest=rest, expired=expired, column=column)


def key_top(pred: Predicate) -> sql.Composed:
    """The greatest expired key (NULL when no row is expired): sent before a `key_rest` that
    takes every expired row, it says whether one that deleted nothing found none, or found a
    run of one key at the top to walk. One probe of the index, from the cutoff down."""
    assert pred.column is not None
    return sql.SQL("SELECT max({column}) FROM {table} WHERE {where}").format(
        column=sql.Identifier(pred.column), table=ident(pred.table), where=pred.where
    )


def tie_delete(pred: Predicate) -> sql.Composed:
    """A keyset batch over one value: `%(key_rows)s` expired rows whose key is `%(key_at)s`
    (a batch's worth or more share it, so a range cannot split them), picked by ctid, checked on the
    row."""
    assert pred.column is not None
    return sql.SQL(
        "DELETE FROM {table} WHERE ctid = ANY(ARRAY("
        "SELECT ctid FROM {table} WHERE {where} AND {column} = %(key_at)s LIMIT %(key_rows)s"
        ")) AND {where}"
    ).format(
        table=ident(pred.table),
        where=pred.where,
        column=sql.Identifier(pred.column),
    )


def tie_walk() -> sql.SQL:
    """Sent before a `tie_delete`, in its transaction: the batch's rows come from the expiry
    index in its order, stopping at the batch's count. Left to itself, the generic plan of
    `column = %(key_at)s` goes by the statistics' guess at how many rows share a value: a
    bitmap scan, which gathers every row of the value for each batch (a never-analyzed table),
    or, where the statistics saw few distinct values, a sequential scan, which reads again, for
    each batch, every page earlier batches emptied (why: docs/decisions/tie-walk.md). Local
    to the batch's transaction; the cascades of a foreign key planned in it keep their indexes
    (only other scans are turned off), and a child without one is still read."""
    return sql.SQL("SELECT " + _BY_INDEX)


_BY_INDEX = (
    "set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true)"
)


def _from_key(column: sql.Identifier, after: bool) -> sql.Composable:
    return sql.SQL(" AND {} >= %(key_after)s").format(column) if after else sql.SQL("")


def range_batch(pred: Predicate, closing: Closing = no_ledger) -> sql.Composed:
    """The range batch: every expired row in pages [lo, hi), checked on the row itself. The
    same three columns as `index_batch`, what it deleted standing for what it found."""
    return sql.SQL(
        "WITH deleted AS ("
        "DELETE FROM {table} WHERE ctid >= %(lo)s::tid AND ctid < %(hi)s::tid AND {where}"
        " RETURNING {returning}"
        "){archived}, counted AS (SELECT count(*) AS n FROM deleted){closing}"
    ).format(
        table=ident(pred.table),
        where=pred.where,
        returning=_returning(pred),
        archived=_archived(pred),
        closing=closing(sql.SQL("(SELECT n FROM counted)")),
    )


def range_delete(pred: Predicate) -> sql.Composed:
    """The range batch without an archive: every expired row in pages [lo, hi), checked on the
    row itself, counted by its command tag. Not `range_batch`'s RETURNING and count in one
    statement: projecting every deleted row made the DELETE far dearer (why:
    docs/decisions/server-count.md). The ledger's
    `ledger_add` follows in the same transaction."""
    return sql.SQL(
        "DELETE FROM {table} WHERE ctid >= %(lo)s::tid AND ctid < %(hi)s::tid AND {where}"
    ).format(table=ident(pred.table), where=pred.where)


def pipeline_flush() -> sql.SQL:
    """A statement of no cost whose result, fetched, flushes a pipeline up to it without a
    Sync: the statements before it have run and their command tags are read, and their
    implicit transaction is still open."""
    return sql.SQL("SELECT 1")


def count_expired(pred: Predicate, cap: int | None = None) -> sql.Composed:
    """One row, (expired rows, 0): for a dry run; with `cap`, counted only up to `cap` (the
    backlog a sweep that ran out of time leaves, read through the index)."""
    if cap is None:
        return sql.SQL("SELECT count(*), 0 FROM {} WHERE {}").format(ident(pred.table), pred.where)
    return sql.SQL("SELECT count(*), 0 FROM (SELECT 1 FROM {} WHERE {} LIMIT {}) expired").format(
        ident(pred.table), pred.where, sql.Literal(cap)
    )
