"""Choosing how to sweep one table in one pass, from what the catalog and the planner know.

Two strategies (why: docs/decisions/short-batches.md and keyset-batches.md):
- `range`: walk the heap in fixed physical ranges, `ctid >= lo AND ctid < hi AND expired`. It reads
  every page once, so it costs about what one big DELETE does whatever the share of expired
  rows, and it needs no index. Right for large shares and for predicates no index serves.
- `index`: reads only expired rows through an index on the expiry column. Right for small shares:
  its cost follows the expired rows, not the table. By keyset batches (`keyset_batches` below
  chooses them; `activities.engine.keyset` runs them): the key where the next n expired rows end,
  then one plain DELETE of that key range; by ctid batches
  (`ctid = ANY(ARRAY(SELECT ctid ... ORDER BY col LIMIT n)) AND expired`) where a range cannot
  serve: a composite filter index, a partitioned parent, an archive that needs the rows back.

The choice is `choose_plan`, a pure function of what `table_facts` read (tests/unit/engine/
test_plan_choice.py holds its rules); `plan_table` reads, then chooses.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from psycopg import AsyncConnection, sql

from activities.engine.filter_binding import BoundFilter
from activities.engine.rules import Predicate, ident
from activities.engine.table_facts import TableFacts, read_table_facts
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
#: An index on the expiry column alone still serves a filtered rule when at most this share of
#: the rows it finds expired does not match the filter (each batch steps over those again).
STEP_OVER_SHARE = 0.1
#: The most selected rows per heap page for which index batches beat a walk, for a filtered
#: rule: its rows share their heap pages with the rows it leaves, so index batches visit a page
#: for each row they delete (in index order, a page again and again) where a range walk reads
#: each page once for all of its rows (why: docs/decisions/filter-strategy.md).
INDEX_ROWS_PER_PAGE = 0.5


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
    children: str = ""
    """The warning naming each child table whose foreign key into this one has no index
    (`TableAccess.prepare`), also in `advice`: kept apart for a partitioned table swept
    partition by partition, whose partitions' plans do not carry it."""
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


async def plan_table(conn: AsyncConnection[Any], pred: Predicate) -> TablePlan:
    """Read what the catalog and the planner say of the table, and choose its plan (with the
    advice binding its rule gave, such as the index a related table needs)."""
    return planned(pred, await read_table_facts(conn, pred))


def planned(pred: Predicate, facts: TableFacts) -> TablePlan:
    """The plan `facts` call for, with the advice binding `pred`'s rule gave."""
    plan = choose_plan(facts)
    if pred.advice:
        plan = replace(plan, advice=" ".join(filter(None, (plan.advice, pred.advice))))
    return plan


def choose_plan(facts: TableFacts) -> TablePlan:
    """The strategy for sweeping the table, and the advice for its operator: no I/O."""
    index, order = _serving_index(facts)
    share = None if not facts.rows else min(1.0, facts.expired / facts.rows)
    in_order = (
        facts.correlation is not None
        and abs(facts.correlation) >= IN_ORDER
        and share is not None
        and share <= IN_ORDER_MAX_SHARE
        and keyset_batches(facts.column, facts.archived, facts.partitioned, order)
    )
    use_index = index is not None and (share is None or share <= INDEX_MAX_SHARE or in_order)
    if use_index and facts.row_filter is not None:
        # A filter's rows are spread among rows it leaves: the index pays only when sparse.
        use_index = index_pays(facts.expired, facts.pages)
    plan = TablePlan(
        strategy="index" if use_index else "range",
        pages=facts.pages,
        rows=facts.rows,
        expired=facts.expired,
        index=index,
        referenced=facts.referenced,
        partitioned=facts.partitioned,
        order=order,
        correlation=facts.correlation,
        counts_deletes=facts.counts_deletes and not facts.referenced,
    )
    column, rows = facts.column, facts.rows
    if index is not None or column is None or not rows or not _worth_advice(facts, rows):
        return plan
    # No index serves, so the plan is a walk that reads the whole table on every pass.
    if facts.row_filter is not None:
        return replace(plan, advice=_filtered_advice(facts, facts.row_filter, column, rows))
    return replace(plan, advice=_advice(facts, column, rows))


def keyset_batches(
    column: str | None, archived: bool, partitioned: bool, order: tuple[str, ...]
) -> bool:
    """Whether an index sweep of a table goes by keyset batches: the index is the expiry
    column's own (a composite filter index orders by other keys first), the table is not swept
    through a partitioned parent, and no archive needs the deleted rows returned."""
    return column is not None and not archived and not partitioned and order in ((), (column,))


def index_pays(expired: float, pages: int) -> bool:
    """Whether index batches beat a walk for a filtered rule: at most about one selected row
    in two heap pages."""
    return expired <= INDEX_ROWS_PER_PAGE * max(pages, 1)


def _serving_index(facts: TableFacts) -> tuple[str | None, tuple[str, ...]]:
    """The index the rule's batches may walk and its order (empty: the expiry column's)."""
    if facts.row_filter is None or facts.column is None:
        return facts.index, ()
    if facts.filter_index is not None:
        return facts.filter_index, facts.filter_order
    # An index on the expiry column alone steps over every expired row the filter leaves, on
    # every batch: it serves only when nearly every expired row matches.
    found = facts.age_expired
    if (
        facts.index is not None
        and found is not None
        and found - facts.expired <= STEP_OVER_SHARE * found
    ):
        return facts.index, ()
    return None, ()


def _worth_advice(facts: TableFacts, rows: float) -> bool:
    """Whether a table no index serves is worth one: large, with a small share expired; for a
    filter, sparse enough that the index would be used (past half a row a page the table is
    walked anyway)."""
    if facts.pages < LARGE_PAGES or facts.expired / rows >= SMALL_SHARE:
        return False
    return facts.row_filter is None or index_pays(facts.expired, facts.pages)


def _advice(facts: TableFacts, column: str, rows: float) -> str:
    """The index on the expiry column."""
    create = sql.SQL("CREATE INDEX CONCURRENTLY ON {} ({})").format(
        ident(facts.table), sql.Identifier(column)
    )
    share = min(1.0, facts.expired / rows)
    return (
        f"{facts.table}: about {facts.expired:,.0f} of {rows:,.0f} rows "
        f"({share:.1%}) are expired and no index serves {column}, so every pass reads the "
        f"whole table; create one: {create.as_string()}"
    )


def _filtered_advice(facts: TableFacts, bound: BoundFilter, expiry: str, rows: float) -> str:
    """The composite index on the filter's fixed columns and the expiry column, or a partial
    one holding only the rows the filter selects."""
    table, column = ident(facts.table), sql.Identifier(expiry)
    options: list[sql.Composable] = []
    if bound.equal:
        keys = [sql.Identifier(c) for c, _ in bound.equal] + [column]
        options.append(
            sql.SQL("CREATE INDEX CONCURRENTLY ON {} ({})").format(table, sql.SQL(", ").join(keys))
        )
    # Values as quoted literals: advice is text a person reads and runs, never run here.
    conditions: list[sql.Composable] = []
    for name, texts in bound.equal:
        values = sql.SQL(", ").join(sql.Literal(text) for text in texts)
        form = "{} = {}" if len(texts) == 1 else "{} IN ({})"
        conditions.append(sql.SQL(form).format(sql.Identifier(name), values))
    conditions += [sql.SQL("{} IS NULL").format(sql.Identifier(c)) for c in bound.null]
    conditions += [sql.SQL("{} IS NOT NULL").format(sql.Identifier(c)) for c in bound.not_null]
    options.append(
        sql.SQL("CREATE INDEX CONCURRENTLY ON {} ({}) WHERE {}").format(
            table, column, sql.SQL(" AND ").join(conditions)
        )
    )
    share = facts.expired / rows
    named = ", ".join([c for c, _ in bound.equal] + [*bound.null, *bound.not_null])
    create = ", or a partial one: ".join(o.as_string() for o in options)
    return (
        f"{facts.table}: about {facts.expired:,.0f} of {rows:,.0f} rows ({share:.1%}) "
        f"match the filter and are expired, and no index serves both the filter ({named}) and "
        f"{expiry}, so every pass reads the whole table; create one: {create}"
    )
