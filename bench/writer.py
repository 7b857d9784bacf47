"""The concurrent single-row writer: an application renewing keys while a sweep runs.

It runs in its own process (`python -m bench.writer CONFIG`) so its timings share no event loop and
no GIL with the sweep under test: a 5 ms GIL switch interval would otherwise show up in its p99.
Protocol on stdin/stdout, one line each: it prints `ready` once connected, starts on `go`, stops
on `stop` (or end of input, so it never outlives the bench), then prints one JSON line of results.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench.data import Dataset
from bench.stats import WriterRun

REPO = Path(__file__).resolve().parent.parent

#: Renewals land on an expired key half the time (the rows a sweep races with) and on any key
#: otherwise (plain contention with the rows a sweep leaves alone).
EXPIRED_SHARE = 0.5
#: A renewal moves a key's expiry this far past the pass's instant.
RENEW_MS = 3_600_000


@dataclass(frozen=True)
class WriterConfig:
    url: str
    schema: str
    table: str
    kind: str
    rows: int
    expired: int
    layout: str
    now_ms: int
    rate: float
    """Upserts a second; 0 is as fast as one connection goes."""
    seed: int


#: The `events` writer's ids start here, far above the table's own.
EVENT_IDS = 10**12


def _upsert(config: WriterConfig) -> sql.Composed:
    table = sql.Identifier(config.schema, config.table)
    if config.kind == "events":
        # An application logging events as they happen: a new row in today's partition, never
        # a renewal; each must be there after the form.
        return sql.SQL(
            "INSERT INTO {t} (id, created_ms, user_id, body) VALUES (%(id)s, %(now_ms)s,"
            " %(id)s %% 1000, 'written during the form')"
        ).format(t=table)
    if config.kind == "idempotency":
        return sql.SQL(
            "INSERT INTO {t} AS t (key, response, expires_at_ms)"
            " VALUES (%(key)s, '{{\"status\": 200}}', %(expires)s)"
            " ON CONFLICT (key) DO UPDATE SET expires_at_ms = excluded.expires_at_ms"
        ).format(t=table)
    # One request served at now_ms: refill to now, take a token. Stamped with the pass's own
    # instant, so the bucket is not full at now_ms and must survive the sweep.
    return sql.SQL(
        "INSERT INTO {t} AS t (key, tokens, capacity, refill_per_ms, last_ms)"
        " VALUES (%(key)s, 9, 10, 0.001, %(now_ms)s)"
        " ON CONFLICT (key) DO UPDATE SET"
        " tokens = greatest(least(t.capacity,"
        " t.tokens + (excluded.last_ms - t.last_ms) * t.refill_per_ms) - 1, 0),"
        " last_ms = excluded.last_ms"
    ).format(t=table)


def _own_wal_bytes(conn: psycopg.Connection[Any]) -> int | None:
    """This backend's WAL so far (PostgreSQL 18's per-backend statistics), flushed first."""
    try:
        conn.execute("SELECT pg_stat_force_next_flush()")
        # The pending counters are flushed when the backend next goes idle, i.e. after this.
        conn.execute("SELECT 1")
        row = conn.execute(
            "SELECT wal_bytes FROM pg_stat_get_backend_wal(pg_backend_pid())"
        ).fetchone()
    except psycopg.errors.UndefinedFunction:
        return None
    return int(row[0]) if row and row[0] is not None else None


class _Signals:
    """`go` and `stop` from the parent, read on a thread so the loop never blocks on stdin."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.stop = threading.Event()
        self.stopped_at = float("inf")
        """perf_counter() when `stop` arrived: upserts due before it still count."""

    def listen(self) -> None:
        for line in sys.stdin:
            word = line.strip()
            if word == "go":
                self.go.set()
            elif word == "stop":
                break
        self.stopped_at = time.perf_counter()
        self.go.set()
        self.stop.set()


def main() -> None:
    config = WriterConfig(**json.loads(sys.argv[1]))
    events = config.kind == "events"
    data = Dataset(
        "idempotency" if events else config.kind,  # type: ignore[arg-type]
        config.rows,
        config.expired,
        config.layout,  # type: ignore[arg-type]
    )
    rng = random.Random(config.seed)
    statement = _upsert(config)
    signals = _Signals()
    threading.Thread(target=signals.listen, daemon=True).start()
    with psycopg.connect(
        config.url, autocommit=True, application_name="purge-bench-writer"
    ) as conn:
        print("ready", flush=True)
        signals.go.wait()
        wal_before = _own_wal_bytes(conn)
        latencies: list[float] = []
        late: list[float] = []
        renewed: list[str] = []
        errors = 0
        interval = 1.0 / config.rate if config.rate > 0 else 0.0
        due = time.perf_counter()
        # At a fixed rate, an upsert is due at its slot whether or not the previous one has
        # returned: one stalled upsert then delays every upsert due during the stall, and
        # `late` (measured from the slot) counts each of them, which the statement times alone
        # would hide (coordinated omission). Upserts due before `stop` are still sent.
        while due <= signals.stopped_at and not (interval == 0 and signals.stop.is_set()):
            if events:
                key = str(EVENT_IDS + len(late) + errors)
            elif data.expired and rng.random() < EXPIRED_SHARE:
                key = data.key(data.expired_index(rng.randrange(data.expired)))
            else:
                key = data.key(rng.randrange(data.rows))
            params = {
                "key": key,
                "id": int(key) if events else 0,
                "expires": config.now_ms + RENEW_MS,
                "now_ms": config.now_ms,
            }
            started = time.perf_counter()
            try:
                conn.execute(statement, params, prepare=True)
            except psycopg.Error:
                errors += 1
            else:
                done = time.perf_counter()
                if started < signals.stopped_at:
                    # Statement times only while the form ran, not for the catch-up after it.
                    latencies.append((done - started) * 1000)
                late.append((done - min(due, started)) * 1000)
                renewed.append(key)
            if interval:
                due += interval
                signals.stop.wait(max(0.0, due - time.perf_counter()))
            else:
                due = time.perf_counter()
        wal_after = _own_wal_bytes(conn)
    wal = wal_after - wal_before if wal_before is not None and wal_after is not None else None
    result = WriterRun(
        latencies_ms=latencies, late_ms=late, renewed=renewed, errors=errors, wal_bytes=wal
    )
    print(json.dumps(asdict(result)), flush=True)


class Writer:
    """The parent's handle on one writer process."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc

    async def _send(self, word: str) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(f"{word}\n".encode())
        await self._proc.stdin.drain()

    async def _line(self, wait_s: float) -> str:
        assert self._proc.stdout is not None
        async with asyncio.timeout(wait_s):
            line = await self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the writer exited (status {await self._proc.wait()})")
        return line.decode().strip()

    async def go(self) -> None:
        await self._send("go")

    async def stop(self) -> WriterRun:
        await self._send("stop")
        raw = json.loads(await self._line(wait_s=120))
        await self._proc.wait()
        return WriterRun(**raw)

    async def kill(self) -> None:
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            await self._proc.wait()


@contextlib.asynccontextmanager
async def running_writer(config: WriterConfig) -> AsyncIterator[Writer]:
    """A connected writer, waiting for `go`; killed on the way out if still running."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.writer",
        json.dumps(asdict(config)),
        cwd=REPO,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        # Its own session: a Ctrl-C reaches the bench, which stops the writer in order.
        start_new_session=True,
        # Results can be a few hundred KB of JSON on one line.
        limit=64 * 1024 * 1024,
    )
    writer = Writer(proc)
    try:
        ready = await writer._line(wait_s=60)
        if ready != "ready":
            raise RuntimeError(f"the writer said {ready!r}, want 'ready'")
        yield writer
    finally:
        await writer.kill()


if __name__ == "__main__":
    main()
