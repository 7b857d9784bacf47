"""A new user's first minutes, as the docs print them: the shell blocks that put a table of
their own beside `dev` (docs/operating.md) and a `python` target of their own
(docs/own-targets.md) run as written, against the tests' servers, with only what a reader
fills in replaced (the URL `dev` printed, the checkout's venv). Each is a few `pg-purge`
processes: the slow suite."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.procs import clean_env
from tests.support.servers import RunningTemporal

REPO = Path(__file__).resolve().parents[1]
#: The shell a reader pastes the blocks into.
BASH = shutil.which("bash") or "/bin/bash"

pytestmark = pytest.mark.slow


def fenced(page: str, heading: str, lang: str) -> str:
    """The first ```LANG block after `heading` in docs/PAGE."""
    text = (REPO / "docs" / page).read_text(encoding="utf-8")
    after = text[text.index(heading) :]
    found = re.search(rf"^```{lang}\n(.*?)^```$", after, re.S | re.M)
    assert found, f"no {lang} block after {heading!r} in {page}"
    return found.group(1)


def as_run_here(block: str, url: str, variable: str) -> str:
    """`block` with what a reader fills in put in: the test's database for the URL `dev`
    printed, and no venv to activate (the tests' own is on PATH). A step that fails ends it,
    and the worker it started in the background with it."""
    lines = []
    for line in block.splitlines():
        if line.startswith("source "):
            continue
        if line.startswith(f"export {variable}="):
            line = f"export {variable}={shlex.quote(url)}"
        lines.append(line)
    assert any(line.startswith(f"export {variable}=") for line in lines), block
    stop = "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n"
    return "set -e\n" + stop + "\n".join(lines) + "\n"


def run_block(script: str, cwd: Path, temporal: RunningTemporal) -> str:
    """Run `script` with bash in `cwd`, in a process group of its own; its output, after
    checking it succeeded. A script still running after 300 s (a hang's bound) is killed with
    every process it started, the worker it left in the background too."""
    env = clean_env(TEMPORAL_ADDRESS=temporal.address)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    with subprocess.Popen(
        [BASH, "-c", script],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    assert proc.returncode == 0, out + err
    return out


def table_line(out: str, name: str) -> list[str]:
    """The cells of each report line of target `name`."""
    return [line.split() for line in out.splitlines() if line.startswith(f"{name} ")]


async def test_a_python_target_beside_dev_runs_as_the_docs_print_it(
    tmp_path: Path, schema_url: str, db: psycopg.Connection[Any], temporal_server: RunningTemporal
) -> None:
    """docs/own-targets.md: the factory as printed, saved as myapp/purge.py; then its "Try it
    beside dev" block: `check` finds the factory's target, the dry run counts 5, the sweep
    removes those 5 and leaves the 5 not yet expired."""
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "purge.py").write_text(
        fenced("own-targets.md", "## A factory in the config", "python")
    )
    block = fenced("own-targets.md", "### Try it beside `dev`", "sh")

    out = await asyncio.to_thread(
        run_block, as_run_here(block, schema_url, "APP_DATABASE_URL"), tmp_path, temporal_server
    )

    assert "ok      myapp.purge:targets (python, gives tmp_uploads)" in out.splitlines()
    dry, swept = table_line(out, "tmp_uploads")
    assert (dry[1], swept[1], swept[3]) == ("5", "5", "custom"), out
    assert db.execute("SELECT count(*) FROM tmp_uploads").fetchone() == (5,)


async def test_a_table_of_your_own_beside_dev_runs_as_the_docs_print_it(
    tmp_path: Path, schema_url: str, db: psycopg.Connection[Any], temporal_server: RunningTemporal
) -> None:
    """docs/operating.md, "Your own table, beside dev": the tokens table, its config, the
    schema, `check`, a worker, a dry run of 5, a sweep of 5, the report."""
    block = fenced("operating.md", "In a second shell", "sh")

    out = await asyncio.to_thread(
        run_block, as_run_here(block, schema_url, "PURGE_DATABASE_URL"), tmp_path, temporal_server
    )

    assert "ok      tokens (1 table)" in out.splitlines()
    dry, swept, *_ = table_line(out, "tokens")
    assert (dry[1], swept[1]) == ("5", "5"), out
    assert db.execute("SELECT count(*) FROM tokens").fetchone() == (5,)
