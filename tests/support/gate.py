"""A target for the worker-kill tests, loaded by a worker process through `kind = "python"`.

Each run leaves a file in $PURGE_TEST_GATE_DIR. On a worker started with PURGE_TEST_GATE_HANG=1
it then hangs, as a long sweep would, until that worker is killed.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path


class Gate:
    name = "gate"

    async def purge_expired(self, now_ms: int) -> int:
        runs = Path(os.environ["PURGE_TEST_GATE_DIR"])
        (runs / f"run-{os.getpid()}-{time.time_ns()}").touch()
        if os.environ.get("PURGE_TEST_GATE_HANG") == "1":
            (runs / "hanging").touch()
            await asyncio.Event().wait()
        return 0


def targets() -> list[Gate]:
    return [Gate()]
