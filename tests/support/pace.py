"""The moments a sweep's test needs, made to happen whatever the machine's speed.

A sweep decides three things by the clock: the size of its next batch (from how long the last
took), when a lazily committed batch reaches a durable point (and so when it is reported), and
when its budget is spent. A test that needs a sweep to be mid-table at some moment fixes the
first two here instead of hoping that a table outlasts a timer, holds the sweep at a row it
locked (`row_locked`, `until_a_sweep_waits`), and spends the budget by hand (`budget_clock`)
or cancels.

`machine_pace` makes the whole suite meet a machine much faster or much slower than this one
(`PURGE_TEST_PACE=fast|slow`, .ci/run runs the sweep tests both ways): a test that passes only
at this machine's speed fails there.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
import types
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import psycopg
import pytest

from activities.engine import batching, context, keyset, ledger

T = TypeVar("T")

PACES = {"fast": 1 / 50, "slow": 50.0}
"""What a batch's measured duration is multiplied by under PURGE_TEST_PACE."""


def fixed_batches(monkeypatch: pytest.MonkeyPatch, *, pages: int = 8, rows: int = 200) -> None:
    """Every walk batch `pages` heap pages, every index and keyset batch `rows` rows, however
    long each takes: a table of known size is then a known number of batches."""
    monkeypatch.setattr(batching, "FIRST_PAGES", pages)
    monkeypatch.setattr(batching, "PAGES_RANGE", (pages, pages))
    monkeypatch.setattr(batching, "FIRST_ROWS", rows)
    monkeypatch.setattr(batching, "ROWS_RANGE", (rows, rows))


def unhurried_whole_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A first batch that takes every expired row by the planner's estimate runs under the
    setting's statement_timeout, not ten batch targets (150 ms at the default): a test that
    counts on that batch being the sweep's one (a few milliseconds on a quiet machine) then
    holds on a machine that stalls a statement past 150 ms. The rollback past ten targets
    has a test of its own, with a row that makes it happen."""
    monkeypatch.setattr(keyset, "WHOLE_LIMIT_TARGETS", 1_000_000)


class HandClock:
    """A `time.monotonic()` that stands still but when moved on by hand: a test puts
    `monotonic` where a module reads its clock, and `spend` makes time pass there at once, the
    moment the test chooses. It starts at the real clock's reading, and real time never moves
    it: a budget read by it is spent by the test alone, not by a busy machine's connecting,
    planning and locking (a one-second budget on a clock that was the real one plus what the
    test spent could run out before a slow machine's first batch)."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.ahead = 0.0

    def monotonic(self) -> float:
        return self.start + self.ahead

    def spend(self, seconds: float) -> None:
        """`seconds` gone by, at once, for everything that reads this clock."""
        self.ahead += seconds


def budget_clock(monkeypatch: pytest.MonkeyPatch) -> HandClock:
    """The clock sweeps read their time budget by (`activities.engine.context`), moved on by
    hand only (`HandClock`): a sweep's budget, however short (the config's smallest, 1s), is
    never spent on its own; the test spends it at the moment it chooses (the sweep held at a
    locked row, say), where a short real budget could run out before a slow machine's sweep
    got there. A budget of 0 is spent from the start."""
    clock = HandClock()
    monkeypatch.setattr(context, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    return clock


def durable_every(monkeypatch: pytest.MonkeyPatch, batches: int) -> None:
    """A durable point (and so a heartbeat reporting the batches it covers) every `batches`
    batches that delete rows, by a clock that ticks once a batch instead of by the second.
    `batches=1`: every batch commits as the session does and is reported on its own."""
    monkeypatch.setattr(ledger, "clock", itertools.count().__next__)
    monkeypatch.setattr(ledger, "DURABLE_EVERY_S", batches)


#: The engine's own resize, taken before `machine_pace` can scale batch times.
ENGINE_RESIZE = batching._resize


def durations_as_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches sized by their durations as measured, whatever PURGE_TEST_PACE says: for a test
    whose durations are made by a sleep in the server (it lasts as long on any machine), and
    which a pace's scaling would only blur."""
    monkeypatch.setattr(batching, "_resize", ENGINE_RESIZE)


def machine_pace(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under PURGE_TEST_PACE=fast every batch is sized as if it had taken a fiftieth of its
    time: a table ends in a few large batches, all inside one durable point, as on a machine
    much faster than this one. Under `slow`, fifty times its time, and durable points fifty
    times closer: batches at their smallest, each reported nearly on its own. Unset: nothing
    changes. (Durable points stay half a second apart under `fast`: a test that sleeps in
    PostgreSQL does not get faster with the machine, and its heartbeats still come.)"""
    pace = os.environ.get("PURGE_TEST_PACE", "")
    if not pace:
        return
    if pace not in PACES:
        raise pytest.UsageError(f"PURGE_TEST_PACE must be one of {sorted(PACES)}, got {pace!r}")
    factor = PACES[pace]
    resize = batching._resize

    def paced(size: int, ms: float, target_ms: int, size_range: tuple[int, int]) -> int:
        return resize(size, ms * factor, target_ms, size_range)

    monkeypatch.setattr(batching, "_resize", paced)
    if factor > 1:
        monkeypatch.setattr(ledger, "DURABLE_EVERY_S", ledger.DURABLE_EVERY_S / factor)


@contextlib.contextmanager
def row_locked(
    url: str, table: str, key: object, column: str = "key"
) -> Iterator[psycopg.Connection[Any]]:
    """Another session holding the row of `table` whose `column` is `key` locked (FOR UPDATE,
    changing nothing) until the block ends: a batch that reaches it waits there."""
    with psycopg.connect(url, autocommit=True) as holder:
        holder.execute("BEGIN")
        locked = holder.execute(f"SELECT 1 FROM {table} WHERE {column} = %s FOR UPDATE", (key,))
        assert locked.fetchone(), f"no row {key!r} in {table} to lock"
        try:
            yield holder
        finally:
            holder.execute("COMMIT")


def waiting_sweeps(
    db: psycopg.Connection[Any], holder: psycopg.Connection[Any] | None = None
) -> int:
    """How many of the sweeps' sessions (named temporal-pg-purge) wait for a lock now: only
    those `holder`'s session blocks, given one; else those holding or awaiting a lock on a
    relation in `db`'s own schema (its search_path's first). On a server tests share, other
    tests' sweeps wait at the same time, each in its own schema, on its own holder."""
    if holder is not None:
        own, args = "%s = ANY(pg_blocking_pids(a.pid))", (holder.info.backend_pid,)
    else:
        own, args = (
            "EXISTS (SELECT 1 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
            " WHERE l.pid = a.pid AND c.relnamespace = current_schema()::regnamespace"
            " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))",
            (),
        )
    found = db.execute(
        "SELECT count(*) FROM pg_stat_activity a WHERE a.application_name = 'temporal-pg-purge'"
        f" AND a.wait_event_type = 'Lock' AND {own}",
        args,
    ).fetchone()
    assert found is not None
    return int(found[0])


async def until_a_sweep_waits(
    db: psycopg.Connection[Any],
    running: asyncio.Future[Any],
    holder: psycopg.Connection[Any] | None = None,
) -> None:
    """Returns once a sweep's batch (its connection named temporal-pg-purge) waits for a lock
    (`holder`'s, given one; else as a sweep of `db`'s schema, see `waiting_sweeps`): every
    batch before it has committed, and it commits only when the lock is let go."""
    while not waiting_sweeps(db, holder):
        assert not running.done(), "the sweep never waited for the lock"
        await asyncio.sleep(0.01)


async def cut_short_at(
    db: psycopg.Connection[Any],
    url: str,
    table: str,
    key: object,
    clock: HandClock,
    start: Callable[[], Awaitable[T]],
    seconds: float = 3_600,
    column: str = "key",
) -> T:
    """What `start()` returns when its sweep runs out of time at a moment this chooses: the row
    of `table` whose `column` is `key` held locked, the sweep started, and once its batch
    waits there, `seconds` of `clock` (`budget_clock`) spent and the row let go: that batch
    commits, and a sweep whose budget is below `seconds` finds it gone before the next. However
    fast or slow the machine, the sweep has then removed rows and left some."""
    with row_locked(url, table, key, column) as holder:
        running = asyncio.ensure_future(start())
        await until_a_sweep_waits(db, running, holder=holder)
        clock.spend(seconds)
    return await running
