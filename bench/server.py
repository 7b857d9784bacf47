"""What the bench measures on: the embedded PostgreSQL 18, with settings chosen for it, or a URL.

The tests' embedded server runs with fsync and full_page_writes off because it holds throwaway
data; a benchmark that reports WAL bytes needs full-page images on, or the WAL figures would be a
fraction of what a production server writes after each checkpoint.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

from psycopg import AsyncConnection

#: Settings for the embedded server. Everything else is PostgreSQL 18's default.
SERVER_SETTINGS = {
    # Full-page images on, as in production: the first change to a page after a checkpoint logs
    # the whole 8 KB page, which is most of a mass delete's WAL.
    "full_page_writes": "on",
    # A 2M-row idempotency table with its indexes is ~400 MB: one copy fits, prewarmed, with room.
    "shared_buffers": "1GB",
    # No checkpoint may start inside a form (the bench checkpoints before each one), and WAL
    # segments are recycled rather than created, so no form pays for zero-filling new files.
    "max_wal_size": "8GB",
    "min_wal_size": "2GB",
    "checkpoint_timeout": "30min",
    # Only for building the copies' indexes faster; no form builds an index.
    "maintenance_work_mem": "256MB",
}

#: Settings the report shows, whichever server it ran against.
REPORTED_SETTINGS = (
    "server_version",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_compression",
    "data_checksums",
    "shared_buffers",
    "max_wal_size",
    "checkpoint_timeout",
    "work_mem",
    "autovacuum",
)


def embedded_settings(*, fsync: bool, shared_buffers: str | None) -> dict[str, str]:
    settings = {**SERVER_SETTINGS, "fsync": "on" if fsync else "off"}
    if shared_buffers:
        settings["shared_buffers"] = shared_buffers
    return settings


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    model = platform.processor()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gb": round(memory / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
    }


async def server_settings(conn: AsyncConnection[Any]) -> dict[str, str]:
    cur = await conn.execute(
        "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)",
        (list(REPORTED_SETTINGS),),
    )
    found = {str(name): str(value) for name, value in await cur.fetchall()}
    return {name: found[name] for name in REPORTED_SETTINGS if name in found}


async def enable_prewarm(conn: AsyncConnection[Any], *, embedded: bool) -> bool:
    """pg_prewarm, created on our own server, only used if already there on someone else's."""
    if embedded:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
        # For the cold forms: pg_buffercache_evict_relation() (PostgreSQL 18).
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_buffercache")
        return True
    cur = await conn.execute("SELECT to_regproc('pg_prewarm') IS NOT NULL")
    row = await cur.fetchone()
    return bool(row and row[0])
