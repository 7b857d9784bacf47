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
from purge_config.names import TableName


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


#: The ledger's upsert, added to a batch when the target's database has `purge_progress`: the
#: batch's count becomes durable in the same transaction as its DELETE. Its parameters name the
#: pass (`ledger_workflow`, `ledger_run`, `ledger_now`) and the target (`ledger_target`).
_LEDGER = sql.SQL(
    ", ledger AS ("
    "INSERT INTO purge_progress AS p (workflow_id, run_id, target, now_ms, removed, batches)"
    " SELECT %(ledger_workflow)s, %(ledger_run)s, %(ledger_target)s, %(ledger_now)s, n, 1"
    " FROM counted WHERE n > 0"
    " ON CONFLICT (workflow_id, run_id, target) DO UPDATE"
    " SET removed = p.removed + EXCLUDED.removed, batches = p.batches + 1"
    " RETURNING removed)"
    " SELECT {found}, (SELECT n FROM counted), (SELECT removed FROM ledger)"
)
_NO_LEDGER = sql.SQL(" SELECT {found}, (SELECT n FROM counted), NULL::bigint")


def _counted(found: sql.Composable, ledger: bool) -> sql.Composed:
    """The batch's closing select: (rows found, rows deleted, the ledger's total or NULL)."""
    return (_LEDGER if ledger else _NO_LEDGER).format(found=found)


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
    pred: Predicate, limit: int, ledger: bool = False, order: tuple[str, ...] = ()
) -> sql.Composed:
    """The index-ordered batch: the oldest `limit` expired rows, the predicate checked again on
    the row itself so that one renewed while this waited for its lock is kept. It returns how
    many rows it found, how many it deleted and (with `ledger`) the pass's total so far: fewer
    found than `limit` means the last batch, without a final empty one to find that out.
    `order` is the serving index's key columns up to the expiry column (default: that column
    alone), so the read walks the index in its own order."""
    assert pred.column is not None
    return sql.SQL(
        "WITH found AS MATERIALIZED ("
        "SELECT ctid FROM {table} WHERE {where} ORDER BY {order} LIMIT {limit}"
        "), deleted AS ("
        "DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM found)) AND {where}"
        " RETURNING {returning}"
        "){archived}, counted AS (SELECT count(*) AS n FROM deleted){closing}"
    ).format(
        table=ident(pred.table),
        where=pred.where,
        order=sql.SQL(", ").join(sql.Identifier(c) for c in order or (pred.column,)),
        limit=sql.Literal(limit),
        returning=_returning(pred),
        archived=_archived(pred),
        closing=_counted(sql.SQL("(SELECT count(*) FROM found)"), ledger),
    )


def range_batch(pred: Predicate, ledger: bool = False) -> sql.Composed:
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
        closing=_counted(sql.SQL("(SELECT n FROM counted)"), ledger),
    )


def ledger_entry() -> sql.SQL:
    """The pass's total so far for one target: what a resumed attempt starts counting from."""
    return sql.SQL(
        "SELECT removed, batches FROM purge_progress"
        " WHERE workflow_id = %(ledger_workflow)s AND run_id = %(ledger_run)s"
        " AND target = %(ledger_target)s"
    )


def ledger_writable() -> sql.SQL:
    """Whether `purge_progress` exists (by the search_path) and this role may use it."""
    return sql.SQL(
        "SELECT coalesce(has_table_privilege(to_regclass('purge_progress'),"
        " 'SELECT, INSERT, UPDATE, DELETE'), false)"
    )


def ledger_expire() -> sql.SQL:
    """Remove ledger rows of passes older than `keep_ms` before this pass's instant: the
    ledger is retention data too, judged by the caller's clock like every other table."""
    return sql.SQL("DELETE FROM purge_progress WHERE now_ms < %(ledger_now)s - %(keep_ms)s")


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


def oldest_expired(pred: Predicate) -> sql.Composed:
    """One row: the least `expired_at` among the rows still expired (NULL when none), through
    the index on the rule's column when there is one."""
    if pred.column is not None:
        return sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY {} LIMIT 1").format(
            pred.expired_at, ident(pred.table), pred.where, sql.Identifier(pred.column)
        )
    return sql.SQL("SELECT min({}) FROM {} WHERE {}").format(
        pred.expired_at, ident(pred.table), pred.where
    )


def flush_statistics() -> sql.SQL:
    """Make this session's table statistics (the dead tuples its batches left) visible to the
    views once it goes idle (PostgreSQL 15+)."""
    return sql.SQL("SELECT pg_stat_force_next_flush()")


def table_tuples() -> sql.SQL:
    """One row: live and dead tuples of `%(rel)s` (over its leaf partitions) per the views."""
    return sql.SQL(
        "SELECT coalesce(sum(s.n_live_tup), 0), coalesce(sum(s.n_dead_tup), 0)"
        " FROM pg_stat_all_tables s"
        " WHERE s.relid IN (SELECT relid FROM pg_partition_tree(%(rel)s::regclass) WHERE isleaf"
        " UNION SELECT %(rel)s::regclass)"
    )


def may_analyze(server_version: int) -> sql.SQL:
    """Whether this role may ANALYZE `%(rel)s`: the MAINTAIN privilege (PostgreSQL 17+) or
    membership in the owning role."""
    owner = "pg_has_role(c.relowner, 'USAGE')"
    if server_version >= 170000:
        owner += " OR has_table_privilege(c.oid, 'MAINTAIN')"
    return sql.SQL("SELECT " + owner + " FROM pg_class c WHERE c.oid = %(rel)s::regclass")


def analyze(pred: Predicate) -> sql.Composed:
    """Refresh the planner's statistics of the table after a sweep removed a large share."""
    return sql.SQL("ANALYZE {}").format(ident(pred.table))


#: The first key of every advisory lock this package takes ('purg'); the second is the table's
#: OID, so two sweeps of one table, from any pass, worker or cluster, take the same lock.
LOCK_SPACE = 0x70757267


def lock_table() -> sql.Composed:
    """Take the session's advisory lock on `%(rel)s`, waiting at most the lock_timeout."""
    return sql.SQL(
        "SELECT pg_advisory_lock({}, (%(rel)s::regclass::oid::bigint - 2147483648)::int4)"
    ).format(sql.Literal(LOCK_SPACE))


def unlock_tables() -> sql.SQL:
    """Release every advisory lock of this session: the connection goes back to the pool."""
    return sql.SQL("SELECT pg_advisory_unlock_all()")


def column_statistics() -> sql.SQL:
    """The planner's view of `%(column)s` of `%(rel)s`: histogram bounds, most common values
    and their frequencies, as exact numbers; no row when the table was never analyzed."""
    return sql.SQL(
        "SELECT s.histogram_bounds::text::numeric[], s.most_common_vals::text::numeric[],"
        " s.most_common_freqs"
        " FROM pg_stats s"
        " JOIN pg_class c ON c.relname = s.tablename"
        " JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = s.schemaname"
        " WHERE c.oid = %(rel)s::regclass AND s.attname = %(column)s"
        " ORDER BY s.inherited DESC LIMIT 1"
    )


def column_sample(table: TableName, column: str, rows: int) -> sql.Composed:
    """A few values of the column, as the first pages hold them: bounded, never a scan."""
    return sql.SQL("SELECT {col} FROM {t} WHERE {col} IS NOT NULL LIMIT {n}").format(
        col=sql.Identifier(column), t=ident(table), n=sql.Literal(rows)
    )


def unindexed_children() -> sql.SQL:
    """Foreign keys that reference `%(rel)s` from a table with no valid, whole index whose
    leading columns are the key's columns: (child table, its columns, ON DELETE action). Each
    delete of a parent row then reads the whole child table."""
    return sql.SQL(
        "SELECT f.conrelid::regclass::text,"
        " array_agg(a.attname::text ORDER BY k.ord),"
        " CASE f.confdeltype WHEN 'c' THEN 'CASCADE' WHEN 'n' THEN 'SET NULL'"
        " WHEN 'd' THEN 'SET DEFAULT' WHEN 'r' THEN 'RESTRICT' ELSE 'NO ACTION' END"
        " FROM pg_constraint f"
        " CROSS JOIN LATERAL unnest(f.conkey) WITH ORDINALITY k(attnum, ord)"
        " JOIN pg_attribute a ON a.attrelid = f.conrelid AND a.attnum = k.attnum"
        " WHERE f.contype = 'f' AND f.confrelid = %(rel)s::regclass"
        " AND NOT EXISTS ("
        "  SELECT 1 FROM pg_index i WHERE i.indrelid = f.conrelid AND i.indisvalid"
        "  AND i.indpred IS NULL"
        "  AND (i.indkey::int2[])[0:cardinality(f.conkey) - 1] @> f.conkey"
        "  AND (i.indkey::int2[])[0:cardinality(f.conkey) - 1] <@ f.conkey)"
        " GROUP BY f.oid, f.conrelid, f.confdeltype ORDER BY 1"
    )


def may_read_replication() -> sql.SQL:
    """Whether this role sees the replicas' lag in pg_stat_replication (else it reads NULL)."""
    return sql.SQL(
        "SELECT pg_has_role('pg_read_all_stats', 'USAGE')"
        " OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)"
    )


def replica_lag_ms() -> sql.SQL:
    """The largest replay lag of any streaming replica, in ms (0 without replicas)."""
    return sql.SQL(
        "SELECT coalesce(max(extract(epoch FROM replay_lag) * 1000), 0)"
        " FROM pg_stat_replication WHERE state = 'streaming'"
    )


def wal_position() -> sql.SQL:
    """The server's WAL write position, in bytes from the start of WAL."""
    return sql.SQL("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
