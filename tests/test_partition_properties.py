"""With `partitions = "drop"`, a partitioned table keeps exactly the rows the design calls live,
whatever its layout, and no partition that could hold a live row is ever dropped.

Layouts are drawn at random: ranges with gaps between them, MINVALUE and MAXVALUE ends, a DEFAULT
partition, sub-partitioned ranges (themselves with gaps), bounds one unit either side of the
cutoff, in a bigint column of epoch ms or a timestamptz column (bounds to the microsecond, printed
in a random session time zone). The oracle is the design's rule in plain Python:
`column + max_age <= now` is expired, NULL never is; a partition `FROM (a) TO (b)` may be dropped
only when every value below `b` is expired.

Each example builds its table afresh in the test's schema and drops it after (see
tests/test_properties.py for how the examples share the schema and run the target).
"""

from __future__ import annotations

import itertools
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from hypothesis import event, given, settings
from hypothesis import strategies as st
from psycopg_pool import AsyncConnectionPool

from activities import builtin_kinds as kinds
from activities.clock import EARLIEST_NOW_MS
from activities.progress import LedgerKey, SweepStats
from purge_config.names import TableName
from purge_config.settings import PartitionPolicy
from tests.conftest import Pools
from tests.test_partitions import pending
from tests.test_properties import PROFILE, with_time_zone

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
HOUR_MS = 3_600_000
#: Bounds and rows are drawn on a grid of this many units around the cutoff, one unit apart at
#: the edges: wide enough for gaps, narrow enough that cutoffs fall on and beside bounds.
WIDTHS_MS = [1, 1000, HOUR_MS]
AGES_MS = [0, 1, 1000, HOUR_MS, 24 * HOUR_MS]
ZONES = ["UTC", "Asia/Kathmandu", "America/St_Johns"]
#: Cutoffs (the pass's instant less max_age), far enough from 2200 that a layout a few hours
#: wide stays inside the range.
CLOCKS = st.one_of(
    st.sampled_from([EARLIEST_NOW_MS, 1_000_000_000_000, 5_000_000_000_000]),
    st.integers(EARLIEST_NOW_MS, 7_000_000_000_000),
)


@dataclass(frozen=True)
class Part:
    """One partition of the drawn layout: `[lo, hi)` in units, None for MINVALUE/MAXVALUE."""

    name: str
    lo: int | None
    hi: int | None
    subs: tuple[tuple[int, int], ...] = ()
    """Sub-partitions `[a, b)` when the partition is itself partitioned (gaps allowed)."""


@dataclass(frozen=True)
class Case:
    column_type: str
    """`bigint` (units are ms) or `timestamptz` (units are µs)."""
    parts: tuple[Part, ...]
    default: bool
    now_ms: int
    max_age_ms: int
    zone: str
    values: tuple[int | None, ...]

    @property
    def unit(self) -> int:
        """Units per ms."""
        return 1 if self.column_type == "bigint" else 1000

    @property
    def cutoff(self) -> int:
        """The greatest expired value, in units."""
        return (self.now_ms - self.max_age_ms) * self.unit

    def expired(self, value: int | None) -> bool:
        """The design's rule: `column + max_age <= now`; NULL is never expired."""
        return value is not None and value + self.max_age_ms * self.unit <= self.now_ms * self.unit

    def wholly_expired(self, part: Part) -> bool:
        """Every value `part` may hold (up to `hi - 1` unit) is expired."""
        return part.hi is not None and self.expired(part.hi - 1)

    def holds(self, value: int | None) -> bool:
        """Some leaf (or the DEFAULT partition) takes `value`."""
        for part in self.parts:
            inside = (part.lo is None or (value is not None and value >= part.lo)) and (
                part.hi is None or (value is not None and value < part.hi)
            )
            if value is not None and inside:
                return not part.subs or any(a <= value < b for a, b in part.subs)
        return self.default


@st.composite
def cases(draw: st.DrawFn) -> Case:
    column_type = draw(st.sampled_from(["bigint", "timestamptz"]))
    unit = 1 if column_type == "bigint" else 1000
    # The cutoff first; bounds on a grid around it, each nudged up to two units (a µs for
    # timestamptz), so that bounds fall on it and one and two units either side of it.
    cutoff_ms = draw(CLOCKS)
    width = draw(st.sampled_from(WIDTHS_MS)) * unit
    steps = sorted(set(draw(st.lists(st.integers(-4, 4), min_size=2, max_size=7))))
    nudges = st.sampled_from([0, -1, 1, -2, 2])
    points = sorted({cutoff_ms * unit + s * width + draw(nudges) for s in steps})
    if len(points) < 2:
        points.append(points[0] + width)
    parts: list[Part] = []
    for n, (lo, hi) in enumerate(itertools.pairwise(points)):
        if draw(st.integers(0, 4)) == 0:
            continue  # a gap
        subs: tuple[tuple[int, int], ...] = ()
        if hi - lo >= 2 and draw(st.integers(0, 3)) == 0:
            mid = lo + (hi - lo) // 2
            subs = tuple(r for r in ((lo, mid), (mid, hi)) if draw(st.integers(0, 3)))
        parts.append(Part(f"p{n}", lo, hi, subs))
    if draw(st.booleans()):
        parts.insert(0, Part("pmin", None, points[0]))
    if draw(st.booleans()):
        parts.append(Part("pmax", points[-1], None))
    default = draw(st.booleans())
    max_age_ms = draw(st.sampled_from(AGES_MS))
    candidates = [p + d for p in points for d in (-1, 0, 1)]
    candidates += [cutoff_ms * unit + d for d in (-1, 0, 1)]
    values = draw(
        st.lists(
            st.one_of(
                st.sampled_from(candidates),
                st.integers(points[0] - 2 * width, points[-1] + 2 * width),
                st.none(),
            ),
            max_size=30,
        )
    )
    zone = draw(st.sampled_from(ZONES))
    case = Case(column_type, tuple(parts), default, cutoff_ms + max_age_ms, max_age_ms, zone, ())
    return Case(**{**case.__dict__, "values": tuple(v for v in values if case.holds(v))})


def literal(case: Case, value: int | None, end: str) -> str:
    """A bound as DDL text: MINVALUE/MAXVALUE, a number, or a UTC timestamp to the µs."""
    if value is None:
        return end
    if case.column_type == "bigint":
        return str(value)
    return f"'{(EPOCH + timedelta(microseconds=value)).isoformat()}'"


def as_param(case: Case, value: int | None) -> object:
    if value is None or case.column_type == "bigint":
        return value
    return EPOCH + timedelta(microseconds=value)


def create(db: psycopg.Connection[Any], case: Case, table: str) -> None:
    db.execute(f"CREATE TABLE {table} (id int, v {case.column_type}) PARTITION BY RANGE (v)")
    db.execute(f"CREATE INDEX ON {table} (v)")
    for part in case.parts:
        bound = (
            f"FROM ({literal(case, part.lo, 'MINVALUE')}) TO ({literal(case, part.hi, 'MAXVALUE')})"
        )
        sub = " PARTITION BY RANGE (v)" if part.subs else ""
        db.execute(f"CREATE TABLE {table}_{part.name} PARTITION OF {table} FOR VALUES {bound}{sub}")
        for n, (a, b) in enumerate(part.subs):
            db.execute(
                f"CREATE TABLE {table}_{part.name}_{n} PARTITION OF {table}_{part.name}"
                f" FOR VALUES FROM ({literal(case, a, '')}) TO ({literal(case, b, '')})"
            )
    if case.default:
        db.execute(f"CREATE TABLE {table}_def PARTITION OF {table} DEFAULT")
    with db.cursor() as cur:
        cur.executemany(
            f"INSERT INTO {table} VALUES (%s, %s)",
            [(i, as_param(case, v)) for i, v in enumerate(case.values)],
        )


def children(db: psycopg.Connection[Any], table: str) -> set[str]:
    rows = db.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = %s::regclass",
        (table,),
    ).fetchall()
    return {str(r[0]) for r in rows}


async def sweep(pool: AsyncConnectionPool[Any], table: str, case: Case) -> SweepStats:
    target = kinds.expiring(
        pool, table, TableName(table), "v", case.max_age_ms, partitions=PartitionPolicy("drop")
    )
    key = LedgerKey("props", uuid.uuid4().hex, table, case.now_ms)
    return await target.sweep(case.now_ms, ledger=key)


@settings(PROFILE, max_examples=max(PROFILE.max_examples // 4, 25))
@given(case=cases())
async def test_dropping_partitions_leaves_exactly_the_live_rows(
    db: psycopg.Connection[Any], schema_url: str, pools: Pools, case: Case
) -> None:
    """The rows left are exactly the oracle's live rows, `removed` counts every expired one, and
    the partitions dropped are exactly those whose every possible value is expired (and that
    are not the DEFAULT one)."""
    # A name of its own: the shared connection prepares statements, whose plans a table of the
    # same name but another column type would invalidate.
    table = f"pt_{uuid.uuid4().hex[:8]}"
    try:
        create(db, case, table)
        before = children(db, table)
        pool = await pools(with_time_zone(schema_url, case.zone))
        stats = await sweep(pool, table, case)

        left = db.execute(f"SELECT v FROM {table}").fetchall()
        as_units = Counter(
            None if v is None else v if case.column_type == "bigint" else _us(v) for (v,) in left
        )
        live = Counter(v for v in case.values if not case.expired(v))
        assert as_units == live
        assert stats.removed == sum(1 for v in case.values if case.expired(v))
        dropped = before - children(db, table)
        event(f"dropped {min(len(dropped), 3)}")
        event(f"default {case.default}")
        qualifying = {f"{table}_{p.name}" for p in case.parts if case.wholly_expired(p)}
        assert dropped == qualifying
        assert stats.partition_rows == sum(
            1
            for v in case.values
            for p in case.parts
            if p.name and f"{table}_{p.name}" in dropped and _in(p, v)
        )
        assert pending(db) == 0
    finally:
        db.execute(f"DROP TABLE IF EXISTS {table}")


def _us(value: datetime) -> int:
    return (value - EPOCH) // timedelta(microseconds=1)


def _in(part: Part, value: int | None) -> bool:
    return (
        value is not None
        and (part.lo is None or value >= part.lo)
        and (part.hi is None or value < part.hi)
    )
