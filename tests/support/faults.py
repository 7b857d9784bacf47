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
from typing import Any

import pytest

from purge_ops.ports import free_ports
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

    def merge(self, other: Tally) -> None:
        """Add `other`'s figures (another pytest-xdist worker's) to these."""
        self.faults.update(other.faults)
        self.in_target.update(other.in_target)
        self.passes += other.passes
        self.rows += other.rows
        self.seeds.update(other.seeds)

    def to_wire(self) -> dict[str, Any]:
        """Plain values, as pytest-xdist carries a worker's output to the controller."""
        return {
            "faults": dict(self.faults),
            "in_target": dict(self.in_target),
            "passes": self.passes,
            "rows": self.rows,
            "seeds": dict(self.seeds),
        }

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> Tally:
        return cls(
            faults=Counter(raw["faults"]),
            in_target=Counter(raw["in_target"]),
            passes=raw["passes"],
            rows=raw["rows"],
            seeds=dict(raw["seeds"]),
        )

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


#: The key of a worker's tally in pytest-xdist's `workeroutput`.
TALLY_KEY = "purge_fault_tally"


def write_tally(terminalreporter: pytest.TerminalReporter, tally: Tally) -> None:
    terminalreporter.write_sep("=", "fault injection")
    for line in tally.lines():
        terminalreporter.write_line(line)


class TallyReport:
    """A pytest plugin printing a tally in the terminal summary, where `pytest -m slow` shows it
    without -s."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        # On a pytest-xdist worker, whose summary nobody sees: the figures (the seeds above
        # all) go to the controller, which prints every worker's together (WorkersTally).
        output = getattr(session.config, "workeroutput", None)
        if output is not None:
            output[TALLY_KEY] = self.tally.to_wire()

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        write_tally(terminalreporter, self.tally)


class WorkersTally:
    """On pytest-xdist's controller: the fault tallies of its workers, merged and printed in
    the terminal summary (none when no worker ran a fault test)."""

    def __init__(self) -> None:
        self.tally: Tally | None = None

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        raw = getattr(node, "workeroutput", {}).get(TALLY_KEY)
        if raw is not None:
            if self.tally is None:
                self.tally = Tally()
            self.tally.merge(Tally.from_wire(raw))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.tally is not None:
            write_tally(terminalreporter, self.tally)


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
