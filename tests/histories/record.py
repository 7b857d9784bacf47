"""Record the histories `tests/test_replay.py` replays: `python -m tests.histories.record`.

Run it when a new workflow shape ships, with a new prefix, and commit the files beside the old
ones: every shape that has shipped must keep replaying (or move behind `workflow.patched()`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

import psycopg
from temporalio.client import Client, WorkflowFailureError

from activities import kinds
from activities.schema import reference_ddl
from activities.targets import TargetRegistry
from purge_ops.connect import open_pool
from purge_ops.dev import epoch_ms_now
from purge_ops.embedded import EmbeddedPostgres, TemporalDevServer
from purge_ops.runner import new_worker

HERE = Path(__file__).resolve().parent
SCENARIOS: dict[str, dict[str, Any]] = {
    "pass": {"targets": ["x_idempotency", "x_rate_limit", "x_auth"]},
    "dry-run": {"targets": ["x_idempotency", "x_auth"], "dry_run": True},
    "duplicate": {"targets": ["x_auth", "x_idempotency", "x_auth"]},
    "failed-target": {"targets": ["x_idempotency", "no_such_target", "x_auth"]},
    "empty": {"targets": []},
}


def scratch() -> Path:
    base = Path(tempfile.mkdtemp(prefix="purge-record-"))
    base.chmod(0o755)  # PostgreSQL runs as its own account under root and must enter it
    return base


async def record(prefix: str) -> None:
    base = scratch()
    try:
        with TemporalDevServer(base / "t") as temporal, EmbeddedPostgres(base / "pg") as pg:
            now = epoch_ms_now()
            with psycopg.connect(pg.url(), autocommit=True) as conn:
                conn.execute(reference_ddl())
                conn.execute(
                    "INSERT INTO x_idempotency VALUES ('a', null, %s), ('b', null, %s)",
                    (now - 60_000, now + 60_000),
                )
                conn.execute("INSERT INTO x_auth_lockouts VALUES ('carol', %s)", (now - 1000,))
            pool = await open_pool(pg.url())
            client = await Client.connect(temporal.address)
            registry = TargetRegistry(
                [kinds.idempotency(pool), kinds.rate_limit(pool), kinds.auth(pool)]
            )
            async with new_worker(client, registry, "purge"):
                for scenario, request in SCENARIOS.items():
                    workflow_id = f"purge-{prefix}-{scenario}"
                    handle = await client.start_workflow(
                        "Purge", request, id=workflow_id, task_queue="purge"
                    )
                    # The failures are what some of these histories are for.
                    with contextlib.suppress(WorkflowFailureError):
                        await handle.result()
                    history = await handle.fetch_history()
                    out = HERE / f"{prefix}-{scenario}.json"
                    out.write_text(history.to_json(), encoding="utf-8")
                    print(f"wrote {out.relative_to(HERE.parent.parent)}")
            await pool.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prefix", default="v1", help="the workflow shape these histories are of")
    asyncio.run(record(parser.parse_args().prefix))


if __name__ == "__main__":
    main()
