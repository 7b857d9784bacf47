"""Pacing between batches: wait for streaming replicas to catch up, and keep the WAL a sweep
writes under a rate. Both wait only between batches (no row lock is held then; the table's
advisory lock is, so another sweep of the table finds it busy), count against the sweep's
time budget, and leave heartbeats running (the activity heartbeats in the background).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from psycopg import AsyncConnection, sql

from activities.engine.context import never
from purge_config.settings import SweepSettings

#: How often the replicas' lag is read while it is under the limit: a read costs a round trip.
LAG_CHECK_EVERY_S = 0.5
#: How long a paused sweep sleeps between two reads of the lag.
LAG_POLL_S = 0.25
#: How often a pause asks whether the sweep must end now (its worker stopping).
STOP_CHECK_S = 0.5


@dataclass
class Pacer:
    """The pacing of one table's sweep on its connection."""

    conn: AsyncConnection[Any]
    settings: SweepSettings
    deadline: float
    stopping: Callable[[], bool] = never
    """Whether the sweep must end now (its worker is stopping): a pause ends early for it."""
    warnings: list[str] = field(default_factory=list)
    paused_s: float = 0.0
    reason: str = ""
    """Why the sweep stopped before its end: the budget ran out while it waited."""
    _lag_readable: bool | None = None
    _lag_checked: float = 0.0
    _wal_start: tuple[int, float] | None = None

    async def start(self) -> None:
        if self.settings.max_wal_rate:
            self._wal_start = (await self._wal(), time.monotonic())

    async def before_batch(self) -> bool:
        """Wait as pacing asks; False when the budget ran out while waiting for replicas, when
        the WAL rate would hold the sweep past its budget (then at once, with no wait), or the
        sweep must end now (`stopping`)."""
        return await self._replicas() and await self._wal_rate() and not self.stopping()

    async def _replicas(self) -> bool:
        limit = self.settings.max_replica_lag_ms
        if limit is None or time.monotonic() - self._lag_checked < LAG_CHECK_EVERY_S:
            return True
        if self._lag_readable is None:
            cur = await self.conn.execute(may_read_replication())
            row = await cur.fetchone()
            self._lag_readable = bool(row and row[0])
            if not self._lag_readable:
                self.warnings.append(
                    "max_replica_lag is set but this role cannot read the replicas' lag (it "
                    "needs pg_monitor or pg_read_all_stats: GRANT pg_monitor TO <role>); the "
                    "sweep was not paced for them"
                )
        if not self._lag_readable:
            return True
        while True:
            self._lag_checked = time.monotonic()
            cur = await self.conn.execute(replica_lag_ms())
            row = await cur.fetchone()
            lag = float(row[0]) if row and row[0] is not None else 0.0
            if lag <= limit:
                return True
            if self.stopping():
                return False
            if time.monotonic() + LAG_POLL_S >= self.deadline:
                self.reason = (
                    f"paused for a replica {lag / 1000:.1f} s behind (max_replica_lag "
                    f"{limit / 1000:g} s) until the time budget ran out"
                )
                return False
            await self._sleep(LAG_POLL_S)

    async def _wal_rate(self) -> bool:
        rate = self.settings.max_wal_rate
        if not rate or self._wal_start is None:
            return True
        start_lsn, started = self._wal_start
        written = await self._wal() - start_lsn
        # The WAL written so far may take this long at the rate; sleep off any time ahead.
        ahead = started + written / rate - time.monotonic()
        if ahead <= 0:
            return True
        if time.monotonic() + ahead >= self.deadline:
            self.reason = f"held to max_wal_rate {rate / 1024**2:g} MB/s until the budget ran out"
            return False
        await self._sleep(ahead)
        return True

    async def _wal(self) -> int:
        cur = await self.conn.execute(wal_position())
        row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def _sleep(self, seconds: float) -> None:
        """Pause up to `seconds`, in slices between which a sweep that must end now
        (`stopping`) ends the pause: a stopping worker's sweep does not sit out a long WAL-rate
        pause. `paused_s` counts what was paused."""
        left = seconds
        while left > 0 and not self.stopping():
            step = min(left, STOP_CHECK_S)
            await asyncio.sleep(step)
            self.paused_s += step
            left -= step


# The statements pacing reads the server by.


def may_read_replication() -> sql.SQL:
    """Whether this role sees the replicas' lag in pg_stat_replication (else it reads NULL)."""
    return sql.SQL(
        "SELECT pg_has_role('pg_read_all_stats', 'USAGE')"
        " OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)"
    )


def replica_lag_ms() -> sql.SQL:
    """The largest replay lag of any streaming replica, in ms (0 without replicas)."""
    return sql.SQL(
        "SELECT coalesce(max(extract(epoch FROM replay_lag) * 1000), 0)"
        " FROM pg_stat_replication WHERE state = 'streaming'"
    )


def wal_position() -> sql.SQL:
    """The server's WAL insert position, in bytes from the start of WAL: every byte made so far,
    written out or not. The write position (`pg_current_wal_lsn()`) lags it while lazily
    committed batches wait for the WAL writer (180 kB behind in a 20,000-row test sweep), and
    pacing by it let a sweep's last batches run on unpaced."""
    return sql.SQL("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
