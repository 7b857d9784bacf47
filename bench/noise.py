"""How fast this machine runs a fixed piece of work right now, and how much that moves.

On a machine whose cores are shared (this project's: 2 vCPUs of a VM), the same CPU work takes
a different time from one second to the next, whatever this process does. A ratio of two forms
timed one after the other is only as steady as that. So the bench times one fixed CPU probe
before every form (`measure_form`), keeps it in the run's notes (`probe_ms`) and prints its
spread over the run beside the load average: a run whose probe moved by 1.3x cannot resolve a
goal of 1.15x from one round.

The probe is a pure-Python loop: it stands for the CPU a process gets, not for PostgreSQL's
memory-bound work, so it tells a noisy run from a quiet one rather than correcting a figure.

    python -m bench.noise                  # 20 s of probes, every 0.5 s, and their spread
    python -m bench.noise --seconds 60 --every 0.2
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

#: About 50 ms on the bench machine: short beside a form's copy (seconds), long beside a tick.
PROBE_ITERATIONS = 300_000


def probe_ms() -> float:
    """The milliseconds one fixed CPU loop takes now."""
    started = time.perf_counter()
    total = 0
    for i in range(PROBE_ITERATIONS):
        total += i * i
    elapsed = (time.perf_counter() - started) * 1000
    assert total > 0  # the loop's result is used, whatever an optimizer might think
    return elapsed


@dataclass(frozen=True)
class Spread:
    """Low, median and high of a run's probes."""

    low: float
    median: float
    high: float
    count: int

    @property
    def ratio(self) -> float:
        """How much slower the slowest probe ran than the fastest."""
        return self.high / self.low if self.low > 0 else float("inf")

    def line(self, when: str) -> str:
        """One line for a report: `when` says when the probes ran ("before each of 9 forms")."""
        return (
            f"machine probe ({PROBE_ITERATIONS:,}-step CPU loop, {when}): "
            f"{self.low:.1f}-{self.high:.1f} ms, median {self.median:.1f}; "
            f"the slowest {self.ratio:.2f}x the fastest"
        )


def spread(samples: Sequence[float]) -> Spread | None:
    """The spread of `samples`, or None without any."""
    if not samples:
        return None
    return Spread(min(samples), statistics.median(samples), max(samples), len(samples))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.noise", description="time a fixed CPU probe, again and again"
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="how long (default 20)")
    parser.add_argument("--every", type=float, default=0.5, help="seconds between probes")
    args = parser.parse_args(argv)
    samples: list[float] = []
    ends = time.monotonic() + args.seconds
    while time.monotonic() < ends:
        samples.append(probe_ms())
        print(f"{samples[-1]:7.1f} ms", flush=True)
        time.sleep(args.every)
    found = spread(samples)
    if found is not None:
        print(found.line(f"{found.count} times, {args.every:g} s apart"))


if __name__ == "__main__":
    main()
