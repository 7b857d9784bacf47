"""The catalog reads that plan a table's sweep (its size, its serving index, the foreign keys
that reference it, its column's statistics). Every other statement now sits beside the code
that runs it: a batch's in `batch_sql`, the ledger's in `ledger`, a partition's in
`partitions` and `detaching`, pacing's, the lock's, the shares' and the after-sweep reads in
their own modules."""

from __future__ import annotations

from psycopg import sql

from activities.engine.rules import ident
from purge_config.names import TableName

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
