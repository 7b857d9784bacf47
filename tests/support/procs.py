"""Worker processes started the way a user starts them: `python worker.py run --config F`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without purge or Temporal settings, plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PURGE_", "TEMPORAL_")) or k == "PURGE_TEST_DATABASE_URL"
    }
    env.update(extra)
    return env


def start_worker(
    config: Path, env: Mapping[str, str], log: Path, *args: str
) -> subprocess.Popen[bytes]:
    """A worker process (`run --config F ARGS`); its stdout and stderr go to `log`."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "worker.py", "run", "--config", str(config), *args],
            cwd=REPO,
            env=dict(env),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `condition` until true, or fail naming `what`."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Make sure `proc` is gone (for finally blocks)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def worker_config(path: Path, database_url: str, task_queue: str, targets: str) -> Path:
    """Write a config file with `targets` (TOML [[targets]] tables) and return its path."""
    path.write_text(
        f"database_url = {database_url!r}\ntask_queue = {task_queue!r}\n\n{targets}",
        encoding="utf-8",
    )
    return path
