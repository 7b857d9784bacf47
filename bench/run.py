"""`python -m bench.run`: one DELETE, this package's sweep and the `key IN` loop, side by side.

Against the embedded PostgreSQL 18 (started and stopped here) or `--url`; every table lives in a
scratch schema or a scratch database, dropped at the end. See bench/README.md for what is
measured and how.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psycopg import AsyncConnection, sql
from psycopg_pool import AsyncConnectionPool

import activities
from activities.schema import reference_ddl
from bench import noise, report, server
from bench.archive import CASES as ARCHIVE_CASES
from bench.archive import archive_targets, run_archive_case
from bench.backlog import run_backlog
from bench.case_worker import case_worker
from bench.cases import (
    Bench,
    Case,
    build_cases,
    can_checkpoint,
    run_case,
    schema_first,
    warm_sessions,
)
from bench.fleet import FleetResult, fleet_table, fleet_targets, run_fleet
from bench.orchestration import OrchestrationResult, run_orchestration
from bench.partitioned import partitioned_lines, run_partitioned
from bench.services import scratch_dir
from bench.stats import FormResult
from bench.steady import SCALE as STEADY_SCALE
from bench.steady import SteadyResult, run_steady, steady_lines, steady_profile_lines
from bench.tenants import (
    DEFAULT_TENANTS,
    TenantsResult,
    run_tenants,
    tenants_history_table,
    tenants_lines,
    tenants_table,
)
from purge_config.dsn import redact
from purge_dev.servers import EmbeddedPostgres
from purge_ops.connect import open_pool

log = logging.getLogger("bench")

DEFAULT_ROWS = 2_000_000
QUICK_ROWS = 200_000
#: The tenants case's schemas in a smoke run (--quick) unless --tenants.
QUICK_TENANTS = 200
#: Which copy of the package is measured: the bench may run from an export of another commit.
PACKAGE_DIR = str(Path(activities.__file__).resolve().parent.parent)
CASE_ORDER = (
    "interleaved", "clustered", "rate_limit", "scaling", "orchestration", "partitioned",
    *ARCHIVE_CASES, "backlog", "fleet", "tenants", "steady",
)  # fmt: skip
#: The partitioned case's table is this many times --rows (6,000,000 at the default).
PARTITIONED_SCALE = 3


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run",
        description="Measure one DELETE, this package's sweep and the key-IN loop side by side.",
    )
    parser.add_argument("--rows", type=int, help=f"table size (default {DEFAULT_ROWS:,})")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke run: {QUICK_ROWS:,} rows unless --rows, {QUICK_TENANTS} tenants unless"
        " --tenants",
    )
    parser.add_argument("--url", help="measure this PostgreSQL instead of the embedded one")
    parser.add_argument(
        "--cases",
        nargs="+",
        metavar="CASE",
        help=f"a subset, by name or number 1-{len(CASE_ORDER)}: {', '.join(CASE_ORDER)}"
        " (default all)",
    )
    parser.add_argument(
        "--tenants",
        type=int,
        metavar="N",
        help=f"tenant schemas of the tenants case (default {DEFAULT_TENANTS:,}; --quick "
        f"{QUICK_TENANTS})",
    )
    parser.add_argument(
        "--worker-processes",
        type=int,
        default=1,
        metavar="N",
        help="the tenants case's workers in all: the bench's own and N-1 `python worker.py run`"
        " processes of its config (default 1)",
    )
    parser.add_argument(
        "--steady-rows",
        type=int,
        metavar="N",
        help=f"the steady case's table (default {STEADY_SCALE} x --rows)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results here")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every form N times, each on a fresh copy, and report the median (default 1)",
    )
    parser.add_argument(
        "--writer-rate",
        type=float,
        default=200.0,
        help="concurrent writer upserts a second; 0 = as fast as it can (default 200)",
    )
    parser.add_argument(
        "--fsync",
        choices=("on", "off"),
        default="on",
        help="embedded server's fsync (default on)",
    )
    parser.add_argument(
        "--shared-buffers", help="embedded server's shared_buffers (default 1GB)", metavar="SIZE"
    )
    args = parser.parse_args(argv)
    args.rows = args.rows or (QUICK_ROWS if args.quick else DEFAULT_ROWS)
    if args.tenants is None:
        args.tenants = QUICK_TENANTS if args.quick else DEFAULT_TENANTS
    if args.rows < 100:
        parser.error(f"--rows must be at least 100, got {args.rows}")
    args.steady_rows = args.steady_rows or STEADY_SCALE * args.rows
    if args.steady_rows < 10_000:
        parser.error(f"--steady-rows must be at least 10000, got {args.steady_rows}")
    if args.tenants < 1:
        parser.error(f"--tenants must be at least 1, got {args.tenants}")
    if args.worker_processes < 1:
        parser.error(f"--worker-processes must be at least 1, got {args.worker_processes}")
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    args.cases = _select(parser, args.cases)
    return args


def _select(parser: argparse.ArgumentParser, raw: list[str] | None) -> list[str]:
    if not raw:
        return list(CASE_ORDER)
    chosen: set[str] = set()
    for word in (w for item in raw for w in item.split(",") if w):
        number = word.isdigit() and 1 <= int(word) <= len(CASE_ORDER)
        name = CASE_ORDER[int(word) - 1] if number else word
        if name not in CASE_ORDER:
            parser.error(
                f"no case {word!r}; choose from {', '.join(CASE_ORDER)} or 1-{len(CASE_ORDER)}"
            )
        chosen.add(name)
    return [name for name in CASE_ORDER if name in chosen]


@dataclass
class Outcome:
    """Everything one run measured."""

    environment: dict[str, Any]
    results: list[FormResult] = field(default_factory=list)
    """One row per form and dataset: the median run."""
    runs: list[FormResult] = field(default_factory=list)
    """Every run, repeats included."""
    orchestration: OrchestrationResult | None = None
    fleet: FleetResult | None = None
    tenants: TenantsResult | None = None
    steady: SteadyResult | None = None


async def run_bench(
    url: str, args: argparse.Namespace, scratch: Path, data_dir: Path | None
) -> Outcome:
    # SIGTERM ends the run as Ctrl-C does: by cancelling, so every `finally` below still runs.
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    schema = f"purge_bench_{uuid.uuid4().hex[:8]}"
    conn = await AsyncConnection.connect(url, autocommit=True, application_name="purge-bench")
    try:
        await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        # The reference tables, empty: every copy is made LIKE one of them, indexes included.
        await conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(schema)))
        await conn.execute(reference_ddl())
        await conn.execute("RESET search_path")
        embedded = data_dir is not None
        prewarm = await server.enable_prewarm(conn, embedded=embedded)
        checkpoint = await can_checkpoint(conn)
        if not checkpoint:
            log.warning("this role cannot CHECKPOINT: WAL figures will vary with checkpoint timing")
        outcome = Outcome(
            environment={
                "machine": server.machine(),
                "server": "embedded" if embedded else redact(url),
                "package": PACKAGE_DIR,
                "settings": await server.server_settings(conn),
                # Another process busy on a 2-core machine moves every figure: say so in the report.
                "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
                "rows": args.rows,
                "repeat": args.repeat,
                "cases": args.cases,
                "writer_rate": args.writer_rate,
                "prewarm": prewarm,
                "checkpoint_before_each_form": checkpoint,
            }
        )
        # The bench schema on the pool's search_path, so the sweep finds the purge_progress
        # table made there (as a user's worker finds theirs); and a pool that finds none.
        pool = await open_pool(schema_first(url, schema))
        pool_no_ledger = await open_pool(url)
        hand: AsyncConnection[Any] | None = None
        try:
            # The hand forms' session: open as long as the pool's, making no copy (Bench.hand).
            hand = await AsyncConnection.connect(
                url, autocommit=True, application_name="purge-bench-hand"
            )
            if not await _ledger_absent(pool_no_ledger):
                log.warning(
                    "a purge_progress table is on the default search_path: the no-ledger"
                    " form counts in it"
                )
            bench = Bench(
                url=url,
                schema=schema,
                now_ms=int(time.time() * 1000),
                conn=conn,
                pool=pool,
                writer_rate=args.writer_rate,
                checkpoint=checkpoint,
                prewarm=prewarm,
                repeat=args.repeat,
                data_dir=data_dir,
                pool_no_ledger=pool_no_ledger,
                hand=hand,
            )
            await warm_sessions(bench)
            cases = build_cases(args.rows)
            for name in args.cases:
                if name == "orchestration":
                    outcome.orchestration = await run_orchestration(bench, scratch)
                elif name == "partitioned":
                    rows = args.rows * PARTITIONED_SCALE
                    outcome.results.extend(await run_partitioned(bench, rows, scratch))
                elif name in ARCHIVE_CASES:
                    outcome.results.extend(await run_archive_case(bench, name, args.rows, scratch))
                elif name == "backlog":
                    outcome.results.extend(
                        await run_backlog(bench, scratch, args.rows, args.fsync == "on")
                    )
                elif name == "fleet":
                    outcome.fleet = await run_fleet(bench, scratch, args.rows, args.fsync == "on")
                elif name == "tenants":
                    outcome.tenants = await run_tenants(
                        bench, scratch, args.tenants, args.worker_processes
                    )
                elif name == "steady":
                    outcome.steady = await run_steady(
                        bench, scratch, args.steady_rows, args.fsync == "on"
                    )
                    outcome.results.extend(outcome.steady.results)
                else:
                    outcome.results.extend(await _run_plain_case(bench, cases[name], scratch))
            outcome.runs = bench.all_runs
        finally:
            if hand is not None:
                await hand.close()
            await pool.close()
            await pool_no_ledger.close()
        return outcome
    finally:
        await _drop_schema(conn, schema)
        await conn.close()
        loop.remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, _interrupt)


async def _run_plain_case(bench: Bench, case: Case, scratch: Path) -> list[FormResult]:
    """A case of `bench.cases`, with the Temporal dev server and worker its `ours_temporal`
    form's pass runs on where it has one (one dataset: the copy that form sweeps)."""
    if "ours_temporal" not in case.forms:
        return await run_case(bench, case)
    [data] = case.datasets
    copy = f"{case.name}_{data.rows}_ours_temporal"
    async with case_worker(bench, scratch, copy, data.reference_table) as temporal:
        bench.temporal = temporal
        try:
            return await run_case(bench, case)
        finally:
            bench.temporal = None


async def _ledger_absent(pool: AsyncConnectionPool[Any]) -> bool:
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT to_regclass('purge_progress') IS NULL")
        row = await cur.fetchone()
    return bool(row and row[0])


def _interrupt(signum: int, frame: object) -> None:
    # Outside the event loop (starting or stopping PostgreSQL), SIGTERM unwinds as Ctrl-C does.
    raise KeyboardInterrupt


async def _drop_schema(conn: AsyncConnection[Any], schema: str) -> None:
    if conn.closed:
        return
    try:
        # Bounded: a statement of ours still running elsewhere must not hang the exit.
        await conn.execute("SET lock_timeout = '10s'")
        await conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    except Exception as err:
        log.warning("could not drop schema %s (%s); drop it by hand", schema, err)


def _probe_line(runs: list[FormResult]) -> list[str]:
    """How much the machine itself moved over the run's forms (bench.noise), when measured."""
    probes = [float(p) for r in runs if isinstance(p := r.notes.get("probe_ms"), int | float)]
    found = noise.spread(probes)
    return [found.line(f"before each of {found.count} forms")] if found is not None else []


def print_report(outcome: Outcome, elapsed: float) -> None:
    environment, results, orchestration = (
        outcome.environment,
        outcome.results,
        outcome.orchestration,
    )
    settings = environment["settings"]
    mach = environment["machine"]
    out = [
        "",
        f"PostgreSQL {settings.get('server_version')} ({environment['server']}), "
        f"{mach['cpus']} CPUs ({mach['cpu_model']}), {mach['memory_gb']} GB",
        f"package measured: {environment['package']}",
        "settings: " + ", ".join(f"{k}={v}" for k, v in settings.items() if k != "server_version"),
        f"rows {environment['rows']:,}, writer {environment['writer_rate']:g} upserts/s, "
        f"each form run {environment['repeat']}x (median shown), "
        f"prewarm {'on' if environment['prewarm'] else 'off'}, "
        f"checkpoint before each form {_yes(environment['checkpoint_before_each_form'])},"
        f" run took {elapsed:.0f} s",
        f"load average (1, 5, 15 min) at start {environment['load_average_at_start']},"
        f" at end {environment['load_average_at_end']}",
        *_probe_line(outcome.runs),
        "",
    ]
    if results:
        out += [report.forms_table(results), ""]
        scaling = report.scaling_line(results)
        if scaling:
            out += [scaling, ""]
    if orchestration is not None:
        out += [
            f"orchestration: Purge passes over {orchestration.targets} empty targets in "
            f"{orchestration.databases} databases, through a Temporal dev server, and the "
            "same sweeps called directly",
            "",
            report.orchestration_table(orchestration),
            "",
            report.orchestration_history_table(orchestration),
            "",
            *report.orchestration_targets(orchestration),
            "",
        ]
    if outcome.fleet is not None:
        fleet = outcome.fleet
        out += [
            f"fleet: {fleet.databases} databases, each {fleet.rows:,} rows with {fleet.expired:,}"
            f" expired (interleaved), shared_buffers {fleet.shared_buffers}, through Temporal",
            "",
            fleet_table(fleet),
            "",
            *fleet_targets(fleet),
            "",
        ]
    if outcome.tenants is not None:
        tenants = outcome.tenants
        out += [
            f"tenants: one pattern target over {tenants.tenants:,} tenant schemas (one expired"
            " and one live row each), passes through a Temporal dev server, against the DELETEs"
            " a DBA would type"
            + (
                f"; {tenants.worker_processes} worker processes (the bench's own and"
                f" {tenants.worker_processes - 1} `worker.py run`)"
                if tenants.worker_processes > 1
                else ""
            ),
            "",
            tenants_table(tenants),
            "",
            tenants_history_table(tenants),
            "",
            *tenants_lines(tenants),
            "",
        ]
    if results:
        out += ["issue targets (ratios and latencies from this run):"]
        out += ["  " + line for line in report.issue_targets(results)]
        out += ["  " + line for line in archive_targets(results)]
        out += ["  " + line for line in partitioned_lines(results)]
    if outcome.steady is not None:
        out += ["  " + line for line in steady_lines(outcome.steady)]
        out += ["", *steady_profile_lines(outcome.steady)]
    sys.stdout.write("\n".join(out) + "\n")


def _yes(flag: object) -> str:
    return "yes" if flag else "no"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    # The bench's progress at INFO; the package's own loggers (one line per target swept) only
    # at WARNING, so a plan-check warning still shows.
    logging.basicConfig(
        level=logging.WARNING,
        format="%(asctime)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    log.setLevel(logging.INFO)
    postgres: EmbeddedPostgres | None = None
    started = time.perf_counter()
    with scratch_dir("purge-bench-") as scratch:
        try:
            if args.url:
                url = args.url
            else:
                postgres = EmbeddedPostgres(
                    scratch / "postgres",
                    settings=server.embedded_settings(
                        fsync=args.fsync == "on", shared_buffers=args.shared_buffers
                    ),
                )
                log.info("starting the embedded PostgreSQL in %s", scratch)
                postgres.start()
                url = postgres.url()
            data_dir = postgres.data_dir if postgres is not None else None
            outcome = asyncio.run(run_bench(url, args, scratch, data_dir))
        except (KeyboardInterrupt, asyncio.CancelledError):
            log.warning("interrupted; servers stopped, nothing reported")
            return 130
        finally:
            if postgres is not None:
                postgres.stop()
    elapsed = time.perf_counter() - started
    outcome.environment["seconds"] = round(elapsed, 1)
    outcome.environment["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print_report(outcome, elapsed)
    if args.json:
        report.write_json(
            args.json,
            outcome.environment,
            outcome.results,
            outcome.runs,
            outcome.orchestration,
            outcome.fleet,
            outcome.tenants,
            outcome.steady,
        )
        log.info("wrote %s", args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
