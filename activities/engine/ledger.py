"""The pass's ledger, `purge_progress`: one row per pass (the workflow's run) and target, holding
the rows every attempt of the pass removed, so that a retried attempt's count is exact whatever
an earlier attempt's worker did before it died. Every statement that reads or writes the table
is here, and everything else reaches it through `Ledger`:

- `Ledger.open`: old passes' rows expired, the pass's count so far read;
- each batch's count added in the batch's own transaction (`BatchTally`): by the batch's own
  statement (`BatchTally.closing`), or after a plain DELETE by an upsert, its count taken on the
  server (`ledger_add_deleted`) or from the DELETE's tag (`ledger_add`);
- lazy commits, and the durable points before which nothing of theirs is reported
  (`LazyCommits`);
- partition marks: a partition this pass is taking out whole, and its rows once counted
  (`Ledger.mark`, `Ledger.marks`, `count_partition`, `add_partitions`).

Lazy commits. A batch whose ledger row is in its own transaction may commit without waiting for
its WAL (`lazy_commit`): a crash of the server that loses that commit loses the batch's deletes
and its count together, so the ledger's count stays exact. Each batch's commit otherwise waited
for its WAL to reach disk, where one DELETE of the same rows waits once (why:
docs/decisions/lazy-commits.md).

What a sweep reports must not be undone by a crash: a lazy batch's heartbeat (its rows into the
worker's `purge_rows_removed` counter, its place for a retry) waits for a durable point, a
commit that waits for the WAL up to it and so for every lazy commit before it. A batch commits
as the session does when the last durable point is DURABLE_EVERY_S old (so heartbeats stay about
half a second apart) or when it is known to be the table's last; the sweep's end, or its
cancellation, is a durable point of its own (`durable_point`) when its last batch was lazy.

A retry resumes from what was reported, so from durable work only: index and keyset batches
start again from the index, and a walk at the page its last heartbeat named, which is a durable
batch's (the walk keeps its own place meanwhile). Pages walked after it are walked again; what
a crash undid there is still expired, and is deleted then. Both count from the ledger.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import psycopg
from psycopg import AsyncConnection, AsyncCursor, sql

from activities.engine.batch_sql import local_timeouts, pipeline_flush
from activities.engine.partition_advice import WINDOW_MS as SHARES_WINDOW_MS
from activities.engine.partition_advice import shares_expire
from activities.engine.pipelines import settled_pipeline
from activities.engine.rules import ident
from activities.engine.sessions import session_key
from activities.progress import LedgerKey
from purge_config.names import TableName
from purge_config.settings import SweepSettings

#: Ledger rows are kept this long after their pass (by the pass's clock): far longer than any
#: pass runs, so a resumed attempt always finds its own.
LEDGER_KEEP_MS = 7 * 86_400_000
#: How long opening the ledger may take: a report's bookkeeping, never worth holding up a pass.
OPEN_TIMEOUT_MS = 2_000
#: How long after a durable point a batch may still commit lazily: the batches a server crash
#: can undo, and the wait of heartbeats (which report only durable batches), are this much
#: plus the batch begun just before it ended, and any pacing pause or backlog count between.
DURABLE_EVERY_S = 0.5
#: What DURABLE_EVERY_S is measured by, read once a batch and once a durable point: a module
#: name, so that a test can count batches instead of seconds (tests/support/pace.py).
clock = time.monotonic

#: No more columns after a batch's closing select (`BatchTally.closing`).
NOTHING = sql.SQL("")

#: (host, port, database, the tables' OIDs, pass instant) whose ledger this worker has cleared
#: of old passes.
_EXPIRED: set[tuple[object, ...]] = set()
#: How a statement on the ledger's tables fails when they were dropped or put out of this role's
#: reach since the worker last looked: an open sent as before (`OpenAhead`) then goes again
#: step by step.
LEDGER_GONE = (psycopg.errors.UndefinedTable, psycopg.errors.InsufficientPrivilege)
#: What `ledger_writable` last returned through each connection setting (`session_key`): what
#: `open` assumes the next time, to send its reads with the check in one round trip.
_WRITABLE: dict[tuple[object, ...], tuple[object, ...] | None] = {}


@dataclass(frozen=True)
class Opened:
    """What a sweep found of its optional tables when it opened its pass's ledger."""

    counted: int | None
    """The pass's count so far (0 for a first attempt); None when `purge_progress` is missing
    or this role may not use it."""
    shares: bool
    """Whether `purge_shares` is there for this role to record the pass in."""


class Ledger:
    """One pass's row for one target in `purge_progress`, and the target's partition marks."""

    def __init__(self, key: LedgerKey) -> None:
        self.key = key
        self.params: dict[str, object] = {
            "ledger_workflow": key.workflow_id,
            "ledger_run": key.run_id,
            "ledger_target": key.target,
            "ledger_now": key.now_ms,
        }
        """The parameters every ledger statement names the pass and the target by."""

    async def open(self, conn: AsyncConnection[Any], settings: SweepSettings) -> Opened:
        """The pass's count so far, after removing ledger rows (and `purge_shares` rows) of old
        passes, and whether the shares may be recorded.

        One round trip where this worker has opened a ledger through the same connection
        settings before (every pass but a worker's first): what the tables were then is
        assumed, their reads and deletes sent with the read that checks it (`OpenAhead`).
        Otherwise, and when the tables changed since, the check first and the rest after it."""
        ahead = self.ahead(conn, settings)
        if ahead is not None:
            try:
                async with settled_pipeline(conn):
                    await ahead.send(conn)
                opened = await ahead.opened()
            except LEDGER_GONE:
                # Dropped or revoked since: its expiry and read failed with the transaction.
                ahead.forget()
                opened = None
            if opened is not None:
                return opened
        cur = await conn.execute(ledger_writable(), prepare=True)
        row = await cur.fetchone()
        _WRITABLE[session_key(conn)] = tuple(row) if row else None
        return await self._open_found(conn, settings, row)

    def ahead(self, conn: AsyncConnection[Any], settings: SweepSettings) -> OpenAhead | None:
        """The open as this worker last found the ledger through `conn`'s settings, to send
        in a round trip (`OpenAhead`); None when it has not opened one through them, or found
        neither table usable then (`open` then checks first)."""
        where = session_key(conn)
        before = _WRITABLE.get(where)
        if before is None or not any(usable(before)):
            return None
        return OpenAhead(self, settings, before, where)

    async def _open_found(
        self, conn: AsyncConnection[Any], settings: SweepSettings, row: Any
    ) -> Opened:
        """`open` once `ledger_writable` has said what there is (`row`)."""
        ledger, shares = usable(row)
        if not ledger and not shares:
            return Opened(None, False)
        # One round trip: pipelined up to one Sync, these are one implicit transaction.
        async with settled_pipeline(conn):
            expiry = await self._expire(conn, settings, row)
            cur = await conn.execute(
                ledger_entry() if ledger else pipeline_flush(), self.params, prepare=True
            )
        _expired(expiry)
        return _opened(ledger, shares, await cur.fetchone())

    async def expire_old(
        self, conn: AsyncConnection[Any], settings: SweepSettings, writable: Any
    ) -> None:
        """What `open` does but read the count: old passes' rows removed (once per pass and
        database on this worker), given what `ledger_writable` returned (`writable`)."""
        if not any(usable(writable)) or _expiry_key(conn, writable, self.key) in _EXPIRED:
            return
        async with settled_pipeline(conn):
            expiry = await self._expire(conn, settings, writable)
        _expired(expiry)

    async def _expire(
        self, conn: AsyncConnection[Any], settings: SweepSettings, writable: Any
    ) -> tuple[object, ...]:
        """In a pipeline: the timeouts of opening the ledger and, unless done already in this
        pass, the deletes of old passes' rows; the key to note as done once they ran."""
        ledger, shares = usable(writable)
        params = {**self.params, "keep_ms": LEDGER_KEEP_MS, "window_ms": SHARES_WINDOW_MS}
        # Old passes' rows go once per pass and database on this worker, not before every
        # target: the delete reads the whole ledger, up to 7 days of passes (why:
        # docs/decisions/catalog-reads-by-oid.md).
        expiry = _expiry_key(conn, writable, self.key)
        await conn.execute(
            local_timeouts(), (settings.lock_timeout_ms, OPEN_TIMEOUT_MS), prepare=True
        )
        if expiry not in _EXPIRED:
            if ledger:
                await conn.execute(ledger_expire(), params)
            if shares:
                await conn.execute(shares_expire(), params)
        return expiry

    @staticmethod
    def counted() -> sql.SQL:
        """An expression: the pass's count so far for the target as the statement's snapshot
        sees it (NULL before its first row), for a statement that reads it beside its batch."""
        return sql.SQL(
            "(SELECT removed FROM purge_progress WHERE workflow_id = %(ledger_workflow)s"
            " AND run_id = %(ledger_run)s AND target = %(ledger_target)s)"
        )

    async def durable_point(self, conn: AsyncConnection[Any]) -> None:
        """Make every lazy commit of this server before now durable (see `durable_point`),
        under OPEN_TIMEOUT_MS's lock and statement timeouts (one implicit transaction up to one
        Sync): the ledger's row locked by another session (an older attempt's, an operator's
        DDL) fails the write in seconds rather than holding the sweep, and its table's lock,
        until the activity's start-to-close."""
        async with settled_pipeline(conn):
            await conn.execute(local_timeouts(), (OPEN_TIMEOUT_MS, OPEN_TIMEOUT_MS), prepare=True)
            await conn.execute(durable_point(), self.params)

    async def mark(self, conn: AsyncConnection[Any], keys: list[str]) -> None:
        """Mark every partition of `keys` as being taken out by this pass, in one commit, under
        OPEN_TIMEOUT_MS's lock and statement timeouts (pipelined: the BEGIN, the timeouts,
        every mark and the COMMIT, which psycopg syncs after the BEGIN, the body and the
        COMMIT)."""
        async with settled_pipeline(conn), conn.transaction():
            await conn.execute(local_timeouts(), (OPEN_TIMEOUT_MS, OPEN_TIMEOUT_MS), prepare=True)
            for key in keys:
                await conn.execute(partition_mark(), {**self.params, "mark": key})

    async def unmark(self, conn: AsyncConnection[Any], key: str) -> None:
        """Remove one partition's mark, under the same timeouts as `mark` (one implicit
        transaction up to one Sync)."""
        async with settled_pipeline(conn):
            await conn.execute(local_timeouts(), (OPEN_TIMEOUT_MS, OPEN_TIMEOUT_MS), prepare=True)
            await conn.execute(partition_unmark(), {**self.params, "mark": key})

    async def marks(self, conn: AsyncConnection[Any]) -> list[tuple[str, int, int]]:
        """This pass's partition marks for the target: (key, rows, 1 done or 0 under way)."""
        cur = await conn.execute(partition_marks(), self.params)
        return [(str(k), int(r), int(b)) for k, r, b in await cur.fetchall()]

    async def marked_done(self, conn: AsyncConnection[Any]) -> tuple[list[str], int]:
        """The partitions this pass took out of the target's tables, by every attempt, and
        their rows: from the marks."""
        names, rows = [], 0
        for key, removed, finished in await self.marks(conn):
            if finished:
                names.append(marked(key)[1])
                rows += removed
        return names, rows


class OpenAhead:
    """A ledger's open sent as this worker last found the tables (`before`, what
    `ledger_writable` returned): the check, then what `_open_found` would send, in a pipeline
    (`send`), up to whatever Sync comes next: `Ledger.open`'s own, or that of the statements
    after it in the round trip (`TableAccess.prepare`'s). Their transaction is one: a failure
    of either rolls back both. After the Sync, `opened`."""

    def __init__(
        self,
        ledger: Ledger,
        settings: SweepSettings,
        before: tuple[object, ...],
        where: tuple[object, ...],
    ) -> None:
        self.ledger, self.settings, self.before, self.where = ledger, settings, before, where
        self._sent: tuple[AsyncCursor[Any], tuple[object, ...], AsyncCursor[Any]] | None = None

    async def send(self, conn: AsyncConnection[Any]) -> None:
        """In a pipeline: the check, the old passes' rows removed, the pass's count read."""
        checked = await conn.execute(ledger_writable(), prepare=True)
        expiry = await self.ledger._expire(conn, self.settings, self.before)
        ledger, _ = usable(self.before)
        entry = await conn.execute(
            ledger_entry() if ledger else pipeline_flush(), self.ledger.params, prepare=True
        )
        self._sent = (checked, expiry, entry)

    async def opened(self) -> Opened | None:
        """After the Sync: what the open found; None when the check says the tables are not
        what they were (nothing of it is used, and the memory is dropped: open step by
        step)."""
        assert self._sent is not None, "OpenAhead.opened before send"
        checked, expiry, entry = self._sent
        row = await checked.fetchone()
        if row is None or tuple(row) != self.before:
            self.forget()
            return None
        ledger, shares = usable(self.before)
        _expired(expiry)
        return _opened(ledger, shares, await entry.fetchone() if ledger else None)

    def forget(self) -> None:
        """The tables are not as remembered (dropped, out of reach or changed since): the next
        open through these settings checks first."""
        _WRITABLE.pop(self.where, None)


def usable(writable: Any) -> tuple[bool, bool]:
    """Whether `purge_progress` and `purge_shares` may be used, from `ledger_writable`'s row."""
    return bool(writable and writable[0]), bool(writable and writable[2])


def _expiry_key(conn: AsyncConnection[Any], writable: Any, key: LedgerKey) -> tuple[object, ...]:
    """(host, port, database, the tables' OIDs, pass instant): a pass's old rows, once gone."""
    info = conn.info
    return (info.host, info.port, info.dbname, writable[1], writable[3], key.now_ms)


def _opened(ledger: bool, shares: bool, entry: Any) -> Opened:
    """What `open` found: the pass's count from its row `entry` (0 before its first batch; None
    without a ledger this role may use) and whether the shares may be recorded."""
    return Opened(int(entry[0]) if entry else 0, shares) if ledger else Opened(None, shares)


def _expired(expiry: tuple[object, ...]) -> None:
    _EXPIRED.add(expiry)
    if len(_EXPIRED) > 1024:  # a worker's passes over weeks: keep the set small
        _EXPIRED.clear()
        _EXPIRED.add(expiry)


def mark_key(target: str, oid: int, table: TableName) -> str:
    """A partition's key in the ledger: the target's name, `#`, and the partition."""
    return f"{target}#" + json.dumps({"oid": oid, "table": str(table)}, sort_keys=True)


def marked(key: str) -> tuple[int, str]:
    """(OID, table as it was named) of a mark."""
    raw = json.loads(key.partition("#")[2])
    return int(raw["oid"]), str(raw["table"])


def count_partition(
    table: TableName, ledger: Ledger | None, key: str
) -> tuple[sql.Composed, dict[str, object]]:
    """The count of a detached partition `table` about to be dropped or moved, in that
    transaction, and its parameters: one row, its rows, written (with the ledger) into the
    partition's mark `key`, set done (batches 1). The pass's total takes them with
    `add_partitions`, last in the same transaction."""
    if ledger is None:
        return sql.SQL("SELECT count(*) FROM {}").format(ident(table)), {}
    return _COUNT_PARTITION.format(table=ident(table)), {**ledger.params, "mark": key}


def add_partitions(ledger: Ledger, keys: list[str]) -> tuple[sql.SQL, dict[str, object]]:
    """The rows the partitions of marks `keys` were counted with (`count_partition`, earlier in
    the same transaction), added to the pass's total for the target: one row, that total. Last
    in the transaction, so the total's row stays locked only for its commit, not for the counts
    and drops before it (the edge's batches, beside, add to that row too)."""
    return _ADD_PARTITIONS, {**ledger.params, "marks": keys}


@dataclass(frozen=True)
class BatchTally:
    """How one table's batches add their counts to the ledger, or that there is none."""

    ledger: Ledger | None
    rel: str | None = None
    """The table (quoted), when a plain DELETE's rows are counted on the server, with no round
    trip (`ledger_add_deleted`); None: from the DELETE's tag, or without the ledger."""

    @staticmethod
    def of(
        ledger: Ledger | None, conn: AsyncConnection[Any], table: TableName, server_counts: bool
    ) -> BatchTally:
        """The tally of `table`'s batches: counted on the server where the plan says the
        server's count is the DELETE's tag (`server_counts`, `TablePlan.counts_deletes`)."""
        if ledger is None or not server_counts:
            return BatchTally(ledger)
        return BatchTally(ledger, ident(table).as_string(conn))

    @property
    def params(self) -> dict[str, object]:
        """The ledger's parameters for a batch's statements (none without the ledger)."""
        return self.ledger.params if self.ledger is not None else {}

    def closing(self, found: sql.Composable, more: sql.Composable = NOTHING) -> sql.Composed:
        """The closing select of a batch statement that counts in SQL: (rows found, rows
        deleted, the ledger's total or NULL), the ledger's upsert in the same statement; then
        `more` (`, expression, ...`), if given."""
        closing = _LEDGER if self.ledger is not None else _NO_LEDGER
        return closing.format(found=found) + more

    def begin(
        self,
        settings: SweepSettings,
        walk: bool = False,
        generic: bool = False,
        lazy: bool = False,
        flush: bool = False,
        by_index: bool = False,
    ) -> tuple[sql.Composed, tuple[object, ...]]:
        """A plain batch's first statement (`local_timeouts`) and its parameters: its timeouts,
        the table when its deletes are counted on the server (see `add`), with `lazy` what
        `lazy_commit` sets (in the same statement: one fewer a batch), with `flush` the
        statistics flush a table's last batch asks for, and with `by_index` the tie walk's
        planner settings."""
        marked = (self.rel,) if self.rel is not None else ()
        return (
            local_timeouts(
                walk, generic, mark=self.rel is not None, lazy=lazy, flush=flush, by_index=by_index
            ),
            (settings.lock_timeout_ms, settings.statement_timeout_ms, *marked),
        )

    async def add(
        self, conn: AsyncConnection[Any], deleted: AsyncCursor[Any]
    ) -> AsyncCursor[Any] | None:
        """With the ledger, in a plain batch's transaction (its pipeline, before the Sync): the
        DELETE's count added to the pass's row. Where the server counts (`rel`, the transaction
        begun by `begin`), with no round trip; else read from the DELETE's tag, by flushing the
        pipeline up to it (one round trip more). The upsert's cursor, which yields no row when
        the batch deleted nothing (no ledger row is written: the count stays); None without the
        ledger, or when the tag says nothing was deleted."""
        if self.ledger is None:
            return None
        if self.rel is not None:
            return await conn.execute(
                ledger_add_deleted(), {**self.ledger.params, "rel": self.rel}, prepare=True
            )
        await (await conn.execute(pipeline_flush())).fetchone()
        if deleted.rowcount <= 0:
            return None
        return await conn.execute(ledger_add(), {**self.ledger.params, "n": deleted.rowcount})


class Done(NamedTuple):
    """A committed batch, as its heartbeat reports it."""

    removed: int
    total: int | None
    """The ledger's total after it, or None (no ledger, or nothing deleted)."""
    ms: float
    page: int


class LazyCommits:
    """Of one table's sweep, on the connection its batches run on: whether the next batch may
    commit lazily, and whether any batch since the last durable point did."""

    def __init__(self, conn: AsyncConnection[Any], ledger: Ledger | None) -> None:
        self.conn = conn
        self.ledger = ledger
        """Lazy commits need the ledger: their counts are exact only in it."""
        self.pending = False
        """Whether a batch committed lazily since the last durable point."""
        self._durable_at = clock()
        self._held: list[Done] = []

    def lazy(self, more_may_follow: bool) -> bool:
        """Whether the next batch may commit lazily: with the ledger, not the table's last (as
        far as is known), and inside DURABLE_EVERY_S of the last durable point."""
        return (
            self.ledger is not None
            and more_may_follow
            and clock() - self._durable_at < DURABLE_EVERY_S
        )

    def committed(self, lazily: bool, wrote: bool) -> None:
        """A batch committed, lazily or as the session does, having deleted rows (`wrote`) or
        not. Only a commit that wrote WAL waits for it, so only such a commit as the session does
        is a durable point; a lazy one that deleted nothing leaves nothing to lose."""
        if lazily and wrote:
            self.pending = True
        elif wrote:
            self._durable()

    def hold(self, batch: Done) -> list[Done]:
        """`batch`, just committed (see `committed`): the batches to report now, in order (all
        held so far once a durable point covers them; none while one is still to come)."""
        self._held.append(batch)
        if self.pending:
            return []
        return self._release()

    @contextlib.asynccontextmanager
    async def settled(self, report: Callable[[list[Done]], None]) -> AsyncIterator[None]:
        """The batches run inside end at a durable point, and what it covers is `report`ed:
        when they end, are cancelled or fail. After a failure the connection may be gone, and
        the batches held are then never reported: a retry counts them from the ledger, and a
        server crash may have undone them."""
        try:
            yield
        except BaseException:
            with contextlib.suppress(psycopg.Error):
                await self._settle(report)
            raise
        await self._settle(report)

    async def _settle(self, report: Callable[[list[Done]], None]) -> None:
        if self.pending and self.ledger is not None:
            await self.ledger.durable_point(self.conn)
        self._durable()
        report(self._release())

    def _release(self) -> list[Done]:
        held, self._held = self._held, []
        return held

    def _durable(self) -> None:
        self.pending = False
        self._durable_at = clock()


# The ledger's statements. Each names the pass by `%(ledger_workflow)s`, `%(ledger_run)s` and
# `%(ledger_now)s` (its instant), and the target by `%(ledger_target)s` (`Ledger.params`).

#: The ledger's upsert, in two pieces around the row it adds: each batch's count accumulates in
#: its pass's row, which returns the pass's total. Shared by the upsert inside a batch's own
#: statement (`_LEDGER`), the one after a plain DELETE (`ledger_add`, `ledger_add_deleted`)
#: and, its first piece, a partition's mark and count (`_COUNT_PARTITION`, `_ADD_PARTITIONS`).
_LEDGER_INTO = (
    "INSERT INTO purge_progress AS p (workflow_id, run_id, target, now_ms, removed, batches)"
)
_LEDGER_ACCUMULATE = (
    " ON CONFLICT (workflow_id, run_id, target) DO UPDATE"
    " SET removed = p.removed + EXCLUDED.removed, batches = p.batches + 1"
    " RETURNING removed"
)

#: The ledger's upsert, added to a batch when the target's database has `purge_progress`: the
#: batch's count becomes durable in the same transaction as its DELETE.
_LEDGER = sql.SQL(
    ", ledger AS ("
    + _LEDGER_INTO
    + " SELECT %(ledger_workflow)s, %(ledger_run)s, %(ledger_target)s, %(ledger_now)s, n, 1"
    " FROM counted WHERE n > 0"
    + _LEDGER_ACCUMULATE
    + ") SELECT {found}, (SELECT n FROM counted), (SELECT removed FROM ledger)"
)
_NO_LEDGER = sql.SQL(" SELECT {found}, (SELECT n FROM counted), NULL::bigint")

#: `count_partition` with the ledger: the partition's rows written into its mark, set done.
_COUNT_PARTITION = sql.SQL(
    "WITH n AS (SELECT count(*) AS rows FROM {table}), mark AS ("
    + _LEDGER_INTO
    + " SELECT %(ledger_workflow)s, %(ledger_run)s, %(mark)s, %(ledger_now)s, n.rows, 1 FROM n"
    " ON CONFLICT (workflow_id, run_id, target) DO UPDATE SET removed = EXCLUDED.removed,"
    " batches = 1)"
    " SELECT n.rows FROM n"
)
#: `add_partitions`: the marks' rows added to the pass's total (not a batch: batches 0).
_ADD_PARTITIONS = sql.SQL(
    _LEDGER_INTO + " SELECT %(ledger_workflow)s, %(ledger_run)s, %(ledger_target)s, %(ledger_now)s,"
    " coalesce(sum(m.removed), 0), 0 FROM purge_progress m"
    " WHERE m.workflow_id = %(ledger_workflow)s AND m.run_id = %(ledger_run)s"
    " AND m.target = ANY(%(marks)s::text[])"
    " ON CONFLICT (workflow_id, run_id, target) DO UPDATE SET removed = p.removed"
    " + EXCLUDED.removed RETURNING removed"
)


def ledger_add() -> sql.SQL:
    """Add one batch's count (`%(n)s`, above 0) to its pass's `purge_progress` row, in the
    batch's own transaction: one row, the pass's total so far."""
    return sql.SQL(
        _LEDGER_INTO
        + " VALUES (%(ledger_workflow)s, %(ledger_run)s, %(ledger_target)s, %(ledger_now)s,"
        " %(n)s, 1)" + _LEDGER_ACCUMULATE
    )


def ledger_add_deleted() -> sql.SQL:
    """`ledger_add`, its count taken on the server: the rows the batch's DELETE removed from
    `%(rel)s`, since `local_timeouts(mark=True)` began the transaction. So it follows the DELETE
    in the same pipeline with no round trip to read the DELETE's tag first (one of a batch's
    three; why: docs/decisions/server-count.md). The session's count of deleted rows goes on across
    transactions until its statistics are flushed (PostgreSQL 15+), hence the difference. A
    batch that deleted nothing writes no row. Only where `track_counts` is on: without it the
    count stays 0."""
    return sql.SQL(
        _LEDGER_INTO
        + " SELECT %(ledger_workflow)s, %(ledger_run)s, %(ledger_target)s, %(ledger_now)s, n, 1"
        " FROM (SELECT pg_stat_get_xact_tuples_deleted(%(rel)s::regclass)"
        " - current_setting('purge.deleted_before')::bigint AS n) d WHERE n > 0"
        + _LEDGER_ACCUMULATE
    )


def lazy_commit() -> sql.SQL:
    """Lets the current transaction commit without waiting for its WAL to reach disk (SET LOCAL
    synchronous_commit = off), for a batch whose ledger row is in the same transaction: a crash
    that loses the commit loses the batch's deletes and its count together, so the count stays
    exact. Its rows are reported only once a durable point covers them (`LazyCommits`). Each
    batch's commit otherwise waited for its WAL to be flushed, where one DELETE waits once."""
    return sql.SQL("SELECT set_config('synchronous_commit', 'off', true)")


def durable_point() -> sql.SQL:
    """A transaction of its own that writes WAL (the ledger's row rewritten as it is), so its
    commit waits, as the session's synchronous_commit says, for the WAL up to it: every lazy
    commit of this server before it is then as durable as a commit of that session's own. A
    transaction that only takes an id writes nothing and waits for nothing."""
    return sql.SQL(
        "UPDATE purge_progress SET batches = batches"
        " WHERE workflow_id = %(ledger_workflow)s AND run_id = %(ledger_run)s"
        " AND target = %(ledger_target)s"
    )


def ledger_entry() -> sql.SQL:
    """The pass's total so far for one target: what a resumed attempt starts counting from."""
    return sql.SQL(
        "SELECT removed, batches FROM purge_progress"
        " WHERE workflow_id = %(ledger_workflow)s AND run_id = %(ledger_run)s"
        " AND target = %(ledger_target)s"
    )


def ledger_writable() -> sql.SQL:
    """Whether `purge_progress` exists (by the search_path) and this role may use it, and
    which table that is (its OID); then the same of `purge_shares`, the partition advice's
    memory. One row, four columns: two optional tables found in one round trip."""
    return sql.SQL(
        "SELECT "
        + _may_use("purge_progress")
        + ", to_regclass('purge_progress')::oid, "
        + _may_use("purge_shares")
        + ", to_regclass('purge_shares')::oid"
    )


def _may_use(table: str) -> str:
    # has_table_privilege with a list of privileges is true when ANY of them is held: each
    # is asked on its own, so a role that may only read the table is not told it may write.
    checks = " AND ".join(
        f"has_table_privilege(to_regclass('{table}'), '{privilege}')"
        for privilege in ("SELECT", "INSERT", "UPDATE", "DELETE")
    )
    return f"coalesce({checks}, false)"


def ledger_expire() -> sql.SQL:
    """Remove ledger rows of passes older than `keep_ms` before this pass's instant: the
    ledger is retention data too, judged by the caller's clock like every other table."""
    return sql.SQL("DELETE FROM purge_progress WHERE now_ms < %(ledger_now)s - %(keep_ms)s")


def partition_mark() -> sql.SQL:
    """Note in the ledger, before a concurrent detach starts, the partition `%(mark)s` this
    pass is taking out (removed 0, batches 0: under way), so that a retry after a death between
    the detach and the drop finds it. The mark's key is the target's name, `#`, and the
    partition (a target name has no `#`, so no target's own count is ever read as one)."""
    return sql.SQL(
        "INSERT INTO purge_progress (workflow_id, run_id, target, now_ms, removed, batches)"
        " VALUES (%(ledger_workflow)s, %(ledger_run)s, %(mark)s, %(ledger_now)s, 0, 0)"
        " ON CONFLICT (workflow_id, run_id, target) DO NOTHING"
    )


def partition_unmark() -> sql.SQL:
    """Forget the mark `%(mark)s`: that partition's detach never started, or it is not ours."""
    return sql.SQL(
        "DELETE FROM purge_progress WHERE workflow_id = %(ledger_workflow)s"
        " AND run_id = %(ledger_run)s AND target = %(mark)s"
    )


def partition_marks() -> sql.SQL:
    """This pass's partition marks for the target: (key, rows, 1 when done, 0 when under way)."""
    return sql.SQL(
        "SELECT target, removed, batches FROM purge_progress"
        " WHERE workflow_id = %(ledger_workflow)s AND run_id = %(ledger_run)s"
        " AND starts_with(target, %(ledger_target)s || '#') ORDER BY target"
    )
