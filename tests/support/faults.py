"""The machinery of the fault-injection suite: worker processes to kill, and the run's figures."""

from __future__ import annotations

import re
import signal
import subprocess
import urllib.request
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from purge_dev.servers import free_ports
from tests.support.procs import identity, start_worker, stop


@dataclass
class Tally:
    """What a fault-injection run did, printed in pytest's terminal summary."""

    faults: Counter[str] = field(default_factory=Counter)
    """Faults injected, by kind."""
    in_target: Counter[str] = field(default_factory=Counter)
    """Of those, the ones that struck a target in the middle of its sweep (for a kill, a
    restart of PostgreSQL or a lock: the ones that failed its running attempt)."""
    passes: int = 0
    """Passes that completed and were checked."""
    rows: int = 0
    """Rows whose fate was checked after those passes."""
    seeds: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, in_target: bool) -> None:
        self.faults[kind] += 1
        self.in_target[kind] += in_target

    def lines(self) -> list[str]:
        kinds = "; ".join(
            f"{kind} {n} ({self.in_target[kind]} in a target)"
            for kind, n in sorted(self.faults.items())
        )
        seeds = ", ".join(f"{test}={seed}" for test, seed in self.seeds.items())
        return [
            f"faults injected: {self.faults.total()} ({kinds or 'none'})",
            f"passes completed: {self.passes}",
            f"rows checked: {self.rows:,} (every live row still there, every expired row gone)",
            f"seeds (PURGE_FAULT_SEED=...): {seeds or 'none'}",
        ]


class TallyReport:
    """A pytest plugin printing a tally in the terminal summary, where `pytest -m slow` shows it
    without -s."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        terminalreporter.write_sep("=", "fault injection")
        for line in self.tally.lines():
            terminalreporter.write_line(line)


class Fleet:
    """The worker processes of one test (`python worker.py run --config F`): one at a time,
    a new one started after each kill, every one reaped at the end whatever happened."""

    def __init__(
        self, config: Path, env: Mapping[str, str], log_dir: Path, metrics: bool = False
    ) -> None:
        self.config, self.env, self.log_dir = config, dict(env), log_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        #: With `metrics`, each worker serves Prometheus metrics on a port of its own.
        self.metrics = metrics
        self.port = 0
        log_dir.mkdir(parents=True, exist_ok=True)

    @property
    def current(self) -> subprocess.Popen[bytes]:
        return self.procs[-1]

    @property
    def alive(self) -> bool:
        return bool(self.procs) and self.current.poll() is None

    def start(self) -> subprocess.Popen[bytes]:
        """A new worker, its output in `<n>.log` of the log directory."""
        assert not self.alive, "one worker at a time: a kill must hit the one running the pass"
        args: list[str] = []
        if self.metrics:
            [self.port] = free_ports(1)
            args = ["--metrics", f"127.0.0.1:{self.port}"]
        proc = start_worker(self.config, self.env, self.log_dir / f"{len(self.procs)}.log", *args)
        self.procs.append(proc)
        return proc

    def kill(self) -> str:
        """SIGKILL the current worker and wait until it is gone; the identity it polled with."""
        proc = self.current
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        return identity(proc)

    def rows_removed(self) -> dict[str, int]:
        """`purge_rows_removed` per target, as the current worker serves it now."""
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as page:
            text = page.read().decode()
        return {
            m.group(1): int(float(m.group(2)))
            for m in re.finditer(
                r'^purge_rows_removed\{[^}]*target="([^"]+)"[^}]*\} (\S+)$', text, re.M
            )
        }

    def close(self) -> None:
        for proc in self.procs:
            stop(proc)

    def logs(self, lines: int = 15) -> str:
        """The tail of each worker's log, for a failing test's report."""
        tails = []
        for n, proc in enumerate(self.procs):
            text = (self.log_dir / f"{n}.log").read_text(errors="replace").splitlines()
            tails.append(f"--- worker {n} ({identity(proc)}, exit {proc.returncode}) ---")
            tails += text[-lines:]
        return "\n".join(tails)
