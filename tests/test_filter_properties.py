"""Several filtered targets on one table, some archiving, against a plain-Python oracle.

Random rows (states, flags, counts, instants around each target's cutoff) and one to three
`expiring` targets on the same table, each with its own `match`, `match_null` or
`match_not_null` and its own age, swept one after another at one caller instant: the rows left
are exactly those the oracle keeps; each target counts (dry run) and removes exactly the rows
the oracle gives it; and each removed row of an archiving target is in its archive exactly
once, byte for byte, its identity value kept.

Run as tests/test_properties.py runs its own: one pool for every example, tables made once per
test and emptied by each example. `HYPOTHESIS_PROFILE=ci` (as `.ci/run` sets it) runs 250
examples; the default run, 10.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from activities import builtin_kinds as kinds
from activities.clock import EARLIEST_NOW_MS, LATEST_NOW_MS
from activities.engine.sql_target import SqlTarget
from purge_config.file import parse_config
from purge_ops.connect import open_pool
from tests.test_properties import PROFILE

HOUR = 3_600_000
DAY = 24 * HOUR
STATES = ("queued", "done", "failed")
AGES = (0, HOUR, DAY, 7 * DAY, 30 * DAY)
#: The same row shape twice: one table with indexes that serve the filters (swept by index
#: where the share allows) and one without any (walked).
TABLES = ("pjobs_indexed", "pjobs_plain")
#: Every column as text, for a byte-for-byte comparison of a row and its archived copy.
COLUMNS = ("id", "state", "flag", "n", "at", "body")


@dataclass(frozen=True)
class Row:
    state: str
    flag: bool | None
    n: int | None
    at: int
    body: str


@dataclass(frozen=True)
class Target:
    states: tuple[str, ...]
    flag: bool | None
    """`match = { flag = ... }` when set."""
    n_values: tuple[int, ...]
    """`match = { n = [...] }` when not empty."""
    n_null: bool | None
    """`match_null = ["n"]` when True, `match_not_null = ["n"]` when False."""
    max_age_ms: int
    archive: bool

    def entry(self, index: int, table: str) -> dict[str, Any]:
        """The `[[targets]]` entry, as tomllib would read it."""
        match: dict[str, Any] = {"state": list(self.states)}
        if self.flag is not None:
            match["flag"] = self.flag
        if self.n_values:
            match["n"] = list(self.n_values)
        raw: dict[str, Any] = {
            "kind": "expiring",
            "name": f"t{index}",
            "table": table,
            "column": "at",
            "max_age": f"{self.max_age_ms}ms",
            "match": match,
        }
        if self.n_null is not None:
            raw["match_null" if self.n_null else "match_not_null"] = ["n"]
        if self.archive:
            raw["archive_table"] = f"parch_{index}"
        return raw

    def takes(self, row: Row, now_ms: int) -> bool:
        """The oracle: every entry holds (a NULL equals no value) and the row is old enough."""
        return (
            row.state in self.states
            and (self.flag is None or row.flag is self.flag)
            and (not self.n_values or (row.n is not None and row.n in self.n_values))
            and (self.n_null is None or (row.n is None) == self.n_null)
            and row.at + self.max_age_ms <= now_ms
        )


TARGETS = st.builds(
    Target,
    states=st.lists(st.sampled_from(STATES), min_size=1, max_size=3, unique=True).map(tuple),
    flag=st.none() | st.booleans(),
    n_values=st.lists(st.integers(0, 3), max_size=2, unique=True).map(tuple),
    n_null=st.none() | st.booleans(),
    max_age_ms=st.sampled_from(AGES),
    archive=st.booleans(),
).filter(lambda t: not (t.n_values and t.n_null))  # the config refuses "n = 1 and n IS NULL"


@st.composite
def cases(draw: st.DrawFn) -> tuple[int, str, list[Target], list[Row]]:
    """The instant, the table, the targets and rows whose instants sit on, just before, just
    after or anywhere around some target's cutoff."""
    now_ms = draw(st.integers(EARLIEST_NOW_MS + 60 * DAY, LATEST_NOW_MS - 60 * DAY))
    targets = draw(st.lists(TARGETS, min_size=1, max_size=3))
    cutoffs = [now_ms - t.max_age_ms for t in targets]
    at = st.builds(
        lambda cutoff, delta: cutoff + delta,
        st.sampled_from(cutoffs),
        st.sampled_from([0, -1, 1]) | st.integers(-2 * DAY, 2 * DAY),
    )
    row = st.builds(
        Row,
        state=st.sampled_from(STATES),
        flag=st.none() | st.booleans(),
        n=st.none() | st.integers(0, 3),
        at=at,
        # Any text jsonb holds: UTF-8 (no lone surrogates), no NUL.
        body=st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8),
    )
    return now_ms, draw(st.sampled_from(TABLES)), targets, draw(st.lists(row, max_size=30))


@pytest.fixture
def tables(db: psycopg.Connection[Any]) -> None:
    """The two job tables and three archives (identity kept, an `archived_at` of their own),
    made once for all of a test's examples; autovacuum off so no example's statistics reach
    the next."""
    db.execute("CREATE TYPE pstate AS ENUM ('queued', 'done', 'failed')")
    for table in TABLES:
        db.execute(
            f"CREATE TABLE {table} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
            " state pstate NOT NULL, flag boolean, n integer, at bigint NOT NULL, body jsonb)"
            " WITH (autovacuum_enabled = off)"
        )
    db.execute("CREATE INDEX ON pjobs_indexed (state, at)")
    db.execute("CREATE INDEX ON pjobs_indexed (at) WHERE n IS NULL")
    for index in range(3):
        db.execute(
            f"CREATE TABLE parch_{index} (LIKE pjobs_indexed INCLUDING IDENTITY,"
            " archived_at timestamptz NOT NULL DEFAULT now())"
        )


@pytest.fixture
async def pool(schema_url: str) -> AsyncIterator[AsyncConnectionPool[Any]]:
    """One pool for every example of a test (a new one per example costs more than a sweep)."""
    opened = await open_pool(schema_url, max_size=1)
    try:
        yield opened
    finally:
        await opened.close()


def contents(db: psycopg.Connection[Any], table: str) -> list[tuple[str | None, ...]]:
    listed = ", ".join(f"{c}::text" for c in COLUMNS)
    # By the bigint itself: a bare `id` here would name the text output column.
    return [tuple(r) for r in db.execute(f"SELECT {listed} FROM {table} t ORDER BY t.id")]


@settings(PROFILE, max_examples=max(10, PROFILE.max_examples // 4))
@given(case=cases())
async def test_filtered_targets_on_one_table_delete_and_archive_exactly_the_oracles_rows(
    db: psycopg.Connection[Any],
    pool: AsyncConnectionPool[Any],
    tables: None,
    case: tuple[int, str, list[Target], list[Row]],
) -> None:
    now_ms, table, targets, rows = case
    for name in (*TABLES, "parch_0", "parch_1", "parch_2"):
        db.execute(f"DELETE FROM {name}")
    with db.cursor() as cur:
        cur.executemany(
            f"INSERT INTO {table} (state, flag, n, at, body) VALUES (%s, %s, %s, %s, %s)",
            [(r.state, r.flag, r.n, r.at, Jsonb(r.body)) for r in rows],
        )
    original = {row[0]: row for row in contents(db, table)}
    by_id = dict(zip(original, rows, strict=True))
    raw = {"targets": [t.entry(i, table) for i, t in enumerate(targets)]}
    specs = parse_config(raw, env={"PURGE_DATABASE_URL": "postgresql://x@y/z"}).targets

    left = dict(by_id)
    for index, (target, spec) in enumerate(zip(targets, specs, strict=True)):
        sql_target = kinds.build_target(spec, pool)
        assert isinstance(sql_target, SqlTarget)
        taken = {key for key, row in left.items() if target.takes(row, now_ms)}

        counted = await sql_target.count_expired(now_ms)
        stats = await sql_target.sweep(now_ms)
        event(f"{table} swept by {stats.strategy}{' into an archive' if target.archive else ''}")

        assert (counted, stats.removed) == (len(taken), len(taken)), (index, target)
        assert stats.archived == (len(taken) if target.archive else 0)
        if target.archive:
            # The rows moved, each once, every column as it was.
            assert contents(db, f"parch_{index}") == [
                original[key] for key in sorted(taken, key=int)
            ]
        left = {key: row for key, row in left.items() if key not in taken}

    assert contents(db, table) == [original[key] for key in sorted(left, key=int)]
