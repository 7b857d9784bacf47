"""Where a steady hour's sweep spends its time, phase by phase, beside one DELETE of an hour.

Case 12's table (`bench.steady`): `--rows` rows created over 100 hours in id order, on a server
with PostgreSQL's defaults for what the bench tunes (shared_buffers 128MB). Each round deletes
the next hour's rows, alternately by one DELETE and by the activity, the table dropped from
shared_buffers (the OS cache keeps what it has) and a checkpoint taken before each form, as
case 12 does. For each activity
round: the time before its first batch; the batches that read their boundary (the first, a run
of one key, a last batch that met one), the key spans and the last batch with no read (`rest`)
(`activities.engine.keyset`), each summed with its median; the gaps between batches; and the
time after the last.

    python -m bench.steady_phases --rows 10000000 --rounds 8   # 100,000 rows an hour
    python -m bench.steady_phases --batch-target-ms 60   # the same with fewer, longer batches
    python -m bench.steady_phases --statements   # and each form's server time beside the rest

After the rounds it prints this process's CPU time by phase, medians of the rounds after the
first (the client's CPU is on the pass's path wherever the server waits for its next statement),
and beside them psycopg's own CPU for a pipeline of three trivial prepared statements
(`pipeline_floor`), the least a batch's round trip can cost the client.

With `--statements` the server loads pg_stat_statements, and each round of either form also
prints its statements' execution time summed on the server (`exec`), the rest of its time
(`outside`: parse, bind, commit, round trips and the client) and, for the activity, this
process's CPU time while it ran.

The phases are timed by wrapping `run_key_batch`, `run_key_span`, `run_key_rest` and
`run_key_whole` (a sweep the planner expects in one batch, with `--rows` small enough) in this
process: the activity runs as it ships, only observed. A batch is its whole round trip: its
timeouts, its statement (the boundary read and the DELETE in one for a boundary batch), the
ledger's row and the commit, pipelined to one Sync.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg

import activities.engine.batching as batching
from activities import builtin_kinds as kinds
from activities.schema import reference_ddl
from bench import data as tables
from bench import steady
from bench.forms import run_target
from bench.services import embedded_postgres, scratch_dir
from purge_config.names import TableName
from purge_config.settings import SweepSettings
from purge_ops.connect import open_pool

START_MS = 1_700_000_000_000
#: (kind of batch, when it started, when it ended, this process's CPU time at its start and at
#: its end), in the order they ran.
Marks = list[tuple[str, float, float, float, float]]


def observe(marks: Marks) -> None:
    """Record, in `marks`, each batch's kind ("boundary", "span", "rest" or "whole"), start and
    end, and this process's CPU time at both."""
    # Through the module's namespace: what `_by_key` looks up when it runs a batch.
    engine = vars(batching)

    def timed(kind: str, run: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def timed_run(*args: Any) -> Any:
            started, cpu = time.perf_counter(), time.process_time()
            ran = await run(*args)
            marks.append((kind, started, time.perf_counter(), cpu, time.process_time()))
            return ran

        return timed_run

    engine["run_key_batch"] = timed("boundary", engine["run_key_batch"])
    engine["run_key_span"] = timed("span", engine["run_key_span"])
    engine["run_key_rest"] = timed("rest", engine["run_key_rest"])
    engine["run_key_whole"] = timed("whole", engine["run_key_whole"])


def phases(marks: Marks, began: float, ended: float) -> str:
    """One activity round's phases, in ms."""
    if not marks:
        return "no keyset batch"

    def total(kind: str) -> str:
        ms = [(mark[2] - mark[1]) * 1000 for mark in marks if mark[0] == kind]
        median = statistics.median(ms) if ms else 0.0
        return f"{len(ms)} {kind} {sum(ms):6.1f} (median {median:5.2f})"

    gaps = sum((b[1] - a[2]) * 1000 for a, b in itertools.pairwise(marks))
    return (
        f"before the first {(marks[0][1] - began) * 1000:5.1f}; {total('boundary')}; "
        f"{total('span')}; {total('rest')}; {total('whole')}; gaps {gaps:5.1f}; "
        f"after the last {(ended - marks[-1][2]) * 1000:5.1f} ms"
    )


def client_cpu(marks: Marks, began: float, ended: float) -> dict[str, float]:
    """One activity round's CPU time in this process, in ms: before its first batch, each kind
    of batch's median, and after its last (`began` and `ended` are CPU times). The client's
    CPU is on the pass's path wherever the server waits for its next statement."""
    if not marks:
        return {}
    cpu = {"before the first": (marks[0][3] - began) * 1000}
    for kind in ("boundary", "span", "rest", "whole"):
        ms = [(mark[4] - mark[3]) * 1000 for mark in marks if mark[0] == kind]
        if ms:
            cpu[f"a {kind}"] = statistics.median(ms)
    cpu["after the last"] = (ended - marks[-1][4]) * 1000
    cpu["in all"] = (ended - began) * 1000
    return cpu


#: The statements' execution time on the server since the last reset, leaving out the bench's
#: own between the forms (CHECKPOINT, VACUUM, pg_buffercache's eviction, this read).
SERVER_EXEC_MS = (
    "SELECT coalesce(sum(total_exec_time), 0) FROM pg_stat_statements"
    " WHERE query !~* '^(CHECKPOINT|VACUUM)' AND query !~ 'pg_stat_statements|pg_buffercache'"
)


async def server_split(
    conn: psycopg.AsyncConnection[Any], seconds: float, cpu_s: float | None
) -> tuple[str, float]:
    """A round's server execution time and the rest of its `seconds`, as a line, and the rest
    in ms; `cpu_s` is this process's CPU time over the round (the activity's only)."""
    cur = await conn.execute(SERVER_EXEC_MS)
    row = await cur.fetchone()
    exec_ms = float(row[0]) if row else 0.0
    outside = seconds * 1000 - exec_ms
    cpu = f"; client CPU {cpu_s * 1000:5.1f}" if cpu_s is not None else ""
    return f"exec {exec_ms:5.1f}; outside {outside:5.1f}{cpu} ms", outside


#: A pipeline of three trivial prepared statements with parameters, the shape of a key span's
#: round trip (its timeouts, its DELETE, its ledger row) with none of their work on the server.
FLOOR_STATEMENT = (
    "SELECT set_config('lock_timeout', %(ms)s::text, true) WHERE %(key)s::bigint IS NOT NULL"
)


async def pipeline_floor(url: str, pipelines: int = 300) -> float:
    """psycopg's own CPU time for a pipeline of three statements on this machine, in ms: the
    least a batch's round trip can cost the client, beside what the sweep's batches cost."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        rounds = []
        for _ in range(3):
            cpu = time.process_time()
            for key in range(pipelines):
                async with conn.pipeline():
                    for _ in range(3):
                        params = {"ms": "1000", "key": key}
                        await conn.execute(FLOOR_STATEMENT, params, prepare=True)
            rounds.append((time.process_time() - cpu) * 1000 / pipelines)
        return min(rounds)


async def measure(
    url: str, rows: int, rounds: int, settings: SweepSettings, statements: bool = False
) -> None:
    marks: Marks = []
    observe(marks)
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    await conn.execute(reference_ddl())
    await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_buffercache")
    if statements:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    outside: dict[str, list[float]] = {"DELETE": [], "activity": []}
    cpu_rounds: list[dict[str, float]] = []
    data = steady.Hours(rows, START_MS)
    await steady._build(conn, data)  # case 12's table: `rows` over 100 hours, in id order
    pool = await open_pool(url)
    max_age = steady.HOURS * steady.HOUR_MS
    await steady._delete(conn, data.cutoff(0))
    await conn.execute(tables.flush_counts(conn))
    await conn.execute("VACUUM (ANALYZE) steady")
    per_row: dict[str, list[float]] = {"DELETE": [], "activity": []}
    hour = 1

    async def one_delete(cut: int) -> tuple[float, int]:
        run = await steady._delete(conn, cut)
        if statements:
            line, rest = await server_split(conn, run.seconds, None)
            outside["DELETE"].append(rest)
            print(f"DELETE   {run.seconds * 1000:6.1f} ms: {line}")
        return run.seconds, run.removed

    async def one_sweep(cut: int) -> tuple[float, int]:
        marks.clear()
        table = TableName(steady.TABLE, "public")
        target = kinds.expiring(pool, f"steady_{hour}", table, "created_ms", max_age, settings)
        began, cpu_began = time.perf_counter(), time.process_time()
        run = await run_target(target, cut + max_age)
        cpu_ended = time.process_time()
        cpu = cpu_ended - cpu_began
        print(f"activity {run.seconds * 1000:6.1f} ms: {phases(marks, began, time.perf_counter())}")
        cpu_rounds.append(client_cpu(marks, cpu_began, cpu_ended))
        if statements:
            line, rest = await server_split(conn, run.seconds, cpu)
            outside["activity"].append(rest)
            print(f"activity {run.seconds * 1000:6.1f} ms: {line}")
        return run.seconds, run.removed

    forms: dict[str, Callable[[int], Awaitable[tuple[float, int]]]] = {
        "DELETE": one_delete,
        "activity": one_sweep,
    }
    for n in range(rounds):
        for form in ("DELETE", "activity") if n % 2 == 0 else ("activity", "DELETE"):
            await tables.make_cold(conn, "public", steady.TABLE, None)
            await conn.execute("CHECKPOINT")
            if statements:
                await conn.execute("SELECT pg_stat_statements_reset()")
            seconds, removed = await forms[form](data.cutoff(hour))
            per_row[form].append(seconds * 1e6 / removed)
            await conn.execute(tables.flush_counts(conn))
            await conn.execute("VACUUM (ANALYZE) steady")
            hour += 1
    for form, figures in per_row.items():
        print(f"{form:8} us a row: {', '.join(f'{x:.2f}' for x in figures)}")
    mine, floor = (statistics.median(per_row[f]) for f in ("activity", "DELETE"))
    print(f"activity {mine / floor:.2f}x one DELETE (median {mine:.2f} against {floor:.2f} us)")
    # The first round is the pool's first sweep: its session plans every prepared read.
    later = [r for r in cpu_rounds[1:] if r] or [r for r in cpu_rounds if r]
    if later:
        print(
            "client CPU, median ms of the rounds after the first: "
            + "; ".join(
                f"{k} {statistics.median(r[k] for r in later if k in r):.2f}" for k in later[0]
            )
        )
    floor_ms = await pipeline_floor(url)
    print(f"client CPU of a pipeline of three trivial prepared statements: {floor_ms:.2f} ms")
    if statements:
        print(
            "outside the statements, median ms: "
            + "; ".join(f"{form} {statistics.median(ms):.1f}" for form, ms in outside.items())
        )
    await pool.close()
    await conn.close()


async def on_embedded_server(scratch: Path, args: argparse.Namespace) -> None:
    # PostgreSQL's own defaults for what the bench tunes, as case 12's default-settings server
    # (and fsync on: the embedded server's own default is off).
    settings = {**steady.DEFAULT_SETTINGS, "fsync": "on"}
    if args.statements:
        settings |= {"shared_preload_libraries": "pg_stat_statements"}
    async with embedded_postgres(scratch, settings) as server:
        sweep = SweepSettings(batch_target_ms=args.batch_target_ms)
        await measure(server.url(), args.rows, args.rounds, sweep, args.statements)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--batch-target-ms", type=int, default=SweepSettings.batch_target_ms)
    parser.add_argument(
        "--statements",
        action="store_true",
        help="load pg_stat_statements and print each round's server time beside the rest",
    )
    args = parser.parse_args()
    with scratch_dir("purge-bench-") as scratch:
        asyncio.run(on_embedded_server(scratch, args))


if __name__ == "__main__":
    main()
