"""Case 12 `steady`: the hourly steady state of a big table, one hour's rows a round.

A table of `--steady-rows` rows (default 5 x `--rows`) created over 100 hours in id order: row i
was created at `start + i * 1 h / (rows / 100)`, so each hour holds 1% of the table, together at
the front of the heap and of the `created_ms` index, as a table written in time order leaves them.
The target is `expiring` on `created_ms` with a `max_age`, the way a user configures an events
or audit table. Built once per server with one INSERT ... SELECT over generate_series, then its
primary key and index, then VACUUM (ANALYZE): the heap all-visible, as a real table's is.

Each round removes the next hour's rows (the oldest hour left; hour 0 by an unmeasured DELETE
first), in turn by:

- (a) one hand-typed `DELETE FROM steady WHERE created_ms <= $cutoff`;
- (b) the activity, through ActivityEnvironment, as the other cases run it;
- (b) through Temporal: a `Purge` pass started by a client and its result awaited, run by an
  in-process worker built from a config (as cases 9 and 10). The workflow takes its instant from
  its own clock, so each such round gets a worker of its own whose config's `max_age` puts the
  pass's cutoff at the end of that hour (the instant a few ms late moves it by about one row at
  100,000 rows an hour); a warm-up pass over a small table first, unmeasured, so the round does
  not pay the worker's first workflow task or its pool's first connections.

Before each round: none of the table in shared_buffers (the OS cache keeps what it has), a
CHECKPOINT. After it: no row left at or before its cutoff, and the table's row count down by
exactly what the form said it removed; then VACUUM (ANALYZE), untimed, as autovacuum would run
between two hourly passes. The figure is time per row removed, median over the rounds of each
form, against the DELETE's.

That VACUUM leaves the index as it is when under 2% of the heap's pages hold dead rows
(PostgreSQL's index-cleanup bypass, autovacuum's too): one hour's rows are 1% of the pages, so
every other round starts with the last hour's dead entries still at the front of the index, and
runs slower (both forms: about 0.1 us a row more). The rounds alternate their forms' order, so
each form meets both states; the figures are also printed by state (`--cases steady` lines
"index clean" and "index holding the last hour's dead entries").

Run twice: on a PostgreSQL with PostgreSQL's defaults for what the bench tunes (shared_buffers
128MB, so the table does not fit; max_wal_size 1GB; checkpoint_timeout 5min), and on the bench's
own server (tuned: `--shared-buffers`, default 1GB). With `--url`, once, on that server.

Last, one more hour is swept by the activity with every statement recorded, in order: each call's
time at the client (a pipelined statement is only queued, its round trip lands on the pipeline's
exit) and, on an embedded server, each statement's own time from the server's log
(`log_min_duration_statement = 0` on that pool's connections only).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import statistics
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psycopg import AsyncConnection, sql
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool
from temporalio.client import Client

from activities import builtin_kinds as kinds
from bench import data as tables
from bench import server
from bench.backlog import database_bench
from bench.cases import Bench, _lsn, _wal_since
from bench.forms import run_target
from bench.services import (
    TargetEntry,
    config_worker,
    embedded_postgres,
    fleet_config,
    temporal_dev_server,
)
from bench.stats import FormResult, FormRun, WriterRun, median_of, summarize
from purge_config.names import TableName
from purge_ops.connect import check_unless_quiet

log = logging.getLogger("bench")

HOUR_MS = 3_600_000
HOURS = 100
TABLE = "steady"
#: The warm-up pass's table: the same shape, a few rows, none expired.
WARM_TABLE = "steady_warm_up"
FORMS = ("delete", "ours", "ours_temporal")
#: Rounds of each form per `--repeat`: each round is one hour's rows, cheap next to the build,
#: and single rounds vary by 2-3x on a shared machine.
ROUNDS_PER_REPEAT = 3
#: `steady_rows` default: this many times --rows.
SCALE = 5
#: What PostgreSQL itself defaults to for every setting the bench's own server tunes.
DEFAULT_SETTINGS = {
    "full_page_writes": "on",
    "shared_buffers": "128MB",
    "max_wal_size": "1GB",
    "min_wal_size": "80MB",
    "checkpoint_timeout": "5min",
    "maintenance_work_mem": "64MB",
}
#: Seconds between writing a round's config and its pass's start: room for the worker to start
#: and run its warm-up pass, so the pass starts when its `max_age` was computed for.
E2E_LEAD_S = 4.0


@dataclass(frozen=True)
class Hours:
    """`rows` rows over HOURS hours in id order; `start_ms` is row 0's `created_ms`."""

    rows: int
    start_ms: int

    @property
    def per_hour(self) -> int:
        return self.rows // HOURS

    def cutoff(self, hour: int) -> int:
        """The last instant of `hour` (0-based): rows of hours 0..hour are at or before it."""
        return self.start_ms + (hour + 1) * HOUR_MS - 1

    def label(self, setting: str) -> str:
        return f"{self.rows:,} rows, 100 hours, {self.per_hour:,} an hour; {setting}"


@dataclass
class Statement:
    """One statement the profiled activity sent, in order."""

    text: str
    client_ms: float
    at_ms: float
    """When it was sent, from the activity's start."""


@dataclass
class SteadyProfile:
    """Every statement of one activity on one hour, and what the server logged for them."""

    setting: str
    removed: int
    seconds: float
    batches: int | None
    client: list[Statement] = field(default_factory=list)
    server: list[tuple[str, float, str]] = field(default_factory=list)
    """(what: parse, bind, execute or statement; ms; text), from the server's log."""


@dataclass
class SteadyResult:
    results: list[FormResult] = field(default_factory=list)
    profiles: list[SteadyProfile] = field(default_factory=list)


@dataclass
class _Where:
    """One server's run: its bench, label, and log file (embedded only)."""

    bench: Bench
    setting: str
    log_path: Path | None


async def run_steady(
    bench: Bench, scratch: Path, rows: int, fsync: bool, *, both: bool = True
) -> SteadyResult:
    """The rounds on a default-settings server and on the bench's own (tuned) one."""
    result = SteadyResult()
    data = Hours(rows=rows - rows % HOURS, start_ms=bench.now_ms - HOURS * HOUR_MS)
    async with temporal_dev_server(scratch) as (client, _):
        if bench.data_dir is not None:
            settings = {**DEFAULT_SETTINGS, "fsync": "on" if fsync else "off"}
            async with (
                embedded_postgres(scratch, settings) as postgres,
                database_bench(bench, postgres.url(), postgres.data_dir, "s") as here,
            ):
                where = _Where(here, "default settings", postgres.base_dir / "postgres.log")
                await _run_server(where, client, data, result)
                bench.all_runs.extend(here.all_runs)
            if not both:
                return result
        async with database_bench(bench, bench.url, bench.data_dir, "s") as here:
            log_path = bench.data_dir.parent / "postgres.log" if bench.data_dir else None
            setting = "tuned" if bench.data_dir is not None else "the --url server"
            await _run_server(_Where(here, setting, log_path), client, data, result)
            bench.all_runs.extend(here.all_runs)
    return result


async def _run_server(where: _Where, client: Client, data: Hours, result: SteadyResult) -> None:
    bench = where.bench
    settings = await server.server_settings(bench.conn)
    where.setting += f", shared_buffers {settings.get('shared_buffers')}"
    started = time.perf_counter()
    await _build(bench.conn, data)
    size = await _size(bench.conn)
    log.info(
        "steady (%s): %s rows built in %.1f s, %s with indexes",
        where.setting,
        f"{data.rows:,}",
        time.perf_counter() - started,
        size,
    )
    runs: dict[str, list[FormResult]] = {form: [] for form in FORMS}
    # Hour 0 by a DELETE, unmeasured: the first round after the build pays for what the build
    # left (the checkpoint's backlog, the first reads of the index's upper levels).
    _, total, dirty = await _round(where, client, data, "delete", 0, data.rows, False)
    hour = 1
    for block in range(bench.repeat * ROUNDS_PER_REPEAT):
        order = FORMS if block % 2 == 0 else tuple(reversed(FORMS))
        for form in order:
            run, total, dirty = await _round(where, client, data, form, hour, total, dirty)
            run.notes["table_size"] = size
            runs[form].append(run)
            hour += 1
    profile = await _profile(where, data, hour, total)
    result.profiles.append(profile)
    bench.all_runs.extend(r for form in FORMS for r in runs[form])
    per_row = {form: statistics.median(_us_per_row(r) for r in runs[form]) for form in FORMS}
    for form in FORMS:
        chosen = median_of(runs[form])
        chosen.notes = {
            **chosen.notes,
            "us_per_row": per_row[form],
            "us_per_row_all": [round(_us_per_row(r), 3) for r in runs[form]],
            # Per the index's state at the round's start (see the module's docstring).
            "us_per_row_by_index": {
                state: round(statistics.median(figures), 3)
                for state in ("clean", "dirty")
                if (
                    figures := [_us_per_row(r) for r in runs[form] if r.notes.get("index") == state]
                )
            },
        }
        # Per row removed: the pass through Temporal removes a few rows more or less than one
        # hour's, its instant being its own clock's.
        chosen.ratio = per_row[form] / per_row["delete"] if per_row["delete"] else None
        result.results.append(chosen)


def _us_per_row(result: FormResult) -> float:
    return 1e6 * result.seconds / result.removed if result.removed else 0.0


async def _build(conn: AsyncConnection[Any], data: Hours) -> None:
    """One INSERT ... SELECT, then the keys (as a restore builds them), then VACUUM (ANALYZE) so
    the heap is all-visible and hinted, as a table that has lived a while is."""
    for name, rows in ((TABLE, data.rows), (WARM_TABLE, 100)):
        table = sql.Identifier(name)
        await conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id bigint NOT NULL, created_ms bigint NOT NULL,"
                " user_id bigint, body text) WITH (autovacuum_enabled = false)"
            ).format(table)
        )
        # The warm-up table's rows are all a day in the future: a pass over it removes none.
        start = data.start_ms if name == TABLE else data.start_ms + (HOURS + 24) * HOUR_MS
        await conn.execute(
            sql.SQL(
                "INSERT INTO {} SELECT i, {} + i * {} / {}, mod(i, 1000), md5(i::text)"
                " FROM generate_series(0::bigint, {}) i"
            ).format(
                table,
                sql.Literal(start),
                sql.Literal(HOUR_MS),
                sql.Literal(data.per_hour),
                sql.Literal(rows - 1),
            )
        )
        # Only the build's sessions: the server's own setting stays as configured.
        await conn.execute("SET maintenance_work_mem = '512MB'")
        await conn.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (id)").format(table))
        await conn.execute(sql.SQL("CREATE INDEX ON {} (created_ms)").format(table))
        await conn.execute("RESET maintenance_work_mem")
        await conn.execute(tables.flush_counts(conn))
        await conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(table))
    cur = await conn.execute(
        sql.SQL("SELECT count(*), min(created_ms), max(created_ms) FROM {}").format(
            sql.Identifier(TABLE)
        )
    )
    row = await cur.fetchone()
    assert row is not None
    if int(row[0]) != data.rows or int(row[1]) != data.start_ms:
        raise RuntimeError(f"steady: built {row[0]} rows from {row[1]}, want {data.rows}")
    if int(row[2]) > data.cutoff(HOURS - 1):
        raise RuntimeError(f"steady: a row at {row[2]} lies after the 100th hour")


async def _size(conn: AsyncConnection[Any]) -> str:
    cur = await conn.execute(
        "SELECT pg_size_pretty(pg_table_size(%s::regclass)) || ' heap, '"
        " || pg_size_pretty(pg_total_relation_size(%s::regclass))",
        (TABLE, TABLE),
    )
    row = await cur.fetchone()
    return str(row[0]) if row else "?"


async def _round(
    where: _Where, client: Client, data: Hours, form: str, hour: int, total: int, dirty: bool
) -> tuple[FormResult, int, bool]:
    """One form on `hour`'s rows: settle, time, check, vacuum. `dirty`: the index holds the
    last hour's dead entries (its VACUUM bypassed index cleanup). Returns the result, the
    table's row count after it and whether this round's VACUUM left its dead entries."""
    bench = where.bench
    conn = bench.conn
    # None of the table in shared_buffers: the next hour's rows were written 100 hours ago.
    await tables.make_cold(conn, "public", TABLE, None)
    await conn.execute("CHECKPOINT")
    cutoff = data.cutoff(hour)
    lsn = await _lsn(conn)
    if form == "delete":
        run = await _delete(conn, cutoff)
    elif form == "ours":
        target = kinds.expiring(
            bench.pool, f"steady_{hour}", TableName(TABLE, "public"), "created_ms", HOURS * HOUR_MS
        )
        run = await run_target(target, cutoff + HOURS * HOUR_MS)
    else:
        run, cutoff = await _through_temporal(bench, client, cutoff)
    wal = await _wal_since(conn, lsn)
    cur = await conn.execute(
        sql.SQL("SELECT count(*) FILTER (WHERE created_ms <= %s), count(*) FROM {}").format(
            sql.Identifier(TABLE)
        ),
        (cutoff,),
    )
    row = await cur.fetchone()
    assert row is not None
    left, after = int(row[0]), int(row[1])
    # Exact: the rows gone are the rows the form said it removed, and none at or before the
    # cutoff is left.
    lost = (total - after) - run.removed
    if left or lost:
        raise RuntimeError(
            f"steady: {form} on hour {hour}: {left} rows left at or before the cutoff,"
            f" {total - after} gone but {run.removed} reported"
        )
    result = summarize(
        "steady",
        data.label(where.setting),
        form,
        data.rows,
        data.per_hour,
        run,
        WriterRun([], [], [], 0, None),
        left=left,
        lost=lost,
        wal_total=wal,
    )
    log.info(
        "steady (%s): hour %d by %s: %d rows in %.3f s (%.2f us a row)",
        where.setting,
        hour,
        form,
        run.removed,
        run.seconds,
        _us_per_row(result),
    )
    result.notes["index"] = "dirty" if dirty else "clean"
    # As autovacuum would between two hourly passes: the dead rows gone, the statistics fresh;
    # the index's dead entries too, unless the bypass left them (the module's docstring).
    said: list[str] = []

    def hear(notice: Any) -> None:
        said.append(notice.message_primary or "")

    conn.add_notice_handler(hear)
    try:
        await conn.execute(tables.flush_counts(conn))
        await conn.execute(sql.SQL("VACUUM (VERBOSE, ANALYZE) {}").format(sql.Identifier(TABLE)))
    finally:
        conn.remove_notice_handler(hear)
    return result, after, any("index scan bypassed" in text for text in said)


async def _delete(conn: AsyncConnection[Any], cutoff: int) -> FormRun:
    """What a DBA types: the hour's rows, by the index, in one statement."""
    statement = sql.SQL("DELETE FROM {} WHERE created_ms <= %s").format(sql.Identifier(TABLE))
    started = time.perf_counter()
    cur = await conn.execute(statement, (cutoff,))
    seconds = time.perf_counter() - started
    return FormRun(max(cur.rowcount, 0), seconds, [seconds * 1000])


async def _through_temporal(bench: Bench, client: Client, cutoff: int) -> tuple[FormRun, int]:
    """A pass through Temporal whose cutoff (its own clock's instant minus `max_age`) is
    `cutoff`, give or take the few ms between the planned and the actual start. Returns the run
    and the pass's real cutoff."""
    due_ms = int(time.time() * 1000 + E2E_LEAD_S * 1000)
    max_age_ms = due_ms - cutoff
    config = fleet_config(
        bench.url,
        {},
        [
            TargetEntry("steady", TABLE, "created_ms", max_age=f"{max_age_ms}ms"),
            TargetEntry("steady_warm_up", WARM_TABLE, "created_ms", max_age=f"{max_age_ms}ms"),
        ],
    )
    async with config_worker(client, config):
        await _pass(client, config, ["steady_warm_up"])
        await asyncio.sleep(max(0.0, due_ms / 1000 - time.time()))
        started = time.perf_counter()
        report = await _pass(client, config, ["steady"])
        seconds = time.perf_counter() - started
    [sweep] = report["swept"]
    if sweep.get("status", "ok") != "ok":
        raise RuntimeError(f"steady: the pass reported {sweep}")
    activity = float(sweep.get("seconds") or 0.0)
    notes: dict[str, object] = {
        "strategy": sweep.get("strategy"),
        "batches": sweep.get("batches"),
        "p95_batch_ms": sweep.get("p95_batch_ms"),
        "activity_seconds": activity,
        "temporal_ms": 1000 * (seconds - activity),
        "late_ms": int(report["now_ms"]) - due_ms,
    }
    run = FormRun(int(sweep["removed"]), seconds, [seconds * 1000], notes)
    return run, int(report["now_ms"]) - max_age_ms


async def _pass(client: Client, config: Any, names: list[str]) -> dict[str, Any]:
    report: dict[str, Any] = await client.execute_workflow(
        "Purge",
        config.pass_input(names),
        id=f"bench-steady-{uuid.uuid4().hex[:8]}",
        task_queue=config.task_queue,
    )
    return report


_RECORDED: list[Statement] = []
#: perf_counter() at the profiled activity's start: each statement's `at_ms` counts from it.
_T0 = [0.0]


class RecordingConnection(AsyncConnection[Any]):
    """Records every `execute`, in order, with its time at the client."""

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        text = query if isinstance(query, str) else query.as_string(self)
        started = time.perf_counter()
        try:
            return await super().execute(query, params, **kwargs)
        finally:
            text = " ".join(text.split()) or "(empty: the pool's check before lending)"
            ms = 1000 * (time.perf_counter() - started)
            _RECORDED.append(Statement(text, ms, 1000 * (started - _T0[0])))


@contextlib.asynccontextmanager
async def _recording_pool(url: str, logged: bool) -> AsyncIterator[AsyncConnectionPool[Any]]:
    """A pool as `purge_ops.connect.open_pool` makes it (autocommit, checked before lending),
    whose connections record their statements and, `logged`, have the server log each one."""
    options = "-c log_min_duration_statement=0" if logged else None
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        make_conninfo(url, options=options) if options else url,
        open=False,
        min_size=1,
        max_size=4,
        connection_class=RecordingConnection,
        kwargs={"autocommit": True, "application_name": "purge-bench-profile"},
        check=check_unless_quiet,
    )
    await pool.open()
    await pool.wait()
    try:
        yield pool
    finally:
        await pool.close()


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) else None


_LOG_ENTRY = re.compile(r"\d{4}-\d\d-\d\d ")
_DURATION = re.compile(r"duration: ([0-9.]+) ms\s+(parse|bind|execute|statement)[^:]*: (.*)")


async def _profile(where: _Where, data: Hours, hour: int, total: int) -> SteadyProfile:
    """One more hour by the activity, every statement recorded (a warm-up call first, on an
    empty hour, so the pool's first connections are not in it)."""
    bench = where.bench
    logged = where.log_path is not None and where.log_path.exists()
    async with _recording_pool(bench.url, logged) as pool:
        target = kinds.expiring(
            pool, "steady_profile", TableName(WARM_TABLE, "public"), "created_ms", HOURS * HOUR_MS
        )
        await run_target(target, data.cutoff(hour) + HOURS * HOUR_MS)
        await tables.make_cold(bench.conn, "public", TABLE, None)
        await bench.conn.execute("CHECKPOINT")
        offset = where.log_path.stat().st_size if logged and where.log_path else 0
        _RECORDED.clear()
        target = kinds.expiring(
            pool, "steady_profile", TableName(TABLE, "public"), "created_ms", HOURS * HOUR_MS
        )
        _T0[0] = time.perf_counter()
        run = await run_target(target, data.cutoff(hour) + HOURS * HOUR_MS)
        recorded = list(_RECORDED)
    profile = SteadyProfile(
        where.setting,
        run.removed,
        run.seconds,
        _int_or_none(run.notes.get("batches")),
        recorded,
    )
    if logged and where.log_path is not None:
        # The server writes its log asynchronously to us: give it a moment.
        await asyncio.sleep(0.5)
        with where.log_path.open("rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
        lines = text.splitlines()
        for n, line in enumerate(lines):
            match = _DURATION.search(line)
            if match:
                # A statement that starts with a line break goes on in the log's next line
                # (unless that is the next entry: the pool's empty check).
                what = match[3].strip()
                after = lines[n + 1].strip() if n + 1 < len(lines) else ""
                if not what and not _LOG_ENTRY.match(after):
                    what = after
                profile.server.append((match[2], float(match[1]), what))
    log.info(
        "steady (%s): profiled hour %d: %d rows in %.3f s, %d statements",
        where.setting,
        hour,
        run.removed,
        run.seconds,
        len(recorded),
    )
    if total - run.removed <= 0:
        raise RuntimeError("steady: the profiled sweep removed the whole table")
    return profile


def steady_lines(result: SteadyResult) -> list[str]:
    """The issue's goal for case 12, per server, with this run's figures."""
    lines = []
    for r in result.results:
        if r.form == "delete" or r.ratio is None:
            continue
        us = r.notes.get("us_per_row")
        where = r.dataset.split("; ", 1)[-1]
        if r.form == "ours":
            verdict = "met" if r.ratio <= 1.3 else "NOT met"
            lines.append(
                f"{verdict:7} steady ({where}): the activity per row vs the DELETE's:"
                f" {r.ratio:.2f}x ({us:.2f} us a row; target <= 1.3x)"
            )
            lines += _by_index(result, r, where)
        else:
            lines.append(
                f"info    steady ({where}): end to end through Temporal per row vs the DELETE's:"
                f" {r.ratio:.2f}x ({us:.2f} us a row)"
            )
    return lines


def _by_index(result: SteadyResult, ours: FormResult, where: str) -> list[str]:
    """The activity against the DELETE in the rounds that began on a clean index, and in those
    that began with the last hour's dead entries in it."""
    [delete] = [r for r in result.results if r.form == "delete" and r.dataset == ours.dataset]
    mine, floor = (
        ours.notes.get("us_per_row_by_index", {}),
        delete.notes.get("us_per_row_by_index", {}),
    )
    names = {"clean": "index clean", "dirty": "index holding the last hour's dead entries"}
    return [
        f"info    steady ({where}), {names[state]}: {mine[state] / floor[state]:.2f}x"
        f" ({mine[state]:.2f} against {floor[state]:.2f} us a row)"
        for state in ("clean", "dirty")
        if state in mine and state in floor
    ]


def _is_batch(text: str) -> bool:
    return text.startswith(("WITH found", "DELETE"))


def profile_summary(p: SteadyProfile) -> list[str]:
    """Where one activity's time went: before its first batch, in its batches' statements on the
    server, and between them (commits, round trips, the worker's own work)."""
    sent = [s.at_ms for s in p.client if _is_batch(s.text)]
    if not sent:
        return []
    before = sum(ms for _, ms, text in p.server[: _first_batch(p.server)])
    executed = [ms for what, ms, text in p.server if what == "execute" and _is_batch(text)]
    total = 1000 * p.seconds
    return [
        f"  summary: first batch sent at {sent[0]:.1f} ms ({_first_batch(p.server)} log entries"
        f" before it, {before:.1f} ms of them on the server); {len(sent)} batches from"
        f" {sent[0]:.1f} to {total:.1f} ms, their statements' server time"
        f" {sum(executed):.1f} ms ({', '.join(f'{ms:.1f}' for ms in executed)}): "
        f"{total - sent[0] - sum(executed):.1f} ms between and after them",
    ]


def _first_batch(server: list[tuple[str, float, str]]) -> int:
    return next((n for n, (_, _, text) in enumerate(server) if _is_batch(text)), len(server))


def steady_profile_lines(result: SteadyResult) -> list[str]:
    """Each profiled activity's statements, in order, with their times."""
    lines: list[str] = []
    for p in result.profiles:
        lines.append(
            f"steady ({p.setting}): one activity, {p.removed:,} rows in {1000 * p.seconds:.1f} ms,"
            f" {p.batches} batches, {len(p.client)} execute calls, in order (sent at ms from"
            " the activity's start; ms at the client):"
        )
        lines += [f"  {s.at_ms:7.2f} {s.client_ms:7.2f}  {s.text[:140]}" for s in p.client]
        if p.server:
            lines.append(f"  the server's log of the same ({len(p.server)} entries, ms):")
            lines += [f"  {ms:8.3f}  {what:9} {text[:140]}" for what, ms, text in p.server]
        lines += profile_summary(p)
    return lines
