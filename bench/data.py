"""The benchmark's tables: each dataset built once into a template, then copied for every form.

Every copy is made the same way (reference DDL, one INSERT ... SELECT in the template's physical
order, VACUUM ANALYZE, prewarm, CHECKPOINT), so the forms differ in nothing but the form.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from psycopg import AsyncConnection, sql
from psycopg_pool import AsyncConnectionPool

from activities import builtin_kinds as kinds
from activities.engine.batch_sql import flush_statistics, flushes_statistics
from activities.engine.sql_target import SqlTarget
from purge_config.names import TableName

Kind = Literal["idempotency", "rate_limit"]
Layout = Literal["interleaved", "ordered"]

#: Idempotency rows live or expired by up to an hour around now_ms, spread by a cheap hash of i.
_SPREAD_MS = 3_600_000
#: In expiry order, consecutive rows expire this far apart.
_ORDERED_STEP_MS = 10


def flush_counts(conn: Any) -> sql.SQL:
    """Sent before a VACUUM or ANALYZE on a session (sync or async) that has just written the
    table: the counts of those writes reach the statistics views first. A session flushes them
    at most once a second; flushed after the VACUUM set the table's live rows, they would be
    counted twice (the advice, and which reads a sweep makes, follow the views' figures). Before
    PostgreSQL 15 the server cannot be asked: an empty SELECT."""
    return flush_statistics() if flushes_statistics(conn) else sql.SQL("SELECT")


#: A day in milliseconds: a partition's width, and how long after the bench's instant live rows
#: expire where a pass through Temporal is timed beside forms that judge by that instant
#: (`Dataset.live_after_ms`).
DAY_MS = 86_400_000


@dataclass(frozen=True)
class Dataset:
    """A table of `rows` rows of which `expired` are expired at now_ms, laid out by `layout`.

    interleaved: row i is expired when i % stride == 0 (and fewer than `expired` so far), so
    expired and live rows share every heap page. ordered: rows are inserted in expiry order and the
    expired ones are the first `expired`, so they sit together at the front of the heap, as a
    table written with one fixed TTL ends up.
    """

    kind: Kind
    rows: int
    expired: int
    layout: Layout
    live_after_ms: int = 1
    """Interleaved idempotency rows that live expire this long after now_ms or later. A pass
    through Temporal judges by the workflow's clock, minutes after now_ms: a day's gap
    (`DAY_MS`) keeps its expired rows exactly those the other forms delete."""

    @property
    def stride(self) -> int:
        return max(1, self.rows // max(1, self.expired)) if self.layout == "interleaved" else 1

    @property
    def prefix(self) -> str:
        return "k" if self.kind == "idempotency" else "b"

    @property
    def reference_table(self) -> str:
        """The reference DDL's table this dataset's copies are shaped like (columns, indexes)."""
        return "x_idempotency" if self.kind == "idempotency" else "x_rate_limit"

    @property
    def label(self) -> str:
        share = 100 * self.expired / self.rows if self.rows else 0.0
        return f"{self.rows:,} rows, {self.expired:,} expired ({share:.3g}%, {self.layout})"

    def key(self, i: int) -> str:
        return f"{self.prefix}{i}"

    def expired_index(self, j: int) -> int:
        """The row number of the j-th expired row (0 <= j < expired)."""
        return j * self.stride

    def predicate(self) -> sql.Composable:
        """The expiry rule of the package's built-in kind, the instant as parameter `now_ms`.

        Written out here rather than taken from activities.engine.rules so the bench's own forms
        do not move when the package's internals do; the text matches the package's rule.
        """
        if self.kind == "idempotency":
            return sql.SQL("expires_at_ms <= %(now_ms)s")
        return sql.SQL(
            "tokens::float8 + (%(now_ms)s::float8 - last_ms::float8) * refill_per_ms::float8"
            " >= capacity::float8"
        )

    def target(self, pool: AsyncConnectionPool[Any], name: str, table: TableName) -> SqlTarget:
        """The package's built-in target for this kind, pointed at `table`."""
        if self.kind == "idempotency":
            return kinds.idempotency(pool, name=name, table=table)
        return kinds.rate_limit(pool, name=name, table=table)

    def _is_expired(self) -> sql.Composable:
        if self.layout == "ordered":
            return sql.SQL("i < {}").format(sql.Literal(self.expired))
        return sql.SQL("mod(i, {stride}) = 0 AND i / {stride} < {expired}").format(
            stride=sql.Literal(self.stride), expired=sql.Literal(self.expired)
        )

    def generate(self, table: sql.Composable) -> sql.Composed:
        """One INSERT ... SELECT over generate_series: seconds for millions of rows.

        `i` is bigint: `i * 7919` passes int4 at 271,000 rows.
        """
        if self.kind == "idempotency":
            if self.layout == "ordered":
                # Monotonic in i: the heap is in expiry order, so is the expiry index. The live
                # rows start `live_after_ms` out (the first at least `_ORDERED_STEP_MS`).
                expires = sql.SQL(
                    "%(now_ms)s + (i - {last}) * {step}"
                    " + CASE WHEN i > {last} THEN {live_after} - 1 ELSE 0 END"
                ).format(
                    last=sql.Literal(self.expired - 1),
                    step=sql.Literal(_ORDERED_STEP_MS),
                    live_after=sql.Literal(self.live_after_ms),
                )
            else:
                expires = sql.SQL(
                    "CASE WHEN {expired} THEN %(now_ms)s - 1 - mod(i * 7919, {spread})"
                    " ELSE %(now_ms)s + {live_after} + mod(i * 7919, {spread}) END"
                ).format(
                    expired=self._is_expired(),
                    spread=sql.Literal(_SPREAD_MS),
                    live_after=sql.Literal(self.live_after_ms),
                )
            # A small stored response, about the size real idempotency rows carry.
            values = sql.SQL(
                "{prefix} || i, jsonb_build_object('status', 200, 'body', md5(i::text)), {expires}"
            ).format(prefix=sql.Literal(self.prefix), expires=expires)
            columns = sql.SQL("key, response, expires_at_ms")
        else:
            # Capacity 10, one token a second. A full bucket was last hit 10+ minutes ago with 3
            # tokens left; a bucket that is not full was hit within the last second and is empty.
            values = sql.SQL(
                "{prefix} || i,"
                " CASE WHEN {expired} THEN 3 ELSE 0.5 END, 10, 0.001,"
                " CASE WHEN {expired} THEN %(now_ms)s - 600000 - mod(i * 7919, 3600000)"
                " ELSE %(now_ms)s - mod(i, 1000) END"
            ).format(prefix=sql.Literal(self.prefix), expired=self._is_expired())
            columns = sql.SQL("key, tokens, capacity, refill_per_ms, last_ms")
        return sql.SQL(
            "INSERT INTO {table} ({columns}) SELECT {values}"
            " FROM generate_series(0::bigint, {last}) AS {i}"
        ).format(
            table=table,
            columns=columns,
            values=values,
            last=sql.Literal(self.rows - 1),
            i=sql.Identifier("i"),
        )


async def build_template(
    conn: AsyncConnection[Any], schema: str, name: str, data: Dataset, now_ms: int
) -> None:
    """The dataset once, UNLOGGED and unindexed: it is only ever read, to make copies."""
    table = sql.Identifier(schema, name)
    await conn.execute(
        sql.SQL(
            "CREATE UNLOGGED TABLE {} (LIKE {} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
            " WITH (autovacuum_enabled = false)"
        ).format(table, sql.Identifier(schema, data.reference_table))
    )
    await conn.execute(data.generate(table), {"now_ms": now_ms})
    # The count is checked, not trusted: a wrong generator would make every figure meaningless.
    cur = await conn.execute(
        sql.SQL("SELECT count(*) FILTER (WHERE {}), count(*) FROM {}").format(
            data.predicate(), table
        ),
        {"now_ms": now_ms},
    )
    row = await cur.fetchone()
    assert row is not None
    if (row[0], row[1]) != (data.expired, data.rows):
        raise RuntimeError(
            f"template {name} holds {row[1]} rows, {row[0]} expired; "
            f"want {data.rows}, {data.expired}"
        )


async def make_copy(
    conn: AsyncConnection[Any],
    schema: str,
    template: str,
    name: str,
    data: Dataset,
    *,
    prewarm: bool,
) -> None:
    """A logged copy of the template with the reference DDL's keys and indexes, vacuumed."""
    table = sql.Identifier(schema, name)
    # LIKE the reference table, INCLUDING ALL: the same primary key and indexes as
    # activities/schema.sql, whatever that file says when the bench runs. Autovacuum off so
    # it cannot start on this table in the middle of a measurement.
    await conn.execute(
        sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING ALL) WITH (autovacuum_enabled = false)").format(
            table, sql.Identifier(schema, data.reference_table)
        )
    )
    # No parallel scan and no synchronized scan: the copy keeps the template's physical order.
    await conn.execute("SET synchronize_seqscans = off")
    await conn.execute(
        sql.SQL("INSERT INTO {} SELECT * FROM {}").format(table, sql.Identifier(schema, template))
    )
    await conn.execute("RESET synchronize_seqscans")
    # Hint bits and the visibility map set now, not by the first form to read the table.
    await conn.execute(flush_counts(conn))
    await conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(table))
    if prewarm:
        # Bulk writes and vacuum go through small ring buffers, so most of a fresh copy is only
        # in the OS cache; load heap and indexes into shared_buffers so every form starts hot.
        await conn.execute(
            sql.SQL(
                "SELECT pg_prewarm(c.oid) FROM pg_class c WHERE c.oid = {rel}::regclass"
                " OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = {rel}::regclass)"
            ).format(rel=sql.Literal(f'"{schema}"."{name}"'))
        )


async def drop_table(conn: AsyncConnection[Any], schema: str, name: str) -> None:
    await conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(schema, name)))


async def count_expired(
    conn: AsyncConnection[Any], schema: str, name: str, data: Dataset, now_ms: int
) -> int:
    cur = await conn.execute(
        sql.SQL("SELECT count(*) FROM {} WHERE {}").format(
            sql.Identifier(schema, name), data.predicate()
        ),
        {"now_ms": now_ms},
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def count_missing(conn: AsyncConnection[Any], schema: str, name: str, keys: list[str]) -> int:
    """How many of `keys` have no row: a renewed key that is gone was deleted after renewal."""
    cur = await conn.execute(
        sql.SQL(
            "SELECT count(*) FROM unnest(%s::text[]) AS r(key)"
            " WHERE NOT EXISTS (SELECT 1 FROM {} t WHERE t.key = r.key)"
        ).format(sql.Identifier(schema, name)),
        (sorted(set(keys)),),
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def make_cold(
    conn: AsyncConnection[Any], schema: str, name: str, data_dir: Path | None
) -> bool:
    """Drop a table and its indexes from shared_buffers (pg_buffercache_evict_relation,
    PostgreSQL 18) and, on the embedded server, from the OS page cache too (posix_fadvise
    DONTNEED on their files, which the checkpoint before has written): its next reads come
    from the disk. Only this table's files are dropped, so nothing else on a shared machine is
    touched. Returns whether the OS cache was dropped too."""
    rel = sql.Literal(f'"{schema}"."{name}"')
    cur = await conn.execute(
        sql.SQL(
            "SELECT c.oid::regclass::text, pg_relation_filepath(c.oid) FROM pg_class c"
            " WHERE c.oid = {rel}::regclass"
            " OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = {rel}::regclass)"
        ).format(rel=rel)
    )
    relations = await cur.fetchall()
    for relation, _ in relations:
        await conn.execute("SELECT pg_buffercache_evict_relation(%s::regclass)", (str(relation),))
    if data_dir is None or not hasattr(os, "posix_fadvise"):
        return False
    for _, filepath in relations:
        base = data_dir / str(filepath)
        # Every segment (16384, 16384.1, ...) and fork (16384_fsm, 16384_vm) of the relation,
        # and not 163841.
        for path in base.parent.glob(base.name + "*"):
            if path.name != base.name and path.name[len(base.name)] not in "._":
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return True
