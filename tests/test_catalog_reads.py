"""The catalog reads a sweep makes of each table: right for every shape of table and foreign key,
and, among thousands of tables, each reads a few catalog rows, not every relation's.

A pass over thousands of tenants' tables runs these once a table: a read that scans pg_class or
pg_constraint costs the pass time in proportion to the square of the tables
(docs/decisions/catalog-reads-by-oid.md).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from activities import builtin_kinds as kinds
from activities.engine import catalog, leftover, partitions, units
from activities.engine.catalog import plan_nodes
from activities.pattern_matches import HASH_JOINS, candidates
from activities.spread_steps import PatternStep
from purge_config.names import TableName
from purge_config.patterns import parse_table, pattern_of

#: The catalogs a per-table read may look into, by index, a few rows each.
CATALOGS = {
    "pg_class",
    "pg_constraint",
    "pg_depend",
    "pg_attribute",
    "pg_index",
    "pg_statistic",
    "pg_inherits",
    "pg_namespace",
    "pg_partitioned_table",
    "pg_type",
}


def _one(db: psycopg.Connection[Any], query: sql.Composable, rel: str) -> Any:
    return db.execute(query, {"rel": rel, "column": "id"}).fetchone()


def _referenced(db: psycopg.Connection[Any], rel: str) -> bool:
    """The definition: some foreign key's `confrelid` is the table (a scan of pg_constraint)."""
    [found] = db.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_constraint WHERE contype = 'f'"
        " AND confrelid = %s::regclass)",
        (rel,),
    ).fetchone() or [False]
    return bool(found)


def test_a_foreign_key_is_found_on_the_table_it_references_and_on_no_other(
    db: psycopg.Connection[Any],
) -> None:
    db.execute(
        """
        CREATE TABLE parent (id bigint PRIMARY KEY);
        CREATE TABLE child (id bigint PRIMARY KEY, parent_id bigint REFERENCES parent);
        CREATE TABLE selfref (id bigint PRIMARY KEY, up bigint REFERENCES selfref);
        CREATE TABLE pair (a int, b int, PRIMARY KEY (a, b));
        CREATE TABLE pair_child (a int, b int,
            FOREIGN KEY (a, b) REFERENCES pair ON DELETE CASCADE);
        CREATE TABLE pp (id bigint PRIMARY KEY) PARTITION BY RANGE (id);
        CREATE TABLE pp_1 PARTITION OF pp FOR VALUES FROM (0) TO (10);
        CREATE TABLE pp_2 PARTITION OF pp FOR VALUES FROM (10) TO (20);
        CREATE TABLE pp_child (pp_id bigint REFERENCES pp);
        CREATE TABLE gone (id bigint PRIMARY KEY);
        CREATE TABLE goner (gone_id bigint CONSTRAINT to_gone REFERENCES gone);
        ALTER TABLE goner DROP CONSTRAINT to_gone;
        CREATE TABLE viewed (id bigint PRIMARY KEY);
        CREATE VIEW a_view AS SELECT id FROM viewed;
        CREATE TABLE indexed_child (parent_id bigint REFERENCES parent);
        CREATE INDEX ON indexed_child (parent_id);
        """
    )
    tables = ["parent", "child", "selfref", "pair", "pair_child", "pp", "pp_1", "pp_2"]
    tables += ["pp_child", "gone", "goner", "viewed", "indexed_child"]

    found = {rel: bool(_one(db, catalog.is_referenced(), rel)[0]) for rel in tables}

    assert found == {rel: _referenced(db, rel) for rel in tables}
    assert {rel for rel, yes in found.items() if yes} == {
        "parent", "selfref", "pair", "pp", "pp_1", "pp_2",
    }  # fmt: skip
    # The keys without an index on the child's columns, one row a key (a key of two columns
    # depends on both: found once).
    children = catalog.unindexed_children()
    params = {"column": "id"}
    assert db.execute(children, {**params, "rel": "parent"}).fetchall() == [
        ("child", ["parent_id"], "NO ACTION")
    ]
    assert db.execute(children, {**params, "rel": "pair"}).fetchall() == [
        ("pair_child", ["a", "b"], "CASCADE")
    ]
    assert db.execute(children, {**params, "rel": "gone"}).fetchall() == []


def test_table_size_reads_every_leaf_of_plain_and_partitioned_tables(
    db: psycopg.Connection[Any],
) -> None:
    db.execute(
        """
        CREATE TABLE plain (id bigint, pad text);
        INSERT INTO plain SELECT i, repeat('x', 100) FROM generate_series(1, 2000) i;
        CREATE TABLE unread (id bigint);
        INSERT INTO unread SELECT generate_series(1, 10);
        CREATE TABLE parted (id bigint, pad text) PARTITION BY RANGE (id);
        CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (1000);
        CREATE TABLE parted_2 PARTITION OF parted FOR VALUES FROM (1000) TO (5000);
        INSERT INTO parted SELECT i, repeat('x', 100) FROM generate_series(0, 4999) i;
        CREATE TABLE inherited (id bigint);
        CREATE TABLE inherited_child () INHERITS (inherited);
        CREATE TABLE triggered (id bigint);
        CREATE FUNCTION keep_going() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN OLD; END';
        CREATE TRIGGER on_delete BEFORE DELETE ON triggered
          FOR EACH ROW EXECUTE FUNCTION keep_going();
        CREATE TABLE ruled (id bigint);
        CREATE RULE also_log AS ON DELETE TO ruled DO ALSO NOTIFY ruled;
        CREATE TABLE insert_triggered (id bigint);
        CREATE TRIGGER on_insert BEFORE INSERT ON insert_triggered
          FOR EACH ROW EXECUTE FUNCTION keep_going();
        ANALYZE plain;
        ANALYZE parted;
        """
    )

    def pages(rel: str) -> int:
        [n] = db.execute(
            "SELECT pg_relation_size(%s::regclass) / current_setting('block_size')::int", (rel,)
        ).fetchone() or [0]
        return int(n)

    size = catalog.table_size()
    # The fifth column: whether a DELETE of the table counts, on the server, every row it
    # removes as the table's own, and only those (track_counts on; no partitions, inheritance
    # children, rules or DELETE triggers). The sixth: whether a plain table may have
    # inheritance children (the sweep then reads them, and refuses the table).
    assert _one(db, size, "plain") == (pages("plain"), 2000, False, False, True, False)
    assert _one(db, size, "unread")[2:] == (True, False, True, False)  # never analyzed
    # The largest leaf's pages, every leaf's rows.
    assert _one(db, size, "parted") == (pages("parted_2"), 5000, False, True, False, False)
    assert _one(db, size, "parted_1") == (pages("parted_1"), 1000, False, False, True, False)
    # A DELETE of an inheritance parent removes its children's rows too, counted as theirs.
    assert _one(db, size, "inherited")[3:] == (False, False, True)
    assert _one(db, size, "inherited_child")[3:] == (False, True, False)
    # A DELETE trigger or a rule of its own might delete more rows than the DELETE's tag says.
    assert _one(db, size, "triggered")[4] is False
    assert _one(db, size, "ruled")[4] is False
    assert _one(db, size, "insert_triggered")[4] is True


@pytest.fixture
def many_tenants(db: psycopg.Connection[Any], schema: str) -> Iterator[str]:
    """2,000 tenant schemas of one table each, as a schema-per-tenant application has them, and
    a partitioned table; the table to read is tenant 7's (a foreign key references it).
    Dropped after."""
    tenants = [f"{schema}_{i:04d}" for i in range(2000)]
    for start in range(0, len(tenants), 250):
        db.execute(
            "; ".join(
                f'CREATE SCHEMA "{t}"; CREATE TABLE "{t}".sessions'
                f' (id bigint PRIMARY KEY, expires_at bigint); CREATE INDEX ON "{t}".sessions'
                " (expires_at)"
                for t in tenants[start : start + 250]
            )
        )
    db.execute(f'CREATE TABLE kid (id bigint REFERENCES "{tenants[7]}".sessions)')
    db.execute(
        "CREATE TABLE parted (id bigint, expires_at bigint) PARTITION BY RANGE (expires_at);"
        " CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (10);"
        " CREATE TABLE parted_2 PARTITION OF parted FOR VALUES FROM (10) TO (20)"
    )
    # The catalogs (their statistics must know of the 2,000 tables, as autovacuum's would) and
    # the tables made here: a database-wide ANALYZE reached every other test's tables on the
    # shared server, mid-test (one whose statistics must stay unmade, or counted once).
    catalogs = db.execute(
        "SELECT oid::regclass::text FROM pg_class"
        " WHERE relnamespace = 'pg_catalog'::regnamespace AND relkind = 'r'"
    ).fetchall()
    made = [sql.Identifier(t, "sessions") for t in tenants] + [sql.Identifier("kid")]
    made += [sql.Identifier("parted"), *(sql.SQL(name) for (name,) in catalogs)]
    db.execute(sql.SQL("ANALYZE {}").format(sql.SQL(", ").join(made)))
    try:
        yield f'"{tenants[7]}".sessions'
    finally:
        for start in range(0, len(tenants), 250):
            db.execute(
                "; ".join(f'DROP SCHEMA "{t}" CASCADE' for t in tenants[start : start + 250])
            )


#: Every read a sweep makes of one table's catalog entries (`%(rel)s`, `%(column)s`).
PER_TABLE_READS: list[Callable[[], sql.Composable]] = [
    catalog.table_size,
    catalog.is_referenced,
    catalog.unindexed_children,
    catalog.serving_index,
    catalog.column_statistics,
    catalog.column_correlation,
    catalog.small_table,
    leftover.table_tuples,
    partitions.partition_key,
    partitions.partition_children,
    partitions.partition_tree,
]


def _by_name(rel: str, oid: int) -> dict[str, str]:
    return {"rel": rel, "column": "expires_at"}


#: The reads that bind a rule to its table, each with its own parameters (from the table's name
#: and its OID).
BINDING_READS: dict[Callable[[], sql.Composable], Callable[[str, int], Any]] = {
    catalog.column_types: lambda rel, oid: (rel,),
    catalog.btree_indexes: lambda rel, oid: (rel,),
    catalog.archive_target: lambda rel, oid: {"src": rel, "arc": rel},
    catalog.archive_columns: lambda rel, oid: {"src": oid, "arc": oid},
    catalog.related_keys: lambda rel, oid: {"rel": rel, "related": rel},
}


@pytest.mark.slow
def test_each_per_table_catalog_read_reads_a_few_catalog_rows_among_thousands_of_tables(
    db: psycopg.Connection[Any], many_tenants: str
) -> None:
    """Among 2,000 tables, no node of a read's plan reads more than a few dozen catalog rows
    (its actual rows and the rows its filter removed). Scanning pg_class read 6,000 here."""
    too_many = {}
    reads = {**dict.fromkeys(PER_TABLE_READS, _by_name), **BINDING_READS}
    for (read, params), rel in itertools.product(reads.items(), [many_tenants, "parted"]):
        [oid] = db.execute("SELECT %s::regclass::oid", (rel,)).fetchone() or [0]
        explain = sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) ") + read()
        row = db.execute(explain, params(rel, oid)).fetchone()
        assert row is not None
        for node in plan_nodes(row[0][0]["Plan"]):
            if node.get("Relation Name") not in CATALOGS:
                continue
            rows = node["Actual Rows"] * node["Actual Loops"] + node.get(
                "Rows Removed by Filter", 0
            )
            if rows > 50:
                too_many[(read.__name__, rel, node["Node Type"], node["Relation Name"])] = rows

    assert too_many == {}


@pytest.mark.slow
def test_a_patterns_matches_are_read_in_one_pass_over_the_catalog_on_stale_statistics(
    pg_url: str,
) -> None:
    """2,000 tenant schemas made in a fresh database, its catalog's statistics still the
    template's (as after a large onboarding): the page of matches is read with hash joins,
    a few rows a tenant. Left to the planner, it expected one schema and joined by a nested
    loop that read every tenant's table once per tenant (4,000,000 rows here; 19 s a page
    among 5,000)."""
    name = f"stale_{uuid.uuid4().hex[:8]}"
    tenants = 2000
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            with psycopg.connect(make_conninfo(pg_url, dbname=name), autocommit=True) as conn:
                for start in range(0, tenants, 500):
                    conn.execute(
                        "; ".join(
                            f"CREATE SCHEMA tenant_{i:04d}; CREATE TABLE tenant_{i:04d}.sessions"
                            " (id bigint PRIMARY KEY, expires_at bigint)"
                            for i in range(start, start + 500)
                        )
                    )
                pattern = pattern_of(parse_table("tenant_*.sessions"))
                assert pattern is not None
                query, params = candidates(pattern, PatternStep(name="sessions", now_ms=0))
                with conn.transaction():
                    conn.execute(HASH_JOINS)
                    row = conn.execute(
                        sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) ") + query, params
                    ).fetchone()
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    assert row is not None
    read = sum(
        node["Actual Rows"] * node["Actual Loops"] + node.get("Rows Removed by Filter", 0)
        for node in plan_nodes(row[0][0]["Plan"])
        if node.get("Relation Name") in CATALOGS
    )
    assert read <= 5 * tenants


def test_the_coarse_unit_probe_is_planned_without_walking_rows_deleted_since_the_index_vacuum(
    db: psycopg.Connection[Any],
) -> None:
    """Every sweep of an epoch column probes its index for a value in a coarser unit
    (`units.coarse_band`), and the probe is planned again after every ANALYZE. Its bounds lie
    below the column's histogram: as constants, the planner read the index's actual least key
    to estimate them, over the entries of an hour's deleted rows that a VACUUM left in the index
    (it skips the index while few pages hold dead rows): about a hundred heap pages at every
    planning, on the pass's path. The planning reads only the catalog; the probe still finds a
    coarse value through the index."""
    db.execute("CREATE TABLE probed (id bigint PRIMARY KEY, at_ms bigint NOT NULL)")
    db.execute(
        "INSERT INTO probed SELECT i, 1700000000000 + i * 36 FROM generate_series(1, 200000) i"
    )
    db.execute("CREATE INDEX ON probed (at_ms)")
    db.execute("VACUUM ANALYZE probed")
    # The oldest tenth deleted, the index left as a VACUUM that skips it leaves it.
    db.execute("DELETE FROM probed WHERE id <= 20000")
    db.execute("VACUUM (INDEX_CLEANUP OFF, ANALYZE) probed")
    rel = db.execute("SELECT 'probed'::regclass::text").fetchone()
    assert rel is not None
    probe = catalog.value_in_range(sql.Identifier("probed"), "at_ms", 10**8, 10**11)
    explain = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + probe
    params = {"rel": rel[0], "column": "at_ms"}
    db.execute(explain, params)  # the catalog's caches warmed

    def planned() -> tuple[int, Any]:
        row = db.execute(explain, params).fetchone()
        assert row is not None
        plan = row[0][0]
        buffers = plan["Planning"]
        return buffers["Shared Hit Blocks"] + buffers["Shared Read Blocks"], plan["Plan"]

    pages, _ = planned()
    # Measured: 10 (the catalog); 128 with the bounds as constants.
    assert pages < 40
    db.execute("INSERT INTO probed VALUES (0, 1700000000)")  # seconds, in a column of ms
    pages, plan = planned()
    assert pages < 40
    assert db.execute(probe, params).fetchone() == (1700000000,)
    assert _scans_of(plan, "probed") == ["Index Only Scan"]


def _scans_of(node: dict[str, Any], relation: str) -> list[str]:
    """The kinds of the scans of `relation` in an EXPLAIN (FORMAT JSON) plan node."""
    found = [node["Node Type"]] if node.get("Relation Name") == relation else []
    for child in node.get("Plans", []):
        found += _scans_of(child, relation)
    return found


def test_a_partitioned_tables_coarse_unit_probe_plans_none_of_its_partitions(
    db: psycopg.Connection[Any],
) -> None:
    """On a table partitioned by its epoch column the probe's constant bounds prune every
    partition while planning; as InitPlans (a plain table's form, above) each of them would be
    opened and planned at every planning, which the sweep's drops of partitions bring each
    pass."""
    db.execute("CREATE TABLE parted (id bigint, at_ms bigint NOT NULL) PARTITION BY RANGE (at_ms)")
    day = 86_400_000
    for n in range(40):
        low = 1_700_000_000_000 + n * day
        db.execute(
            sql.SQL("CREATE TABLE {} PARTITION OF parted FOR VALUES FROM ({}) TO ({})").format(
                sql.Identifier(f"parted_{n}"), sql.Literal(low), sql.Literal(low + day)
            )
        )
    db.execute("CREATE INDEX ON parted (at_ms)")
    db.execute(
        "INSERT INTO parted"
        " SELECT i, 1700000000000 + i::bigint * 3600000 FROM generate_series(0, 959) i"
    )
    db.execute("ANALYZE parted")
    rel = db.execute("SELECT 'parted'::regclass::text").fetchone()
    assert rel is not None
    params = {"rel": rel[0], "column": "at_ms"}

    def partitions_planned(partitioned: bool) -> int:
        probe = catalog.value_in_range(
            sql.Identifier("parted"), "at_ms", 10**8, 10**11, partitioned
        )
        row = db.execute(sql.SQL("EXPLAIN (FORMAT JSON) ") + probe, params).fetchone()
        assert row is not None
        return sum(len(_scans_of(row[0][0]["Plan"], f"parted_{n}")) for n in range(40))

    assert partitions_planned(partitioned=True) == 0
    assert partitions_planned(partitioned=False) == 40


async def test_a_sweep_probes_a_plain_table_by_initplans_and_a_partitioned_one_by_constants(
    db: psycopg.Connection[Any], pool: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Which form a sweep's unit check sends follows the table it reads in the plan's round trip
    (the columns' read, which carries the relkind)."""
    sent: list[bool] = []
    probe = units.value_in_range

    def recorded(*args: Any, partitioned: bool = False) -> Any:
        sent.append(partitioned)
        return probe(*args, partitioned=partitioned)

    monkeypatch.setattr(units, "value_in_range", recorded)
    db.execute("CREATE TABLE plain_ms (id bigint PRIMARY KEY, at_ms bigint NOT NULL)")
    db.execute("CREATE INDEX ON plain_ms (at_ms)")
    db.execute(
        "CREATE TABLE split_ms (id bigint, at_ms bigint NOT NULL) PARTITION BY RANGE (at_ms)"
    )
    db.execute("CREATE TABLE split_ms_0 PARTITION OF split_ms FOR VALUES FROM (0) TO (MAXVALUE)")
    db.execute("CREATE INDEX ON split_ms (at_ms)")
    now_ms = 1_800_000_000_000
    for table in ("plain_ms", "split_ms"):
        target = kinds.expiring(pool, table, TableName(table), "at_ms")
        await target.sweep(now_ms)

    assert sent == [False, True]
