"""Record the histories `tests/test_replay.py` replays: `python -m tests.histories.record`.

Run it when a new workflow shape ships, with a new prefix, and commit the files beside the old
ones: every shape that has shipped must keep replaying (or move behind `workflow.patched()`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
from pathlib import Path
from typing import Any

import psycopg
from temporalio.client import Client, WorkflowFailureError

from activities import builtin_kinds as kinds
from activities.builtin_kinds import build_registry
from activities.registry import TargetRegistry
from activities.schema import reference_ddl
from activities.search_attributes import at_start
from purge_config.file import parse_config
from purge_dev.dev import epoch_ms_now
from purge_dev.servers import venv_executable
from purge_ops.connect import open_pool
from purge_ops.runner import activity_worker, new_worker
from tests.support.history import (
    cancel_once_scheduled,
    child_ids,
    events,
    history,
    started_children,
)
from tests.support.servers import running_postgres, running_temporal

HERE = Path(__file__).resolve().parent
#: Each shape's scenarios, by the prefix of their files. A new shape gets a new prefix; the
#: files of older ones are never recorded again.
SCENARIOS: dict[str, dict[str, dict[str, Any]]] = {
    "v1": {
        "pass": {"targets": ["x_idempotency", "x_rate_limit", "x_auth"]},
        "dry-run": {"targets": ["x_idempotency", "x_auth"], "dry_run": True},
        "duplicate": {"targets": ["x_auth", "x_idempotency", "x_auth"]},
        "failed-target": {"targets": ["x_idempotency", "no_such_target", "x_auth"]},
        "empty": {"targets": []},
    },
    # A pass with limits (the concurrent-pass patch): three targets two at a time; and one whose
    # budget is spent by its first target, so the others are reported skipped.
    "v2": {
        "concurrent": {
            "targets": ["x_idempotency", "x_rate_limit", "x_auth"],
            "max_concurrent": 2,
            "max_per_database": 2,
            "budget_ms": 600_000,
        },
        "out-of-budget": {
            "targets": ["x_idempotency", "x_rate_limit", "x_auth"],
            "max_concurrent": 1,
            "budget_ms": 1,
        },
    },
    # A pass spread over children (the spread-pass patch): a pattern over 5 tenants and a
    # listed target, 4 targets a child in runs of 2, so the first child continues as new; and
    # a pass refused after its expansion, a match taking a listed target's name.
    "v3": {
        "spread": {
            "targets": ["x_idempotency", "sessions"],
            "patterns": ["sessions"],
            "max_concurrent": 2,
            "max_per_database": 2,
            "budget_ms": 600_000,
            "child_size": 4,
            "run_size": 2,
        },
        "spread-duplicate": {
            "targets": ["sessions@tenant_0001", "sessions"],
            "patterns": ["sessions"],
        },
    },
}

# v4: a pass whose targets' activities go to their database's own task queue (workers next
# to their databases): one routed target beside one on the pass's own queue.
SCENARIOS["v4"] = {
    "routed": {
        "targets": ["x_idempotency", "x_auth@eu"],
        "databases": {"x_auth@eu": "eu"},
        "queues": {"eu": "purge-eu"},
        "worker_wait_ms": 60_000,
        "max_concurrent": 2,
        "max_per_database": 1,
        "budget_ms": 600_000,
    },
}

# v5: a pass started with its search attributes on a namespace that defines them (the
# searchable-pass patch), one target failing: it records the failed target and the rows
# removed, then fails.
SCENARIOS["v5"] = {
    "searchable": {"targets": ["x_idempotency", "no_such_target", "x_auth"]},
}
# v6: a spread pass whose pattern's database has a queue of its own, whose worker runs the
# children too (the chunk-on-database-queue patch): the child runs there, its activities with it.
SCENARIOS["v6"] = {
    "spread-routed": {
        "targets": ["x_idempotency", "sessions"],
        "patterns": ["sessions"],
        "databases": {"sessions": "eu"},
        "queues": {"eu": "purge-eu"},
        "worker_wait_ms": 60_000,
        "max_concurrent": 2,
        "max_per_database": 2,
        "budget_ms": 600_000,
    },
}
# v7: a spread pass at the default limits (4 at once, 1 a database) whose pattern's matches
# are all small (the small-tables-together patch): the listed target's child sweeps one at a
# time, the small matches' child four at once.
SCENARIOS["v7"] = {
    "spread-small": {
        "targets": ["x_idempotency", "sessions"],
        "patterns": ["sessions"],
        "max_concurrent": 4,
        "max_per_database": 1,
        "budget_ms": 600_000,
    },
}
# v8: a spread pass at the default limits whose pattern's database has a queue of its own (its
# worker runs the children): the small matches' child there sweeps them as local activities
# (the small-tables-local marker), recorded with that child's run.
SCENARIOS["v8"] = {
    "spread-local": {
        "targets": ["x_idempotency", "sessions"],
        "patterns": ["sessions"],
        "databases": {"sessions": "eu"},
        "queues": {"eu": "purge-eu"},
        "worker_wait_ms": 60_000,
        "max_concurrent": 4,
        "max_per_database": 1,
        "budget_ms": 600_000,
    },
}
# v9: a pass whose routed database's queue no worker polls (the unpolled-queue-once patch):
# its first target waits worker_wait and fails NoPurgeWorker; the two after it, on the same
# queue, fail at once without an activity; the target on the pass's own queue is swept.
SCENARIOS["v9"] = {
    "unpolled": {
        "targets": ["x_auth@eu", "x_idempotency@eu", "x_rate_limit@eu", "x_idempotency"],
        "databases": {"x_auth@eu": "eu", "x_idempotency@eu": "eu", "x_rate_limit@eu": "eu"},
        "queues": {"eu": "purge-nowhere"},
        "worker_wait_ms": 1_000,
        "max_concurrent": 1,
        "max_per_database": 4,
        "budget_ms": 600_000,
    },
}
# v10: a pass spread over children (a pattern) whose pattern and plain target share a routed
# queue no worker polls (the spread-unpolled-queue-once patch): the pattern's expansion waits
# worker_wait and fails NoPurgeWorker; the plain target there fails at once, with no child of
# its own; the target on the pass's own queue is swept by a child.
SCENARIOS["v10"] = {
    "spread-unpolled": {
        "targets": ["sessions", "x_auth@eu", "x_idempotency"],
        "patterns": ["sessions"],
        "databases": {"sessions": "eu", "x_auth@eu": "eu"},
        "queues": {"eu": "purge-nowhere"},
        "worker_wait_ms": 1_000,
        "max_concurrent": 1,
        "max_per_database": 1,
        "budget_ms": 600_000,
    },
}
# v11: passes cancelled by request while an activity waits on a queue no worker polls (the
# cancel-ends-pass patch): the sequential pass ends cancelled with no target after the routed
# one scheduled; the spread pass, cancelled while it expands its pattern, starts no child.
SCENARIOS["v11"] = {
    "cancelled": {
        "targets": ["x_auth@eu", "x_idempotency"],
        "databases": {"x_auth@eu": "eu"},
        "queues": {"eu": "purge-nowhere"},
        "worker_wait_ms": 600_000,
    },
    "spread-cancelled": {
        "targets": ["sessions", "x_idempotency"],
        "patterns": ["sessions"],
        "databases": {"sessions": "eu"},
        "queues": {"eu": "purge-nowhere"},
        "worker_wait_ms": 600_000,
        "max_concurrent": 1,
        "max_per_database": 1,
        "budget_ms": 600_000,
    },
}
# v13: spread passes started with their search attributes, as `sweep` and the schedule start
# them: one cancelled while its child's routed activity waits (the pass ends cancelled at once;
# Temporal terminates the child as its parent closes); one whose child's routed queue no worker
# polls (the child asks busy-queue-resent, then unpolled-queue-once: its run recorded too, the
# first child's run since v3 with the patches after it); and one with a failed target
# recording its outcome (searchable-pass).
SCENARIOS["v13"] = {
    "spread-child-cancelled": {
        "targets": ["x_auth@eu", "sessions"],
        "patterns": ["sessions"],
        "databases": {"x_auth@eu": "eu"},
        "queues": {"eu": "purge-nowhere"},
        "worker_wait_ms": 600_000,
        "max_concurrent": 1,
        "max_per_database": 1,
        "budget_ms": 600_000,
    },
    "spread-child-unpolled": {
        "targets": ["x_auth@eu", "x_idempotency@eu", "sessions"],
        "patterns": ["sessions"],
        "databases": {"x_auth@eu": "eu", "x_idempotency@eu": "eu"},
        "queues": {"eu": "purge-nowhere"},
        "worker_wait_ms": 1_000,
        "max_concurrent": 1,
        "max_per_database": 1,
        "budget_ms": 600_000,
    },
    "spread-searchable": {
        "targets": ["x_idempotency", "no_such_target", "sessions"],
        "patterns": ["sessions"],
    },
}
#: v13's child runs recorded beside their pass: the scenario, the child's shape, and the target
#: that picks the child (the one on the routed queue).
CHILDREN = {"spread-child-unpolled": ("chunk-unpolled", "x_auth@eu")}

#: The prefixes whose passes are cancelled once their first activity is scheduled.
CANCELLED = {"v11"}
#: The scenarios cancelled once their first child has scheduled an activity.
CHILD_CANCELLED = {"spread-child-cancelled"}

#: The prefixes whose workers are built from V3_CONFIG (a pattern among their targets).
PATTERNED = {"v3", "v6", "v7", "v8", "v10", "v11", "v13"}

#: The prefixes whose passes start with the search attributes, as `sweep` and the schedule
#: start them where the namespace defines them (docs/operating.md gives these commands).
SEARCHABLE = {"v5", "v13"}
CREATE_ATTRIBUTES = [
    ["--name", "PurgeFailedTargets", "--type", "KeywordList"],
    ["--name", "PurgeRowsRemoved", "--type", "Int"],
]

#: The config of the v3 worker: the built-in kinds and a pattern over the tenants.
V3_CONFIG = {
    "targets": [
        {"kind": "idempotency"},
        {"kind": "rate_limit"},
        {"kind": "auth"},
        {"kind": "expiring", "name": "sessions", "table": "tenant_*.sessions", "column": "at"},
    ]
}


async def record(prefix: str) -> None:
    with (
        running_temporal("purge-record-t-") as temporal,
        running_postgres("purge-record-pg-") as pg,
    ):
        now = epoch_ms_now()
        with psycopg.connect(pg.url(), autocommit=True) as conn:
            conn.execute(reference_ddl())
            conn.execute(
                "INSERT INTO x_idempotency VALUES ('a', null, %s), ('b', null, %s)",
                (now - 60_000, now + 60_000),
            )
            conn.execute("INSERT INTO x_auth_lockouts VALUES ('carol', %s)", (now - 1000,))
            for i in range(5):
                conn.execute(
                    f"CREATE SCHEMA tenant_{i:04d}; "
                    f"CREATE TABLE tenant_{i:04d}.sessions (at bigint NOT NULL); "
                    f"INSERT INTO tenant_{i:04d}.sessions VALUES ({now - 1000}), ({now + 60_000})"
                )
        for command in CREATE_ATTRIBUTES if prefix in SEARCHABLE else []:
            create = [venv_executable("temporal"), "operator", "search-attribute", "create"]
            subprocess.run([*create, *command, "--address", temporal.address], check=True)
        pool = await open_pool(pg.url())
        try:
            client = await Client.connect(temporal.address)
            registry = (
                build_registry(parse_config(V3_CONFIG), pool)
                if prefix in PATTERNED
                else TargetRegistry(
                    [
                        kinds.idempotency(pool),
                        kinds.rate_limit(pool),
                        kinds.auth(pool),
                        kinds.auth(pool, name="x_auth@eu"),
                    ]
                )
            )
            async with (
                new_worker(client, registry, "purge"),
                activity_worker(client, registry, "purge-eu"),
            ):
                for scenario, request in SCENARIOS[prefix].items():
                    handle = await client.start_workflow(
                        "Purge",
                        request,
                        id=f"purge-{prefix}-{scenario}",
                        task_queue="purge",
                        search_attributes=at_start() if prefix in SEARCHABLE else None,
                    )
                    if prefix in CANCELLED:
                        await cancel_once_scheduled(client, handle.id)
                    if scenario in CHILD_CANCELLED:
                        await _cancel_once_a_child_waits(client, handle.id)
                    # The failures are what some of these histories are for.
                    with contextlib.suppress(WorkflowFailureError):
                        await handle.result()
                    out = HERE / f"{prefix}-{scenario}.json"
                    out.write_text((await history(client, handle.id)).to_json(), encoding="utf-8")
                    print(f"wrote {out.relative_to(HERE.parent.parent)}")
                    if scenario == "spread":
                        await _record_first_child_run(client, handle.id, prefix)
                    if scenario == "spread-local":
                        await _record_first_child_run(client, handle.id, prefix, "chunk-local")
                    if scenario in CHILDREN:
                        shape, target = CHILDREN[scenario]
                        await _record_first_child_run(client, handle.id, prefix, shape, target)
        finally:
            await pool.close()


async def _cancel_once_a_child_waits(client: Client, workflow_id: str) -> None:
    """Cancel the pass once its first child has scheduled an activity: on a queue no worker
    polls, the activity waits there, so the cancellation reaches the child at it."""
    while not (children := child_ids(await events(client, workflow_id))):
        await asyncio.sleep(0.05)
    await cancel_once_scheduled(client, children[0], cancel=workflow_id)


async def _record_first_child_run(
    client: Client, workflow_id: str, prefix: str, shape: str = "chunk", target: str = ""
) -> None:
    """The first run of the pass's first child of `shape`: for "chunk", the first child (a
    `PurgeChunk` run that continued as new); for "chunk-local", the small matches' child; with
    `target`, the child that sweeps it."""
    parent = await history(client, workflow_id)
    converter = client.data_converter.payload_converter
    started = [
        e.start_child_workflow_execution_initiated_event_attributes
        for e in parent.events
        if e.HasField("start_child_workflow_execution_initiated_event_attributes")
    ]
    inputs = [(a.workflow_id, converter.from_payloads(a.input.payloads)[0]) for a in started]
    [child_id, *_] = [
        child
        for child, chunk in inputs
        if (target in chunk["targets"] if target else shape == "chunk" or chunk.get("local"))
    ]
    [first] = [e for e in started_children(list(parent.events)) if e.workflow_id == child_id]
    handle = client.get_workflow_handle(first.workflow_id, run_id=first.run_id)
    out = HERE / f"{prefix}-{shape}.json"
    out.write_text((await handle.fetch_history()).to_json(), encoding="utf-8")
    print(f"wrote {out.relative_to(HERE.parent.parent)}")


def recorded(prefix: str) -> list[str]:
    """The committed histories of `prefix` (`v3-spread.json`, ...): a shape that has shipped."""
    return sorted(p.name for p in HERE.glob(f"{prefix}-*.json"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--prefix", choices=sorted(SCENARIOS), required=True, help="the shape to record"
    )
    prefix = parser.parse_args().prefix
    if shipped := recorded(prefix):
        # Recording again would overwrite what `tests/test_replay.py` proves old passes replay.
        parser.exit(2, f"record: {prefix} has histories already ({', '.join(shipped)}); "
                    "record a new shape under the next free prefix\n")  # fmt: skip
    asyncio.run(record(prefix))


if __name__ == "__main__":
    main()
