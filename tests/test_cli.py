"""The command line as a user runs it: `dev --once` on embedded defaults, `dev` until Ctrl-C, and
a worker that stops cleanly on SIGTERM and SIGINT. `dev` and `run` go through the real entry point
(`python worker.py`) here; `dev --once` is `worker.main` in this process."""

from __future__ import annotations

import re
import signal
import socket
from pathlib import Path
from typing import Any

import pytest

from activities.results import PurgeReport
from purge_dev import demo, dev
from purge_dev.servers import port_is_free
from purge_ops import render
from tests.support.procs import (
    DEV_PORT,
    clean_env,
    dev_servers_left,
    run_main,
    start,
    start_worker,
    stop,
    wait_for,
    worker_config,
)
from tests.support.servers import RunningTemporal


@DEV_PORT
def test_dev_once_runs_a_pass_on_embedded_servers_and_stops_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the default Temporal port taken, it picks another, says which, runs one pass, prints
    the report and the rows that stayed, exits 0 and leaves no server running."""
    # The instant the demo rows are written at, and the report (its pass's instant), as `dev`
    # hands them on: what the bucket's tokens are counted from and to.
    seen: dict[str, Any] = {}

    async def create_demo(conn: Any, now_ms: int) -> None:
        seen["seeded_ms"] = now_ms
        await demo.create_demo(conn, now_ms)

    def report_table(report: PurgeReport) -> str:
        seen["report"] = report
        return render.report_table(report)

    monkeypatch.setattr(dev, "create_demo", create_demo)
    monkeypatch.setattr(dev, "report_table", report_table)
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken = port_is_free(7233)
        if taken:
            squatter.bind(("127.0.0.1", 7233))
            squatter.listen()
        done = run_main("dev", "--once")
    out = done.stdout
    assert done.returncode == 0, done.stderr[-2000:]
    moved = re.search(r"Temporal port 7233 is taken .*; using port (\d+) instead", out)
    assert moved, out
    assert f"Temporal dev server at 127.0.0.1:{moved.group(1)}" in out
    report = {
        m.group(1): int(m.group(2))
        for m in re.finditer(
            r"^(\w+)\s+(\d+)\s+(?:[\d.]+\s+\w+\s+\d+\s+[\d.]+\s+\d+%\s+ok)?\s*$", out, re.M
        )
    }
    assert report == {
        "x_idempotency": 2,
        "x_rate_limit": 1,
        "x_auth": 3,
        "demo_sessions": 2,
        "total": 8,
    }
    assert "why it stayed" in out
    assert out.rstrip().endswith("docs/operating.md#your-own-table-beside-dev")
    # The half-empty bucket stayed, and says why. It was emptied 30 s before the demo rows were
    # written and refills a token a minute (up to its 4): half a token, plus what the time
    # between writing the rows and the pass's instant added, however long that took.
    held = re.search(r"holds (\d+\.\d+) of 4 tokens", out)
    assert held, out
    since_ms = seen["report"].now_ms - (seen["seeded_ms"] - 30_000)
    assert float(held.group(1)) == pytest.approx(min(4.0, since_ms / 60_000), abs=0.0051), out
    assert "Traceback" not in done.stderr
    assert dev_servers_left(out) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_worker_shuts_down_gracefully_on_signal(
    tmp_path: Path,
    temporal_server: RunningTemporal,
    schema_url: str,
    task_queue: str,
    sig: signal.Signals,
) -> None:
    config = worker_config(
        tmp_path / "purge.toml", schema_url, task_queue, '[[targets]]\nkind = "auth"\n'
    )
    log = tmp_path / "worker.log"
    worker = start_worker(config, clean_env(TEMPORAL_ADDRESS=temporal_server.address), log)
    try:
        wait_for(lambda: "worker on task queue" in log.read_text(), 60, "the worker to start")
        worker.send_signal(sig)
        assert worker.wait(30) == 0
    finally:
        stop(worker)
    text = log.read_text()
    assert "stopping: no new work on any queue" in text
    assert "targets: x_auth" in text
    assert "Traceback" not in text


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_worker_stopped_while_it_waits_for_its_database_exits_at_once(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """A signal while `run` still waits for its database (up to `database_wait`, two minutes
    here) ends the start there: exit 0 at once, no queue polled, not a start that goes on
    until the database answers or the wait ends (status 1). The moment:
    the database's address accepted the worker's connection and answers nothing."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        path = tmp_path / "purge.toml"
        path.write_text(
            f'database_url = "postgresql://app@127.0.0.1:{port}/app"\n'
            'database_wait = "120s"\n[[targets]]\nkind = "idempotency"\n',
            encoding="utf-8",
        )
        log = tmp_path / "worker.log"
        worker = start_worker(path, clean_env(TEMPORAL_ADDRESS="127.0.0.1:1"), log, "--schedule")
        try:
            silent.settimeout(60)
            held, _ = silent.accept()  # the worker is waiting for its database
            with held:
                worker.send_signal(sig)
                assert worker.wait(30) == 0, log.read_text()
        finally:
            stop(worker)
    text = log.read_text()
    assert "stopped while starting: it polled no queue" in text
    assert "Traceback" not in text


# In the slow suite: a second whole `dev` (servers, schedule, UI) beside the `--once` above.
@pytest.mark.slow
@DEV_PORT
def test_dev_keeps_a_worker_and_the_ui_up_until_ctrl_c(tmp_path: Path) -> None:
    """Without --once: the schedule is created, it prints the UI's address, the UI answers, and
    Ctrl-C (SIGINT) stops the worker and both servers, exit 0."""
    import urllib.request

    log = tmp_path / "dev.log"
    dev = start(["dev"], clean_env(), log)
    try:
        wait_for(lambda: "Ctrl-C stops" in log.read_text(), 120, "dev to come up")
        text = log.read_text()
        # The schedule is in place, so a scheduled pass can be watched in the UI.
        assert "created schedule purge-hourly: cron '23 * * * *' in UTC" in text
        ui = re.search(r"Temporal UI: (http://127\.0\.0\.1:(\d+))", text)
        assert ui, text
        with urllib.request.urlopen(ui.group(1), timeout=10) as page:  # noqa: S310 (http only)
            assert page.status == 200
        # Both servers found by what they run with, so finding none below means something.
        assert len(dev_servers_left(text)) == 2, dev_servers_left(text)
        dev.send_signal(signal.SIGINT)
        assert dev.wait(60) == 0
    finally:
        if dev.poll() is None:
            dev.kill()
            dev.wait()
    assert "stopping" in log.read_text()
    assert dev_servers_left(log.read_text()) == []
