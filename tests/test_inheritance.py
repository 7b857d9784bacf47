"""A table with inheritance children is refused: a DELETE of it removes the children's rows
too (PostgreSQL's inheritance), rows of tables the target does not name, which its count and
its walk (bounded by the parent's own pages) would not account for. `check`, a dry run and the
sweep refuse it alike, deleting nothing; a child named as a target of its own is swept."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from activities import builtin_kinds as kinds
from activities.errors import BadPurgeTarget
from activities.inputs import PurgeStep
from activities.registry import TargetRegistry
from activities.sweep import PurgeActivities
from purge_config.names import TableName
from tests.support.activity import activity_env
from tests.support.procs import clean_env, run_main, worker_config
from tests.support.rows import HOUR

NOW = 1_800_000_000_000
REFUSAL = (
    "table logs has inheritance children (logs_keep): a DELETE of it removes their rows too, "
    "which this target neither names nor counts; name each table as a target of its own (a "
    "pattern can), or sweep a table without children"
)


def logs(db: psycopg.Connection[Any]) -> None:
    """Ten log rows, five expired at NOW; an old archive child of 100 rows, all expired."""
    db.execute("CREATE TABLE logs (id bigint, expires_ms bigint NOT NULL)")
    db.execute("CREATE TABLE logs_keep (note text) INHERITS (logs)")
    db.execute(
        "INSERT INTO logs SELECT g, %s + (g - 5) * %s FROM generate_series(1, 10) g", (NOW, HOUR)
    )
    db.execute(
        "INSERT INTO logs_keep SELECT g, %s - g * %s, 'kept' FROM generate_series(1, 100) g",
        (NOW, HOUR),
    )


def rows(db: psycopg.Connection[Any], table: str) -> int:
    row = db.execute(f"SELECT count(*) FROM ONLY {table}").fetchone()
    return int(row[0]) if row else 0


async def run(pool: AsyncConnectionPool[Any], table: str, dry_run: bool = False) -> Any:
    target = kinds.expiring(pool, "logs", TableName(table), "expires_ms")
    step = PurgeStep(name="logs", now_ms=NOW, dry_run=dry_run)
    return await activity_env().run(PurgeActivities(TargetRegistry([target])).purge_target, step)


@pytest.mark.parametrize("dry_run", [False, True], ids=["sweep", "dry-run"])
async def test_a_parent_of_inheritance_children_is_refused_and_nothing_is_deleted(
    pool: AsyncConnectionPool[Any], db: psycopg.Connection[Any], dry_run: bool
) -> None:
    logs(db)

    with pytest.raises(BadPurgeTarget) as refused:
        await run(pool, "logs", dry_run)

    assert refused.value.message == REFUSAL
    assert (rows(db, "logs"), rows(db, "logs_keep")) == (10, 100)


async def test_check_refuses_it_in_one_line(
    tmp_path: Path, schema_url: str, db: psycopg.Connection[Any]
) -> None:
    logs(db)
    entry = '[[targets]]\nkind = "expiring"\nname = "logs"\ntable = "logs"\n'
    path = worker_config(
        tmp_path / "purge.toml", schema_url, "purge", entry + 'column = "expires_ms"\n'
    )
    env = clean_env(TEMPORAL_ADDRESS="127.0.0.1:1")

    done = await asyncio.to_thread(run_main, "check", "--config", str(path), env=env)

    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines() == [f"FAILED  logs (1 table): {REFUSAL}"]


async def test_a_child_is_swept_as_its_own_target_and_a_parent_whose_children_left_again(
    pool: AsyncConnectionPool[Any], db: psycopg.Connection[Any]
) -> None:
    """The child named alone: its rows only. The parent once its child is dropped (the
    catalog's flag that it has children outlives them until a VACUUM): swept, not refused."""
    logs(db)

    child = await run(pool, "logs_keep")
    db.execute("DROP TABLE logs_keep")
    parent = await run(pool, "logs")

    assert (child.removed, parent.removed) == (100, 5)
    assert rows(db, "logs") == 5
