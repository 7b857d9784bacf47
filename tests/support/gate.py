"""Targets named `gate` that hold a pass where a test needs it held.

`Gate`, for the worker-kill tests, is loaded by a worker process through `kind = "python"`:
each run leaves a file in $PURGE_TEST_GATE_DIR, and on a worker started with
PURGE_TEST_GATE_HANG=1 it then hangs, as a long sweep would, until that worker is killed.
`HeldGate`, for a worker in the test's own process, holds its sweep until the test lets it go.
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


class HeldGate:
    """A target that holds its sweep until the test lets it go (`release`), having said it
    began (`reached`)."""

    name = "gate"

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.release = asyncio.Event()

    async def purge_expired(self, now_ms: int) -> int:
        self.reached.set()
        await self.release.wait()
        return 0
