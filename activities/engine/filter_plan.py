"""Planning for a filtered rule: which index walks only the rows the filter and the age select,
and the advice naming one when none does.

An index serves a filtered rule's index batches when it is a btree whose keys, up to the expiry
column, are columns the filter fixes (one value, a list of values, or NULL): a walk in the
index's order then reads the matching expired rows and stops, e.g. `(state, finished_at)` for
`match = { state = [...] }`. A partial index (`(finished_at) WHERE state = 'failed'`) serves
when the planner can use it for the filter, which it decides from the parameters' values.
An index on the expiry column alone steps over every expired row that does not match, on every
batch: it serves only when nearly every expired row matches.

Even an index that serves pays only for a few rows per page: a filter's rows share their heap
pages with the rows it leaves, so index batches visit a page for each row they delete (in index
order, a page again and again) where a range walk reads each page once for all of its rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import AsyncConnection, sql

from activities.engine import catalog
from activities.engine.rules import Predicate, ident

#: An index on the expiry column alone still serves a filtered rule when at most this share of
#: the rows it finds expired does not match the filter (each batch steps over those again).
STEP_OVER_SHARE = 0.1
#: Rows a partial index's check asks the planner to read in the index's order.
_PROBE_ROWS = 1000
#: The most selected rows per heap page for which index batches beat a walk. Measured here
#: (2M rows of about 100 bytes, 2 cores, PostgreSQL 18 with full-page writes), against one
#: DELETE of the same rows: at 0.2 rows a page the index took 1.2-1.4x and a walk 2x; at 0.6,
#: the index 1.4x and a walk 1.1x; at 10 (one state of three, half expired) the index 13x and a
#: walk 0.93x (bench/README.md, "Filters and archives").
INDEX_ROWS_PER_PAGE = 0.5


def index_pays(expired: float, pages: int) -> bool:
    """Whether index batches beat a walk for a filtered rule: at most about one selected row
    in two heap pages."""
    return expired <= INDEX_ROWS_PER_PAGE * max(pages, 1)


@dataclass(frozen=True)
class _Candidate:
    name: str
    """As a statement names it (schema-qualified when off the search_path)."""
    relname: str
    """As EXPLAIN names it."""
    partial: bool
    order: tuple[str, ...]
    covered: int
    """How many of the filter's columns lead the index."""


async def filtered_index(
    conn: AsyncConnection[Any],
    relation: str,
    pred: Predicate,
    plain: str | None,
    expired: float,
) -> tuple[str | None, tuple[str, ...]]:
    """(the index that serves the filtered rule, the order to walk it in); the order is empty
    when the index leads with the expiry column and serves in that column's order, and the
    index is None when none serves."""
    assert pred.row_filter is not None
    assert pred.column is not None
    for candidate in await _candidates(conn, relation, pred):
        if not candidate.partial or await _planner_uses(conn, pred, candidate):
            return candidate.name, candidate.order
    if plain is None:
        return None, ()
    found = await _estimate(conn, pred, pred.row_filter.age_where)
    if found - expired <= STEP_OVER_SHARE * found:
        return plain, ()
    return None, ()


async def _candidates(
    conn: AsyncConnection[Any], relation: str, pred: Predicate
) -> list[_Candidate]:
    """Valid btree indexes whose keys lead to the expiry column through filter columns only,
    best first: partial ones on the expiry column itself (they hold only matching rows), then
    those that cover the most filter columns."""
    assert pred.row_filter is not None
    assert pred.column is not None
    cur = await conn.execute(catalog.btree_indexes(), (relation,))
    fixed = pred.row_filter.index_columns
    found: list[_Candidate] = []
    for relname, name, partial, keys in await cur.fetchall():
        if pred.column not in keys:
            continue
        prefix = keys[: keys.index(pred.column)]
        # An expression key (no column name) or a column the filter does not fix breaks the
        # walk's order; a plain index on the expiry column is not a filter's index.
        if not all(key in fixed for key in prefix) or not (prefix or partial):
            continue
        order = (*prefix, pred.column) if prefix else ()
        found.append(_Candidate(name, relname, bool(partial), order, len(set(prefix))))
    return sorted(found, key=lambda c: (c.order != () or not c.partial, -c.covered, c.partial))


async def _planner_uses(conn: AsyncConnection[Any], pred: Predicate, index: _Candidate) -> bool:
    """Whether the planner can walk the partial `index` for this filter in order: asked with
    every other way of reading the table priced out, in a savepoint that is then undone."""
    assert pred.column is not None
    query = catalog.ordered_walk(
        ident(pred.table), pred.where, index.order or (pred.column,), _PROBE_ROWS
    )
    async with conn.transaction() as savepoint:
        await conn.execute(catalog.index_order_only())
        cur = await conn.execute(query, pred.params)
        row = await cur.fetchone()
        # Undo the settings with the savepoint: they must not reach the sweep's own statements.
        raise psycopg.Rollback(savepoint)
    if row is None:
        return False
    nodes = list(catalog.plan_nodes(catalog.top_plan(row)))
    return not any(n.get("Node Type") == "Sort" for n in nodes) and any(
        n.get("Index Name") == index.relname for n in nodes
    )


async def _estimate(conn: AsyncConnection[Any], pred: Predicate, where: sql.Composable) -> float:
    cur = await conn.execute(catalog.estimate(ident(pred.table), where), pred.params)
    row = await cur.fetchone()
    return float(catalog.top_plan(row)["Plan Rows"]) if row is not None else 0.0


def filtered_advice(
    conn: AsyncConnection[Any], pred: Predicate, expired: float, rows: float
) -> str:
    """The advice for a large table whose filtered rule no index serves: the composite index
    on the filter's fixed columns and the expiry column, or a partial one holding only the
    rows the filter selects."""
    assert pred.row_filter is not None
    assert pred.column is not None
    bound = pred.row_filter
    table, column = ident(pred.table), sql.Identifier(pred.column)
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
    share = expired / rows if rows else 0.0
    named = ", ".join([c for c, _ in bound.equal] + [*bound.null, *bound.not_null])
    create = ", or a partial one: ".join(o.as_string(conn) for o in options)
    return (
        f"{pred.table}: about {expired:,.0f} of {rows:,.0f} rows ({share:.1%}) match the "
        f"filter and are expired, and no index serves both the filter ({named}) and "
        f"{pred.column}, so every pass reads the whole table; create one: {create}"
    )
