"""`dev`: the whole thing on one machine from wheels, with demo rows, one pass now, and a worker."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

import psycopg

from activities.builtin_kinds import build_registry
from activities.clock import epoch_ms
from purge_dev.demo import create_demo, demo_config, rows_that_stayed
from purge_dev.servers import (
    EmbeddedPostgres,
    TemporalDevServer,
    port_is_free,
)
from purge_ops.connect import connect_temporal, open_pool
from purge_ops.ports import free_ports
from purge_ops.render import report_table
from purge_ops.runner import config_workers
from purge_ops.schedule import ensure_schedules
from workflows.purge import PurgeWorkflow

DEFAULT_TEMPORAL_PORT = 7233
DEFAULT_UI_PORT = 8233
#: Where the docs walk a user from the demo to a table of their own.
TRIAL = "docs/operating.md#your-own-table-beside-dev"


async def run_dev(once: bool, out: TextIO | None = None) -> int:
    """Start both servers, seed the demo, run one pass through Temporal and print what happened
    on `out` (default: sys.stdout as it is when called, not as it was at import).

    With `once`, return after the pass; otherwise keep the worker up until SIGINT/SIGTERM.
    Every server started here is stopped before returning, whatever happened.
    """
    stream = sys.stdout if out is None else out
    say: Callable[[str], None] = lambda text: print(text, file=stream, flush=True)  # noqa: E731
    base = _scratch_dir()
    temporal = TemporalDevServer(
        base / "temporal",
        port=_default_or_free(DEFAULT_TEMPORAL_PORT, say, "Temporal"),
        ui_port=_default_or_free(DEFAULT_UI_PORT, say, "Temporal UI"),
        headless=once,
    )
    postgres = EmbeddedPostgres(base / "postgres")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        started = time.monotonic()
        # Both servers start at once; each waits in a thread so neither holds up the other.
        await asyncio.gather(asyncio.to_thread(temporal.start), asyncio.to_thread(postgres.start))
        say(f"PostgreSQL 18 at {postgres.url()} (data in {postgres.data_dir})")
        say(f"Temporal dev server at {temporal.address}")
        say(f"servers up in {time.monotonic() - started:.1f} s")

        await _demo_pass(postgres.url(), temporal, once, stop, say)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        temporal.stop(immediate=True)  # in memory: nothing in it outlives this pass
        postgres.remove()
        shutil.rmtree(base, ignore_errors=True)
    return 0


async def _demo_pass(
    url: str,
    temporal: TemporalDevServer,
    once: bool,
    stop: asyncio.Event,
    say: Callable[[str], None],
) -> None:
    """The demo's tables and rows, one pass through Temporal and its report; unless `once`,
    the schedule and the worker kept up until `stop`."""
    config = demo_config(url)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await create_demo(conn, epoch_ms_now())
    say("created the built-in tables from activities/schema.sql and demo rows")
    pool = await open_pool(url)
    try:
        client = await connect_temporal(temporal.address)
        async with contextlib.AsyncExitStack() as running:
            for worker in config_workers(client, config, build_registry(config, pool)):
                await running.enter_async_context(worker)
            workflow_id = f"purge-dev-{time.strftime('%Y%m%dT%H%M%S')}"
            report = await client.execute_workflow(
                PurgeWorkflow.run, config.pass_input(), id=workflow_id, task_queue=config.task_queue
            )
            say("")
            say(report_table(report))
            say("")
            async with pool.connection() as conn:
                say(await rows_that_stayed(conn, report.now_ms))
            if once:
                say("")
                say(f"next: `python worker.py dev` keeps both servers up; a table of your own "
                    f"beside the demo: {TRIAL}")  # fmt: skip
                return
            say("")
            for outcome in await ensure_schedules(client, config):
                say(f"{outcome.action} {outcome.summary}")
            say(f"Temporal UI: {temporal.ui_url}  (the pass is workflow {workflow_id})")
            queue = config.task_queue
            say(f"worker running on task queue {queue!r}; Ctrl-C stops it and both servers")
            say(f"a table of your own beside the demo: {TRIAL}")
            await stop.wait()
            say("stopping")
    finally:
        await pool.close()


def _scratch_dir() -> Path:
    base = Path(tempfile.mkdtemp(prefix="purge-dev-"))
    base.chmod(0o755)  # PostgreSQL runs as its own account when we are root and must enter it
    return base


def epoch_ms_now() -> int:
    """The machine's clock in epoch ms, for writing demo rows (the pass uses workflow time)."""
    return epoch_ms(datetime.now(UTC))


def _default_or_free(port: int, say: Callable[[str], None], what: str) -> int:
    if port_is_free(port):
        return port
    chosen = free_ports(1)[0]
    say(f"{what} port {port} is taken (another server?); using port {chosen} instead")
    return chosen
