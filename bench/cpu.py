"""CPU seconds spent by each process of a measurement: the bench itself (its worker, client and
sweeps, all threads), the Temporal dev server, the PostgreSQL server (all its backends).

On a 2-core machine the question "what limits this" is often "who had the CPUs": a pass that
takes 2 s of wall time while the three processes spent 3.8 s of CPU between them was CPU-bound.
Linux only (/proc); elsewhere the figures are simply left out.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces: split after its closing parenthesis.
    return text[text.rindex(")") + 2 :].split()


def process_tree_seconds(pid: int) -> float | None:
    """User + system CPU of `pid`, its reaped children and its live children (one level: a
    postmaster's backends, a server's helpers)."""
    fields = _stat(pid)
    if fields is None:
        return None
    # After the name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
    ticks = sum(int(f) for f in fields[11:15])
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        child = _stat(int(entry.name))
        if child is not None and child[1] == str(pid):
            ticks += int(child[11]) + int(child[12])
    return ticks / _TICKS


def own_seconds() -> float:
    """This process's CPU, every thread (the SDK's workflow threads and its Rust core too)."""
    times = os.times()
    return times.user + times.system


@dataclass
class CpuMeter:
    """Snapshots of the named processes' CPU; `since()` gives what each spent in between."""

    pids: dict[str, int] = field(default_factory=dict)
    """Other processes by name (e.g. "temporal", "postgres"); this process is always "bench"."""

    def snapshot(self) -> dict[str, float]:
        seen = {"bench": own_seconds()}
        for name, pid in self.pids.items():
            seconds = process_tree_seconds(pid)
            if seconds is not None:
                seen[name] = seconds
        return seen

    def since(self, before: dict[str, float]) -> dict[str, float]:
        now = self.snapshot()
        return {name: round(now[name] - before[name], 3) for name in before if name in now}


def postmaster_pid(data_dir: Path | None) -> int | None:
    """The PostgreSQL server's pid from its data directory's postmaster.pid, when local."""
    if data_dir is None:
        return None
    try:
        return int((data_dir / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
