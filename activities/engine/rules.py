"""Expiry rules, and the catalog check that binds a rule to a real table.

A rule turns the caller's `now_ms` into a WHERE clause with the instant as a parameter. No rule
reads the server's clock: rows written from the application's clock are measured by that clock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from psycopg import AsyncConnection, sql

from activities.engine import catalog
from activities.engine.archive import Archive, bind_archive
from activities.engine.column_memory import assume, remember
from activities.engine.errors import BadTable
from activities.engine.filter_binding import BoundFilter, bind_filter
from activities.engine.nearest import nearest_table
from purge_config.errors import did_you_mean
from purge_config.filters import RowFilter
from purge_config.names import TableName
from purge_config.settings import EpochUnit

#: Column types an epoch-millisecond rule accepts.
MS_TYPES = ("bigint", "integer")
#: Column types an `expiring` target accepts, beside epoch milliseconds.
INSTANT_TYPES = ("timestamp with time zone", "timestamp without time zone")
#: Column types the full-bucket rule accepts for its arithmetic.
NUMBER_TYPES = ("double precision", "real", "numeric", "bigint", "integer")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: How far past the pass's instant a partitioned table's ranges must reach for it to be warned
#: of nothing, however few partitions begin after the instant: a year (`RangeKey.horizon`).
AHEAD_HORIZON_MS = 366 * 24 * 3600 * 1000


#: Milliseconds per unit of an integer epoch column.
_UNIT_MS: dict[EpochUnit, float] = {"ms": 1.0, "s": 1000.0, "us": 0.001}


def _in_unit(cutoff_ms: int, unit: EpochUnit) -> int:
    """The cutoff in the column's unit, exactly: a row is expired when its instant is at or
    before `cutoff_ms` (`col * 1000 <= cutoff_ms` for seconds: round down)."""
    if unit == "s":
        return cutoff_ms // 1000
    if unit == "us":
        return cutoff_ms * 1000
    return cutoff_ms


def ident(table: TableName) -> sql.Identifier:
    """The quoted name for a statement: `"app"."sessions"`, never `"app.sessions"`."""
    return (
        sql.Identifier(table.schema, table.table) if table.schema else sql.Identifier(table.table)
    )


@dataclass(frozen=True)
class RangeKey:
    """What a partition's bounds are compared with, for a rule whose whole predicate is
    `column <= cutoff` (see `activities.engine.partitions`)."""

    column: str
    sql_type: str
    """`bigint`, `integer`, `timestamptz` or `timestamp`: the type bounds are cast to."""
    cutoff: object
    """The greatest value that is expired at this pass's instant, as a value of that type."""
    step: object
    """The type's least step (1, or one microsecond): a partition `FROM (a) TO (b)` holds
    values up to `b - step`, so it is wholly expired when `b - step <= cutoff`."""
    now: object
    """The pass's instant as a value of that type: partitions that begin after it are ahead."""
    horizon: object
    """A year after the instant, as a value of that type: a table whose ranges reach past it
    needs no new partition soon, however few begin after the instant."""


@dataclass(frozen=True)
class Predicate:
    """A rule bound to one table as it really is: the WHERE clause and its parameters."""

    table: TableName
    where: sql.Composable
    params: dict[str, object]
    column: str | None
    """The column an index on which serves the rule (`column <= cutoff`); None when no
    single-column index can (the full-bucket arithmetic)."""
    expired_at: sql.Composable = field(default_factory=lambda: sql.SQL("NULL::float8"))
    """The epoch-ms instant a row expired (or expires), computed from the row alone: how long
    the oldest expired row left behind has waited is `now_ms` minus its least value."""
    range_key: RangeKey | None = None
    """Set only when `where` is exactly `column <= cutoff`, so that a partition's bounds alone
    can say every row it may hold is expired. A rule with any other condition (the full-bucket
    arithmetic, a filter) leaves it None: its partitions are never dropped whole."""
    epoch_columns: tuple[tuple[str, EpochUnit], ...] = ()
    """(column, unit) of each integer epoch column the rule compares: checked for a wrong unit
    before anything is deleted (activities.engine.units)."""
    row_filter: BoundFilter | None = None
    """The target's row filter, already AND-ed into `where`; planning reads it to find an
    index that serves the filter too."""
    archive: Archive | None = None
    """Where each batch inserts the rows it deletes, in the same statement; None: deleted."""
    epoch_table: TableName | None = None
    """The table `epoch_columns` belong to when it is not `table` (a related table's)."""
    advice: str = ""
    """What the operator should know from binding alone (an index the rule's reads need)."""
    column_cutoff: object | None = None
    """The greatest expired value of `column` (a value of its type), when `where` is
    `column <= cutoff`, alone or AND-ed with a filter: every expired row's key is at most this,
    so a keyset sweep's key spans end there (`activities.engine.keyset.KeySpans`)."""


class Rule(Protocol):
    """How one table decides which of its rows are expired."""

    @property
    def table(self) -> TableName: ...

    @property
    def archive(self) -> TableName | None:
        """Where the table's deleted rows move to, or None."""
        ...

    async def bind(self, conn: AsyncConnection[Any], now_ms: int) -> Predicate:
        """Check the table against the catalog and build its WHERE clause for `now_ms`."""
        ...


#: Words of a column's name that say when a row was written or changed, not when it expires.
_WRITTEN_WORDS = frozenset(
    [
        "created",
        "creation",
        "inserted",
        "insertion",
        "updated",
        "modified",
        "written",
        "logged",
        "recorded",
        "occurred",
        "added",
        "sent",
        "received",
        "timestamp",
    ]
)
#: Words that say the column is an expiry after all (`created_expires_at` is one).
_EXPIRY_WORDS = frozenset(
    ["expires", "expiry", "expiration", "expire", "expired", "until", "deadline", "ttl"]
)


def written_column_advice(rule: Rule) -> str | None:
    """Advice for an age rule with no `max_age` whose column is named like a write time
    (`created_at`, `insertedAt`): with no age the column is read as the instant each row
    expires, so every row written before the pass goes, at the first sweep the whole table.
    Said by `check`, a dry run and every sweep; never refused (the name may mislead)."""
    if not isinstance(rule, ExpiryRule | NewestRelatedRule) or rule.max_age_ms:
        return None
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", rule.column).lower()
    words = set(re.split(r"[^a-z0-9]+", spaced))
    if not words & _WRITTEN_WORDS or words & _EXPIRY_WORDS:
        return None
    return (
        f"{rule.table}: `{rule.column}` reads as when a row was written, but with no `max_age` "
        "it is taken as when the row expires, so every row written before the pass goes; give "
        'the entry a `max_age` (`"30d"`), or leave it if the column holds the expiry'
    )


def table_names(rules: list[Rule]) -> list[str]:
    """The tables of a target's rules, in order, as its config names them: what a progress
    heartbeats, so a retry on a worker whose config lists them otherwise starts again."""
    return [str(rule.table) for rule in rules]


@dataclass(frozen=True)
class ExpiryRule:
    """Expired when `column + max_age <= now`: the column is an integer epoch (in `unit`:
    ms, s or us) or a timestamp."""

    table: TableName
    column: str
    max_age_ms: int = 0
    accepts: tuple[str, ...] = MS_TYPES
    unit: EpochUnit = "ms"
    row_filter: RowFilter | None = None
    """Only rows that also match this (`match`, `match_null`, `match_not_null`) expire."""
    archive: TableName | None = None
    """Rows move here rather than being only deleted."""

    async def bind(self, conn: AsyncConnection[Any], now_ms: int) -> Predicate:
        types = await column_types(conn, self.table)
        kind = _require(self.table, types, self.column, self.accepts)
        _check_unit_type(self.table, self.column, kind, self.unit)
        # Move the age onto the parameter, not the column, so an index on the column serves;
        # and convert the cutoff, never the column, to the column's unit for the same reason.
        cutoff = _cutoff(kind, self.unit, now_ms - self.max_age_ms)
        column = sql.Identifier(self.column)
        where: sql.Composable = sql.SQL("{} <= %(cutoff)s").format(column)
        expired_at = sql.SQL("{} + {}").format(
            _instant(kind, self.unit, column), sql.Literal(self.max_age_ms)
        )
        epoch = ((self.column, self.unit),) if kind in MS_TYPES else ()
        params: dict[str, object] = {"cutoff": cutoff}
        where, bound = await _filtered(conn, self.table, types, self.row_filter, where, params)
        # The instant in the column's unit too: partitions ahead of it are judged in that unit.
        # A filter or an archive means a partition's bounds cannot say all its rows may go
        # (or go without their copy): then no partition leaves whole.
        now, horizon = now_ms, now_ms + AHEAD_HORIZON_MS
        if kind in MS_TYPES:
            now, horizon = _in_unit(now, self.unit), _in_unit(horizon, self.unit)
        whole = self.row_filter is None and self.archive is None
        key = _range_key(self.column, kind, cutoff, now, horizon) if whole else None
        return Predicate(
            self.table,
            where,
            params,
            self.column,
            expired_at,
            key,
            epoch_columns=epoch,
            row_filter=bound,
            archive=await _archive(conn, self.table, self.archive),
            column_cutoff=cutoff,
            advice=zone_advice(conn, self.table, self.column, kind),
        )


@dataclass(frozen=True)
class NewestRelatedRule:
    """Expired when the newest of its related rows is at least `max_age` old: a job by its
    newest event, a conversation by its last message. The related rows are those of `related`
    whose one foreign key points at the row; `column` is theirs (an integer epoch in `unit`, or
    a timestamp). A row with no related row has no age and is kept. The key must be ON DELETE
    CASCADE: the related rows leave with their row, by the server, in the same statement."""

    table: TableName
    related: TableName
    column: str
    max_age_ms: int = 0
    unit: EpochUnit = "ms"
    row_filter: RowFilter | None = None
    """Only rows that also match this (`match`, `match_null`, `match_not_null`) expire."""

    @property
    def archive(self) -> TableName | None:
        """None: an archive would keep the row but not the related rows its delete cascades to."""
        return None

    async def bind(self, conn: AsyncConnection[Any], now_ms: int) -> Predicate:
        types = await column_types(conn, self.table)
        kind = _require(
            self.related,
            await column_types(conn, self.related),
            self.column,
            (*MS_TYPES, *INSTANT_TYPES),
        )
        _check_unit_type(self.related, self.column, kind, self.unit)
        key = await self._key(conn)
        newest = _newest_related(self.related, self.column, key, set(types))
        cutoff = _cutoff(kind, self.unit, now_ms - self.max_age_ms)
        # NULL (no related row, or none with a value) is never <= the cutoff: such rows stay.
        where: sql.Composable = sql.SQL("{} <= %(cutoff)s").format(newest)
        expired_at = sql.SQL("{} + {}").format(
            _instant(kind, self.unit, newest), sql.Literal(self.max_age_ms)
        )
        params: dict[str, object] = {"cutoff": cutoff}
        where, bound = await _filtered(conn, self.table, types, self.row_filter, where, params)
        # No index on the table serves the age (column None: the heap is walked), and no
        # partition's bounds can say its rows are expired (no range key).
        return Predicate(
            self.table,
            where,
            params,
            None,
            expired_at,
            epoch_columns=((self.column, self.unit),) if kind in MS_TYPES else (),
            row_filter=bound,
            epoch_table=self.related,
            advice=" ".join(
                filter(
                    None, (self._advice(key), zone_advice(conn, self.related, self.column, kind))
                )
            ),
        )

    async def _key(self, conn: AsyncConnection[Any]) -> RelatedKey:
        """The one foreign key from the related table to the table, ON DELETE CASCADE."""
        names = {
            "rel": ident(self.table).as_string(conn),
            "related": ident(self.related).as_string(conn),
        }
        cur = await conn.execute(catalog.related_keys(), names)
        rows = await cur.fetchall()
        pair = f"{self.related} -> {self.table}"
        if not rows:
            raise BadTable(
                f"age_from: no foreign key from {self.related} to {self.table}: the age of a row "
                f"of {self.table} is read from the rows of {self.related} that reference it"
            )
        if len(rows) > 1:
            named = ", ".join(str(row[0]) for row in rows)
            raise BadTable(
                f"age_from: {len(rows)} foreign keys {pair} ({named}): which rows are a row's "
                "related rows is ambiguous; keep one key"
            )
        name, action, columns, referenced, readable, indexed = rows[0]
        if not readable:
            raise BadTable(f"age_from: this role may not read {self.related} (grant SELECT)")
        if action != "c":
            raise BadTable(
                f"age_from: foreign key {name} ({pair}) is not ON DELETE CASCADE: deleting a row "
                f"of {self.table} would fail, or orphan its rows in {self.related}, while they "
                "remain; make the key ON DELETE CASCADE"
            )
        return RelatedKey(str(name), tuple(columns), tuple(referenced), bool(indexed))

    def _advice(self, key: RelatedKey) -> str:
        """The index the related table needs, when none leads with the key's columns: without
        it each row's age reads the whole related table, and so does each cascaded delete."""
        if key.indexed:
            return ""
        create = sql.SQL("CREATE INDEX CONCURRENTLY ON {} ({})").format(
            ident(self.related),
            sql.SQL(", ").join(sql.Identifier(c) for c in (*key.columns, self.column)),
        )
        return (
            f"{self.table}: no index of {self.related} leads with {', '.join(key.columns)} (the "
            f"foreign key {key.name}), so reading each row's newest {self.column}, and each "
            f"cascaded delete, reads all of {self.related}; create one: {create.as_string()}"
        )


@dataclass(frozen=True)
class RelatedKey:
    """The foreign key through which a row's related rows are found."""

    name: str
    columns: tuple[str, ...]
    """The related table's columns, in the key's order."""
    referenced: tuple[str, ...]
    """The table's columns they reference, in the same order."""
    indexed: bool
    """Whether a valid, whole index of the related table leads with `columns`."""


def _newest_related(
    related: TableName, column: str, key: RelatedKey, outer: set[str]
) -> sql.Composed:
    """`(SELECT max(column) of the row's related rows)`, correlated by unqualified names: the
    same SQL then serves the table and each of its partitions (swept by their own names). The
    related rows are read through a derived table whose only columns are named here, apart
    from every column of the table, so no name can be captured inside the subquery."""
    names = ["newest", *(f"key_{i}" for i in range(len(key.columns)))]
    while outer & set(names):
        names = [f"_{n}" for n in names]
    value, *keys = names
    inner = sql.SQL(", ").join(
        sql.SQL("{} AS {}").format(sql.Identifier(c), sql.Identifier(n))
        for c, n in zip((column, *key.columns), names, strict=True)
    )
    joined = sql.SQL(" AND ").join(
        sql.SQL("r.{} = {}").format(sql.Identifier(k), sql.Identifier(c))
        for k, c in zip(keys, key.referenced, strict=True)
    )
    return sql.SQL("(SELECT max(r.{}) FROM (SELECT {} FROM {}) r WHERE {})").format(
        sql.Identifier(value), inner, ident(related), joined
    )


@dataclass(frozen=True)
class FullBucketRule:
    """A token bucket is expired only once it is full again at `now`.

    Deleting a bucket that still lacks tokens would hand its client a free limit reset.
    """

    table: TableName
    archive: TableName | None = None
    """Buckets move here rather than being only deleted."""

    async def bind(self, conn: AsyncConnection[Any], now_ms: int) -> Predicate:
        types = await column_types(conn, self.table)
        bucket = ("tokens", "capacity", "refill_per_ms", "last_ms")
        missing = [column for column in bucket if column not in types]
        if len(missing) > 1:
            # Most likely not a bucket table at all: every column it lacks, in one line.
            raise BadTable(
                f"table {self.table} has no columns {', '.join(map(repr, missing))}: a token "
                f"bucket's are {', '.join(bucket)} (activities/schema.sql's x_rate_limit)"
            )
        for column in bucket[:3]:
            _require(self.table, types, column, NUMBER_TYPES)
        _require(self.table, types, "last_ms", MS_TYPES)
        # float8, the same IEEE arithmetic a client does; the subtraction is in float8 so a wild
        # last_ms cannot overflow bigint (|elapsed| stays under 1e19). PostgreSQL raises on a
        # float8 overflow where IEEE gives infinity, so one absurd bucket (refill 1e300) would
        # fail every pass of the table: buckets that could overflow are judged in numeric,
        # exact and unbounded, instead. Every other bucket computes bit for bit as a client does.
        # A bucket holding NaN or an infinity is kept: numeric ranks NaN above every number, so
        # the exact branch would call it full (IEEE never does), and what an infinite refill
        # means is the client's to say; deleting it on a guess would reset its limit.
        where = sql.SQL(
            # As text: a numeric past float8's range would fail a cast to float8 here.
            "CASE WHEN 'NaN' IN (tokens::text, capacity::text, refill_per_ms::text)"
            " OR tokens::text IN ('Infinity', '-Infinity')"
            " OR capacity::text IN ('Infinity', '-Infinity')"
            " OR refill_per_ms::text IN ('Infinity', '-Infinity') THEN false"
            " WHEN abs(refill_per_ms::float8) <= 1e280 AND abs(tokens::float8) <= 1e300"
            " AND abs(capacity::float8) <= 1e300"
            " THEN tokens::float8 + (%(now_ms)s::float8 - last_ms::float8) * refill_per_ms::float8"
            " >= capacity::float8"
            " ELSE tokens::numeric + (%(now_ms)s::numeric - last_ms::numeric)"
            " * refill_per_ms::numeric >= capacity::numeric END"
        )
        # Full again at last_ms + the missing tokens' refill time; at last_ms where it was
        # full then (a refill of 0 would divide by zero: the read of what a sweep left failed).
        expired_at = sql.SQL(
            "CASE WHEN tokens::float8 >= capacity::float8 THEN last_ms::float8"
            " ELSE last_ms::float8 + (capacity::float8 - tokens::float8)"
            " / nullif(refill_per_ms::float8, 0) END"
        )
        return Predicate(
            self.table,
            where,
            {"now_ms": now_ms},
            None,
            expired_at,
            epoch_columns=(("last_ms", "ms"),),
            archive=await _archive(conn, self.table, self.archive),
        )


def _check_unit_type(table: TableName, column: str, kind: str, unit: EpochUnit) -> None:
    """BadTable when `unit` is set on a column that is no integer epoch."""
    if unit != "ms" and kind not in MS_TYPES:
        raise BadTable(
            f"column {table}.{column} is {kind}: unit = {unit!r} is for integer epoch "
            "columns; remove it"
        )


def _cutoff(kind: str, unit: EpochUnit, cutoff_ms: int) -> object:
    """The greatest expired value as a value of the column's type (`kind`)."""
    if kind in MS_TYPES:
        return _in_unit(cutoff_ms, unit)
    if kind == "timestamp with time zone":
        return _EPOCH + timedelta(milliseconds=cutoff_ms)
    # A `timestamp` column is read as UTC: compare it with a naive UTC instant so the
    # session's TimeZone never enters the comparison.
    return (_EPOCH + timedelta(milliseconds=cutoff_ms)).replace(tzinfo=None)


#: Two instants of a year, winter and summer: a zone is UTC's only where both are 0 ahead.
_SEASONS = (datetime(2026, 1, 15, tzinfo=UTC), datetime(2026, 7, 15, tzinfo=UTC))


def zone_advice(conn: AsyncConnection[Any], table: TableName, column: str, kind: str) -> str:
    """Advice for a `timestamp without time zone` column read over a connection whose
    TimeZone is not UTC: the sweep reads its values as UTC, but values the database fills
    (`DEFAULT now()`) or an application writes as local times (Django's `USE_TZ = False`) are
    then hours off, and west of UTC live rows go early. From the TimeZone the server reported
    at connect: no round trip."""
    if kind != "timestamp without time zone":
        return ""
    zone = conn.info.timezone
    offsets = {at.astimezone(zone).utcoffset() for at in _SEASONS}
    if offsets == {timedelta(0)}:
        return ""
    hours = max(abs(o or timedelta(0)) for o in offsets) / timedelta(hours=1)
    name = conn.info.parameter_status("TimeZone") or str(zone)
    return (
        f"{table}: `{column}` is timestamp without time zone, read as UTC, but this "
        f"connection's TimeZone is {name}: if its values are local times (DEFAULT now(), "
        f"Django with USE_TZ = False) they are read up to {hours:g} h off, and west of UTC "
        f"live rows go early; lengthen `max_age` by {hours:g}h, or, if they are UTC, connect "
        "with TimeZone UTC (options=-c TimeZone=UTC in the URL) to say so"
    )


def _instant(kind: str, unit: EpochUnit, value: sql.Composable) -> sql.Composable:
    """A value of the column's type in epoch ms: extract() of the value, never of the server's
    clock; a `timestamp`'s epoch is read as UTC, as the cutoff reads it."""
    if kind in MS_TYPES:
        return sql.SQL("{}::float8 * {}").format(value, sql.Literal(_UNIT_MS[unit]))
    return sql.SQL("extract(epoch FROM {})::float8 * 1000").format(value)


async def _filtered(
    conn: AsyncConnection[Any],
    table: TableName,
    types: dict[str, str],
    row_filter: RowFilter | None,
    where: sql.Composable,
    params: dict[str, object],
) -> tuple[sql.Composable, BoundFilter | None]:
    """`where` narrowed by the rule's row filter, bound to the table (its values added to
    `params`); unchanged, with no bound filter, when the rule has none."""
    if row_filter is None:
        return where, None
    bound = await bind_filter(conn, table, ident(table), types, row_filter, where)
    params.update(bound.params)
    return sql.SQL("{} AND {}").format(where, bound.where), bound


def _range_key(column: str, kind: str, cutoff: object, now_ms: int, horizon_ms: int) -> RangeKey:
    if isinstance(cutoff, datetime):
        now = _EPOCH + timedelta(milliseconds=now_ms)
        horizon = _EPOCH + timedelta(milliseconds=horizon_ms)
        if cutoff.tzinfo is None:
            now, horizon = now.replace(tzinfo=None), horizon.replace(tzinfo=None)
        sql_type = "timestamptz" if kind == "timestamp with time zone" else "timestamp"
        return RangeKey(column, sql_type, cutoff, timedelta(microseconds=1), now, horizon)
    return RangeKey(column, kind, cutoff, 1, now_ms, horizon_ms)


async def _archive(
    conn: AsyncConnection[Any], table: TableName, archive: TableName | None
) -> Archive | None:
    """The rule's archive checked against its table, or None when it has none."""
    if archive is None:
        return None
    return await bind_archive(conn, table, ident(table), archive, ident(archive))


async def column_types(conn: AsyncConnection[Any], table: TableName) -> dict[str, str]:
    """Column name to SQL type (domains resolved to their base type); BadTable if no table.
    Inside `column_memory.assumed_types()`, what this worker read last time, where it has read
    them before: the read is then checked later in the round trip (`TypesAhead.check`)."""
    qualified = ident(table).as_string(conn)
    # Prepared: read for every table of every pass, the same text each time.
    cur = await conn.execute(catalog.column_types(), (qualified,), prepare=True)
    columns = assume(conn, qualified, cur)
    if columns is None:
        rows = await cur.fetchall()
        if not rows:
            hint = await nearest_table(conn, table)
            raise BadTable(f"table {table} does not exist (looked for {qualified}){hint}")
        if rows[0][2] not in ("r", "p"):
            raise BadTable(f"{table} is not a table (relkind {rows[0][2]!r})")
        columns = remember(conn, qualified, rows)
    return {name: kind for name, kind, _ in columns}


def _require(table: TableName, types: dict[str, str], column: str, accepts: tuple[str, ...]) -> str:
    kind = types.get(column)
    if kind is None:
        raise BadTable(f"table {table} has no column {column!r}{did_you_mean(column, types)}")
    if kind not in accepts:
        raise BadTable(
            f"column {table}.{column} is {kind}, this target takes {' or '.join(accepts)}"
        )
    return kind
