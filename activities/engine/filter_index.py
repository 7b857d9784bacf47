"""Finding the index a filtered rule's batches can walk: one that reads only the rows the filter
and the age select (the choice whether to walk it is `planning.choose_plan`'s).

An index serves a filtered rule's index batches when it is a btree whose keys, up to the expiry
column, are columns the filter fixes (one value, a list of values, or NULL): a walk in the
index's order then reads the matching expired rows and stops, e.g. `(state, finished_at)` for
`match = { state = [...] }`. A partial index (`(finished_at) WHERE state = 'failed'`) serves
when the planner can use it for the filter, which it decides from the parameters' values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import AsyncConnection

from activities.engine import catalog
from activities.engine.rules import Predicate, ident

#: Rows a partial index's check asks the planner to read in the index's order.
_PROBE_ROWS = 1000


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


async def find_filter_index(
    conn: AsyncConnection[Any], pred: Predicate
) -> tuple[str | None, tuple[str, ...]]:
    """(the index that serves the filtered rule, the order to walk it in); the order is empty
    when the index leads with the expiry column and serves in that column's order, and the
    index is None when none serves. An index on the expiry column alone is not one: whether
    it still serves is the plan's choice."""
    assert pred.row_filter is not None
    assert pred.column is not None
    relation = ident(pred.table).as_string(conn)
    for candidate in await _candidates(conn, relation, pred):
        if not candidate.partial or await _planner_uses(conn, pred, candidate):
            return candidate.name, candidate.order
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
