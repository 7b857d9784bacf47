"""`pg-purge discover`: what in a database a sweep could keep small, read from its catalog.

It reads, never writes: one connection, one `READ ONLY` transaction, and only `SELECT`s (the
catalog, and counts of the tables the role may read). It finds the tables it recognises by
their documented schemas (`purge_ops.frameworks`) and every other table with an expiry-like
column, counts their rows and the rows that would go now (by this machine's clock, as a pass
reads its clock from the workflow, never the server's), says whether an index serves the sweep
(and which to create where none does), and groups tables of one shape in many schemas (or many
tables of one shape in a schema) into the pattern that covers them. `purge_ops.discover_render`
prints the result as a commented config or as JSON.
"""

from __future__ import annotations

import re
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

import psycopg
from psycopg import AsyncConnection, sql

from purge_config.dsn import redact
from purge_config.errors import ConfigError
from purge_config.fleet import check_dsn
from purge_config.names import SQL_NAME, TARGET_NAME, TableName
from purge_config.patterns import TablePattern
from purge_config.settings import EpochUnit
from purge_config.values import read_duration
from purge_ops.connect import APPLICATION_NAME
from purge_ops.frameworks import Preset, presets_of

#: Column types an `expiring` target sweeps, by `format_type` of the column's base type.
INSTANTS = ("timestamp with time zone", "timestamp without time zone")
INTEGERS = ("bigint", "integer")
#: Found and reported, but no target kind reads it today.
OTHER_TIMES = ("date",)
#: Expiry-like column names: an expiry word as a whole `_`-separated part (expires_at,
#: expire_date, expiry, expiration_ms), a `..._until` (valid_until, until_ms), or a
#: `purge_after`/`delete_after`. Names that say when a row was made or touched are not here:
#: their age is a policy only the application knows.
EXPIRY_NAME = re.compile(
    r"(?:^|_)(?:expires?|expiry|expiration|expiring)(?:_|$)"
    r"|(?:^|_)until(?:_(?:at|ms|s|us|ts|date|time))?$"
    r"|(?:^|_)(?:purge|delete|remove|discard)_after(?:_|$)",
    re.IGNORECASE,
)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
#: A column that says when a row was made, and a table name that says its rows are short-lived
#: (a token, a code, an attempt, a session, an audit row): such a table with no expiry-like
#: column is named in a comment (`Discovery.made_only`), never an entry, since how long to keep
#: its rows is a policy only the application knows. Most tables have a `created_at`; only these
#: names are said, or every table would be.
MADE_NAME = re.compile(r"^(?:created|inserted|issued|requested)(?:_(?:at|on|time))?$", re.I)
SHORT_LIVED = re.compile(
    r"(?:^|_)(?:tokens?|nonces?|otps?|resets?|verifications?|confirmations?|challenges?"
    r"|attempts?|sessions?|idempotency|throttles?|audits?)(?:_|$)",
    re.I,
)


def snake(name: str) -> str:
    """`name` in lower case, each camelCase word apart (`expiresAt` is `expires_at`), as
    EXPIRY_NAME reads names: ORMs that keep a model's field names (Prisma) make such columns."""
    return _CAMEL.sub("_", name).lower()


def expiry_like(column: str) -> bool:
    """Whether `column`'s name says it holds an expiry (EXPIRY_NAME, camelCase read apart)."""
    return EXPIRY_NAME.search(snake(column)) is not None


#: The instants each epoch unit reads as plausible (1973 to the year 5138), as the sweep's own
#: unit check (activities/engine/units.py) judges them.
EPOCH_WINDOWS: dict[EpochUnit, tuple[int, int]] = {
    "s": (10**8, 10**11),
    "ms": (10**11, 10**14),
    "us": (10**14, 10**17),
}
#: A column's name that says its unit, for a table with no rows to tell.
_UNIT_SUFFIX = re.compile(r"_(ms|us|s|sec|secs|seconds)$", re.IGNORECASE)
_SUFFIX_UNITS: dict[str, EpochUnit] = {
    "ms": "ms", "us": "us", "s": "s", "sec": "s", "secs": "s", "seconds": "s"
}  # fmt: skip
#: Tables of one shape in at least this many schemas (or this many of one shape in a schema)
#: are one pattern entry.
FAMILY_MIN = 3
#: How long one count may take before the planner's estimate stands in for it.
COUNT_TIMEOUT = "5s"
#: Rows read to tell an integer column's epoch unit.
UNIT_SAMPLE = 200

Source = Literal["framework", "expiry"]


class DiscoverError(ConnectionError):
    """The database could not be reached, or refused the connection."""


@dataclass(frozen=True)
class Table:
    """A table as the catalog shows it to this role."""

    oid: int
    schema: str
    name: str
    columns: Mapping[str, str]
    """Each column's type, by `format_type` of its base type (a domain reads as its base)."""
    readable: bool
    """Whether the role may SELECT from it (else its figures are the planner's estimates)."""
    estimate: int
    """The planner's row estimate (-1: never analyzed or vacuumed)."""
    partitioned: bool = False
    """A partitioned table (its partitions are its own: never listed apart)."""

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"


@dataclass(frozen=True)
class IndexUse:
    """Whether an index serves a sweep of one column (under its filter)."""

    serves: str | None
    """The serving index's name, or None."""
    create: str | None
    """The statement that would create one, where none serves."""
    note: str = ""
    """An index that leads with the column but does not serve (partial, invalid, not btree)."""
    how: str = ""
    """What to know before running `create` (a partitioned table's index locks its writes)."""


@dataclass(frozen=True)
class Finding:
    """One table and column a target could sweep (or a recognised table no target can)."""

    source: Source
    schema: str
    table: str
    column: str
    column_type: str
    max_age: str
    unit: EpochUnit | None = None
    unit_note: str = ""
    """How the unit was told (from the values, the name, or a guess on an empty table)."""
    preset: Preset | None = None
    rows: int | None = None
    expired: int | None = None
    """Rows that would go now; None when it could not be counted."""
    sentinels: int = 0
    """Rows whose column reads as an instant before 1973 (SENTINEL_BEFORE_S), counted with
    the others."""
    estimated: bool = False
    """`rows` is the planner's estimate (no SELECT right, or the count ran out of time)."""
    unread: str = ""
    """Why the rows were not counted, when `estimated`."""
    index: IndexUse | None = None
    problem: str = ""
    """Why no target can sweep it as it is (a date column, values that are no epoch, ...)."""
    caution: str = ""
    """Why a target that could sweep it is printed as a comment, to be made live by hand: its
    rows may be records rather than expiring entries, or hold what the sweep would misread."""

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def is_target(self) -> bool:
        """Whether it is printed as a live `[[targets]]` entry of its own keys (one a pattern
        entry may cover with others of its shape)."""
        if self.problem or self.caution:
            return False
        return self.preset is None or self.preset.treatment == "target"

    @property
    def is_live(self) -> bool:
        """Whether it is printed as a live entry: a target, or a table a preset sweeps."""
        if self.is_target:
            return True
        return self.preset is not None and self.preset.treatment == "preset" and not self.problem


@dataclass(frozen=True)
class Family:
    """Tables of one shape that one pattern entry covers."""

    pattern: str
    members: tuple[Finding, ...]
    strays: tuple[str, ...] = ()
    """Other tables the pattern would match that lack the column (each would fail its sweep)."""

    @property
    def first(self) -> Finding:
        return self.members[0]

    @property
    def key(self) -> str:
        """Its key in `Discovery.names`: `pattern:column` (two families may share a pattern)."""
        return f"{self.pattern}:{self.first.column}"


@dataclass(frozen=True)
class Discovery:
    """What `discover` found in one database."""

    database: str
    """Its URL, password masked."""
    now_ms: int
    """The instant 'would go now' was counted at: this machine's clock, epoch ms."""
    user: str
    singles: tuple[Finding, ...] = ()
    families: tuple[Family, ...] = ()
    skipped: tuple[str, ...] = ()
    """Tables with an expiry-like column that no config can name, and why."""
    made_only: tuple[str, ...] = ()
    """Tables whose name says their rows may be short-lived, that no finding sweeps as they
    are, with a column that says when a row was made (`schema.table (column)`): entries only
    their owner can write, with the `max_age` their policy says."""
    names: Mapping[str, str] = field(default_factory=dict)
    """The target name of each single (`schema.table:column`) and family (`pattern:column`,
    `Family.key`): `target_names`."""


def resolve_url(explicit: str | None, fallback: str | None) -> str:
    """The database to read: the URL on the command line, else `fallback` (PURGE_DATABASE_URL
    or the config's `database_url`); checked as a connection string."""
    url = explicit or fallback
    if not url:
        raise ConfigError(
            "discover: no database; give its URL, set PURGE_DATABASE_URL, or name a config "
            "with database_url"
        )
    check_dsn("discover", "URL" if explicit else "database_url", url)
    return url


async def discover(url: str, now_ms: int | None = None) -> Discovery:
    """Read the database at `url` in one read-only transaction and say what a sweep could
    keep small there; DiscoverError when it cannot be reached."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    try:
        conn = await AsyncConnection.connect(url, application_name=APPLICATION_NAME)
    except psycopg.Error as err:
        reason = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
        # libpq's message names host and port, never the password.
        raise DiscoverError(
            f"cannot connect to {redact(url)}: {reason or type(err).__name__}"
        ) from None
    try:
        await conn.set_read_only(True)
        async with conn.transaction():
            await conn.execute(f"SET LOCAL statement_timeout = '{COUNT_TIMEOUT}'")
            return await _read(conn, redact(url), now_ms)
    finally:
        await conn.close()


async def _read(conn: AsyncConnection[Any], database: str, now_ms: int) -> Discovery:
    cur = await conn.execute("SELECT current_user")
    user = str((await cur.fetchone() or ("?",))[0])
    tables = await _tables(conn)
    oids = [t.oid for t in tables]
    indexes = await _indexes(conn, oids)
    leaves = await _leaves(conn, [t.oid for t in tables if t.partitioned])
    leaf_indexes = await _indexes(conn, [leaf for found in leaves.values() for leaf in found])
    referenced = await _references(conn, oids)
    inherited = await _inheritance_children(conn, [t.oid for t in tables if not t.partitioned])
    findings: list[Finding] = []
    skipped: list[str] = []
    for table in tables:
        for candidate in _candidates(table):
            if not (SQL_NAME.fullmatch(table.schema) and SQL_NAME.fullmatch(table.name)):
                skipped.append(
                    f"{table.qualified} ({candidate.column}): a config names tables whose "
                    "schema and name are a letter or _, then letters, digits and _"
                )
                continue
            own = [leaf_indexes.get(leaf, []) for leaf in leaves.get(table.oid, [])]
            finding = await _measure(conn, table, candidate, indexes, now_ms, own)
            if finding.source == "expiry" and not finding.problem:
                finding = _cautioned(finding, table, referenced.get(table.oid, []))
            children = inherited.get(table.oid)
            if children and not finding.problem:
                # As the sweep refuses it (`table_facts.refuse_inheritance`).
                finding = replace(
                    finding,
                    problem=f"it has inheritance children ({', '.join(children)}), whose rows a "
                    "DELETE of it removes too: a sweep refuses it; name the children instead",
                )
            findings.append(finding)
    # Tables no finding sweeps as they are (none found, or each with a problem: an `expires_in`
    # duration, say) that a config can name.
    swept = {f.qualified for f in findings if not f.problem}
    made_only = [
        f"{table.qualified} ({made})"
        for table in tables
        if table.qualified not in swept
        and SQL_NAME.fullmatch(table.schema)
        and SQL_NAME.fullmatch(table.name)
        and (made := _made_at(table))
    ]
    singles, families = group(findings, tables)
    return Discovery(
        database=database,
        now_ms=now_ms,
        user=user,
        singles=tuple(singles),
        families=tuple(families),
        skipped=tuple(dict.fromkeys(skipped)),
        made_only=tuple(made_only),
        names=target_names(singles, families),
    )


_TABLES = """
SELECT c.oid::bigint, n.nspname, c.relname, c.reltuples::bigint, c.relkind = 'p',
       has_table_privilege(c.oid, 'SELECT'),
       array_agg(a.attname::text ORDER BY a.attnum),
       array_agg(format_type(coalesce(nullif(t.typbasetype, 0), t.oid), NULL) ORDER BY a.attnum)
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
JOIN pg_type t ON t.oid = a.atttypid
WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND n.nspname !~ '^pg_' AND n.nspname <> 'information_schema'
GROUP BY c.oid, n.nspname, c.relname, c.reltuples, c.relkind
ORDER BY n.nspname, c.relname
"""


async def _tables(conn: AsyncConnection[Any]) -> list[Table]:
    """Every table the role can see outside the system schemas; a partition is its parent's."""
    cur = await conn.execute(_TABLES)
    return [
        Table(
            oid=oid,
            schema=schema,
            name=name,
            columns=dict(zip(names, types, strict=True)),
            readable=readable,
            estimate=estimate,
            partitioned=partitioned,
        )
        for oid, schema, name, estimate, partitioned, readable, names, types in (
            await cur.fetchall()
        )
    ]


@dataclass(frozen=True)
class _Index:
    name: str
    keys: tuple[str, ...]
    btree: bool
    valid: bool
    predicate: str | None


_INDEXES = """
SELECT i.indrelid::bigint, ic.relname, am.amname = 'btree', i.indisvalid,
       pg_get_expr(i.indpred, i.indrelid),
       ARRAY(SELECT coalesce(a.attname::text, '')
             FROM unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
             LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
             WHERE k.ord <= i.indnkeyatts ORDER BY k.ord)
FROM pg_index i
JOIN pg_class ic ON ic.oid = i.indexrelid
JOIN pg_am am ON am.oid = ic.relam
WHERE i.indrelid = ANY(%s)
"""


async def _indexes(conn: AsyncConnection[Any], oids: list[int]) -> dict[int, list[_Index]]:
    found: dict[int, list[_Index]] = defaultdict(list)
    cur = await conn.execute(_INDEXES, (oids,))
    for oid, name, btree, valid, predicate, keys in await cur.fetchall():
        found[oid].append(_Index(name, tuple(keys), btree, valid, predicate))
    return found


_LEAVES = """
SELECT p.oid::bigint, t.relid::bigint
FROM unnest(%s::oid[]) AS p(oid), pg_partition_tree(p.oid) AS t
WHERE t.isleaf
"""


async def _leaves(conn: AsyncConnection[Any], oids: list[int]) -> dict[int, list[int]]:
    """Each partitioned table's leaf partitions, whose own indexes may serve its sweep."""
    found: dict[int, list[int]] = defaultdict(list)
    if oids:
        cur = await conn.execute(_LEAVES, (oids,))
        for oid, leaf in await cur.fetchall():
            found[oid].append(leaf)
    return found


#: What a foreign key does to its own rows when a row they reference is deleted.
_ON_DELETE = {
    "a": "NO ACTION: a row still referenced cannot be deleted, and the sweep's batch fails",
    "r": "RESTRICT: a row still referenced cannot be deleted, and the sweep's batch fails",
    "c": "CASCADE: its rows go with the row they reference, counted nowhere",
    "n": "SET NULL: its references are emptied",
    "d": "SET DEFAULT: its references are reset",
}

#: The foreign keys into each table (a partitioned table's own, not its partitions' copies).
_REFERENCES = """
SELECT DISTINCT k.confrelid::bigint, n.nspname, c.relname, k.confdeltype::text
FROM pg_constraint k
JOIN pg_class c ON c.oid = k.conrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE k.contype = 'f' AND k.conparentid = 0 AND k.confrelid = ANY(%s)
ORDER BY 2, 3, 4
"""


async def _references(conn: AsyncConnection[Any], oids: list[int]) -> dict[int, list[str]]:
    """For each table, the tables whose foreign keys reference it, each with what deleting a
    row it references does to theirs."""
    found: dict[int, list[str]] = defaultdict(list)
    cur = await conn.execute(_REFERENCES, (oids,))
    for oid, schema, name, action in await cur.fetchall():
        found[oid].append(f"{schema}.{name} (ON DELETE {_ON_DELETE.get(action, action)})")
    return found


async def _inheritance_children(
    conn: AsyncConnection[Any], oids: list[int]
) -> dict[int, list[str]]:
    """For each plain table of `oids` with inheritance children, their names."""
    cur = await conn.execute(
        "SELECT inhparent::bigint, array_agg(c ORDER BY c) FROM pg_catalog.pg_inherits,"
        " LATERAL (SELECT inhrelid::regclass::text) n(c)"
        " WHERE inhparent = ANY(%s::bigint[]::oid[]) GROUP BY 1",
        (oids,),
    )
    return {int(oid): list(names) for oid, names in await cur.fetchall()}


#: Words before an expiry word that still name the row's own expiry (`valid_until`).
_ROW_WORDS = frozenset({"valid", "row", "record", "entry", "item"})
#: An instant before this (1973-03-03, 10**8 s) in an expiry column is no expiry anyone set:
#: 0, the epoch, `-infinity` stand for "never" more often than for an instant. The epoch
#: windows' lower bound.
SENTINEL_BEFORE_S = 10**8


def _cautioned(finding: Finding, table: Table, references: list[str]) -> Finding:
    """`finding` with the caution that keeps it a comment, where one applies: other tables
    reference its table; its column's name says something else of the row expires; or some
    of its rows hold what the sweep would read as an instant before 1973 (`Finding.caution`
    may hold one already: its values could not be read)."""
    reasons = [finding.caution] if finding.caution else []
    if references:
        reasons.append(
            "other tables reference its rows by foreign key, as they reference a record: "
            + "; ".join(references)
        )
    what = whose_expiry(table.name, finding.column)
    if what:
        reasons.append(
            f'its name ({finding.column}) ties the expiry to "{what}" rather than to the row: '
            f"a row of {table.name} may outlive it"
        )
    if finding.sentinels:
        reasons.append(
            f"{finding.sentinels:,} of its rows {'reads' if finding.sentinels == 1 else 'read'}"
            " as an instant before 1973 (0 is 1970-01-01), which often stands for never: a "
            "sweep deletes them with the expired (would go now counts them)"
        )
    return replace(finding, caution="; ".join(reasons)) if reasons else finding


def whose_expiry(table: str, column: str) -> str:
    """The words of `column`'s name before its expiry word that name something other than a
    row of `table` (`password` of users.password_expires_at); empty when the name says the
    row's own expiry (`expires_at`, `valid_until`, `token_expires_at` in `tokens`)."""
    column = snake(column)
    match = EXPIRY_NAME.search(column)
    if match is None:
        return ""
    own = {word.rstrip("s") for word in snake(table).split("_")}
    words = [word for word in column[: match.start()].split("_") if word]
    return "_".join(w for w in words if w not in _ROW_WORDS and w.rstrip("s") not in own)


@dataclass(frozen=True)
class _Candidate:
    source: Source
    column: str
    preset: Preset | None = None


def _candidates(table: Table) -> list[_Candidate]:
    """The columns of `table` worth a finding: its presets' (when recognised), else each
    expiry-like column of a type with an instant in it."""
    presets = presets_of(table.name, frozenset(table.columns))
    if presets:
        return [_Candidate("framework", p.column, p) for p in presets]
    return [
        _Candidate("expiry", column)
        for column, kind in table.columns.items()
        if expiry_like(column) and kind in (*INSTANTS, *INTEGERS, *OTHER_TIMES)
    ]


def _made_at(table: Table) -> str | None:
    """The column of `table` that says when a row was made, where its name says its rows are
    short-lived (MADE_NAME, SHORT_LIVED) and the column holds an instant; else None."""
    if not SHORT_LIVED.search(snake(table.name)):
        return None
    return next(
        (c for c, kind in table.columns.items() if MADE_NAME.match(snake(c)) and kind in INSTANTS),
        None,
    )


async def _measure(
    conn: AsyncConnection[Any],
    table: Table,
    candidate: _Candidate,
    indexes: Mapping[int, list[_Index]],
    now_ms: int,
    leaves: list[list[_Index]] | None = None,
) -> Finding:
    """The finding for one candidate column: its unit, index, and counts. `leaves`: each leaf
    partition's indexes, for a partitioned table."""
    preset = candidate.preset
    column = candidate.column
    kind = table.columns[column]
    finding = Finding(
        source=candidate.source,
        schema=table.schema,
        table=table.name,
        column=column,
        column_type=kind,
        max_age=preset.max_age if preset else "0s",
        preset=preset,
    )
    if preset is not None and preset.treatment != "target":
        return await _counted(conn, finding, table, None, None)
    unit: EpochUnit | None = None
    if kind in INTEGERS:
        unit, note, problem, unread = await _epoch_unit(conn, table, column, preset)
        finding = replace(finding, unit=unit, unit_note=note, problem=problem)
        if unread and table.estimate != 0:
            finding = replace(
                finding,
                caution=f"its values could not be read ({unread}), so neither its unit nor "
                "whether it holds instants at all is known",
            )
    elif kind in OTHER_TIMES:
        finding = replace(
            finding,
            problem=f"a {kind} column: an expiring target reads bigint or integer epoch "
            "values, timestamptz or timestamp",
        )
    match = preset.match if preset else ()
    served = index_use(table, column, match, indexes.get(table.oid, []), leaves or [])
    finding = replace(finding, index=served)
    if finding.problem and kind not in OTHER_TIMES:
        return await _counted(conn, finding, table, None, None)  # no instant: its rows only
    age_ms = read_duration("discover", "max_age", {"max_age": finding.max_age}, "max_age")
    cutoff = _cutoff(kind, unit, now_ms - age_ms)
    # A framework's column holds what the framework writes; only a column found by its name
    # may hold a stand-in for never.
    floor = (
        _cutoff(kind, unit, SENTINEL_BEFORE_S * 1000)
        if candidate.source == "expiry" and kind not in OTHER_TIMES
        else None
    )
    return await _counted(conn, finding, table, match, cutoff, floor)


async def _counted(
    conn: AsyncConnection[Any],
    finding: Finding,
    table: Table,
    match: tuple[tuple[str, tuple[str, ...]], ...] | None,
    cutoff: object,
    floor: object = None,
) -> Finding:
    """`finding` with its rows and the rows that would go by `cutoff` (its rows only, without a
    cutoff), and those before `floor` when given; or the planner's estimate and why where they
    could not be counted."""
    column = finding.column if cutoff is not None else None
    counted = await _count(conn, table, column, match or (), cutoff, floor)
    if not isinstance(counted, str):
        rows, expired, sentinels = counted
        return replace(finding, rows=rows, expired=expired if column else None, sentinels=sentinels)
    estimate = table.estimate if table.estimate >= 0 else None  # -1: never analyzed
    return replace(finding, rows=estimate, estimated=True, unread=counted)


def _cutoff(kind: str, unit: EpochUnit | None, cutoff_ms: int) -> object:
    """The value a row's column must be at or before to go (the clock rule: from `now_ms`)."""
    instant = datetime.fromtimestamp(cutoff_ms / 1000, UTC)
    if kind == "timestamp with time zone":
        return instant
    if kind == "timestamp without time zone":
        return instant.replace(tzinfo=None)  # read as UTC, as the sweep reads it
    if kind == "date":
        return instant.date()
    if unit == "s":
        return cutoff_ms // 1000
    if unit == "us":
        return cutoff_ms * 1000
    return cutoff_ms


async def _count(
    conn: AsyncConnection[Any],
    table: Table,
    column: str | None,
    match: tuple[tuple[str, tuple[str, ...]], ...],
    cutoff: object,
    floor: object = None,
) -> tuple[int, int, int] | str:
    """(rows, rows that would go, rows of those before `floor`) of `table` (none go without a
    `column`), or why they were not counted: the role may not read it, or the count outlived
    COUNT_TIMEOUT (its savepoint rolled back, the transaction goes on)."""
    if not table.readable:
        return "this role may not SELECT from it"
    if column is None:
        expired: sql.Composable = sql.SQL("false")
        params: list[object] = []
    else:
        expired = sql.SQL("{} <= %s").format(sql.Identifier(column))
        params = [cutoff]
    for name, values in match:
        # As text, so a value compares with an enum column as with a text one.
        expired = sql.SQL("{} AND {}::text = ANY(%s)").format(expired, sql.Identifier(name))
        params.append(list(values))
    early: sql.Composable = sql.SQL("false")
    if column is not None and floor is not None:
        early = sql.SQL("{} AND {} < %s").format(expired, sql.Identifier(column))
        params = [*params, *params, floor]  # the expired's own, again, then the floor
    query = sql.SQL(
        "SELECT count(*), count(*) FILTER (WHERE {}), count(*) FILTER (WHERE {}) FROM {}"
    ).format(expired, early, sql.Identifier(table.schema, table.name))
    try:
        async with conn.transaction():
            cur = await conn.execute(query, params)
            row = await cur.fetchone()
    except psycopg.errors.QueryCanceled:
        return f"counting took over {COUNT_TIMEOUT}"
    except psycopg.errors.InsufficientPrivilege as err:
        return f"the count was refused: {err.diag.message_primary or err}"
    return (int(row[0]), int(row[1]), int(row[2])) if row else (0, 0, 0)


async def _epoch_unit(
    conn: AsyncConnection[Any], table: Table, column: str, preset: Preset | None
) -> tuple[EpochUnit | None, str, str, str]:
    """(unit, how it was told, problem, why its values were not read) of an integer column,
    from a sample of its values; a preset's documented unit stands unless the values say
    otherwise."""
    values: list[int] = []
    unread = "" if table.readable else "this role may not SELECT from it"
    if table.readable:
        query = sql.SQL("SELECT {0} FROM {1} WHERE {0} IS NOT NULL LIMIT {2}").format(
            sql.Identifier(column), sql.Identifier(table.schema, table.name), UNIT_SAMPLE
        )
        try:
            async with conn.transaction():
                cur = await conn.execute(query)
                values = [int(v) for (v,) in await cur.fetchall()]
        except psycopg.errors.QueryCanceled:
            unread = f"reading them took over {COUNT_TIMEOUT}"
        except psycopg.errors.InsufficientPrivilege as err:
            unread = f"the read was refused: {err.diag.message_primary or err}"
    if values:
        typical = statistics.median_low(values)
        for unit, (low, high) in EPOCH_WINDOWS.items():
            if low <= abs(typical) <= high:
                return unit, f"epoch {unit}, from its values (e.g. {typical})", "", ""
        return None, "", f"its values (e.g. {typical}) are no epoch instant in s, ms or us", ""
    if preset is not None and preset.unit is not None:
        return preset.unit, f"epoch {preset.unit}, as documented", "", ""
    why = f"its values were not read: {unread}" if unread else "no rows to tell"
    suffix = _UNIT_SUFFIX.search(column)
    if suffix:
        told = _SUFFIX_UNITS[suffix.group(1).lower()]
        return told, f"epoch {told}, from its name ({why})", "", unread
    return "ms", f"epoch ms guessed ({why}); check it", "", unread


def index_use(
    table: Table,
    column: str,
    match: tuple[tuple[str, tuple[str, ...]], ...],
    indexes: Iterable[_Index],
    leaves: list[list[_Index]] | None = None,
) -> IndexUse:
    """The index that serves a sweep of `column` (a btree whose keys lead to it through the
    columns the filter fixes), or the statement to create one. A partitioned table's sweep is
    served by its own index, or by one on each of its leaf partitions (`leaves`)."""
    near: list[str] = []
    serving = _serving(column, match, indexes, near)
    if serving is not None:
        return IndexUse(serves=serving, create=None)
    if table.partitioned and leaves and all(_serving(column, match, own, []) for own in leaves):
        return IndexUse(serves=f"an index on each of its {len(leaves)} partitions", create=None)
    keys = [name for name, _ in match if name != column] + [column]
    on = "{} ({})".format(_quoted(table.schema, table.name), ", ".join(_quoted(k) for k in keys))
    if table.partitioned:
        return IndexUse(
            serves=None,
            create=f"CREATE INDEX ON {on}",
            note="; ".join(near),
            how="a partitioned table's index cannot be built CONCURRENTLY, so this one holds "
            "off writes to every partition while it builds; to build it without that, create "
            "one CONCURRENTLY on each partition, then ATTACH each to one made ON ONLY the table",
        )
    return IndexUse(serves=None, create=f"CREATE INDEX CONCURRENTLY ON {on}", note="; ".join(near))


def _serving(
    column: str,
    match: tuple[tuple[str, tuple[str, ...]], ...],
    indexes: Iterable[_Index],
    near: list[str],
) -> str | None:
    """The name of the first of `indexes` that serves a sweep of `column`, else None; why each
    one that leads with the column does not serve is added to `near`."""
    fixed = {name for name, _ in match}
    for index in indexes:
        leading = list(index.keys)
        while leading and leading[0] in fixed and leading[0] != column:
            leading.pop(0)
        if not leading or leading[0] != column:
            continue
        if not index.btree:
            near.append(f"{index.name} is not a btree")
        elif not index.valid:
            near.append(f"{index.name} is invalid (a failed CREATE INDEX CONCURRENTLY)")
        elif index.predicate:
            predicate = " ".join(index.predicate.split())
            near.append(
                f"{index.name} is partial (WHERE {predicate}): it serves only rows it holds"
            )
        else:
            return index.name
    return None


def _quoted(*parts: str) -> str:
    """A SQL name quoted as sql.Identifier quotes it (names here are SQL_NAME: no quotes)."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in parts)


def group(findings: list[Finding], tables: list[Table]) -> tuple[list[Finding], list[Family]]:
    """The findings no pattern covers, and the families of at least FAMILY_MIN tables of one
    shape: one table in many schemas (`tenant_*.sessions`), or many tables of a schema whose
    names differ only in digits (`app.events_*`)."""
    families: list[Family] = []
    left = [f for f in findings if f.is_target]
    rest = [f for f in findings if not f.is_target]
    # One entry reads one column of one type and unit with one age in every table it matches.
    by_table: dict[tuple[str, ...], list[Finding]] = defaultdict(list)
    for finding in left:
        by_table[(finding.table, *_shape(finding))].append(finding)
    covered: set[int] = set()
    for (name, *_), members in by_table.items():
        if len({m.schema for m in members}) < FAMILY_MIN:
            continue
        star = _star([m.schema for m in members])
        family = _family(f"{star}.{name}", members, tables) if star is not None else None
        if family is not None:
            families.append(family)
            covered.update(id(m) for m in members)
    by_shape: dict[tuple[str, ...], list[Finding]] = defaultdict(list)
    for finding in left:
        if id(finding) not in covered and re.search(r"\d", finding.table):
            numbered = re.sub(r"\d+", "#", finding.table)
            by_shape[(finding.schema, numbered, *_shape(finding))].append(finding)
    for (schema, *_), members in by_shape.items():
        if len(members) < FAMILY_MIN:
            continue
        star = _star([m.table for m in members])
        family = _family(f"{schema}.{star}", members, tables) if star is not None else None
        if family is not None:
            families.append(family)
            covered.update(id(m) for m in members)
    singles = [f for f in left if id(f) not in covered] + rest
    singles.sort(key=lambda f: (f.source != "framework", f.schema, f.table, f.column))
    return singles, families


def _shape(finding: Finding) -> tuple[str, ...]:
    """What one entry fixes for every table it sweeps."""
    return (finding.column, finding.column_type, finding.unit or "", finding.max_age)


def _star(names: list[str]) -> str | None:
    """The pattern part (`tenant_*`) that covers every name with one `*` standing for at
    least one character of each, or None when the names share too little for one."""
    # A star takes every numbered part (tenant_0001 .. tenant_0042 is tenant_*, not
    # tenant_00*; events_2026_01 .. events_2026_03 is events_*, which next year's match too).
    prefix = _unnumbered(_common_prefix(names))
    rest = [n[len(prefix) :][::-1] for n in names]
    suffix = _unnumbered(_common_prefix(rest))[::-1]
    if len(prefix + suffix) < 2:  # `*` alone matches every table, `*a` most of them
        return None
    if any(len(n) <= len(prefix) + len(suffix) for n in names):
        return None
    return f"{prefix}*{suffix}"


def _unnumbered(prefix: str) -> str:
    """`prefix` without its trailing digits and the `_` between them, its last `_` kept."""
    kept = prefix.rstrip("0123456789_")
    return kept + "_" if prefix[len(kept) : len(kept) + 1] == "_" else kept


def _common_prefix(names: list[str]) -> str:
    first, last = min(names), max(names)
    size = 0
    while size < min(len(first), len(last)) and first[size] == last[size]:
        size += 1
    return first[:size]


def _family(pattern: str, members: list[Finding], tables: list[Table]) -> Family | None:
    """A family, with the tables its pattern would also match that lack its column (a
    partition is never matched: the catalog read left them out, as the sweep's expansion does);
    None when its pattern would also match a table that has the column, of any type, and is
    no member: one in another unit, a caution's, one with an entry of its own. Its entry would
    sweep that table by the family's rule (or fail on it at every pass), and deleting the
    table's own entry would not keep it out; its members are then entries of their own."""
    schema, _, name = pattern.partition(".")
    matcher = TablePattern(TableName(name, schema))
    column = members[0].column
    own = {m.qualified for m in members}
    matched = [t for t in tables if matcher.match(t.schema, t.name) is not None]
    # Of any type: the family's rule takes an epoch integer beside timestamptz, so a table with
    # the column as another type is swept by it (in the family's unit), not refused.
    if any(column in t.columns and t.qualified not in own for t in matched):
        return None
    strays = tuple(t.qualified for t in matched if column not in t.columns)
    return Family(pattern, tuple(sorted(members, key=lambda m: m.qualified)), strays)


def target_names(singles: list[Finding], families: list[Family]) -> dict[str, str]:
    """A distinct target name for each live single entry, a preset's table included (keyed
    `schema.table:column`), and each family (keyed `pattern:column`, `Family.key`): the
    preset's, else the table's, then qualified as needed. A preset's table in two schemas
    (procrastinate's jobs) is two targets, which a config may not give one name; so are two
    families of one pattern (its tables' two expiry-like columns), each named with its column
    (`carts_expires_at`, `carts_valid_until`) rather than one taking the table's name."""
    names: dict[str, str] = {}
    taken: set[str] = set()

    def pick(key: str, *choices: str) -> None:
        for choice in choices:
            if TARGET_NAME.fullmatch(choice) and choice not in taken:
                names[key] = choice
                taken.add(choice)
                return
        n = 2
        while f"{choices[-1]}_{n}" in taken:
            n += 1
        names[key] = f"{choices[-1]}_{n}"
        taken.add(names[key])

    shared = Counter(family.pattern for family in families)
    for family in families:
        base = family.first.preset.name if family.first.preset and family.first.preset.name else ""
        stem = family.pattern.split(".")[-1].replace("*", "").strip("_") or "tables"
        column = f"{stem}_{family.first.column}"
        alone = (stem,) if shared[family.pattern] == 1 else ()
        pick(family.key, *(c for c in (base, *alone, column) if c))
    for single in singles:
        if not (single.is_live or (single.caution and not single.problem)):
            continue  # a caution's entry is printed commented out: named, to be made live
        named = single.preset.name if single.preset and single.preset.name else ""
        pick(
            f"{single.qualified}:{single.column}",
            *((named, f"{named}_{single.schema}") if named else (single.table,)),
            f"{single.table}_{single.column}",
            f"{single.schema}_{single.table}_{single.column}",
        )
    return names
