"""What the engine reads of the catalog, the statistics and the planner, in one room.

Every read that binds a rule to its table (the columns and their types, a filter's values, an
archive's shape, the foreign key through which an age kept in another table is read) or that
chooses a table's plan (its size, the index that serves the expiry column or a filter, the
foreign keys into it, the planner's estimates) is written here; the code that runs each read
lives beside its one user (`rules`, `filter_binding`, `archive`, `units`,
`table_facts`, `filter_index`). A sweep runs these once a table, among possibly thousands of
tables: each must read a few catalog rows by index, never scan pg_class or pg_constraint
(tests/test_catalog_reads.py holds them to it).

Reads of one table take `%(rel)s`, its quoted name as text (`rules.ident(...).as_string(conn)`),
and where they read a column, `%(column)s`; composed statements take the table as the
`sql.Identifier` `rules.ident` makes (this module imports nothing of the engine: `rules` reads
through it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from psycopg import sql

# -- Binding a rule: the table, its columns, a filter's values, an archive ---------------------


def column_types() -> sql.SQL:
    """Each column of the table named by the one positional parameter: (name, its SQL type with
    domains resolved to their base type, the table's relkind); no row when there is no table."""
    return sql.SQL(
        """
        SELECT a.attname, format_type(coalesce(nullif(t.typbasetype, 0), t.oid), NULL),
               c.relkind
        FROM pg_class c
        JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
        JOIN pg_type t ON t.oid = a.atttypid
        WHERE c.oid = to_regclass(%s)
        """
    )


def filter_values(relation: sql.Identifier, where: sql.Composable) -> sql.Composed:
    """A statement that reads no row but has the server read each of `where`'s parameters as
    its column's type (parameters are read when a statement is bound)."""
    return sql.SQL("SELECT 1 FROM {} WHERE {} LIMIT 0").format(relation, where)


def filter_column_values(relation: sql.Identifier, column: str, names: list[str]) -> sql.Composed:
    """As `filter_values`, for one column's values only, the parameters `names`."""
    holders = sql.SQL(", ").join(sql.Placeholder(name) for name in names)
    return sql.SQL("SELECT 1 FROM {} WHERE {} IN ({}) LIMIT 0").format(
        relation, sql.Identifier(column), holders
    )


def archive_target() -> sql.SQL:
    """One row for the archive `%(arc)s` of the table `%(src)s`: the source's OID, the
    archive's OID and relkind (NULL when it does not exist), whether this role may insert into
    it, the role's name, the tables whose foreign keys reference the source ON DELETE CASCADE
    (the source itself among them for a key to itself), by name, and whether the two are in
    one partition tree (one the other's partition, or both partitions of one table)."""
    # The source by to_regclass, as its OID is read: a table not there reads NULL here, and is
    # said as such by the rule's own read. A partitioned referencing table once, not each of its
    # partitions' copies of the key (conparentid).
    cascading = _cascading_keys("to_regclass(%(src)s)", " AND f.conparentid = 0")
    return sql.SQL(
        "SELECT to_regclass(%(src)s)::oid, a.oid, a.relkind,"
        " has_table_privilege(a.oid, 'INSERT'), current_user::text,"
        " array(" + cascading + "),"
        " coalesce(pg_partition_root(to_regclass(%(src)s))::oid, to_regclass(%(src)s)::oid)"
        " = coalesce(pg_partition_root(a.oid::regclass)::oid, a.oid)"
        " FROM (SELECT to_regclass(%(arc)s)::oid) r(oid)"
        " LEFT JOIN pg_class a ON a.oid = r.oid"
    )


def archive_columns() -> sql.SQL:
    """The columns of the tables with OIDs `%(src)s` and `%(arc)s`, the source's first, each in
    its table's order: (is the source's, name, type, NOT NULL, has a default, identity,
    generated)."""
    return sql.SQL(
        "SELECT attrelid = %(src)s::oid, attname, format_type(atttypid, atttypmod),"
        " attnotnull, atthasdef, attidentity::text, attgenerated::text"
        " FROM pg_attribute WHERE attrelid IN (%(src)s::oid, %(arc)s::oid)"
        " AND attnum > 0 AND NOT attisdropped ORDER BY attrelid = %(src)s::oid DESC, attnum"
    )


def related_keys() -> sql.SQL:
    """The foreign keys from `%(related)s` to `%(rel)s` (a partitioned table's own, not the
    copies on its partitions): (name, ON DELETE action as pg_constraint's letter, the related
    table's columns, the columns they reference, both in the key's order, whether this role may
    read the related table, and whether a valid whole index of it leads with the key's
    columns)."""
    # By the related table's OID: pg_constraint's index on conrelid serves it, no scan.
    return sql.SQL(
        "SELECT f.conname::text, f.confdeltype::text,"
        " array(SELECT a.attname::text FROM unnest(f.conkey) WITH ORDINALITY k(n, o)"
        " JOIN pg_attribute a ON a.attrelid = f.conrelid AND a.attnum = k.n ORDER BY k.o),"
        " array(SELECT a.attname::text FROM unnest(f.confkey) WITH ORDINALITY k(n, o)"
        " JOIN pg_attribute a ON a.attrelid = f.confrelid AND a.attnum = k.n ORDER BY k.o),"
        " has_table_privilege(f.conrelid, 'SELECT'),"
        " EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = f.conrelid AND i.indisvalid"
        " AND i.indpred IS NULL"
        " AND (i.indkey::int2[])[0:cardinality(f.conkey) - 1] @> f.conkey"
        " AND (i.indkey::int2[])[0:cardinality(f.conkey) - 1] <@ f.conkey)"
        " FROM pg_constraint f"
        " WHERE f.conrelid = %(related)s::regclass AND f.contype = 'f'"
        " AND f.confrelid = %(rel)s::regclass AND f.conparentid = 0"
        " ORDER BY f.conname"
    )


# -- Choosing a plan: sizes, indexes, foreign keys, statistics ----------------------------------


def table_size() -> sql.SQL:
    """One row for `%(rel)s`: the heap pages of its largest leaf (exact, from the file size),
    the live rows its leaves hold per the statistics, whether any leaf was never analyzed,
    whether the table is partitioned, and whether its DELETE's rows can be counted on the
    server (the ledger's count of a plain batch): `track_counts` on, no partitions or
    inheritance children (a DELETE of the table removes their rows and counts them as theirs),
    and no rule or DELETE trigger of its own (which might delete more of its rows than the
    DELETE's tag says; 8 is TRIGGER_TYPE_DELETE); and whether a plain table may have
    inheritance children (`relhassubclass`, which outlives the last child until a VACUUM). The
    leaves hold the rows: a partitioned table's partitions, or a plain table itself
    (pg_partition_tree() returns nothing for a table outside any partition tree)."""
    # Each leaf's pg_class row looked up by its OID (the LATERAL kept apart by OFFSET 0): a
    # plain join let the planner hash the leaves against a scan of every relation on the
    # server (why: docs/decisions/catalog-reads-by-oid.md).
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
        " AND NOT t.tgisinternal AND t.tgtype::int & 8 <> 0),"
        " (SELECT relkind = 'r' AND relhassubclass FROM pg_class WHERE oid = (SELECT oid FROM rel))"
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


def value_in_range(
    relation: sql.Identifier, column: str, low: int, high: int, partitioned: bool = False
) -> sql.Composed:
    """The least value of `column` from `low` up to below `high` (NULL when none), read only where
    `serving_index` finds an index on `%(rel)s` that leads with `%(column)s`: a probe of that
    index. Without one it reads no row of the table (the gate is checked first), never a
    scan. For a `partitioned` table, its bounds are constants (below)."""

    # The bounds are subqueries (InitPlans), never constants the planner sees: bounds below the
    # column's histogram made it read the index's actual least key to estimate them, walking the
    # entries of every row deleted since the index was last vacuumed (a VACUUM skips the index
    # while few pages hold dead rows), heap page by heap page, at every planning: after each
    # ANALYZE, and each custom plan of the prepared probe. ORDER BY keeps the index whatever
    # the planner's default guess at the rows in range: a sort would read the table. But a
    # partitioned table's partitions are pruned while planning only by constants: with
    # InitPlans every partition is opened and planned at each planning (each pass, where the
    # sweep drops partitions), so there the bounds stay constants (its partitions by the
    # column are pruned, none planned).
    def bound(value: int) -> sql.Composable:
        return (
            sql.Literal(value) if partitioned else sql.SQL("(SELECT {})").format(sql.Literal(value))
        )

    probe = sql.SQL(
        "SELECT (SELECT {col} FROM {t} WHERE {col} >= {low} AND {col} < {high}"
        " ORDER BY {col} LIMIT 1) WHERE EXISTS ("
    ).format(col=sql.Identifier(column), t=relation, low=bound(low), high=bound(high))
    return sql.Composed([probe, serving_index(), sql.SQL(")")])


def btree_indexes() -> sql.SQL:
    """Every valid btree index of the table named by the one positional parameter: (its name
    as EXPLAIN gives it, its name as a statement gives it, whether it is partial, its key
    columns in order, NULL for an expression key)."""
    return sql.SQL(
        """
        SELECT ic.relname::text, i.indexrelid::regclass::text, i.indpred IS NOT NULL,
               array(SELECT a.attname::text
                     FROM unnest((i.indkey::int2[])[0:i.indnkeyatts - 1]) WITH ORDINALITY k(n, o)
                     LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n
                     ORDER BY k.o)
        FROM pg_index i
        JOIN pg_class ic ON ic.oid = i.indexrelid
        JOIN pg_am am ON am.oid = ic.relam AND am.amname = 'btree'
        WHERE i.indrelid = %s::regclass AND i.indisvalid
        """
    )


def _dependent_constraints(rel: str = "%(rel)s::regclass") -> str:
    """The constraints that depend on the table `rel` (SQL giving its regclass) or its
    columns, by pg_depend's index on what is depended on: a foreign key is among them for each
    column it references."""
    return (
        "SELECT d.objid FROM pg_depend d WHERE d.refclassid = 'pg_class'::regclass"
        f" AND d.refobjid = {rel} AND d.classid = 'pg_constraint'::regclass"
    )


_DEPENDENT_CONSTRAINTS = _dependent_constraints()


def _cascading_keys(rel: str, also: str) -> str:
    """The tables whose foreign keys reference the table `rel` (SQL giving its regclass) ON
    DELETE CASCADE, by name, found through what depends on it (as `is_referenced`); `also`, a
    further condition on the key `f`."""
    return (
        "SELECT DISTINCT f.conrelid::regclass::text FROM pg_constraint f"
        f" WHERE f.oid IN ({_dependent_constraints(rel)})"
        f" AND f.contype = 'f' AND f.confdeltype = 'c' AND f.confrelid = {rel}{also} ORDER BY 1"
    )


def is_referenced() -> sql.SQL:
    """Whether any foreign key references `%(rel)s`."""
    # Found through what depends on the table (pg_depend, indexed by the object depended on: a
    # foreign key depends on the columns it references), not by scanning pg_constraint, which
    # no index serves by `confrelid` (why: docs/decisions/catalog-reads-by-oid.md).
    return sql.SQL(
        "SELECT EXISTS (SELECT 1 FROM pg_constraint f WHERE f.oid IN ("
        + _DEPENDENT_CONSTRAINTS
        + ") AND f.contype = 'f' AND f.confrelid = %(rel)s::regclass)"
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


def cascading_children() -> sql.SQL:
    """The tables but `%(own)s` (NULL: none) whose foreign keys reference `%(rel)s` ON DELETE
    CASCADE, by name: a DELETE of its rows removes theirs too."""
    return sql.SQL(
        _cascading_keys(
            "%(rel)s::regclass", " AND f.conrelid IS DISTINCT FROM %(own)s::text::regclass"
        )
    )


def delete_vetoes() -> sql.SQL:
    """What may keep a row a DELETE of `%(rel)s` names, by kind and name: its enabled BEFORE
    DELETE row triggers (one that returns NULL keeps the row; a soft delete updates it
    instead) and its DO INSTEAD rules on DELETE. tgtype's bits: ROW 1, BEFORE 2, DELETE 8."""
    return sql.SQL(
        "SELECT 'trigger', t.tgname::text FROM pg_trigger t"
        " WHERE t.tgrelid = %(rel)s::regclass AND NOT t.tgisinternal"
        " AND t.tgenabled IN ('O', 'A') AND t.tgtype & 11 = 11"
        " UNION ALL SELECT 'rule', r.rulename::text FROM pg_rewrite r"
        " WHERE r.ev_class = %(rel)s::regclass AND r.ev_type = '4' AND r.is_instead"
        " ORDER BY 1 DESC, 2"
    )


#: `pg_stats` rows of `%(column)s` of `%(rel)s`, its schema and table names compared with
#: values: joined to pg_class by name instead, the view is computed for every table of that
#: name, every tenant's `sessions` (why: docs/decisions/catalog-reads-by-oid.md).
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


def column_sample(relation: sql.Identifier, column: str, rows: int) -> sql.Composed:
    """A few values of the column, as the first pages hold them: bounded, never a scan."""
    return sql.SQL("SELECT {col} FROM {t} WHERE {col} IS NOT NULL LIMIT {n}").format(
        col=sql.Identifier(column), t=relation, n=sql.Literal(rows)
    )


def schemas_holding() -> sql.SQL:
    """The schemas of the session's search_path, in its order, that hold a table (or a view,
    a foreign table) named `%(name)s`: an unqualified name is the first's."""
    return sql.SQL(
        "SELECT s.name::text FROM unnest(current_schemas(false)) WITH ORDINALITY s(name, o)"
        " JOIN pg_namespace n ON n.nspname = s.name"
        " JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = %(name)s"
        " AND c.relkind IN ('r', 'p', 'v', 'm', 'f')"
        " ORDER BY s.o"
    )


def table_names_in() -> sql.SQL:
    """Up to 5,000 names of tables in schema `%(schema)s`, or, where it is NULL, in the
    session's search_path: the names a misspelt table is compared with (read only when a
    table was not found)."""
    return sql.SQL(
        "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE c.relkind IN ('r', 'p') AND n.nspname = ANY(CASE WHEN %(schema)s::name IS NULL"
        " THEN current_schemas(false) ELSE ARRAY[%(schema)s::name] END) ORDER BY 1 LIMIT 5000"
    )


def inheritance_children() -> sql.SQL:
    """Up to six inheritance children of `%(rel)s`, by name: read only where `table_size` says
    there may be some."""
    return sql.SQL(
        "SELECT i.inhrelid::regclass::text FROM pg_inherits i"
        " WHERE i.inhparent = %(rel)s::regclass ORDER BY 1 LIMIT 6"
    )


def small_table() -> sql.SQL:
    """One row for `%(rel)s`, all a table needs to be swept in one statement when it is small
    (`activities.engine.small_tables`): its relkind; whether it has inheritance children or
    rules (a DELETE of it would reach other tables' rows, or be rewritten); its heap pages
    (exact, from the file's size); its dead tuples per the views; whether a foreign key
    references it; and the unit check's view of `%(column)s`, its statistics as text
    (histogram bounds, most common values and their frequencies; NULL when never analyzed).
    The same text for every table: prepared once a connection, planned once (pg_stats, a
    view of many joins, took 4 ms to plan each time)."""
    return sql.SQL(
        "SELECT c.relkind::text, c.relhassubclass OR c.relhasrules,"
        " pg_relation_size(c.oid) / current_setting('block_size')::int,"
        " pg_stat_get_dead_tuples(c.oid),"
        # By OID, as is_referenced: no scan of pg_constraint.
        " EXISTS (SELECT 1 FROM pg_constraint f WHERE f.oid IN ("
        + _DEPENDENT_CONSTRAINTS
        + ") AND f.contype = 'f' AND f.confrelid = c.oid),"
        " st.bounds, st.common, st.freqs"
        " FROM pg_class c LEFT JOIN LATERAL (SELECT s.histogram_bounds::text,"
        " s.most_common_vals::text, s.most_common_freqs::text FROM pg_stats s WHERE "
        + _STATS_OF_REL
        + " ORDER BY s.inherited DESC LIMIT 1) st(bounds, common, freqs) ON true"
        " WHERE c.oid = %(rel)s::regclass"
    )


def sample_texts(relation: sql.Identifier, column: str, rows: int) -> sql.Composed:
    """An expression: up to `rows` values of the column as text[] (of any type, so that it
    may be read before the type is known), as `column_sample` reads them (the first pages'
    non-null values, never a scan)."""
    return sql.SQL(
        "(SELECT array_agg(v::text) FROM (SELECT {col} AS v FROM {t} WHERE {col} IS NOT NULL"
        " LIMIT {n}) sample)"
    ).format(col=sql.Identifier(column), t=relation, n=sql.Literal(rows))


# -- The planner's estimates: EXPLAIN, never run ------------------------------------------------


def estimate(relation: sql.Identifier, where: sql.Composable) -> sql.Composed:
    """The planner's estimate of the rows `where` selects (the top node's `Plan Rows`)."""
    return sql.SQL("EXPLAIN (FORMAT JSON) SELECT 1 FROM {} WHERE {}").format(relation, where)


def index_order_only() -> sql.SQL:
    """Prices every way of reading a table but an index in order out of the planner's choice,
    for the current transaction only (undo it with a savepoint's rollback)."""
    return sql.SQL(
        "SELECT set_config('enable_seqscan', 'off', true),"
        " set_config('enable_bitmapscan', 'off', true), set_config('enable_sort', 'off', true)"
    )


def ordered_walk(
    relation: sql.Identifier, where: sql.Composable, order: tuple[str, ...], rows: int
) -> sql.Composed:
    """The planner's plan for reading the first `rows` rows `where` selects in `order`."""
    return sql.SQL(
        "EXPLAIN (FORMAT JSON) SELECT ctid FROM {} WHERE {} ORDER BY {} LIMIT {}"
    ).format(
        relation,
        where,
        sql.SQL(", ").join(sql.Identifier(c) for c in order),
        sql.Literal(rows),
    )


def top_plan(row: Any) -> dict[str, Any]:
    """The top plan node of an `EXPLAIN (FORMAT JSON)` result row."""
    document = json.loads(row[0]) if isinstance(row[0], str) else row[0]
    node: dict[str, Any] = document[0]["Plan"]
    return node


def estimated_rows(row: Any) -> float:
    """The top node's `Plan Rows` of an `estimate` result row; 0 without a row."""
    return float(top_plan(row)["Plan Rows"]) if row is not None else 0.0


def plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """An `EXPLAIN (FORMAT JSON)` plan node and every node under it."""
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)
