"""An application's own target inside a worker built in code (docs/own-targets.md, "A worker
built in code"): the application builds its store (here, a pool) when it starts, which may be
after the purge worker started; the factory hands the worker whatever exists when a step asks.
The target is the documented one (`ownpool_targets.TmpUploads`: its `pool.open()` does nothing
on a pool already open).
"""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool

from tests.support.ownpool_targets import TmpUploads

_built: list[TmpUploads] = []
calls = 0


def start_app(pool: AsyncConnectionPool[Any]) -> None:
    """What the application does at its own start."""
    _built[:] = [TmpUploads(pool)]


def stop_app() -> None:
    _built.clear()


def targets() -> list[TmpUploads]:
    """The factory named in the config: `factory = "tests.support.apptargets:targets"`."""
    global calls
    calls += 1
    return list(_built)
