"""Case 11 `tenants` (issue 18): one table pattern over thousands of tenant schemas, end to end.

A scratch database on the bench's server gets `--tenants` schemas (5,000 by default),
`tenant_NNNN`, each with one small `sessions(id bigint identity primary key, expires_at bigint
not null)` table indexed on `expires_at`, holding one expired row and one live one. One config
names them all with one pattern target (`table = "tenant_*.sessions"`), as a user writes it;
an in-process worker is built from it as `pg-purge run` builds it (its pool included). Passes
are started by a client on a Temporal dev server and their results awaited, so a figure is the
whole pass: the pattern's expansion, the children, their continue-as-new runs, the result.

The forms, in one run, each on freshly re-armed tables (one expired row back in every table):

- `first`: the first pass a fresh worker runs (tuned limits): its sandbox imports, its pool's
  first connections, every match's target built and planned for the first time;
- `defaults`: a pass at the config's default `[pass]` (max_concurrent 4, max_per_database 1);
- `per_database`: the default max_concurrent (4) with max_per_database raised to it;
- `tuned`: a pass with `max_concurrent = 8, max_per_database = 8`;
- the floor a careful DBA types by hand, one DELETE a table, each committed on its own:
  `floor_do`, a PL/pgSQL DO loop over the schemas on one connection (COMMIT after each);
  `floor_client`, a client loop on one connection; `floor_client_N`, N such clients at once,
  each over its share of the schemas.

Every pass's histories are read back, parent and every child run (continue-as-new followed
from the child's started event and each run's last event): events and the largest payload of
each run, against Temporal's warnings. The activity's own cost is timed apart: direct calls
through ActivityEnvironment, one tenant each, as a pass makes them; then a few more whose every
statement the server received is counted from its log (the pool's check, BEGIN, COMMIT and SET
included) with its server time, and printed against issue 37's goal (at most 8).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import re
import statistics
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from psycopg import AsyncConnection, sql
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment

from activities.builtin_kinds import build_registry
from activities.inputs import PurgeStep
from activities.sweep import PurgeActivities
from bench.cases import Bench
from bench.cpu import CpuMeter, postmaster_pid
from bench.data import flush_counts
from bench.report import render_table
from bench.services import config_worker, extra_workers, scratch_databases, temporal_dev_server
from purge_config import PurgeConfig, parse_config
from purge_ops.connect import check_unless_quiet
from purge_ops.discover_render import toml_value
from workflows.chunk import LOCAL_ACTIVITY_MARKER

log = logging.getLogger("bench")

DEFAULT_TENANTS = 5_000
HOUR_MS = 3_600_000
#: Live rows expire a week after the bench's instant: live through every pass of the run.
WEEK_MS = 7 * 86_400_000
#: Schemas created per round trip.
CREATE_BATCH = 500
#: Independent clients of the parallel floor (the tuned pass's max_concurrent).
FLOOR_CLIENTS = 8
#: Direct activity calls, each on a tenant of its own, after one cold call; then calls whose
#: statements the server counts (the first of them uncounted: its pool's first connections).
DIRECT_CALLS = 20
COUNTED_CALLS = 6
#: Issue 37's goal: statements the server receives for one small table.
GOAL_STATEMENTS = 8
#: Ledger sizes at which the sweep's per-target ledger cleanup is timed apart.
LEDGER_SIZES = (5_000, 120_000, 840_000)
#: Issue 37's goals (tuned limits; the defaults), and Temporal's documented warnings.
GOAL_MS = 8.0
GOAL_DEFAULTS_MS = 15.0
WARN_EVENTS = 10_240
WARN_PAYLOAD = 512 * 1024

PAYLOADS = "temporal.api.common.v1.Payloads"
PAYLOAD = "temporal.api.common.v1.Payload"

#: The forms, in report order: (key, label).
FORMS = (
    ("first", "pass, first on a fresh worker (tuned limits)"),
    ("defaults", "pass, defaults: max_concurrent 4, max_per_database 1"),
    ("per_database", "pass, max_concurrent 4 (the default), max_per_database 4"),
    ("tuned", "pass, tuned: max_concurrent 8, max_per_database 8"),
    ("floor_do", "floor: DO loop, one DELETE + COMMIT a table, one connection"),
    ("floor_client", "floor: client loop, one DELETE a table, one connection"),
    ("floor_client_n", f"floor: {FLOOR_CLIENTS} client loops at once"),
)
PASSES = ("first", "defaults", "per_database", "tuned")
#: Each pass's `[pass]` limits (none: the defaults).
LIMITS: dict[str, dict[str, int]] = {
    "first": {"max_concurrent": 8, "max_per_database": 8},
    "defaults": {},
    "per_database": {"max_concurrent": 4, "max_per_database": 4},
    "tuned": {"max_concurrent": 8, "max_per_database": 8},
}


@dataclass
class RunHistory:
    """One workflow run of a pass, read back from its history."""

    workflow_id: str
    run: int
    """0 for a workflow's first run, 1 after its first continue-as-new, ..."""
    events: int
    largest_payload: int
    """Bytes: the largest Payloads (or lone Payload) of any of its events."""
    largest_in: str
    """The event type holding it."""


@dataclass
class PassHistory:
    runs: list[RunHistory] = field(default_factory=list)
    activities: int = 0
    """Activity tasks and local activities (a child of small tables', workflows.chunk)."""
    local: int = 0
    """Of `activities`, the local ones."""
    activity_s: float = 0.0
    """Sum over every activity of its started-to-completed time (the worker's own measure; a
    local sweep's as its report measured it)."""
    schedule_to_start_ms_median: float = 0.0
    expand_s: float = 0.0
    """From the parent's start to its first child's start: the clock, the pattern's pages."""

    @property
    def workflows(self) -> int:
        return len({r.workflow_id for r in self.runs})

    @property
    def max_events(self) -> RunHistory:
        return max(self.runs, key=lambda r: r.events)

    @property
    def max_payload(self) -> RunHistory:
        return max(self.runs, key=lambda r: r.largest_payload)


@dataclass
class TenantsForm:
    form: str
    seconds: float
    removed: int
    load_before: list[float]
    load_after: list[float]
    cpu: dict[str, float] = field(default_factory=dict)
    ledger_rows: int | None = None
    """purge_progress rows when a pass started (the ledger's cleanup scans them, once a pass and
    database on a worker)."""
    history: PassHistory | None = None
    workflow_id: str = ""


@dataclass
class StatementCost:
    statement: str
    per_call: float
    ms_per_call: float
    """The server's own time (parse, bind and execute), per call."""


@dataclass
class TenantsResult:
    tenants: int
    worker_processes: int = 1
    """Worker processes in all: the bench's own and `python worker.py run` ones."""
    forms: dict[str, TenantsForm] = field(default_factory=dict)
    direct_cold_ms: float = 0.0
    direct_ms: list[float] = field(default_factory=list)
    statements: list[StatementCost] = field(default_factory=list)
    """What the server received for one small table, from its log (empty with --url)."""
    statements_per_call: float = 0.0
    direct_strategy: str = ""
    ledger_expire_ms: dict[int, float] = field(default_factory=dict)

    def per_target_ms(self, form: str) -> float:
        return 1000 * self.forms[form].seconds / self.tenants

    @property
    def direct_median_ms(self) -> float:
        return statistics.median(self.direct_ms) if self.direct_ms else 0.0


def _schema(i: int) -> str:
    return f"tenant_{i:04d}"


async def _create(conn: AsyncConnection[Any], tenants: int, now_ms: int) -> None:
    """The tenants, CREATE_BATCH schemas a round trip (tests/support/tenants.py's shape)."""
    for start in range(0, tenants, CREATE_BATCH):
        statements = [
            sql.SQL(
                "CREATE SCHEMA {s}; "
                "CREATE TABLE {s}.sessions (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
                "expires_at bigint NOT NULL); "
                "CREATE INDEX ON {s}.sessions (expires_at); "
                "INSERT INTO {s}.sessions (expires_at) VALUES ({live});"
            ).format(s=sql.Identifier(_schema(i)), live=sql.Literal(now_ms + WEEK_MS))
            for i in range(start, min(start + CREATE_BATCH, tenants))
        ]
        await conn.execute(sql.SQL("\n").join(statements))
    # Plain DDL for the bench's own bookkeeping: re-arm every table, count what is left.
    await conn.execute("""
CREATE FUNCTION bench_rearm(old bigint, first bigint, n bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE s text;
BEGIN
  FOR s IN SELECT nspname FROM pg_namespace WHERE nspname LIKE 'tenant\\_%'
           ORDER BY 1 OFFSET first LIMIT n LOOP
    EXECUTE format('INSERT INTO %I.sessions (expires_at) VALUES ($1)', s) USING old;
  END LOOP;
END $$;
CREATE FUNCTION bench_left(at bigint, first bigint, n bigint,
                           OUT expired bigint, OUT live bigint, OUT tables bigint)
LANGUAGE plpgsql AS $$
DECLARE s text; e bigint; l bigint;
BEGIN
  expired := 0; live := 0; tables := 0;
  FOR s IN SELECT nspname FROM pg_namespace WHERE nspname LIKE 'tenant\\_%'
           ORDER BY 1 OFFSET first LIMIT n LOOP
    EXECUTE format('SELECT count(*) FILTER (WHERE expires_at <= $1),'
                   ' count(*) FILTER (WHERE expires_at > $1) FROM %I.sessions', s)
      INTO e, l USING at;
    expired := expired + e; live := live + l; tables := tables + 1;
  END LOOP;
END $$;
""")


async def _rearm(conn: AsyncConnection[Any], tenants: int, now_ms: int) -> None:
    """One expired row back in every tenant's table, then a checkpoint: each form starts alike."""
    # CREATE_BATCH tables a transaction: one transaction over all of them runs out of the
    # server's lock table (max_locks_per_transaction).
    for first in range(0, tenants, CREATE_BATCH):
        await conn.execute(
            "SELECT bench_rearm(%s, %s, %s)", (now_ms - HOUR_MS, first, CREATE_BATCH)
        )
    await conn.execute("CHECKPOINT")


async def _check_left(conn: AsyncConnection[Any], tenants: int, form: str) -> None:
    """After a form: no expired row anywhere (as of now), every live row still there."""
    expired = live = tables = 0
    at = int(time.time() * 1000)
    for first in range(0, tenants, CREATE_BATCH):
        cur = await conn.execute("SELECT * FROM bench_left(%s, %s, %s)", (at, first, CREATE_BATCH))
        row = await cur.fetchone()
        assert row is not None
        expired, live, tables = expired + row[0], live + row[1], tables + row[2]
    if (expired, live, tables) != (0, tenants, tenants):
        raise RuntimeError(
            f"tenants: after {form}, {expired} expired and {live} live rows in {tables} tables;"
            f" want 0 and {tenants} in {tenants}"
        )


def _raw(url: str, queue: str, limits: dict[str, int]) -> dict[str, Any]:
    """The config the case's passes and workers run, as a user's TOML file would hold it."""
    raw: dict[str, Any] = {
        "database_url": url,
        "task_queue": queue,
        "targets": [
            {
                "kind": "expiring",
                "name": "sessions",
                "table": "tenant_*.sessions",
                "column": "expires_at",
            }
        ],
    }
    if limits:
        raw["pass"] = limits
    return raw


def _config(url: str, queue: str, limits: dict[str, int]) -> PurgeConfig:
    return parse_config(_raw(url, queue, limits), env={})


def _toml(url: str, queue: str, limits: dict[str, int]) -> str:
    """`_config(url, queue, limits)` as the file a worker process is started with."""
    raw = _raw(url, queue, limits)
    return "".join(f"{key} = {toml_value(value)}\n" for key, value in raw.items())


# -- the floor -------------------------------------------------------------------------------


FLOOR_DO = sql.SQL("""
DO $$
DECLARE s text; n bigint; total bigint := 0;
BEGIN
  FOR s IN SELECT nspname FROM pg_namespace WHERE nspname LIKE 'tenant\\_%' ORDER BY 1 LOOP
    EXECUTE format('DELETE FROM %I.sessions WHERE expires_at <= $1', s) USING {now}::bigint;
    GET DIAGNOSTICS n = ROW_COUNT;
    total := total + n;
    COMMIT;
  END LOOP;
  RAISE NOTICE 'removed %', total;
END $$
""")


async def _schemas(conn: AsyncConnection[Any]) -> list[str]:
    cur = await conn.execute(
        "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'tenant\\_%' ORDER BY 1"
    )
    return [r[0] for r in await cur.fetchall()]


async def _client_loop(url: str, now_ms: int, clients: int) -> int:
    """`clients` connections, each deleting its share of the schemas one statement a table
    (autocommit: each committed on its own). The schema list is read inside the timing."""
    conns = [
        await AsyncConnection.connect(url, autocommit=True, application_name="purge-bench-floor")
        for _ in range(clients)
    ]
    try:
        schemas = await _schemas(conns[0])

        async def one(conn: AsyncConnection[Any], share: list[str]) -> int:
            removed = 0
            for schema in share:
                cur = await conn.execute(
                    sql.SQL("DELETE FROM {} WHERE expires_at <= %s").format(
                        sql.Identifier(schema, "sessions")
                    ),
                    (now_ms,),
                )
                removed += cur.rowcount
            return removed

        counts = await asyncio.gather(
            *(one(conn, schemas[n::clients]) for n, conn in enumerate(conns))
        )
        return sum(counts)
    finally:
        for conn in conns:
            await conn.close()


# -- histories -------------------------------------------------------------------------------


def _largest_payload(message: Message) -> int:
    """The largest Payloads (or a lone Payload outside one) anywhere inside `message`."""
    best = 0
    for fd, value in message.ListFields():
        if fd.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            items = [v for v in value.values() if isinstance(v, Message)]
        elif _repeated(fd):
            items = list(value)
        else:
            items = [value]
        for item in items:
            name = item.DESCRIPTOR.full_name
            size = item.ByteSize() if name in (PAYLOADS, PAYLOAD) else _largest_payload(item)
            best = max(best, size)
    return best


def _repeated(fd: FieldDescriptor) -> bool:
    """protobuf 6 dropped `label` for `is_repeated`; older ones have only `label`."""
    flag = getattr(fd, "is_repeated", None)
    if flag is not None:
        return bool(flag)
    return bool(getattr(fd, "label", 0) == FieldDescriptor.LABEL_REPEATED)


def _at_ms(event: Any) -> float:
    return float(event.event_time.ToMilliseconds() + event.event_time.nanos % 1_000_000 / 1e6)


async def _run_events(client: Client, workflow_id: str, run_id: str | None) -> list[Any]:
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    return list((await handle.fetch_history()).events)


def _local_ms(marker: Any) -> float | None:
    """A local sweep's time, as its report measured it on the worker (`seconds`); None for
    another marker or a failed one. (The marker's own times say nothing here: its
    `original_schedule_time` came after its `complete_time` in the v8 history.)"""
    if marker.marker_name != LOCAL_ACTIVITY_MARKER or "result" not in marker.details:
        return None
    report = json.loads(marker.details["result"].payloads[0].data)
    return 1000 * float(report.get("seconds", 0.0))


async def _pass_history(client: Client, workflow_id: str) -> PassHistory:
    """The parent's history and every run of every child (continue-as-new followed)."""
    result = PassHistory()
    parent = await _run_events(client, workflow_id, None)
    chains: list[tuple[str, str | None, list[Any]]] = [(workflow_id, None, parent)]
    for e in parent:
        if e.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED:
            execution = e.child_workflow_execution_started_event_attributes.workflow_execution
            chains.append((execution.workflow_id, execution.run_id, []))
    started_at = _at_ms(parent[0])
    first_child = next(
        (
            _at_ms(e)
            for e in parent
            if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
        ),
        started_at,
    )
    result.expand_s = (first_child - started_at) / 1000
    run_ms: list[float] = []
    waits: list[float] = []
    for wf_id, run_id, events in chains:
        n = 0
        while True:
            events = events or await _run_events(client, wf_id, run_id)
            largest, where = 0, ""
            scheduled: dict[int, float] = {}
            started: dict[int, float] = {}
            for e in events:
                size = _largest_payload(e)
                if size > largest:
                    largest, where = size, EventType.Name(e.event_type)
                kind = e.event_type
                if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                    scheduled[e.event_id] = _at_ms(e)
                elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                    attrs = e.activity_task_started_event_attributes
                    started[e.event_id] = _at_ms(e)
                    waits.append(_at_ms(e) - scheduled[attrs.scheduled_event_id])
                elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                    done = e.activity_task_completed_event_attributes
                    run_ms.append(_at_ms(e) - started[done.started_event_id])
                elif kind == EventType.EVENT_TYPE_MARKER_RECORDED:
                    took = _local_ms(e.marker_recorded_event_attributes)
                    if took is not None:
                        run_ms.append(took)
                        result.local += 1
            result.runs.append(
                RunHistory(wf_id, n, len(events), largest, where.replace("EVENT_TYPE_", ""))
            )
            last = events[-1]
            if last.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                break
            run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
            events, n = [], n + 1
    result.activities = len(run_ms)
    result.activity_s = sum(run_ms) / 1000
    result.schedule_to_start_ms_median = statistics.median(waits) if waits else 0.0
    return result


# -- the activity alone ----------------------------------------------------------------------


#: A log entry's first line starts with its timestamp (log_line_prefix's %m).
_LOG_ENTRY = re.compile(r"\d{4}-\d\d-\d\d ")
#: A statement's line in the server's log (log_min_duration_statement = 0): its duration, the
#: protocol step (a simple query's `statement`, or an extended one's parse, bind and execute)
#: and its text.
_DURATION = re.compile(r"duration: ([0-9.]+) ms\s+(parse|bind|execute|statement)[^:]*: (.*)")
_TENANT = re.compile(r'"tenant_\d+"')
#: What the counted statements are called when their text says nothing.
EMPTY = "(empty: the pool's check before lending)"


def _log_path(bench: Bench) -> Path | None:
    """The embedded server's log (None with --url: the statements are not counted then)."""
    if bench.data_dir is None:
        return None
    path = bench.data_dir.parent / "postgres.log"
    return path if path.exists() else None


def _direct_pool(url: str, logged: bool) -> AsyncConnectionPool[Any]:
    """A pool as `purge_ops.connect.open_pool` makes it (autocommit, checked before lending);
    `logged`, the server logs every statement of its connections, and its time (only theirs:
    log_min_duration_statement = 0 set by each connection's options)."""
    options = "-c log_min_duration_statement=0" if logged else None
    return AsyncConnectionPool(
        make_conninfo(url, options=options) if options else url,
        open=False,
        min_size=1,
        max_size=4,
        kwargs={"autocommit": True, "application_name": "purge-bench-direct"},
        check=check_unless_quiet,
    )


async def _direct(
    bench: Bench, url: str, config: PurgeConfig, result: TenantsResult, conn: AsyncConnection[Any]
) -> None:
    """Direct calls through ActivityEnvironment, as one pass makes them (one instant, one run):
    one cold call (its pool's first connections, the ledger's cleanup, its target built), then
    DIRECT_CALLS timed, each on its own tenant holding one expired row; then, on a pool whose
    connections have the server log every statement, COUNTED_CALLS more, each statement the
    server received counted from its log: the pool's check, BEGIN, COMMIT and SET included."""
    calls = 1 + DIRECT_CALLS + COUNTED_CALLS
    now_ms = int(time.time() * 1000)
    await conn.execute("SELECT bench_rearm(%s, %s, %s)", (now_ms - HOUR_MS, 0, calls))
    run_id = str(uuid.uuid4())

    async def sweep(activities: PurgeActivities, n: int) -> float:
        env = ActivityEnvironment()
        env.info = dataclasses.replace(env.info, workflow_run_id=run_id)
        started = time.perf_counter()
        swept = await env.run(
            activities.purge_target, PurgeStep(name="sessions@" + _schema(n), now_ms=now_ms)
        )
        if swept.removed != 1:
            raise RuntimeError(f"tenants: a direct call removed {swept.removed}, want 1")
        result.direct_strategy = swept.strategy
        return 1000 * (time.perf_counter() - started)

    pool = _direct_pool(url, logged=False)
    await pool.open()
    await pool.wait()
    try:
        activities = PurgeActivities(build_registry(config, pool))
        result.direct_cold_ms = await sweep(activities, 0)
        for n in range(1, 1 + DIRECT_CALLS):
            result.direct_ms.append(await sweep(activities, n))
    finally:
        await pool.close()
    log_path = _log_path(bench)
    if log_path is None:
        return
    pool = _direct_pool(url, logged=True)
    await pool.open()
    await pool.wait()
    try:
        activities = PurgeActivities(build_registry(config, pool))
        # A first call on the new pool, uncounted: the rest find its connections made.
        await sweep(activities, 1 + DIRECT_CALLS)
        await asyncio.sleep(0.2)
        offset = log_path.stat().st_size
        for n in range(2 + DIRECT_CALLS, calls):
            await sweep(activities, n)
    finally:
        await pool.close()
    # The server writes its log asynchronously to us: give it a moment.
    await asyncio.sleep(0.5)
    with log_path.open("rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    _count_statements(text, COUNTED_CALLS - 1, result)


def _count_statements(text: str, calls: int, result: TenantsResult) -> None:
    """Each statement the log holds (a simple query's line, or an extended one's execute),
    grouped by its text (the tenant's schema left out), with its server time: parse, bind and
    execute together."""
    counts: dict[str, int] = defaultdict(int)
    times: dict[str, float] = defaultdict(float)
    lines = text.splitlines()
    for n, line in enumerate(lines):
        match = _DURATION.search(line)
        if not match:
            continue
        what = match[3].strip()
        after = lines[n + 1].strip() if n + 1 < len(lines) else ""
        if not what and after and not _LOG_ENTRY.match(after):
            what = after  # a statement that starts with a line break goes on in the next line
        key = " ".join(_TENANT.sub('"tenant_N"', what).split())[:70] or EMPTY
        times[key] += float(match[1])
        if match[2] in ("statement", "execute"):
            counts[key] += 1
    for key, ms in sorted(times.items(), key=lambda kv: -kv[1]):
        result.statements.append(StatementCost(key, counts[key] / calls, ms / calls))
    result.statements_per_call = sum(counts.values()) / calls


async def _ledger_expire_cost(conn: AsyncConnection[Any], result: TenantsResult) -> None:
    """The statement a pass's first activity on a worker and database starts with
    (activities.engine.ledger.ledger_expire), timed on a copy of purge_progress holding 5,000
    rows (one pass of this case), a day of hourly passes and the week the ledger keeps
    (LEDGER_KEEP_MS): all recent, so it deletes none, as on every pass but the first of an
    hour."""
    now_ms = int(time.time() * 1000)
    await conn.execute(
        "CREATE TABLE bench_ledger (LIKE purge_progress INCLUDING ALL)"
        " WITH (autovacuum_enabled = off)"
    )
    try:
        have = 0
        for size in LEDGER_SIZES:
            await conn.execute(
                "INSERT INTO bench_ledger SELECT 'purge-' || (g / 5000), 'run', "
                "'sessions@tenant_' || (g %% 5000), %s - (g / 5000) * 3600000, 1, 1 "
                "FROM generate_series(%s, %s - 1) g",
                (now_ms, have, size),
            )
            have = size
            await conn.execute(flush_counts(conn))
            await conn.execute("VACUUM ANALYZE bench_ledger")
            times = []
            for _ in range(5):
                started = time.perf_counter()
                await conn.execute(
                    "DELETE FROM bench_ledger WHERE now_ms < %s - %s", (now_ms, WEEK_MS + HOUR_MS)
                )
                times.append(1000 * (time.perf_counter() - started))
            result.ledger_expire_ms[size] = statistics.median(times)
    finally:
        await conn.execute("DROP TABLE IF EXISTS bench_ledger")


# -- the case --------------------------------------------------------------------------------


async def run_tenants(
    bench: Bench, scratch: Path, tenants: int, worker_processes: int = 1
) -> TenantsResult:
    """Case 11; with `worker_processes` above 1, that many workers in all: this process's
    and the rest as `python worker.py run` processes of the same config."""
    result = TenantsResult(tenants=tenants, worker_processes=worker_processes)
    async with scratch_databases(bench.conn, bench.url, 1, "t") as urls:
        url = urls[0]
        conn = await AsyncConnection.connect(url, autocommit=True, application_name="purge-bench")
        try:
            started = time.perf_counter()
            await _create(conn, tenants, bench.now_ms)
            log.info("tenants: %d schemas in %.1f s", tenants, time.perf_counter() - started)
            queue = f"bench-{uuid.uuid4().hex[:8]}"
            configs = {form: _config(url, queue, limits) for form, limits in LIMITS.items()}
            inputs = {form: c.pass_input() for form, c in configs.items()}
            for form in PASSES[1:]:
                log.info("tenants: %s input %s", form, {**inputs[form], "targets": "..."})
            async with (
                temporal_dev_server(scratch) as (client, temporal_pid),
                config_worker(client, configs["defaults"]),
                extra_workers(
                    client,
                    configs["defaults"],
                    _toml(url, queue, LIMITS["defaults"]),
                    scratch,
                    worker_processes - 1,
                ) as extra,
            ):
                meter = CpuMeter()
                for who, pid in (
                    ("temporal", temporal_pid),
                    ("postgres", postmaster_pid(bench.data_dir)),
                    *((f"worker {i + 2}", pid) for i, pid in enumerate(extra)),
                ):
                    if pid is not None:
                        meter.pids[who] = pid
                for form, _ in FORMS:
                    await _rearm(conn, tenants, bench.now_ms)
                    ledger = None
                    if form in PASSES:
                        cur = await conn.execute("SELECT count(*) FROM purge_progress")
                        row = await cur.fetchone()
                        ledger = int(row[0]) if row else None
                    load_before = [round(x, 2) for x in os.getloadavg()]
                    cpu = meter.snapshot()
                    workflow_id = f"bench-tenants-{form}-{uuid.uuid4().hex[:8]}"
                    t0 = time.perf_counter()
                    removed = await _run_form(form, client, queue, inputs, url, workflow_id, conn)
                    seconds = time.perf_counter() - t0
                    measured = TenantsForm(
                        form,
                        seconds,
                        removed,
                        load_before,
                        [round(x, 2) for x in os.getloadavg()],
                        meter.since(cpu),
                        ledger,
                        workflow_id=workflow_id if form in PASSES else "",
                    )
                    result.forms[form] = measured
                    log.info(
                        "tenants: %s removed %d in %.3f s (%.2f ms a tenant), load %s",
                        form,
                        removed,
                        seconds,
                        1000 * seconds / tenants,
                        measured.load_after,
                    )
                    if removed != tenants:
                        raise RuntimeError(f"tenants: {form} removed {removed}, want {tenants}")
                    await _check_left(conn, tenants, form)
                for form in PASSES:
                    history = await _pass_history(client, result.forms[form].workflow_id)
                    result.forms[form].history = history
            await _direct(bench, url, configs["defaults"], result, conn)
            await _ledger_expire_cost(conn, result)
        finally:
            await conn.close()
    return result


async def _run_form(
    form: str,
    client: Client,
    queue: str,
    inputs: dict[str, dict[str, Any]],
    url: str,
    workflow_id: str,
    conn: AsyncConnection[Any],
) -> int:
    """One form, timed by the caller; the rows it removed."""
    if form in PASSES:
        report = await client.execute_workflow(
            "Purge", inputs[form], id=workflow_id, task_queue=queue
        )
        targets = report.get("targets")
        if report.get("statuses") != {"ok": targets}:
            raise RuntimeError(f"tenants: {form}: statuses {report.get('statuses')}")
        return int(report["removed"])
    now_ms = int(time.time() * 1000)
    if form == "floor_do":
        # The loop says what it removed in a NOTICE (a DO block returns nothing).
        said: list[str] = []

        def hear(diagnostic: Any) -> None:
            said.append(diagnostic.message_primary or "")

        conn.add_notice_handler(hear)
        try:
            await conn.execute(FLOOR_DO.format(now=sql.Literal(now_ms)))
        finally:
            conn.remove_notice_handler(hear)
        return int(said[-1].split()[-1]) if said else 0
    return await _client_loop(url, now_ms, FLOOR_CLIENTS if form == "floor_client_n" else 1)


# -- report ----------------------------------------------------------------------------------


def tenants_table(result: TenantsResult) -> str:
    floor = result.per_target_ms("floor_client")
    floor_n = result.per_target_ms("floor_client_n")
    rows = []
    for form, label in FORMS:
        if form not in result.forms:
            continue
        measured = result.forms[form]
        ms = result.per_target_ms(form)
        cpu = measured.cpu
        rows.append(
            [
                label,
                f"{measured.seconds:.2f}",
                f"{ms:.2f}",
                f"{ms / floor:.1f}x" if floor else "-",
                f"{ms / floor_n:.1f}x" if floor_n else "-",
                ", ".join(f"{cpu.get(k, 0.0):.1f}" for k in ("bench", "temporal", "postgres")),
                f"{measured.load_before[0]:.2f} -> {measured.load_after[0]:.2f}",
            ]
        )
    return render_table(
        (
            ("form", "<"),
            ("s", ">"),
            ("ms/tenant", ">"),
            ("x floor 1 conn", ">"),
            (f"x floor {FLOOR_CLIENTS} conns", ">"),
            ("CPU s: bench, temporal, postgres", "<"),
            ("load 1m", "<"),
        ),
        rows,
    )


def tenants_history_table(result: TenantsResult) -> str:
    rows = []
    for form in PASSES:
        history = result.forms[form].history if form in result.forms else None
        if history is None:
            continue
        big, heavy = history.max_events, history.max_payload
        rows.append(
            [
                form,
                f"{history.workflows} / {len(history.runs)}",
                f"{big.events:,} ({_who(big)})",
                f"{heavy.largest_payload:,} ({_who(heavy)}, {heavy.largest_in})",
                f"{history.expand_s:.2f}",
                f"{history.activities:,}"
                + (f" ({history.local:,} local)" if history.local else ""),
                f"{history.activity_s:.1f}",
                f"{history.schedule_to_start_ms_median:.1f}",
            ]
        )
    return render_table(
        (
            ("pass", "<"),
            ("workflows / runs", ">"),
            (f"max events (warn {WARN_EVENTS:,})", "<"),
            (f"max payload B (warn {WARN_PAYLOAD:,})", "<"),
            ("to 1st child s", ">"),
            ("activities", ">"),
            ("activity s (sum)", ">"),
            ("sched-to-start ms p50", ">"),
        ),
        rows,
    )


def _who(run: RunHistory) -> str:
    tail = run.workflow_id.rpartition("-chunk-")
    name = f"chunk {tail[2]}" if tail[1] else "parent"
    return f"{name} run {run.run}" if tail[1] else name


def tenants_lines(result: TenantsResult) -> list[str]:
    n = result.tenants
    direct = result.direct_median_ms
    lines = [
        f"activity alone (ActivityEnvironment, as one pass calls it: one instant, one tenant a"
        f" call, one expired row each, strategy {result.direct_strategy or '-'}): first call"
        f" {result.direct_cold_ms:.1f} ms (pool, ledger cleanup, target built), then median"
        f" {direct:.2f} ms over {len(result.direct_ms)} calls (min"
        f" {min(result.direct_ms, default=0):.2f}, max {max(result.direct_ms, default=0):.2f})",
    ]
    if result.statements:
        verdict = "met" if result.statements_per_call <= GOAL_STATEMENTS else "NOT met"
        lines.append(
            f"statements the server received for one small table (its log, pool check, BEGIN,"
            f" COMMIT and SET included): {result.statements_per_call:.1f} a call; goal at most"
            f" {GOAL_STATEMENTS}, {verdict}; each with its server time (parse, bind, execute):"
        )
        lines += [
            f"  {s.per_call:4.1f} x {s.ms_per_call:6.3f} ms  {s.statement}"
            for s in result.statements
        ]
    else:
        lines.append("statements a small table: not counted (no server log to read with --url)")
    for form in PASSES:
        if form not in result.forms:
            continue
        measured = result.forms[form]
        seconds, history, cpu = measured.seconds, measured.history, measured.cpu
        line = f"{form}: {seconds:.1f} s"
        if history is not None and history.activity_s:
            worker_s = history.activity_s
            line += (
                f"; activities {worker_s:.1f} s summed (started to completed, the worker's own"
                f" measure: {1000 * worker_s / history.activities:.1f} ms each,"
                f" {worker_s / seconds:.1f} in flight on average)"
            )
            if worker_s <= seconds * 1.1:
                # About one target at a time (the defaults before small matches swept together):
                # what is not an activity is Temporal's (and the spread's).
                rest = seconds - worker_s
                line += (
                    f"; Temporal's share {rest:.1f} s = {100 * rest / seconds:.0f}%"
                    f" ({1000 * rest / n:.2f} ms a tenant); at the direct call's {direct:.2f} ms"
                    f" the activities would take {direct * n / 1000:.1f} s"
                )
        total_cpu = sum(cpu.values())
        if total_cpu:
            line += (
                f"; CPU {total_cpu:.1f} s in {seconds:.1f} s"
                f" ({100 * total_cpu / seconds / (os.cpu_count() or 1):.0f}% of the cores),"
                f" Temporal server {100 * cpu.get('temporal', 0.0) / total_cpu:.0f}% of it"
            )
            others = [f"{who} {s:.1f} s" for who, s in cpu.items() if who.startswith("worker ")]
            if others:
                line += f"; the bench process (its worker) {cpu.get('bench', 0.0):.1f} s, "
                line += ", ".join(others)
        lines.append(line)
        if measured.ledger_rows is not None:
            lines.append(f"  purge_progress held {measured.ledger_rows:,} rows when it started")
    if result.ledger_expire_ms:
        lines.append(
            "ledger cleanup a pass runs once a worker and database (DELETE FROM purge_progress"
            " WHERE now_ms <"
            " ..., no index on now_ms), deleting nothing: "
            + ", ".join(
                f"{ms:.2f} ms at {size:,} rows" for size, ms in result.ledger_expire_ms.items()
            )
        )
    for form, goal in (("defaults", GOAL_DEFAULTS_MS), ("tuned", GOAL_MS)):
        if form in result.forms:
            ms = result.per_target_ms(form)
            verdict = "met" if ms <= goal else "NOT met"
            lines.append(f"goal at most {goal:g} ms a tenant, {form}: {ms:.2f} ms, {verdict}")
    return lines
