"""What the catalog, the statistics and the planner say of one table, read before its plan is
chosen: the I/O half of planning (`planning.choose_plan` is the other, with no I/O)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from psycopg import AsyncConnection, AsyncCursor, sql

from activities.engine import catalog
from activities.engine.errors import BadTable
from activities.engine.filter_binding import BoundFilter
from activities.engine.filter_index import find_filter_index
from activities.engine.pipelines import settled_pipeline
from activities.engine.rules import Predicate, ident
from purge_config.names import TableName


@dataclass(frozen=True)
class TableFacts:
    """One table and its rule as read this pass: everything the choice of its plan depends on."""

    table: TableName
    column: str | None
    """The rule's expiry column, which an index can serve; None when none can (the full-bucket
    arithmetic)."""
    pages: int
    """Heap pages of its largest leaf (of the table itself, when it is not partitioned)."""
    rows: float | None
    """Live rows per the statistics, or None when the table was never analyzed."""
    expired: float
    """The planner's estimate of the rows the rule (its filter included) selects."""
    index: str | None = None
    """A valid btree index whose first key is the expiry column."""
    referenced: bool = False
    """Whether a foreign key references the table."""
    partitioned: bool = False
    correlation: float | None = None
    """ANALYZE's correlation between the expiry column's order and the heap's; None when not
    known (never analyzed, or a filtered rule, whose rows are not read in that order)."""
    counts_deletes: bool = False
    """Whether a DELETE's tag counts exactly the table's own rows (`catalog.table_size`)."""
    archived: bool = False
    """Whether the rule moves its rows to an archive (which needs them returned)."""
    row_filter: BoundFilter | None = None
    filter_index: str | None = None
    """An index that serves the filter and the expiry column together (`filter_index`)."""
    filter_order: tuple[str, ...] = ()
    """Its keys up to the expiry column, when it leads with filter columns."""
    inherited: bool = False
    """Whether the plain table may have inheritance children (`refuse_inheritance`)."""
    age_expired: float | None = None
    """The planner's estimate of the rows the age alone selects: read for a filtered rule with
    no index of its own but the expiry column's, whose batches would step over the rest."""


async def read_table_facts(conn: AsyncConnection[Any], pred: Predicate) -> TableFacts:
    """Read what planning needs of `pred`'s table: one pipelined round trip, and for a filtered
    rule a few more to find the index that serves it."""
    # The catalog reads do not depend on one another: one pipelined round trip, not five.
    async with settled_pipeline(conn):
        reads = await FactReads.send(conn, pred)
    return await reads.facts(conn)


async def refuse_inheritance(conn: AsyncConnection[Any], pred: Predicate) -> None:
    """BadTable where the table has inheritance children: a DELETE of it removes their rows
    too (PostgreSQL's inheritance), rows of tables the target does not name, which neither the
    count nor the walk (its pages are the parent's) would account for."""
    rel = {"rel": ident(pred.table).as_string(conn)}
    cur = await conn.execute(catalog.inheritance_children(), rel)
    children = [str(row[0]) for row in await cur.fetchall()]
    if children:
        named = ", ".join(children[:5]) + (", ..." if len(children) > 5 else "")
        raise BadTable(
            f"table {pred.table} has inheritance children ({named}): a DELETE of it removes "
            "their rows too, which this target neither names nor counts; name each table as a "
            "target of its own (a pattern can), or sweep a table without children"
        )


class FactReads:
    """`read_table_facts` in two steps, for a caller with a pipeline of its own (one implicit
    transaction, its timeouts set once): `send` queues the catalog reads, `facts` reads them."""

    def __init__(self, pred: Predicate, curs: dict[str, AsyncCursor[Any] | None]) -> None:
        self.pred, self._curs = pred, curs

    @classmethod
    async def send(cls, conn: AsyncConnection[Any], pred: Predicate) -> FactReads:
        relation = ident(pred.table)
        rel = {"rel": relation.as_string(conn)}
        column = {**rel, "column": pred.column}
        # The catalog's reads prepared: the same text for every table, each planned once a
        # connection where the transaction asks for generic plans (`TableAccess.prepare`). Not
        # the estimate: its text names the table, and EXPLAIN plans its query with the values.
        curs: dict[str, AsyncCursor[Any] | None] = {
            "sizes": await conn.execute(catalog.table_size(), rel, prepare=True),
            "estimate": await conn.execute(catalog.estimate(relation, pred.where), pred.params),
            "serving": (
                await conn.execute(catalog.serving_index(), column, prepare=True)
                if pred.column
                else None
            ),
            "referencing": await conn.execute(catalog.is_referenced(), rel, prepare=True),
            # Wanted only for an index sweep (its first batch's size), not yet chosen: read
            # anyway, as the same round trip carries it.
            "correlating": (
                await conn.execute(catalog.column_correlation(), column, prepare=True)
                if pred.column and pred.row_filter is None
                else None
            ),
        }
        return cls(pred, curs)

    async def _row(self, name: str) -> Any:
        cur = self._curs[name]
        return await cur.fetchone() if cur is not None else None

    async def facts(self, conn: AsyncConnection[Any]) -> TableFacts:
        """The facts read (and for a filtered rule, the reads that find its index)."""
        pred = self.pred
        size = await self._row("sizes") or (0, 0, True, False, False, False)
        pages, reltuples, never_analyzed, partitioned, counts, inherited = size
        found = await self._row("serving")
        referenced = await self._row("referencing")
        correlated = await self._row("correlating")
        facts = TableFacts(
            table=pred.table,
            column=pred.column,
            pages=int(pages),
            rows=None if never_analyzed else float(reltuples or 0),
            expired=catalog.estimated_rows(await self._row("estimate")),
            index=str(found[0]) if found else None,
            referenced=bool(referenced and referenced[0]),
            partitioned=bool(partitioned),
            correlation=(
                float(correlated[0]) if correlated and correlated[0] is not None else None
            ),
            counts_deletes=bool(counts),
            inherited=bool(inherited),
            archived=pred.archive is not None,
            row_filter=pred.row_filter,
        )
        if pred.row_filter is None or pred.column is None:
            return facts
        return await _filter_facts(conn, pred, facts)


async def _filter_facts(
    conn: AsyncConnection[Any], pred: Predicate, facts: TableFacts
) -> TableFacts:
    """The facts with the index that serves the filter, or, failing one, how many rows an
    index on the expiry column alone would find."""
    assert pred.row_filter is not None
    name, order = await find_filter_index(conn, pred)
    if name is not None:
        return replace(facts, filter_index=name, filter_order=order)
    if facts.index is None:
        return facts
    cur = await conn.execute(
        catalog.estimate(ident(pred.table), pred.row_filter.age_where), pred.params
    )
    return replace(facts, age_expired=catalog.estimated_rows(await cur.fetchone()))


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
