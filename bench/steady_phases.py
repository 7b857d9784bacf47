"""Where a steady hour's sweep spends its time, phase by phase, beside one DELETE of an hour.

Case 12's table (`bench.steady`): `--rows` rows created over 100 hours in id order, on a server
with PostgreSQL's defaults for what the bench tunes (shared_buffers 128MB). Each round deletes
the next hour's rows, alternately by one DELETE and by the activity, the table's buffers and
page cache dropped and a checkpoint taken before each form, as case 12 does. For each activity
round: the time before its first keyset batch, then summed over its batches the boundary read
(to the DELETE's send), the DELETE with the flush that reads its count, the ledger's upsert and
the commit, the gaps between batches, and the time after the last.

    python -m bench.steady_phases --rows 10000000 --rounds 8   # 100,000 rows an hour
    python -m bench.steady_phases --batch-target-ms 60   # the same with fewer, longer batches

The phases are timed by wrapping `run_key_batch` and `BatchTally.add` in this process: the
activity runs as it ships, only observed. Where the ledger takes a batch's count on the server
(engine since `585f6dd`: no round trip between the DELETE and the ledger's row), nothing waits
for the DELETE before the Sync: "DELETEs and counts" is then only their sending, and their
execution falls in "ledger and commit".
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg

import activities.engine.batching as batching
from activities import builtin_kinds as kinds
from activities.engine.ledger import BatchTally
from activities.schema import reference_ddl
from bench import data as tables
from bench import steady
from bench.forms import run_target
from bench.services import embedded_postgres, scratch_dir
from purge_config.names import TableName
from purge_config.settings import SweepSettings
from purge_ops.connect import open_pool

START_MS = 1_700_000_000_000
Marks = list[tuple[str, float]]


def observe(marks: Marks) -> None:
    """Record, in `marks`, when each keyset batch starts, sends its DELETE, has its count, and
    ends."""
    # Through the module's namespace and the class: what a batch looks up when it runs.
    engine = vars(batching)
    run, add = engine["run_key_batch"], BatchTally.add

    async def timed_add(*args: Any) -> Any:
        marks.append(("sent", time.perf_counter()))
        added = await add(*args)
        marks.append(("counted", time.perf_counter()))
        return added

    async def timed_run(*args: Any) -> Any:
        marks.append(("start", time.perf_counter()))
        ran = await run(*args)
        marks.append(("end", time.perf_counter()))
        return ran

    setattr(BatchTally, "add", timed_add)  # noqa: B010 (a method replaced, not a field)
    engine["run_key_batch"] = timed_run


def phases(marks: Marks, began: float, ended: float) -> str:
    """One activity round's phases, in ms."""
    at: dict[str, list[float]] = {"start": [], "sent": [], "counted": [], "end": []}
    for name, t in marks:
        at[name].append(t)
    if not at["start"]:
        return "no keyset batch"

    def total(pairs: list[tuple[float, float]]) -> str:
        spans = [(b - a) * 1000 for a, b in pairs]
        return f"{sum(spans):6.1f} (median {statistics.median(spans) if spans else 0:4.2f})"

    starts, ends = at["start"], at["end"]
    return (
        f"{len(starts)} batches; before the first {(starts[0] - began) * 1000:5.1f}; "
        f"boundary reads {total(list(zip(starts, at['sent'], strict=False)))}; "
        f"DELETEs and counts {total(list(zip(at['sent'], at['counted'], strict=False)))}; "
        f"ledger and commit {total(list(zip(at['counted'], ends, strict=False)))}; "
        f"gaps {total(list(zip(ends, starts[1:], strict=False)))}; "
        f"after the last {(ended - ends[-1]) * 1000:5.1f} ms"
    )


async def measure(url: str, rows: int, rounds: int, settings: SweepSettings) -> None:
    marks: Marks = []
    observe(marks)
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    await conn.execute(reference_ddl())
    await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_buffercache")
    data = steady.Hours(rows, START_MS)
    await steady._build(conn, data)  # case 12's table: `rows` over 100 hours, in id order
    pool = await open_pool(url)
    max_age = steady.HOURS * steady.HOUR_MS
    await steady._delete(conn, data.cutoff(0))
    await conn.execute("VACUUM (ANALYZE) steady")
    per_row: dict[str, list[float]] = {"DELETE": [], "activity": []}
    hour = 1

    async def one_delete(cut: int) -> tuple[float, int]:
        run = await steady._delete(conn, cut)
        return run.seconds, run.removed

    async def one_sweep(cut: int) -> tuple[float, int]:
        marks.clear()
        table = TableName(steady.TABLE, "public")
        target = kinds.expiring(pool, f"steady_{hour}", table, "created_ms", max_age, settings)
        began = time.perf_counter()
        run = await run_target(target, cut + max_age)
        print(f"activity {run.seconds * 1000:6.1f} ms: {phases(marks, began, time.perf_counter())}")
        return run.seconds, run.removed

    forms: dict[str, Callable[[int], Awaitable[tuple[float, int]]]] = {
        "DELETE": one_delete,
        "activity": one_sweep,
    }
    for n in range(rounds):
        for form in ("DELETE", "activity") if n % 2 == 0 else ("activity", "DELETE"):
            await tables.make_cold(conn, "public", steady.TABLE, None)
            await conn.execute("CHECKPOINT")
            seconds, removed = await forms[form](data.cutoff(hour))
            per_row[form].append(seconds * 1e6 / removed)
            await conn.execute("VACUUM (ANALYZE) steady")
            hour += 1
    for form, figures in per_row.items():
        print(f"{form:8} us a row: {', '.join(f'{x:.2f}' for x in figures)}")
    mine, floor = (statistics.median(per_row[f]) for f in ("activity", "DELETE"))
    print(f"activity {mine / floor:.2f}x one DELETE (median {mine:.2f} against {floor:.2f} us)")
    await pool.close()
    await conn.close()


async def on_embedded_server(scratch: Path, args: argparse.Namespace) -> None:
    # PostgreSQL's own defaults for what the bench tunes, as case 12's default-settings server
    # (and fsync on: the embedded server's own default is off).
    settings = {**steady.DEFAULT_SETTINGS, "fsync": "on"}
    async with embedded_postgres(scratch, settings) as server:
        sweep = SweepSettings(batch_target_ms=args.batch_target_ms)
        await measure(server.url(), args.rows, args.rounds, sweep)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--batch-target-ms", type=int, default=SweepSettings.batch_target_ms)
    args = parser.parse_args()
    with scratch_dir("purge-bench-") as scratch:
        asyncio.run(on_embedded_server(scratch, args))


if __name__ == "__main__":
    main()
