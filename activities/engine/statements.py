"""Every statement a sweep runs against a target's table, in one place to read whole.

Each is composed with `psycopg.sql` from a bound `Predicate` (the rule's WHERE clause and its
parameters: the caller's instant, never the server's clock). Names are `sql.Identifier`s; no
text from a config is ever spliced into SQL. Every transaction of a sweep starts with
`local_bounds`, and every DELETE repeats the predicate on the row it deletes, so a row renewed
while the batch waited for its lock is kept.
"""

from __future__ import annotations

from collections.abc import Callable

from psycopg import sql

from activities.engine.rules import Predicate, ident
from purge_config.names import TableName


def local_bounds(walk: bool = False, generic: bool = False, mark: bool = False) -> sql.Composed:
    """The statement that bounds the current transaction: its parameters are the lock and the
    statement timeout in ms (and, with `mark`, the table). Every transaction of a sweep starts
    with it."""
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
        # (measured in bench/harm.py: a child's indexed cascade went from 0.04 s to 4 s).
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
        # yet vacuumed), 1.5-2.7 ms of planning a batch against 1 ms of executing
        # (bench/README.md, issue 20). Their generic plan is the one they are written for: the
        # expiry index, in order, from a key on.
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


def key_bounds(pred: Predicate, after: bool) -> sql.Composed:
    """A keyset batch's boundary: the least key of the expired rows left (from `%(key_after)s`
    on, when `after`: where the last batch stopped), and the one `%(key_skip)s` entries past it
    (a batch's rows less one), NULL when fewer are left. Both read only index entries (an
    index-only scan where the heap is all-visible), so the DELETE that follows does the heap's
    work once; skipping entries to the last costs less than aggregating them (no count, min and
    max per row). The batch's size is a parameter, not part of the text, so the text is the
    same for every batch of a sweep and psycopg prepares it: planned anew each time, it spent
    1.5 ms of each batch's 3.9 ms boundary read planning (bench/README.md, issue 20)."""
    assert pred.column is not None
    column = sql.Identifier(pred.column)
    next_key = sql.SQL(
        "SELECT {column} FROM {table} WHERE {where}{after} ORDER BY {column}"
    ).format(
        column=column, table=ident(pred.table), where=pred.where, after=_from_key(column, after)
    )
    return sql.SQL("SELECT ({next} LIMIT 1), ({next} OFFSET %(key_skip)s LIMIT 1)").format(
        next=next_key
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


def tie_delete(pred: Predicate) -> sql.Composed:
    """A keyset batch over one value: `%(key_rows)s` expired rows whose key is `%(key_at)s`
    (more than a batch share it, so a range cannot split them), picked by ctid, checked on the
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
    bitmap scan, which gathers every row of the value for each batch (a never-analyzed table's
    400,000-row run of one value: 25 ms a batch of any size, 118 s in all, against 3.2 s), or,
    where the statistics saw few distinct values, a sequential scan, which reads again, for each
    batch, every page earlier batches emptied (12.8-21 s; measured here, PostgreSQL 18). Local
    to the batch's transaction; the cascades of a foreign key planned in it keep their indexes
    (only other scans are turned off), and a child without one is still read."""
    return sql.SQL(
        "SELECT set_config('enable_seqscan', 'off', true),"
        " set_config('enable_bitmapscan', 'off', true)"
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
    statement: projecting every deleted row made the DELETE cost 1.75x (a million rows of 2M,
    PostgreSQL 18, measured here: 400 ms plain, 700 ms through the CTE). The ledger's
    `ledger_add` follows in the same transaction."""
    return sql.SQL(
        "DELETE FROM {table} WHERE ctid >= %(lo)s::tid AND ctid < %(hi)s::tid AND {where}"
    ).format(table=ident(pred.table), where=pred.where)


def pipeline_flush() -> sql.SQL:
    """A statement of no cost whose result, fetched, flushes a pipeline up to it without a
    Sync: the statements before it have run and their command tags are read, and their
    implicit transaction is still open."""
    return sql.SQL("SELECT 1")


def shares_expire() -> sql.SQL:
    """Remove `purge_shares` rows of passes a window (`%(window_ms)s`) or more before this
    pass's instant: the advice reads no further back."""
    return sql.SQL("DELETE FROM purge_shares WHERE now_ms <= %(ledger_now)s - %(window_ms)s")


def share_record() -> sql.SQL:
    """Record what this pass removed from one table and the live rows it left (`%(removed)s`,
    `%(live)s`; a retried attempt adds its rows to the pass's), and return the table's passes
    within the window before this pass's instant `%(now_ms)s`, this one included, oldest
    first: (now_ms, removed, live). Through the primary key only: a read of a day's rows of
    one table, whatever else the table holds."""
    return sql.SQL(
        "WITH this AS ("
        "INSERT INTO purge_shares AS s (target, table_name, now_ms, removed, live)"
        " VALUES (%(target)s, %(table)s, %(now_ms)s, %(removed)s, %(live)s)"
        " ON CONFLICT (target, table_name, now_ms) DO UPDATE"
        " SET removed = s.removed + EXCLUDED.removed, live = EXCLUDED.live"
        " RETURNING now_ms, removed, live"
        ") SELECT now_ms, removed, live FROM purge_shares"
        " WHERE target = %(target)s AND table_name = %(table)s"
        " AND now_ms > %(now_ms)s - %(window_ms)s AND now_ms < %(now_ms)s"
        " UNION ALL SELECT now_ms, removed, live FROM this ORDER BY 1"
    )


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


def value_span_days(pred: Predicate, sql_type: str) -> sql.Composed:
    """One row: the days between the least and the greatest value of the rule's column among
    the rows not expired, those past `%(cutoff)s` (NULL when there are none), read from the
    ends of its index. Not over every row: right after a sweep the least value would be found
    by walking the index from its start over an entry for every row the sweep deleted (1.1 s
    after a million, measured in bench case 1); the bound starts the scan past them."""
    assert pred.column is not None
    column = sql.Identifier(pred.column)
    span = (
        sql.SQL("(max({c}) - min({c}))::float8 / 86400000")
        if sql_type in ("bigint", "integer")
        else sql.SQL("extract(epoch FROM max({c}) - min({c}))::float8 / 86400")
    ).format(c=column)
    return sql.SQL("SELECT {} FROM {} WHERE {} > %(cutoff)s").format(
        span, ident(pred.table), column
    )


def flush_statistics() -> sql.SQL:
    """Make this session's table statistics (the dead tuples its batches left) visible to the
    views once it goes idle (PostgreSQL 15+)."""
    return sql.SQL("SELECT pg_stat_force_next_flush()")


def table_tuples() -> sql.SQL:
    """One row: live and dead tuples of `%(rel)s` (over its leaf partitions) per the views."""
    # By OID, not through pg_stat_all_tables: the view computes every relation's row before
    # it filters, 20 ms a call with 3,000 tables on the server against 0.1 ms (measured).
    return sql.SQL(
        "SELECT coalesce(sum(pg_stat_get_live_tuples(t.relid)), 0),"
        " coalesce(sum(pg_stat_get_dead_tuples(t.relid)), 0)"
        " FROM (SELECT relid FROM pg_partition_tree(%(rel)s::regclass) WHERE isleaf"
        " UNION SELECT %(rel)s::regclass) t"
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


# Partitions: reading a partitioned table's layout, and taking wholly expired partitions out
# of it (activities.engine.partitions, activities.engine.detaching).

#: The column types a partition bound is cast to, by RangeKey.sql_type: only these names are
#: ever put into a statement.
_BOUND_TYPES = {t: sql.SQL(t) for t in ("bigint", "integer", "timestamptz", "timestamp")}


def partition_key() -> sql.SQL:
    """One row for a partitioned `%(rel)s`, none for a plain table: strategy (`r`, `l`, `h`),
    number of key columns, the first key column's name (NULL for an expression), the key as
    PostgreSQL prints it, the owner, whether this role is (a member of) the owner, and the
    role itself."""
    return sql.SQL(
        "SELECT p.partstrat::text, p.partnatts, a.attname::text, pg_get_partkeydef(p.partrelid),"
        " c.relowner::regrole::text, pg_has_role(c.relowner, 'USAGE'), current_user::text"
        " FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partrelid"
        " LEFT JOIN pg_attribute a ON a.attrelid = p.partrelid AND p.partattrs[0] <> 0"
        " AND a.attnum = p.partattrs[0]"
        " WHERE p.partrelid = %(rel)s::regclass"
    )


def partition_children() -> sql.SQL:
    """The partitions directly under `%(rel)s`: OID, schema, name, bound as printed, whether
    half-detached, owner, and whether this role is (a member of) it."""
    return sql.SQL(
        "SELECT c.oid::bigint, n.nspname::text, c.relname::text,"
        " pg_get_expr(c.relpartbound, c.oid), i.inhdetachpending,"
        " c.relowner::regrole::text, pg_has_role(c.relowner, 'USAGE')"
        " FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE i.inhparent = %(rel)s::regclass ORDER BY c.oid"
    )


def partition_tree() -> sql.SQL:
    """Every partition under `%(rel)s`, at any depth: OID, its parent's OID, whether it is a
    leaf, schema, name, and whether this role may SELECT and DELETE it by its own name."""
    # Each partition's names looked up by its OID (see table_size): joined, the planner takes
    # the function for a thousand rows and hashes them against a scan of every schema.
    return sql.SQL(
        "SELECT t.relid::oid::bigint, t.parentrelid::oid::bigint, t.isleaf, c.nspname, c.relname,"
        " has_table_privilege(t.relid, 'SELECT') AND has_table_privilege(t.relid, 'DELETE')"
        " FROM pg_partition_tree(%(rel)s::regclass) t"
        " CROSS JOIN LATERAL (SELECT n.nspname::text, c.relname::text FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = t.relid OFFSET 0) c"
        " WHERE t.level > 0"
    )


def bounds_judged(sql_type: str) -> sql.Composed:
    """For each (`%(lo)s`[i], `%(hi)s`[i]) bound pair (text, NULL for MINVALUE/MAXVALUE), in
    order: wholly expired (`hi <= %(limit)s`, the cutoff plus one step), holding no expired row
    (`lo > %(cutoff)s`), beginning after the instant (`lo > %(now)s`); compared in the column's
    type, the texts read back in the session that printed them."""
    t = _BOUND_TYPES[sql_type]
    return sql.SQL(
        "SELECT coalesce(b.hi::{t} <= %(limit)s, false), coalesce(b.lo::{t} > %(cutoff)s, false),"
        " coalesce(b.lo::{t} > %(now)s, false)"
        " FROM unnest(%(lo)s::text[], %(hi)s::text[]) WITH ORDINALITY AS b(lo, hi, n)"
        " ORDER BY b.n"
    ).format(t=t)


def bound_after(sql_type: str) -> sql.Composed:
    """One row: the greatest of the `%(hi)s` bounds, and the upper bound of a next partition
    as wide as the one ending there (in months and days for a timestamp, so a monthly
    partition is followed by a month)."""
    t = _BOUND_TYPES[sql_type]
    width = (
        sql.SQL("b.hi::{t} - b.lo::{t}")
        if sql_type in ("bigint", "integer")
        else sql.SQL("age(b.hi::{t}, b.lo::{t})")
    ).format(t=t)
    return sql.SQL(
        "SELECT b.hi::{t}::text, (b.hi::{t} + {width})::text"
        " FROM unnest(%(lo)s::text[], %(hi)s::text[]) AS b(lo, hi)"
        " ORDER BY b.hi::{t} DESC LIMIT 1"
    ).format(t=t, width=width)


def session_bounds() -> sql.SQL:
    """Lock and statement timeouts (ms) for this session, not a transaction: a `DETACH ...
    CONCURRENTLY` runs outside any transaction block. Undone by `session_reset`."""
    return sql.SQL(
        "SELECT set_config('lock_timeout', %s::text, false),"
        " set_config('statement_timeout', %s::text, false)"
    )


def session_reset() -> sql.SQL:
    """The server's own timeouts again, before the connection goes back to the pool."""
    return sql.SQL("RESET lock_timeout; RESET statement_timeout")


def detach(parent: TableName, child: TableName, how: str) -> sql.Composed:
    """`ALTER TABLE parent DETACH PARTITION child` and `how`: `CONCURRENTLY` (two transactions
    of its own, SHARE UPDATE EXCLUSIVE on the parent), `FINALIZE` (completes one that was
    interrupted between them), or `` (plain, ACCESS EXCLUSIVE, inside a transaction)."""
    suffix = {"CONCURRENTLY": " CONCURRENTLY", "FINALIZE": " FINALIZE", "": ""}[how]
    return sql.SQL("ALTER TABLE {} DETACH PARTITION {}" + suffix).format(
        ident(parent), ident(child)
    )


def count_rows(table: TableName) -> sql.Composed:
    """Every row of a partition: what its drop or move would remove (for a dry run)."""
    return sql.SQL("SELECT count(*) FROM {}").format(ident(table))


def drop_table(table: TableName) -> sql.Composed:
    return sql.SQL("DROP TABLE {}").format(ident(table))


def move_table(table: TableName, schema: str) -> sql.Composed:
    return sql.SQL("ALTER TABLE {} SET SCHEMA {}").format(ident(table), sql.Identifier(schema))


def relation_state() -> sql.SQL:
    """One row for the relation of OID `%(oid)s`, none if it is gone: schema, name, the OID of
    the table it is a partition of (NULL when standalone), and whether half-detached."""
    return sql.SQL(
        "SELECT n.nspname::text, c.relname::text, i.inhparent::bigint, i.inhdetachpending"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " LEFT JOIN pg_inherits i ON i.inhrelid = c.oid WHERE c.oid = %(oid)s::bigint::oid"
    )


def schema_ready() -> sql.SQL:
    """One row: whether schema `%(schema)s` (a quoted name) exists, and whether this role may
    create in it (what moving a table there needs)."""
    return sql.SQL(
        "SELECT s.oid IS NOT NULL,"
        " CASE WHEN s.oid IS NULL THEN false ELSE has_schema_privilege(s.oid, 'CREATE') END"
        " FROM (SELECT to_regnamespace(%(schema)s)::oid AS oid) s"
    )


def name_taken() -> sql.SQL:
    """Whether a relation `%(name)s` (quoted, schema-qualified) exists."""
    return sql.SQL("SELECT to_regclass(%(name)s) IS NOT NULL")


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


#: `pg_stats` rows of `%(column)s` of `%(rel)s`, its schema and table names compared with
#: values: joined to pg_class by name instead, the view is computed for every table of that
#: name (every tenant's `sessions`), 76 ms a call among 3,000 of them against 0.9 ms (measured).
_STATS_OF_REL = (
    "(s.schemaname, s.tablename) = (SELECT n.nspname, c.relname FROM pg_class c"
    " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %(rel)s::regclass)"
    " AND s.attname = %(column)s"
)


def column_correlation() -> sql.SQL:
    """ANALYZE's correlation between the order of `%(column)s` and the heap's order in
    `%(rel)s` (the planner's own figure for an index scan's page reads); no row when the table
    was never analyzed."""
    return sql.SQL(
        "SELECT s.correlation FROM pg_stats s WHERE "
        + _STATS_OF_REL
        + " ORDER BY s.inherited DESC LIMIT 1"
    )


def column_statistics() -> sql.SQL:
    """The planner's view of `%(column)s` of `%(rel)s`: histogram bounds, most common values
    and their frequencies, as exact numbers; no row when the table was never analyzed."""
    return sql.SQL(
        "SELECT s.histogram_bounds::text::numeric[], s.most_common_vals::text::numeric[],"
        " s.most_common_freqs"
        " FROM pg_stats s WHERE " + _STATS_OF_REL + " ORDER BY s.inherited DESC LIMIT 1"
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
        # The keys found through pg_depend, as in is_referenced: no scan of pg_constraint.
        " WHERE f.oid IN (" + _DEPENDENT_CONSTRAINTS + ")"
        " AND f.contype = 'f' AND f.confrelid = %(rel)s::regclass"
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


def table_size() -> sql.SQL:
    """One row for `%(rel)s`: the heap pages of its largest leaf (exact, from the file size),
    the live rows its leaves hold per the statistics, whether any leaf was never analyzed,
    whether the table is partitioned, and whether its DELETE's rows can be counted on the
    server (`ledger_add_deleted`): `track_counts` on, no partitions or inheritance children
    (a DELETE of the table removes their rows and counts them as theirs), and no rule or
    DELETE trigger of its own (which might delete more of its rows than the DELETE's tag
    says; 8 is TRIGGER_TYPE_DELETE). The leaves hold the rows: a partitioned table's
    partitions, or a plain table itself (pg_partition_tree() returns nothing for a table
    outside any partition tree)."""
    # Each leaf's pg_class row looked up by its OID (the LATERAL kept apart by OFFSET 0): a
    # plain join let the planner hash the leaves against a scan of every relation on the
    # server, 4.3 ms a table among 3,000 tables, growing with them (bench/README.md).
    return sql.SQL(
        "WITH rel AS (SELECT %(rel)s::regclass AS oid),"
        " leaves AS ("
        "SELECT t.relid AS oid FROM rel, pg_partition_tree(rel.oid) t WHERE t.isleaf"
        " UNION"
        " SELECT rel.oid FROM rel JOIN pg_class c ON c.oid = rel.oid WHERE c.relkind <> 'p')"
        " SELECT coalesce(max(pg_relation_size(l.oid)), 0) / current_setting('block_size')::int,"
        " sum(greatest(c.reltuples, 0)), bool_or(c.reltuples < 0),"
        " (SELECT relkind = 'p' FROM pg_class WHERE oid = (SELECT oid FROM rel)),"
        " current_setting('track_counts')::bool"
        " AND NOT (SELECT relhassubclass OR relhasrules FROM pg_class"
        " WHERE oid = (SELECT oid FROM rel))"
        " AND NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = (SELECT oid FROM rel)"
        " AND NOT t.tgisinternal AND t.tgtype::int & 8 <> 0)"
        " FROM leaves l"
        " CROSS JOIN LATERAL (SELECT reltuples FROM pg_class WHERE oid = l.oid OFFSET 0) c"
    )


def serving_index() -> sql.SQL:
    """A valid, whole-table btree index of `%(rel)s` whose first key is `%(column)s`: its
    name, the one with fewest columns; no row when there is none."""
    return sql.SQL(
        "SELECT i.indexrelid::regclass::text FROM pg_index i"
        " JOIN pg_class ic ON ic.oid = i.indexrelid"
        " JOIN pg_am am ON am.oid = ic.relam AND am.amname = 'btree'"
        " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]"
        " WHERE i.indrelid = %(rel)s::regclass AND i.indisvalid AND i.indpred IS NULL"
        " AND a.attname = %(column)s"
        " ORDER BY i.indnatts LIMIT 1"
    )


def is_referenced() -> sql.SQL:
    """Whether any foreign key references `%(rel)s`."""
    # Found through what depends on the table (pg_depend, indexed by the object depended on: a
    # foreign key depends on the columns it references), not by scanning pg_constraint, which
    # no index serves by `confrelid`: 1.4 ms a table among 3,000 tables, growing with them.
    return sql.SQL(
        "SELECT EXISTS (SELECT 1 FROM pg_constraint f WHERE f.oid IN ("
        + _DEPENDENT_CONSTRAINTS
        + ") AND f.contype = 'f' AND f.confrelid = %(rel)s::regclass)"
    )


#: The constraints that depend on `%(rel)s` or its columns, by pg_depend's index on what is
#: depended on: a foreign key is among them for each column it references.
_DEPENDENT_CONSTRAINTS = (
    "SELECT d.objid FROM pg_depend d WHERE d.refclassid = 'pg_class'::regclass"
    " AND d.refobjid = %(rel)s::regclass AND d.classid = 'pg_constraint'::regclass"
)
