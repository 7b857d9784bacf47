"""A partitioned table as one pass sees it, from the catalog: which partitions can hold only
expired rows (judged from their bounds, never their rows), which can hold none, and which leaves
the batched delete still sweeps, each on its own.

A range partition `FROM (a) TO (b)` holds values `a <= v < b`, so at most `b - step` (one unit
of an integer column, one microsecond of a timestamp). With the rule `column <= cutoff` it is
wholly expired when `b - step <= cutoff`, i.e. `b <= cutoff + step`; it can hold no expired row
when `a > cutoff`. Only a table partitioned by RANGE on the rule's own column, alone, is judged so;
a DEFAULT partition, a MAXVALUE upper bound, a LIST or HASH key, or a key on another column never
qualifies. A sub-partitioned partition qualifies or not as a whole, by its own bounds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from psycopg import AsyncConnection, errors, sql

from activities.engine.pipelines import settled_pipeline
from activities.engine.rules import Predicate, RangeKey, ident
from purge_config.names import TableName

_RANGE = re.compile(r"FOR VALUES FROM \((?P<lo>.*)\) TO \((?P<hi>.*)\)", re.DOTALL)
_LITERAL = re.compile(r"'((?:[^']|'')*)'", re.DOTALL)
#: A bound PostgreSQL prints unquoted: an `integer` column's (a bigint's comes quoted).
_INTEGER = re.compile(r"-?[0-9]+")
#: Fewer partitions than this beginning after the pass's instant, and inserts are near the end
#: of the table's ranges: warn, naming the bound to create.
AHEAD_WANTED = 2


@dataclass(frozen=True)
class Child:
    """A partition directly under the swept table."""

    oid: int
    table: TableName
    bound: str
    """As PostgreSQL prints it: `FOR VALUES FROM ('100') TO ('200')`, `DEFAULT`."""
    pending: bool
    """Left half-detached by an interrupted `DETACH ... CONCURRENTLY`."""
    owner: str
    owned: bool
    """This role is its owner or a member of the owning role."""
    expired: bool = False
    """Every value its bounds allow is expired at this pass's cutoff."""
    unexpired: bool = False
    """No value its bounds allow is expired: its lower bound is after the cutoff."""
    ahead: bool = False
    """It begins after the pass's instant."""
    unbounded_above: bool = False
    """Its upper bound is MAXVALUE: inserts past every other range still land somewhere."""

    @property
    def is_default(self) -> bool:
        return self.bound == "DEFAULT"


@dataclass(frozen=True)
class Leaf:
    """A partition that holds rows (not itself partitioned)."""

    oid: int
    table: TableName
    top: int
    """The OID of the swept table's child it lies under (itself, one level down)."""
    direct: bool
    """This role may SELECT and DELETE it by its own name (privileges on the parent do not
    reach a partition named directly)."""


@dataclass(frozen=True)
class Layout:
    """A partitioned table: its key, its children judged by their bounds, and its leaves."""

    table: TableName
    key: str
    """As PostgreSQL prints it: `RANGE (created_ms)`."""
    owner: str
    owned: bool
    role: str
    """The role this sweep runs as (`current_user`)."""
    judged: bool
    """RANGE on the rule's own column alone, for a rule that is exactly `column <= cutoff`:
    the children's bounds say which are wholly expired."""
    children: tuple[Child, ...]
    leaves: tuple[Leaf, ...]
    next_bound: str = ""
    """When fewer than two partitions begin after the pass's instant and the last range ends
    within a year of it: the bound of the next one to create, `FROM ('x') TO ('y')`."""
    next_blocked_by: TableName | None = None
    """The DEFAULT partition, when it already holds rows of `next_bound`'s range: PostgreSQL
    refuses to create that partition until they leave it."""

    @property
    def expired(self) -> list[Child]:
        """Children whose every possible row is expired, and not already half-detached."""
        return [c for c in self.children if c.expired and not c.pending]

    @property
    def pending(self) -> list[Child]:
        return [c for c in self.children if c.pending]

    @property
    def has_default(self) -> bool:
        return any(c.is_default for c in self.children)

    def to_sweep(self, skip: frozenset[int] = frozenset()) -> list[Leaf]:
        """The leaves a batched delete must sweep, by OID: not under a child in `skip`, a
        half-detached one, or one that can hold no expired row."""
        out = {c.oid for c in self.children if c.pending or c.unexpired} | skip
        return sorted((leaf for leaf in self.leaves if leaf.top not in out), key=lambda x: x.oid)


async def read_layout(conn: AsyncConnection[Any], pred: Predicate) -> Layout | None:
    """The table's partitions as of now, judged against `pred`; None for a plain table."""
    rel = {"rel": ident(pred.table).as_string(conn)}
    # The key, the children and the tree in one round trip: none needs another's answer.
    async with settled_pipeline(conn):
        keyed = await conn.execute(partition_key(), rel)
        listed = await conn.execute(partition_children(), rel)
        grown = await conn.execute(partition_tree(), rel)
    row = await keyed.fetchone()
    if row is None:
        return None
    strategy, columns, column, key, owner, owned, role = row
    key_ = pred.range_key
    judged = key_ is not None and strategy == "r" and columns == 1 and column == key_.column
    children = [
        Child(int(oid), TableName(name, schema), bound or "", pending, owner_, owned_)
        for oid, schema, name, bound, pending, owner_, owned_ in await listed.fetchall()
    ]
    tree = await grown.fetchall()
    next_bound, blocked_by = "", None
    if judged and key_ is not None and children:
        children = await _judge(conn, key_, children)
        next_bound, blocked_by = await _next_bound(conn, pred.table, key_, children)
    parents = {int(oid): int(parent) for oid, parent, *_ in tree}
    tops = {c.oid for c in children}
    leaves = []
    for oid, _, isleaf, schema, name, direct in tree:
        if not isleaf:
            continue
        top = int(oid)
        while top not in tops and top in parents:
            top = parents[top]
        leaves.append(Leaf(int(oid), TableName(name, schema), top, bool(direct)))
    return Layout(
        table=pred.table,
        key=str(key),
        owner=str(owner),
        owned=bool(owned),
        role=str(role),
        judged=judged,
        children=tuple(children),
        leaves=tuple(leaves),
        next_bound=next_bound,
        next_blocked_by=blocked_by,
    )


def range_bounds(bound: str) -> tuple[str | None, str | None] | None:
    """(lower, upper) literal texts of a one-column range bound (quoted, or an `integer`
    column's plain number), None for MINVALUE/MAXVALUE; None for anything else (DEFAULT,
    LIST, HASH, several columns)."""
    match = _RANGE.fullmatch(bound)
    if match is None:
        return None
    out: list[str | None] = []
    for side in (match["lo"], match["hi"]):
        if side in ("MINVALUE", "MAXVALUE"):
            out.append(None)
            continue
        literal = _LITERAL.fullmatch(side)
        if literal is not None:
            out.append(literal.group(1).replace("''", "'"))
        elif _INTEGER.fullmatch(side):
            out.append(side)
        else:
            return None
    return out[0], out[1]


async def _judge(conn: AsyncConnection[Any], key: RangeKey, children: list[Child]) -> list[Child]:
    """Each child's bounds against the cutoff and the instant, compared by PostgreSQL in the
    column's own type (a bound is printed, and read back, in this session's settings)."""
    parsed = [range_bounds(c.bound) for c in children]
    lows = [p[0] if p else None for p in parsed]
    highs = [p[1] if p else None for p in parsed]
    params = {
        "lo": lows,
        "hi": highs,
        "limit": _plus(key.cutoff, key.step),
        "cutoff": key.cutoff,
        "now": key.now,
    }
    cur = await conn.execute(bounds_judged(key.sql_type), params)
    judged = await cur.fetchall()
    out = []
    for child, bounds, (expired, unexpired, ahead) in zip(children, parsed, judged, strict=True):
        if bounds is None:
            out.append(child)  # DEFAULT: never judged by its bounds, always swept
            continue
        out.append(
            replace(
                child,
                expired=bool(expired),
                unexpired=bool(unexpired),
                ahead=bool(ahead),
                unbounded_above=bounds[1] is None,
            )
        )
    return out


async def _next_bound(
    conn: AsyncConnection[Any], table: TableName, key: RangeKey, children: list[Child]
) -> tuple[str, TableName | None]:
    """The bound of the partition to create when fewer than AHEAD_WANTED begin after now and
    the last range ends within a year (`RangeKey.horizon`): from the greatest upper bound, as
    wide as the partition ending there; and the DEFAULT partition when it already holds rows of
    that range. Empty when enough lie ahead, or a MAXVALUE partition takes every later row
    anyway."""
    current = [c for c in children if not c.pending]
    if sum(c.ahead for c in current) >= AHEAD_WANTED or any(c.unbounded_above for c in current):
        return "", None
    pairs = [range_bounds(c.bound) for c in current]
    finite = [p for p in pairs if p is not None and p[0] is not None and p[1] is not None]
    if not finite:
        return "", None
    try:
        cur = await conn.execute(
            bound_after(key.sql_type),
            {"lo": [p[0] for p in finite], "hi": [p[1] for p in finite], "horizon": key.horizon},
        )
        row = await cur.fetchone()
    except errors.DataError:
        return "", None  # the next range would overflow the type: nothing sensible to name
    if row is None or row[2]:
        return "", None  # no range, or the last one ends more than a year ahead
    lo, hi = row[0], row[1]
    default = next((c for c in current if c.is_default), None)
    blocked_by = None
    if default is not None:
        # Through the table itself, whose rights the sweep has (a role may not read a partition
        # by its own name): no range takes rows past the greatest bound, so any are DEFAULT's.
        held = await conn.execute(
            rows_in_range(table, key.column, key.sql_type), {"lo": lo, "hi": hi}
        )
        blocked_by = default.table if (await held.fetchone() or (False,))[0] else None
    return f"FROM ('{lo}') TO ('{hi}')", blocked_by


def _plus(value: object, step: object) -> object:
    # int + int, or datetime + timedelta: the least value that is not expired.
    return value + step  # type: ignore[operator]


# The catalog reads of a partitioned table, and the comparisons of its bounds.


#: The column types a partition bound is cast to, by RangeKey.sql_type: only these names are
#: ever put into a statement.
_BOUND_TYPES = {t: sql.SQL(t) for t in ("bigint", "integer", "timestamptz", "timestamp")}


def partition_key() -> sql.SQL:
    """One row for a partitioned `%(rel)s`, none for a plain table: strategy (`r`, `l`, `h`),
    number of key columns, the first key column's name (NULL for an expression), the key as
    PostgreSQL prints it, the owner, whether this role is (a member of) the owner, and the
    role itself."""
    return sql.SQL(
        "SELECT p.partstrat::text, p.partnatts, a.attname::text, pg_get_partkeydef(p.partrelid),"
        " c.relowner::regrole::text, pg_has_role(c.relowner, 'USAGE'), current_user::text"
        " FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partrelid"
        " LEFT JOIN pg_attribute a ON a.attrelid = p.partrelid AND p.partattrs[0] <> 0"
        " AND a.attnum = p.partattrs[0]"
        " WHERE p.partrelid = %(rel)s::regclass"
    )


def partition_children() -> sql.SQL:
    """The partitions directly under `%(rel)s`: OID, schema, name, bound as printed, whether
    half-detached, owner, and whether this role is (a member of) it."""
    return sql.SQL(
        "SELECT c.oid::bigint, n.nspname::text, c.relname::text,"
        " pg_get_expr(c.relpartbound, c.oid), i.inhdetachpending,"
        " c.relowner::regrole::text, pg_has_role(c.relowner, 'USAGE')"
        " FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE i.inhparent = %(rel)s::regclass ORDER BY c.oid"
    )


def partition_tree() -> sql.SQL:
    """Every partition under `%(rel)s`, at any depth: OID, its parent's OID, whether it is a
    leaf, schema, name, and whether this role may SELECT and DELETE it by its own name."""
    # Each partition's names looked up by its OID (see table_size): joined, the planner takes
    # the function for a thousand rows and hashes them against a scan of every schema.
    return sql.SQL(
        "SELECT t.relid::oid::bigint, t.parentrelid::oid::bigint, t.isleaf, c.nspname, c.relname,"
        " has_table_privilege(t.relid, 'SELECT') AND has_table_privilege(t.relid, 'DELETE')"
        " FROM pg_partition_tree(%(rel)s::regclass) t"
        " CROSS JOIN LATERAL (SELECT n.nspname::text, c.relname::text FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = t.relid OFFSET 0) c"
        " WHERE t.level > 0"
    )


def bounds_judged(sql_type: str) -> sql.Composed:
    """For each (`%(lo)s`[i], `%(hi)s`[i]) bound pair (text, NULL for MINVALUE/MAXVALUE), in
    order: wholly expired (`hi <= %(limit)s`, the cutoff plus one step), holding no expired row
    (`lo > %(cutoff)s`), beginning after the instant (`lo > %(now)s`); compared in the column's
    type, the texts read back in the session that printed them."""
    t = _BOUND_TYPES[sql_type]
    return sql.SQL(
        "SELECT coalesce(b.hi::{t} <= %(limit)s, false), coalesce(b.lo::{t} > %(cutoff)s, false),"
        " coalesce(b.lo::{t} > %(now)s, false)"
        " FROM unnest(%(lo)s::text[], %(hi)s::text[]) WITH ORDINALITY AS b(lo, hi, n)"
        " ORDER BY b.n"
    ).format(t=t)


def bound_after(sql_type: str) -> sql.Composed:
    """One row: the greatest of the `%(hi)s` bounds, the upper bound of a next partition as
    wide as the one ending there (in months and days for a timestamp, so a monthly partition is
    followed by a month), and whether that greatest bound lies past `%(horizon)s`."""
    t = _BOUND_TYPES[sql_type]
    width = (
        sql.SQL("b.hi::{t} - b.lo::{t}")
        if sql_type in ("bigint", "integer")
        else sql.SQL("age(b.hi::{t}, b.lo::{t})")
    ).format(t=t)
    return sql.SQL(
        "SELECT b.hi::{t}::text, (b.hi::{t} + {width})::text, b.hi::{t} > %(horizon)s"
        " FROM unnest(%(lo)s::text[], %(hi)s::text[]) AS b(lo, hi)"
        " ORDER BY b.hi::{t} DESC LIMIT 1"
    ).format(t=t, width=width)


def rows_in_range(table: TableName, column: str, sql_type: str) -> sql.Composed:
    """One row: whether `table` holds a row whose `column` lies in [`%(lo)s`, `%(hi)s`), the
    bounds as printed texts, read in the column's type (one probe of its index where it has
    one)."""
    t = _BOUND_TYPES[sql_type]
    col = sql.Identifier(column)
    return sql.SQL(
        "SELECT EXISTS (SELECT FROM {table} WHERE {col} >= %(lo)s::{t} AND {col} < %(hi)s::{t})"
    ).format(table=ident(table), col=col, t=t)
