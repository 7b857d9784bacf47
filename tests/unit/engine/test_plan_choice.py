"""The choice of a table's plan from what was read of it (`planning.choose_plan`): one row a case,
each naming the strategy, the index walked and the advice (the index a pass lacks), at and just
past each threshold, so that a change to any rule of the choice fails a row."""

from __future__ import annotations

from dataclasses import replace

import pytest
from psycopg import sql

from activities.engine.filter_binding import BoundFilter
from activities.engine.planning import choose_plan
from activities.engine.table_facts import TableFacts
from purge_config.names import TableName

#: A large table (over the 1,024 pages worth advice) of 100,000 rows, indexed on expires_at.
BASE = TableFacts(
    table=TableName("events", "app"),
    column="expires_at",
    pages=2_000,
    rows=100_000,
    expired=1_000,
    index="app.events_expires_at_idx",
)
#: `match = { state = "failed" }`
STATE = BoundFilter(
    where=sql.SQL("state = %(match_0_0)s"),
    params={"match_0_0": "failed"},
    age_where=sql.SQL("expires_at <= %(cutoff)s"),
    equal=(("state", ("failed",)),),
    null=(),
    not_null=(),
)
FILTERED = replace(BASE, row_filter=STATE, index=None, expired=500)
#: The index on the expiry column to create.
PLAIN = 'create one: CREATE INDEX CONCURRENTLY ON "app"."events" ("expires_at")'
#: The filter's composite or partial index to create.
COMPOSITE = (
    'create one: CREATE INDEX CONCURRENTLY ON "app"."events" ("state", "expires_at"), or a '
    'partial one: CREATE INDEX CONCURRENTLY ON "app"."events" ("expires_at") WHERE '
    "\"state\" = 'failed'"
)

CASES = {
    # -- share: an index for a small share, a walk past INDEX_MAX_SHARE (0.2) ----------------
    "a small share through its index": (BASE, "index", BASE.index, ""),
    "a share of 20% still through the index": (
        replace(BASE, expired=20_000),
        "index",
        BASE.index,
        "",
    ),
    "a share just past 20% walked": (replace(BASE, expired=20_001), "range", BASE.index, ""),
    "never analyzed: through the index": (replace(BASE, rows=None), "index", BASE.index, ""),
    # -- index: none serves, so a walk; a large table with a small share is told which --------
    "no index, small share: walked and advised": (replace(BASE, index=None), "range", None, PLAIN),
    "no index, a share just under 10%: advised": (
        replace(BASE, index=None, expired=9_999),
        "range",
        None,
        PLAIN,
    ),
    "no index, a share of 10%: not advised": (
        replace(BASE, index=None, expired=10_000),
        "range",
        None,
        "",
    ),
    "no index, 1,024 pages: advised": (
        replace(BASE, index=None, pages=1_024),
        "range",
        None,
        PLAIN,
    ),
    "no index, 1,023 pages: too small to advise": (
        replace(BASE, index=None, pages=1_023),
        "range",
        None,
        "",
    ),
    "no index, never analyzed: no share to advise on": (
        replace(BASE, index=None, rows=None),
        "range",
        None,
        "",
    ),
    "no expiry column (a bucket's arithmetic): nothing to advise": (
        replace(BASE, index=None, column=None),
        "range",
        None,
        "",
    ),
    # -- correlation: a heap in expiry order keeps the index up to 75% by keyset batches -------
    "half expired, not in order: walked": (
        replace(BASE, expired=50_000, correlation=0.5),
        "range",
        BASE.index,
        "",
    ),
    "half expired, correlation 0.9: through the index": (
        replace(BASE, expired=50_000, correlation=0.9),
        "index",
        BASE.index,
        "",
    ),
    "half expired, correlation -0.9: through the index": (
        replace(BASE, expired=50_000, correlation=-0.9),
        "index",
        BASE.index,
        "",
    ),
    "half expired, correlation 0.89: walked": (
        replace(BASE, expired=50_000, correlation=0.89),
        "range",
        BASE.index,
        "",
    ),
    "in order, 75% expired: through the index": (
        replace(BASE, expired=75_000, correlation=1.0),
        "index",
        BASE.index,
        "",
    ),
    "in order, just past 75% expired: walked": (
        replace(BASE, expired=75_001, correlation=1.0),
        "range",
        BASE.index,
        "",
    ),
    # -- archive and partitioned: no keyset batches, so order no longer keeps the index -------
    "in order but archived: walked": (
        replace(BASE, expired=50_000, correlation=1.0, archived=True),
        "range",
        BASE.index,
        "",
    ),
    "in order but partitioned: walked": (
        replace(BASE, expired=50_000, correlation=1.0, partitioned=True),
        "range",
        BASE.index,
        "",
    ),
    "archived, small share: through the index": (
        replace(BASE, archived=True),
        "index",
        BASE.index,
        "",
    ),
    "partitioned, small share: through the index": (
        replace(BASE, partitioned=True),
        "index",
        BASE.index,
        "",
    ),
    # -- filter: its own index while sparse (half a row a page), the expiry column's when it
    # -- steps over at most 10% of the rows it finds
    "filter with an index of its own, sparse: through it": (
        replace(
            FILTERED, filter_index="app.events_state_idx", filter_order=("state", "expires_at")
        ),
        "index",
        "app.events_state_idx",
        "",
    ),
    "filter with an index of its own, 1,000 rows on 2,000 pages: through it": (
        replace(FILTERED, filter_index="app.events_state_idx", expired=1_000),
        "index",
        "app.events_state_idx",
        "",
    ),
    "filter with an index of its own, too dense: walked, no advice": (
        replace(FILTERED, filter_index="app.events_state_idx", expired=1_001),
        "range",
        "app.events_state_idx",
        "",
    ),
    "filter, the expiry column's index steps over 10%: through it": (
        replace(FILTERED, index=BASE.index, age_expired=1_000, expired=900),
        "index",
        BASE.index,
        "",
    ),
    "filter, the expiry column's index steps over just past 10%: walked, advised": (
        replace(FILTERED, index=BASE.index, age_expired=1_000, expired=899),
        "range",
        None,
        COMPOSITE,
    ),
    "filter, the expiry column's index serves, too dense: walked, no advice": (
        replace(FILTERED, index=BASE.index, age_expired=1_001, expired=1_001),
        "range",
        BASE.index,
        "",
    ),
    "filter, the expiry column's index steps over 75%: walked, advised": (
        replace(FILTERED, index=BASE.index, age_expired=2_000),
        "range",
        None,
        COMPOSITE,
    ),
    "filter, no index: walked, advised": (FILTERED, "range", None, COMPOSITE),
    "filter, no index, too dense for one: not advised": (
        replace(FILTERED, expired=1_001),
        "range",
        None,
        "",
    ),
}


@pytest.mark.parametrize(("facts", "strategy", "index", "advice"), CASES.values(), ids=list(CASES))
def test_the_plan_chosen(facts: TableFacts, strategy: str, index: str | None, advice: str) -> None:
    plan = choose_plan(facts)

    assert (plan.strategy, plan.index) == (strategy, index)
    if advice:
        assert plan.advice.endswith(advice)
        assert plan.advice.startswith("app.events: about ")
    else:
        assert plan.advice == ""


def test_the_advice_gives_the_estimate_and_the_share() -> None:
    plan = choose_plan(replace(BASE, index=None, expired=1_234))

    assert plan.advice == (
        "app.events: about 1,234 of 100,000 rows (1.2%) are expired and no index serves "
        f"expires_at, so every pass reads the whole table; {PLAIN}"
    )


def test_a_filter_s_advice_names_its_columns_and_its_share() -> None:
    plan = choose_plan(FILTERED)

    assert plan.advice == (
        "app.events: about 500 of 100,000 rows (0.5%) match the filter and are expired, and no "
        f"index serves both the filter (state) and expires_at, so every pass reads the whole "
        f"table; {COMPOSITE}"
    )


def test_a_composite_filter_index_walks_in_its_own_order_by_ctid_batches() -> None:
    """A `(state, expires_at)` index is walked in its own order (so by ctid batches, not keyset
    ones); the expiry column's index, in that column's order."""
    facts = replace(
        FILTERED, filter_index="app.events_state_idx", filter_order=("state", "expires_at")
    )

    assert choose_plan(facts).order == ("state", "expires_at")
    assert choose_plan(replace(FILTERED, index=BASE.index, age_expired=500)).order == ()


def test_deletes_are_counted_on_the_server_only_for_a_table_no_foreign_key_references() -> None:
    assert choose_plan(replace(BASE, counts_deletes=True)).counts_deletes is True
    assert choose_plan(replace(BASE, counts_deletes=True, referenced=True)).counts_deletes is False
    assert choose_plan(replace(BASE, referenced=True)).referenced is True
