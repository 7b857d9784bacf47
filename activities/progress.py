"""What a batched sweep reports as it goes and when it ends: plain data, no I/O.

The contract between the activity (which heartbeats `Progress` and resumes from it) and any
target that sweeps in batches (the built-in kinds, in `activities.engine`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class Progress:
    """Where a target's sweep stands: the heartbeat details after every batch, and what a
    retried attempt resumes from, so no deleted row is counted twice (rows a killed worker
    deleted after its last heartbeat reached the server are not counted at all)."""

    table: int = 0
    """Which of the target's tables is being swept."""
    page: int = 0
    """For a range walk: the first page not yet walked."""
    removed: int = 0
    batches: int = 0
    strategy: str = ""
    batch_ms: float = 0.0
    """The last batch's duration."""

    def details(self) -> dict[str, Any]:
        """The heartbeat details (plain JSON)."""
        return asdict(self)

    @classmethod
    def resume(cls, details: Any) -> Progress:
        """Progress from a previous attempt's last heartbeat details, or a fresh start."""
        raw = details[0] if details else None
        if not isinstance(raw, dict):
            return cls()
        fresh = cls()
        for f in fields(cls):
            value = raw.get(f.name)
            # Only a value of the field's own type: a detail a newer or older worker wrote
            # differently means starting over (harmless), never resuming from garbage.
            if type(value) is type(getattr(fresh, f.name)):
                setattr(fresh, f.name, value)
        return fresh


OnBatch = Callable[[Progress], None]


@dataclass
class SweepStats:
    """What one attempt at a target's sweep did."""

    removed: int = 0
    """Rows deleted, counting those of earlier attempts this one resumed from."""
    batches: int = 0
    strategies: list[str] = field(default_factory=list)
    batch_ms: list[float] = field(default_factory=list)
    backlog: int = 0
    """Expired rows left when the time budget ended the sweep (0 when it finished)."""
    advice: list[str] = field(default_factory=list)

    @property
    def strategy(self) -> str:
        """`index`, `range`, or both joined for a target of several tables (`index+range`)."""
        return "+".join(dict.fromkeys(self.strategies))

    @property
    def p95_batch_ms(self) -> float:
        """The 95th percentile of this attempt's batch durations (nearest rank)."""
        if not self.batch_ms:
            return 0.0
        ordered = sorted(self.batch_ms)
        return round(ordered[math.ceil(0.95 * len(ordered)) - 1], 3)
