"""Choosing how to sweep one table in one pass, from what the catalog and the planner know.

Two strategies, measured in bench/ (PostgreSQL 18, 2 cores, 2M rows):
- `range`: walk the heap in fixed physical ranges, `ctid >= lo AND ctid < hi AND expired`. It reads
  every page once, so it costs about what one big DELETE does (1.05-1.1x) whatever the share of
  expired rows, and it needs no index. Right for large shares and for predicates no index serves.
- `index`: reads only expired rows through an index on the expiry column. Right for small shares:
  its cost follows the expired rows, not the table (31 ms vs 290-520 ms for a walk, at 1% of 2M
  rows). By keyset batches (`keyset` below chooses them; `activities.engine.keyset` runs them):
  the key where the next n expired rows end, then one plain DELETE of that key range; by ctid
  batches (`ctid = ANY(ARRAY(SELECT ctid ... ORDER BY col LIMIT n)) AND expired`) where a range
  cannot serve: a composite filter index, a partitioned parent, an archive that needs the rows
  back.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from psycopg import AsyncConnection, sql

from activities.engine import catalog
from activities.engine.batch_sql import index_batch
from activities.engine.filter_plan import filtered_advice, filtered_index, index_pays
from activities.engine.rules import Predicate, ident
from activities.progress import Strategy

#: Above this share of expired rows the walk is cheaper than the index, even with one...
INDEX_MAX_SHARE = 0.2
#: ... unless the heap is in the expiry column's order (|correlation| at least IN_ORDER, as a
#: fixed TTL or an append-only log leaves it): the expired rows then lie together at one end,
#: and keyset batches through the index read only their pages, where a walk reads every page
#: (the edge partition of a daily-partitioned log, half expired: half the pages). Up to
#: IN_ORDER_MAX_SHARE: past it the walk reads little more than the index would.
IN_ORDER = 0.9
IN_ORDER_MAX_SHARE = 0.75
#: A table this large (8 MB of heap) read whole for a small share is worth an index; smaller
#: tables cost too little to bother anyone with advice.
LARGE_PAGES = 1024
SMALL_SHARE = 0.1


@dataclass(frozen=True)
class TablePlan:
    """How one table is swept this pass, and what the planner expected."""

    strategy: Strategy
    pages: int
    """Heap pages to walk (the largest leaf partition's, for a partitioned table swept through
    its parent: each range batch then covers those pages of every partition)."""
    rows: float | None
    """Live rows per the statistics, or None when the table was never analyzed."""
    expired: float
    """The planner's estimate of expired rows."""
    index: str | None
    """An index that serves the expiry column, if any."""
    advice: str = ""
    """A warning for the operator, e.g. the index to create; empty when all is well."""
    referenced: bool = False
    """Whether a foreign key references the table: its deletes then run the child tables'
    referential queries, which must keep their indexes (a walk may not switch them off)."""
    partitioned: bool = False
    """The table is partitioned and swept through its parent (not partition by partition)."""
    order: tuple[str, ...] = ()
    """For a filtered rule's index (`(state, finished_at)`): its keys up to the expiry column,
    the order index batches read in; empty for the expiry column's own order."""
    correlation: float | None = None
    """For an index sweep: ANALYZE's correlation between the expiry column's order and the
    heap's (+-1: rows in expiry order, as a fixed TTL leaves them), None when not known."""
    counts_deletes: bool = False
    """Whether the rows a DELETE of this table removes are counted on the server as its own,
    and only those: `track_counts` on; no partitions, inheritance children, rules or DELETE
    triggers (`catalog.table_size`); no foreign key referencing it (one of its own, ON
    DELETE CASCADE, would count the rows it cascades to). A plain batch's ledger row then takes
    its count there (`ledger.ledger_add_deleted`)."""

    @property
    def rows_per_page(self) -> float | None:
        """Rows a heap page holds, per the statistics; None when unknown."""
        if not self.rows or not self.pages:
            return None
        return self.rows / self.pages

    @property
    def share(self) -> float | None:
        """The expected share of expired rows, when the statistics allow a guess."""
        if not self.rows:
            return None
        return min(1.0, self.expired / self.rows)


@dataclass(frozen=True)
class _Catalog:
    """What the catalog and the statistics say of one table, read in one round trip."""

    pages: int
    rows: float | None
    expired: float
    index: str | None
    referenced: bool
    partitioned: bool
    correlation: float | None
    counts_deletes: bool


async def plan_table(conn: AsyncConnection[Any], pred: Predicate) -> TablePlan:
    """Estimate, choose a strategy, and check the chosen batch statement's plan."""
    relation = ident(pred.table).as_string(conn)
    known = await _read_catalog(conn, pred, relation)
    index = known.index
    order: tuple[str, ...] = ()
    if pred.row_filter is not None and pred.column is not None:
        # A filter wants an index that serves it too (activities.engine.filter_plan).
        index, order = await filtered_index(conn, relation, pred, index, known.expired)
    share = None if not known.rows else min(1.0, known.expired / known.rows)
    in_order = (
        known.correlation is not None
        and abs(known.correlation) >= IN_ORDER
        and share is not None
        and share <= IN_ORDER_MAX_SHARE
        and keyset(pred, partitioned=known.partitioned, order=order)
    )
    use_index = index is not None and (share is None or share <= INDEX_MAX_SHARE or in_order)
    if use_index and pred.row_filter is not None:
        # A filter's rows are spread among rows it leaves: the index pays only when sparse.
        use_index = index_pays(known.expired, known.pages)
    plan = TablePlan(
        strategy="index" if use_index else "range",
        pages=known.pages,
        rows=known.rows,
        expired=known.expired,
        index=index,
        referenced=known.referenced,
        partitioned=known.partitioned,
        order=order,
        correlation=known.correlation,
        counts_deletes=known.counts_deletes and not known.referenced,
    )
    return replace(plan, advice=await _advice(conn, pred, plan))


def keyset(pred: Predicate, partitioned: bool, order: tuple[str, ...]) -> bool:
    """Whether an index sweep of this table goes by keyset batches: the index is the expiry
    column's own (a composite filter index orders by other keys first), the table is not swept
    through a partitioned parent, and no archive needs the deleted rows returned."""
    return (
        pred.column is not None
        and pred.archive is None
        and not partitioned
        and order in ((), (pred.column,))
    )


async def _read_catalog(conn: AsyncConnection[Any], pred: Predicate, relation: str) -> _Catalog:
    rel = {"rel": relation}
    # The catalog reads do not depend on one another: one pipelined round trip, not five.
    async with conn.pipeline():
        sizes = await conn.execute(catalog.table_size(), rel)
        estimate = await conn.execute(catalog.estimate(ident(pred.table), pred.where), pred.params)
        serving = (
            await conn.execute(catalog.serving_index(), {**rel, "column": pred.column})
            if pred.column
            else None
        )
        referencing = await conn.execute(catalog.is_referenced(), rel)
        # Wanted only for an index sweep (its first batch's size), not yet chosen: read
        # anyway, as the same round trip carries it.
        correlating = (
            await conn.execute(catalog.column_correlation(), {**rel, "column": pred.column})
            if pred.column and pred.row_filter is None
            else None
        )
    size = await sizes.fetchone() or (0, 0, True, False, False)
    pages, reltuples, never_analyzed, partitioned, counts = size
    explained = await estimate.fetchone()
    found = await serving.fetchone() if serving is not None else None
    referenced = await referencing.fetchone()
    correlated = await correlating.fetchone() if correlating is not None else None
    return _Catalog(
        pages=int(pages),
        rows=None if never_analyzed else float(reltuples or 0),
        expired=float(catalog.top_plan(explained)["Plan Rows"]) if explained else 0.0,
        index=str(found[0]) if found else None,
        referenced=bool(referenced and referenced[0]),
        partitioned=bool(partitioned),
        correlation=float(correlated[0]) if correlated and correlated[0] is not None else None,
        counts_deletes=bool(counts),
    )


async def _advice(conn: AsyncConnection[Any], pred: Predicate, plan: TablePlan) -> str:
    """EXPLAIN the batch statement about to run; when it reads a large table whole for a small
    share of expired rows, say which index would let it read only those."""
    if pred.column is None or plan.pages < LARGE_PAGES or plan.index is not None:
        # No column an index could serve, a table too small to matter, or an index that
        # already serves it: no index to advise.
        return ""
    share = plan.share
    if share is None or share >= SMALL_SHARE:
        return ""
    explained = await conn.execute(catalog.explain(index_batch(pred, 1000)), pred.params)
    row = await explained.fetchone()
    whole_scan = plan.strategy == "range" or (
        row is not None and _scans_whole(catalog.top_plan(row))
    )
    if not whole_scan:
        return ""
    if pred.row_filter is not None:
        # Only an index that would be used: past half a row a page the table is walked anyway.
        if not index_pays(plan.expired, plan.pages):
            return ""
        return filtered_advice(conn, pred, plan.expired, plan.rows or 0)
    create = sql.SQL("CREATE INDEX CONCURRENTLY ON {} ({})").format(
        ident(pred.table), sql.Identifier(pred.column)
    )
    return (
        f"{pred.table}: about {plan.expired:,.0f} of {plan.rows or 0:,.0f} rows "
        f"({share:.1%}) are expired and no index serves {pred.column}, so every pass reads the "
        f"whole table; create one: {create.as_string(conn)}"
    )


def _scans_whole(node: dict[str, Any]) -> bool:
    if node.get("Node Type") == "Seq Scan":
        return True
    return any(_scans_whole(child) for child in node.get("Plans", []))


async def unindexed_children(conn: AsyncConnection[Any], pred: Predicate) -> str:
    """A warning naming each foreign key into the table whose child table has no index leading
    with its columns, and the index that fixes it; empty when there is none. Without the index
    every parent row deleted makes PostgreSQL read the whole child table."""
    cur = await conn.execute(
        catalog.unindexed_children(), {"rel": ident(pred.table).as_string(conn)}
    )
    lines = []
    for child, columns, action in await cur.fetchall():
        create = sql.SQL("CREATE INDEX CONCURRENTLY ON {} ({})").format(
            sql.SQL(child), sql.SQL(", ").join(sql.Identifier(c) for c in columns)
        )
        lines.append(
            f"{pred.table}: {child} ({', '.join(columns)}) references it ON DELETE {action} with "
            f"no index on those columns, so each deleted row reads all of {child}; create one: "
            f"{create.as_string(conn)}"
        )
    return " ".join(lines)
