"""What a real worker's /metrics shows before and after passes: every series an alert rule needs
exists from the worker's start or its first sweep, at 0 until something happens; and only a sweep
that ran moves a target's gauges and its last-sweep timestamp."""

from __future__ import annotations

import ast
import asyncio
import os
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from temporalio.client import Client
from temporalio.worker import Interceptor

from activities import metrics
from activities.registry import TargetRegistry
from purge_ops.pass_metrics import PassMetrics
from purge_ops.ports import free_ports
from purge_ops.runner import activity_worker, new_worker
from purge_ops.schedule import MEMO_KEY
from tests.support.pace import (
    HandClock,
    budget_clock,
    cut_short_at,
    row_locked,
    until_a_sweep_waits,
)
from tests.support.passes import run_pass
from tests.support.probes import http, samples, scrape, worker
from tests.support.procs import REPO, worker_config
from tests.support.rows import HOUR, idempotency_rows
from tests.support.servers import RunningTemporal
from tests.support.source import parse
from tests.support.tenants import create_tenants, tenant_prefix, tenant_schemas
from tests.test_fleet import hold_table_lock

TARGETS = '[[targets]]\nkind = "idempotency"\n\n[[targets]]\nkind = "auth"\n'

#: A /metrics page as served: each metric's samples, their labels and value.
Page = dict[str, list[tuple[dict[str, str], float]]]


def value(page: Page, name: str, **labels: str) -> float:
    """The one sample of `name` whose labels include `labels`."""
    found = [v for have, v in page.get(name, []) if labels.items() <= have.items()]
    assert len(found) == 1, f"{name}{labels}: {found} in {page.get(name)}"
    return found[0]


async def bodies_around_passes(
    tmp_path: Path,
    temporal_server: RunningTemporal,
    client: Client,
    schema_url: str,
    task_queue: str,
    db: psycopg.Connection[Any],
    real_now: int,
) -> tuple[str, str, str]:
    """A real worker's /metrics text at its start, after a pass that swept x_idempotency (one
    expired row of two) and x_auth, and after a pass that failed (`nope` is no target)."""
    idempotency_rows(db, {"a": real_now - HOUR, "b": real_now + HOUR})
    [port] = free_ports(1)
    config = worker_config(tmp_path / "purge.toml", schema_url, task_queue, TARGETS)
    async with worker(config, temporal_server, port):
        at_start = await metrics_text(port)
        await run_pass(client, task_queue, {"targets": ["x_idempotency", "x_auth"]})
        after_one = await metrics_text(port)
        with pytest.raises(Exception, match="Workflow execution failed"):
            await run_pass(client, task_queue, {"targets": ["x_auth", "nope"]})
        after_two = await metrics_text(port)
    return at_start, after_one, after_two


async def metrics_text(port: int) -> str:
    reply = await http(port, "/metrics")
    assert reply.status == 200, reply.body
    return reply.body


async def pages_around_passes(
    tmp_path: Path,
    temporal_server: RunningTemporal,
    client: Client,
    schema_url: str,
    task_queue: str,
    db: psycopg.Connection[Any],
    real_now: int,
) -> tuple[Page, Page, Page]:
    """The same three pages as samples."""
    at_start, after_one, after_two = await bodies_around_passes(
        tmp_path, temporal_server, client, schema_url, task_queue, db, real_now
    )
    return samples(at_start), samples(after_one), samples(after_two)


def described(body: str) -> dict[str, tuple[str, str]]:
    """Each metric of a /metrics text as its `# HELP` and `# TYPE` lines give it:
    {name: (description, kind)}."""
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", body, re.M))
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", body, re.M))
    return {name: (helps.get(name, ""), kind) for name, kind in types.items()}


async def test_a_pass_records_every_declared_instrument_as_declared(
    tmp_path: Path,
    temporal_server: RunningTemporal,
    client: Client,
    schema_url: str,
    task_queue: str,
    db: psycopg.Connection[Any],
    real_now: int,
) -> None:
    """Every instrument of activities.metrics is served under its declared name, description
    and kind after a pass that swept and a pass that failed, whichever layer recorded it."""
    _, _, after_two = await bodies_around_passes(
        tmp_path, temporal_server, client, schema_url, task_queue, db, real_now
    )

    served = described(after_two)
    assert {i.name: served.get(i.name) for i in metrics.ALL} == {
        i.name: (i.description, i.kind) for i in metrics.ALL
    }
    # And nothing of ours is served that was not declared there.
    assert {name for name in served if name.startswith("purge_")} == {i.name for i in metrics.ALL}


def test_the_operating_guide_lists_every_declared_instrument_with_its_kind() -> None:
    """docs/operating.md's metrics table: one row per declared metric (or a row naming several)
    and its type as declared, nothing else."""
    guide = (REPO / "docs" / "operating.md").read_text()
    listed = {
        name: kind
        for names, kind in re.findall(r"^\| (`purge_[^|]*) \| (\w+) \|", guide, re.M)
        for name in re.findall(r"`(purge_\w+)`", names)
    }

    assert listed == {i.name: i.kind for i in metrics.ALL}


#: A meter's methods that create an instrument (create_histogram, create_gauge_float, ...).
_CREATES = re.compile(r"create_(counter|histogram|gauge)\w*")


def instruments_created(source: str) -> list[int]:
    """The lines of `source` that create a metric instrument."""
    return [
        node.lineno
        for node in ast.walk(parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and _CREATES.fullmatch(node.func.attr)
    ]


def python_sources(root: Path) -> list[Path]:
    """The .py files under `root` outside hidden folders, which are pruned rather than walked:
    a checkout's .venv holds tens of thousands of files (6 s of this test's time)."""
    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [name for name in dirs if not name.startswith(".")]
        found += [Path(folder, name) for name in names if name.endswith(".py")]
    return found


def test_only_activities_metrics_creates_an_instrument() -> None:
    """Every layer records through the one declaration (`metrics.X.on(meter)`), so no name or
    description is spelled twice: no other module of the repository calls a meter's create_*."""
    declaring = REPO / "activities" / "metrics.py"
    ours = python_sources(REPO)
    elsewhere = {
        str(path.relative_to(REPO)): lines
        for path in ours
        if path != declaring and (lines := instruments_created(path.read_text()))
    }

    assert instruments_created(declaring.read_text())
    assert not elsewhere, elsewhere


async def test_pass_counters_and_target_series_start_at_zero_and_count_passes(
    tmp_path: Path,
    temporal_server: RunningTemporal,
    client: Client,
    schema_url: str,
    task_queue: str,
    db: psycopg.Connection[Any],
    real_now: int,
) -> None:
    at_start, after_one, after_two = await pages_around_passes(
        tmp_path, temporal_server, client, schema_url, task_queue, db, real_now
    )

    queue = {"task_queue": task_queue, "workflow_type": "Purge"}
    # Every series names the worker that served it (pid@host, Temporal's identity for it).
    workers = {labels.get("worker") for series in after_one.values() for labels, _ in series}
    assert len(workers) == 1
    assert re.fullmatch(r"\d+@.+", str(workers.pop()))
    assert value(at_start, "purge_passes_completed", **queue) == 0
    assert value(at_start, "purge_passes_failed", **queue) == 0

    assert value(after_one, "purge_passes_completed", **queue) == 1
    assert value(after_one, "purge_pass_seconds_count", **queue) == 1
    for target in ("x_idempotency", "x_auth"):
        assert value(after_one, "purge_target_failures", target=target) == 0
        assert value(after_one, "purge_paused_seconds", target=target) == 0
        assert value(after_one, "purge_partitions_removed", target=target) == 0
        assert value(after_one, "purge_backlog_rows", target=target) == 0
        assert value(after_one, "purge_oldest_expired_age_seconds", target=target) == 0
        assert value(after_one, "purge_batch_p95_seconds", target=target) >= 0
        assert value(after_one, "purge_target_last_sweep_timestamp_seconds", target=target) > (
            real_now / 1000 - 60
        )
    assert value(after_one, "purge_rows_removed", target="x_idempotency") == 1
    # Buckets fit for seconds-long sweeps (the SDK's default would start at 50 s).
    assert value(after_one, "purge_target_seconds_bucket", target="x_auth", le="0.5") >= 0
    assert value(after_one, "purge_pass_seconds_bucket", le="14400", **queue) == 1

    # The failure lands on the series that was at 0 (one series per target, not two), so an
    # `increase()` over it sees the first failure.
    assert value(after_two, "purge_passes_failed", **queue) == 1
    assert value(after_two, "purge_passes_completed", **queue) == 1
    assert value(after_two, "purge_target_failures", target="nope") == 1
    assert value(after_two, "purge_target_failures", target="x_auth") == 0
    assert value(after_two, "purge_pass_seconds_count", **queue) == 2


async def test_a_target_s_counters_are_at_0_while_its_first_sweep_runs(
    tmp_path: Path,
    temporal_server: RunningTemporal,
    client: Client,
    schema_url: str,
    task_queue: str,
    db: psycopg.Connection[Any],
    real_now: int,
) -> None:
    """A new worker's first sweep of a target, its batch held at a locked row: a scrape then
    finds the target's rows, pauses and partitions at 0, so that `increase()` counts the rows
    it removes once the row is let go (a series first scraped at its first rows would not)."""
    idempotency_rows(db, {"a": real_now - HOUR, "b": real_now + HOUR})
    [port] = free_ports(1)
    config = worker_config(tmp_path / "purge.toml", schema_url, task_queue, TARGETS)
    async with worker(config, temporal_server, port):
        with row_locked(schema_url, "x_idempotency", "a") as holder:
            sweeping = asyncio.ensure_future(
                run_pass(client, task_queue, {"targets": ["x_idempotency"]})
            )
            await until_a_sweep_waits(db, sweeping, holder=holder)
            during = samples(await metrics_text(port))
        await sweeping
        after = samples(await metrics_text(port))

    for counter in ("purge_rows_removed", "purge_paused_seconds", "purge_partitions_removed"):
        assert value(during, counter, target="x_idempotency") == 0
    assert value(after, "purge_rows_removed", target="x_idempotency") == 1


async def test_scheduled_passes_are_counted_skipping_or_whole_and_no_other_pass(
    tmp_path: Path,
    temporal_server: RunningTemporal,
    client: Client,
    schema_url: str,
    task_queue: str,
) -> None:
    """`purge_passes_skipping` and `purge_passes_whole` (what PurgeTargetsSkipped reads): at 0
    from the worker's start; of the passes a schedule started (its memo, which the schedule's
    action gives each), skipping for one whose 1 ms budget x_auth spent, one at a time, so
    x_idempotency was skipped (no activity: no sweep metric of its moves), and whole for one
    that swept both; neither for a scheduled dry run, nor for a pass typed by hand, however
    whole (a one-target sweep would have kept the alert quiet)."""
    [port] = free_ports(1)
    config = worker_config(tmp_path / "purge.toml", schema_url, task_queue, TARGETS)
    targets = ["x_auth", "x_idempotency"]
    spent = {"targets": targets, "max_concurrent": 1, "budget_ms": 1}
    queue = {"task_queue": task_queue, "workflow_type": "Purge"}

    async def scheduled(request: dict[str, Any]) -> dict[str, Any]:
        return await client.execute_workflow(
            "Purge",
            request,
            id=f"purge-scheduled-{uuid.uuid4()}",
            task_queue=task_queue,
            memo={MEMO_KEY: "the schedule's fingerprint"},
            result_type=dict,
        )

    async with worker(config, temporal_server, port):
        at_start = samples(await metrics_text(port))
        skipping = await scheduled(spent)
        after_skip = samples(await metrics_text(port))
        await scheduled({"targets": targets})
        await scheduled({**spent, "dry_run": True})
        after_whole = samples(await metrics_text(port))
        await run_pass(client, task_queue, {"targets": ["x_auth"]})  # by hand: whole
        await run_pass(client, task_queue, spent)  # by hand: skipping
        after_by_hand = samples(await metrics_text(port))

    assert [s["status"] for s in skipping["swept"]] == ["ok", "skipped"]
    assert value(at_start, "purge_passes_skipping", **queue) == 0
    assert value(at_start, "purge_passes_whole", **queue) == 0
    assert value(after_skip, "purge_passes_skipping", **queue) == 1
    assert value(after_skip, "purge_passes_whole", **queue) == 0
    assert value(after_whole, "purge_passes_skipping", **queue) == 1
    assert value(after_whole, "purge_passes_whole", **queue) == 1
    assert value(after_by_hand, "purge_passes_skipping", **queue) == 1
    assert value(after_by_hand, "purge_passes_whole", **queue) == 1
    assert value(after_by_hand, "purge_passes_completed", **queue) == 5


async def test_interceptors_given_to_new_worker_run_beside_the_alert_metrics(
    client: Client, task_queue: str
) -> None:
    """`new_worker(..., interceptors=[...])` (docs/own-targets.md: any other keyword goes to
    the SDK's Worker), and a database's own queue's worker built with the same options: the
    package's own interceptor, which records what the alert rules read, stays first; given
    ones replaced it, silently dropping those metrics."""

    class Mine(Interceptor):
        pass

    mine = Mine()
    for built in (
        new_worker(client, TargetRegistry([]), task_queue, interceptors=[mine]),
        activity_worker(client, TargetRegistry([]), f"{task_queue}:own", interceptors=[mine]),
    ):
        interceptors = built.config()["interceptors"]
        assert [type(i) for i in interceptors] == [PassMetrics, Mine]
        assert interceptors[1] is mine


async def test_a_dry_run_is_no_sweep_in_the_sweep_duration_histogram(
    tmp_path: Path,
    temporal_server: RunningTemporal,
    client: Client,
    schema_url: str,
    task_queue: str,
    db: psycopg.Connection[Any],
    real_now: int,
) -> None:
    """`purge_target_seconds` counts the sweeps that came back, which PurgeTargetNotSwept reads
    against the last sweep that ran: a dry run's count is neither, or a target only ever
    counted by hand would page as never swept."""
    idempotency_rows(db, {"a": real_now - HOUR, "b": real_now + HOUR})
    [port] = free_ports(1)
    config = worker_config(tmp_path / "purge.toml", schema_url, task_queue, TARGETS)
    request = {"targets": ["x_idempotency"]}
    async with worker(config, temporal_server, port):
        counted = await run_pass(client, task_queue, {**request, "dry_run": True})
        after_count = samples(await metrics_text(port))
        await run_pass(client, task_queue, request)
        after_sweep = samples(await metrics_text(port))

    assert counted["removed"] == 1
    assert "purge_target_seconds_count" not in after_count
    assert value(after_sweep, "purge_target_seconds_count", target="x_idempotency") == 1


# -- a sweep that did not run leaves the gauges as the last one that ran set them -------------

#: Every gauge a sweep sets for its target, and the timestamp the rules' freshness window reads.
SWEEP_GAUGES = (
    "purge_backlog_rows",
    "purge_oldest_expired_age_seconds",
    "purge_batch_p95_seconds",
    "purge_target_last_sweep_timestamp_seconds",
)
#: Expired rows for the first sweep. Their expiries are scattered over the heap, so its first
#: batch is 500 rows (FIRST_ROWS) whatever the table's statistics say, not the whole table; the
#: sweep runs out of its pass's budget while that batch waits on the oldest row
#: (`cut_short_at`), so on any machine it ends with rows removed and a backlog.
EXPIRED = 2_000
#: A budget no machine spends on its own: the hand clock spends it (`budget_clock`).
PASS_BUDGET_MS = 60_000


def scattered(i: int) -> int:
    """The `i`th expired row's age past an hour, in no order along the heap."""
    return HOUR + i * 7_919 % EXPIRED


#: A held table is reported busy at once, not after the default 10 s.
NO_WAIT = '[sweep]\nbusy_wait = "0s"\n\n'


def gauges(page: Page, target: str) -> dict[str, float]:
    return {name: value(page, name, target=target) for name in SWEEP_GAUGES}


@dataclass(frozen=True)
class Held:
    """The row a sweep's first batch reaches first: `table`'s row whose `column` is `key`."""

    table: str
    column: str
    key: object


async def swept_with_a_backlog(
    client: Client,
    task_queue: str,
    port: int,
    target: str,
    arrange: Callable[[], Held],
    db: psycopg.Connection[Any],
    url: str,
    clock: HandClock,
) -> dict[str, float]:
    """A real sweep of `target` (its rows made by `arrange`) that its pass's budget ends with
    rows left, spent by `clock` while its first batch waits on `arrange`'s row: its gauges as
    served, each checked away from 0, so a later write shows."""
    held = arrange()
    result = await cut_short_at(
        db,
        url,
        held.table,
        held.key,
        clock,
        lambda: run_pass(
            client,
            task_queue,
            {"targets": [target], "max_concurrent": 1, "budget_ms": PASS_BUDGET_MS},
        ),
        column=held.column,
    )
    [sweep] = result["swept"]
    assert (sweep["status"], sweep["removed"] > 0, sweep["backlog"] > 0) == ("ok", True, True), str(
        sweep
    )
    served = gauges(await scrape(port), target)
    assert all(v > 0 for v in served.values()), served
    return served


def expired_idempotency_rows(db: psycopg.Connection[Any], now_ms: int) -> Callable[[], Held]:
    def arrange() -> Held:
        idempotency_rows(db, {f"old{i}": now_ms - scattered(i) for i in range(EXPIRED)})
        idempotency_rows(db, {"live": now_ms + HOUR})
        return Held("x_idempotency", "key", f"old{oldest()}")

    return arrange


def oldest() -> int:
    """The `i` whose row `scattered` makes the oldest."""
    return max(range(EXPIRED), key=scattered)


async def not_run_leaves_the_gauges(
    client: Client,
    task_queue: str,
    port: int,
    target: str,
    status: str,
    before: dict[str, float],
    not_run: Callable[[], Awaitable[dict[str, Any]]],
) -> None:
    """The pass `not_run` reports `target` with `status`, and every gauge is as `before`."""
    result = await not_run()
    [sweep] = [s for s in result["swept"] if s["name"] == target]
    assert (sweep["status"], sweep["removed"]) == (status, 0), sweep
    assert gauges(await scrape(port), target) == before


class TestSweepsThatDidNotRun:
    """A `busy`, `gone` or `skipped` sweep changes no gauge and no last-sweep timestamp (the
    design's fourth round): with a p95 of 0 a stuck target would look fast, and with a fresh
    timestamp the rules would keep reading the last real sweep's backlog as if measured now."""

    async def test_a_busy_sweep_changes_no_gauge(
        self,
        tmp_path: Path,
        temporal_server: RunningTemporal,
        client: Client,
        schema_url: str,
        task_queue: str,
        db: psycopg.Connection[Any],
        real_now: int,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        clock = budget_clock(monkeypatch)
        [port] = free_ports(1)
        targets = NO_WAIT + TARGETS
        config = worker_config(tmp_path / "purge.toml", schema_url, task_queue, targets)
        async with worker(config, temporal_server, port):
            arrange = expired_idempotency_rows(db, real_now)
            before = await swept_with_a_backlog(
                client, task_queue, port, "x_idempotency", arrange, db, schema_url, clock
            )
            with psycopg.connect(schema_url, autocommit=True) as other:
                hold_table_lock(other, "x_idempotency")
                await not_run_leaves_the_gauges(
                    client,
                    task_queue,
                    port,
                    "x_idempotency",
                    "busy",
                    before,
                    lambda: run_pass(client, task_queue, {"targets": ["x_idempotency"]}),
                )

    async def test_a_gone_sweep_changes_no_gauge(
        self,
        tmp_path: Path,
        temporal_server: RunningTemporal,
        client: Client,
        schema_url: str,
        task_queue: str,
        real_now: int,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """A pattern's match swept, then its tenant dropped: the next sweep of it is `gone`."""
        clock = budget_clock(monkeypatch)
        prefix = tenant_prefix()
        tenant = f"{prefix}_0000"
        match = f"sessions@{tenant}"
        targets = (
            f'[[targets]]\nkind = "expiring"\nname = "sessions"\n'
            f'table = "{prefix}_*.sessions"\ncolumn = "expires_at"\n'
        )
        [port] = free_ports(1)
        config = worker_config(tmp_path / "purge.toml", schema_url, task_queue, targets)
        with tenant_schemas(schema_url, prefix) as conn:

            def arrange() -> Held:
                create_tenants(conn, prefix, range(1), real_now)
                sessions = sql.Identifier(tenant, "sessions")
                with conn.cursor() as cur:
                    cur.executemany(
                        sql.SQL("INSERT INTO {} (expires_at) VALUES (%s)").format(sessions),
                        [(real_now - scattered(i),) for i in range(EXPIRED)],
                    )
                    cur.execute(
                        sql.SQL("SELECT id FROM {} WHERE expires_at = %s").format(sessions),
                        (real_now - scattered(oldest()),),
                    )
                    [(key,)] = cur.fetchall()
                return Held(sessions.as_string(conn), "id", key)

            async with worker(config, temporal_server, port):
                before = await swept_with_a_backlog(
                    client, task_queue, port, match, arrange, conn, schema_url, clock
                )
                conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(tenant)))
                await not_run_leaves_the_gauges(
                    client,
                    task_queue,
                    port,
                    match,
                    "gone",
                    before,
                    lambda: run_pass(client, task_queue, {"targets": [match]}),
                )

    async def test_a_skipped_sweep_changes_no_gauge(
        self,
        tmp_path: Path,
        temporal_server: RunningTemporal,
        client: Client,
        schema_url: str,
        task_queue: str,
        db: psycopg.Connection[Any],
        real_now: int,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """x_auth first, one at a time, spends the pass's 1 ms budget: x_idempotency is skipped
        by the workflow, which starts no activity for it, so no worker writes its gauges."""
        clock = budget_clock(monkeypatch)
        [port] = free_ports(1)
        config = worker_config(tmp_path / "purge.toml", schema_url, task_queue, TARGETS)
        spent = {"targets": ["x_auth", "x_idempotency"], "max_concurrent": 1, "budget_ms": 1}
        async with worker(config, temporal_server, port):
            arrange = expired_idempotency_rows(db, real_now)
            before = await swept_with_a_backlog(
                client, task_queue, port, "x_idempotency", arrange, db, schema_url, clock
            )
            await not_run_leaves_the_gauges(
                client,
                task_queue,
                port,
                "x_idempotency",
                "skipped",
                before,
                lambda: run_pass(client, task_queue, spent),
            )
