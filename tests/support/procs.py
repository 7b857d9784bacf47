"""The command line in the tests: `python worker.py ARGS` as a process the way a user starts it,
or `worker.main(ARGS)` in this process where the entry point itself is not what is tested.

One environment cleaner (`clean_env`) for both; one way to start the process (`start`, of which
`start_worker` and `run_process` are the usual forms); one way to call it in-process
(`run_main`). Each command keeps at least one test through the real entry point.
"""

from __future__ import annotations

import io
import itertools
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest
from temporalio import activity, workflow

REPO = Path(__file__).resolve().parents[2]

#: `dev` takes Temporal's default port 7233 when it is free: the tests that run it share one
#: pytest-xdist worker, so one test's `dev` never takes or frees the port under another's.
DEV_PORT = pytest.mark.xdist_group("dev-port-7233")


@dataclass(frozen=True)
class Done:
    """A command's exit status and output, from a process or from `worker.main`."""

    returncode: int
    stdout: str
    stderr: str


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without purge or Temporal settings, plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PURGE_", "TEMPORAL_")) or k == "PURGE_TEST_DATABASE_URL"
    }
    env.update(extra)
    return env


# -- as a process --------------------------------------------------------------------------------


def start(
    args: Sequence[str], env: Mapping[str, str], log: Path, checkout: Path = REPO
) -> subprocess.Popen[bytes]:
    """`python worker.py ARGS` in the background, in `checkout` (this one unless a test made a
    copy); its stdout and stderr go to `log`."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "worker.py", *args],
            cwd=checkout,
            env=dict(env),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def start_worker(
    config: Path, env: Mapping[str, str], log: Path, *args: str
) -> subprocess.Popen[bytes]:
    """A worker process (`run --config F ARGS`); its stdout and stderr go to `log`."""
    return start(["run", "--config", str(config), *args], env, log)


def run_process(
    *args: str, env: Mapping[str, str] | None = None, checkout: Path = REPO, timeout: float = 120
) -> Done:
    """`python worker.py ARGS` to its end, in `checkout`, through the real entry point (`cli`,
    `os._exit`); `env` defaults to `clean_env()`."""
    done = subprocess.run(
        [sys.executable, "worker.py", *args],
        cwd=checkout,
        env=dict(clean_env() if env is None else env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return Done(done.returncode, done.stdout, done.stderr)


def identity(proc: subprocess.Popen[bytes]) -> str:
    """The identity a worker process gives Temporal: the SDK's default, pid@host."""
    return f"{proc.pid}@{socket.gethostname()}"


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `condition` until true, or fail naming `what`."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def dev_servers_left(out: str) -> list[str]:
    """The command lines of the servers a `dev` run's output names (its PostgreSQL by data
    directory, its Temporal by its two ports) that still run. By process, not by port: another
    test's server may take a port the moment `dev` frees it."""
    data_dir = re.search(r"\(data in (\S+)\)", out)
    server = re.search(r"Temporal dev server at 127\.0\.0\.1:(\d+)", out)
    ui = re.search(r"Temporal UI: http://127\.0\.0\.1:(\d+)", out)
    assert data_dir, out
    assert server, out
    marks = [["-D", data_dir.group(1)], ["--port", server.group(1)]]
    if ui:
        marks[1] += ["--ui-port", ui.group(1)]
    left = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue  # it ended while we looked
        if any(_has_pairs(argv, mark) for mark in marks):
            left.append(" ".join(argv))
    return left


def _has_pairs(argv: list[str], mark: list[str]) -> bool:
    """Whether every (flag, value) pair of `mark` follows each other in `argv`."""
    pairs = set(itertools.pairwise(argv))
    return all((mark[i], mark[i + 1]) in pairs for i in range(0, len(mark), 2))


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Make sure `proc` is gone (for finally blocks)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(10)


# -- in this process -----------------------------------------------------------------------------


def run_main(*args: str, env: Mapping[str, str] | None = None, cwd: Path = REPO) -> Done:
    """`worker.main(ARGS)` in this process, as `python worker.py ARGS` would run it: with `env`
    (default `clean_env()`) as its whole environment and `cwd` as its working directory, its
    stdout and stderr captured (log lines included), and everything put back after: the
    environment, the directory, the streams, and the logging `main` configures.

    `main` runs `asyncio.run`: from an async test, `await asyncio.to_thread(run_main, ...)`. A
    `run` that gets as far as starting a worker needs the main thread (signal handlers).
    """
    import worker  # the command line; imported here, as only the tests that call it need it

    out, err = io.StringIO(), io.StringIO()
    wanted = clean_env() if env is None else dict(env)
    with (
        pytest.MonkeyPatch.context() as patch,
        logging_kept(),
        redirect_stdout(out),
        redirect_stderr(err),
    ):
        use_env(patch, wanted)
        patch.chdir(cwd)
        try:
            status = worker.main(list(args))
        except SystemExit as exit_:  # argparse refusing the arguments
            status = exit_.code if isinstance(exit_.code, int) else 1
    return Done(status, out.getvalue(), err.getvalue())


def only_in_python(patch: pytest.MonkeyPatch) -> None:
    """Until `patch` is undone, a change to `os.environ` (`patch.setenv` too) changes Python's
    view alone, not the C library's environment, which other threads read (`use_env`)."""
    patch.setattr(os, "putenv", lambda key, value: None)
    patch.setattr(os, "unsetenv", lambda key: None)


def use_env(patch: pytest.MonkeyPatch, env: Mapping[str, str]) -> None:
    """Make `os.environ` exactly `env` (usually a `clean_env(...)`) until `patch` is undone: for
    code run in this process that reads the environment (Temporal's client configuration, read
    through `os.environ`: `purge_ops.connect.temporal_settings`).

    Python's view only: the C library's environment is left as it is (`os.putenv` and
    `os.unsetenv` do nothing meanwhile). Other threads read it as they run (Temporal's runtime,
    libpq, the time zone for a log line's time), and glibc's setenv moving it beside a getenv
    crashed a test worker with a segmentation fault, the session then waiting on it for ever."""
    only_in_python(patch)
    for key in list(os.environ):
        if key not in env:
            patch.delenv(key)
    for key, value in env.items():
        if os.environ.get(key) != value:
            patch.setenv(key, value)


@contextmanager
def logging_kept() -> Iterator[None]:
    """Undo `purge_ops.logs.configure`, which replaces the root logger's handlers (pytest's
    capture among them) and level, and Temporal's loggers' message settings. Around every test
    (conftest's `logging_put_back`): a test that calls `worker.main` itself leaves the root
    logger writing to the stderr pytest captured for it, closed once it ends."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    on_activity = activity.logger.activity_info_on_message
    on_workflow = workflow.logger.workflow_info_on_message
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        activity.logger.activity_info_on_message = on_activity
        workflow.logger.workflow_info_on_message = on_workflow


def worker_config(path: Path, database_url: str, task_queue: str, targets: str) -> Path:
    """Write a config file with `targets` (TOML [[targets]] tables, after any top-level keys)
    and return its path."""
    path.write_text(
        f"database_url = {database_url!r}\ntask_queue = {task_queue!r}\n\n{targets}",
        encoding="utf-8",
    )
    return path
