"""One sweep of one target, as every level below the target sees it: made once, passed down."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from activities.engine.ledger import Ledger
from activities.progress import OnBatch, PartitionAction, Progress
from purge_config.settings import PartitionPolicy, SweepSettings


def partition_action(policy: PartitionPolicy) -> PartitionAction:
    """What `policy` (`drop` or `detach`) does to a partition it takes out."""
    return "dropped" if policy.mode == "drop" else "detached"


def ignore_batch(progress: Progress) -> None:
    """The `on_batch` of a sweep nobody watches."""
    return None


def never() -> bool:
    """The `stopping` of a sweep nothing stops early."""
    return False


def ms_left(deadline: float) -> int:
    """What is left, in ms (0 once spent), of a time budget that ends at `deadline` (a
    `time.monotonic()`, as `SweepContext.deadline_in` gives one)."""
    return max(0, int((deadline - time.monotonic()) * 1000))


@dataclass(frozen=True)
class SweepContext:
    """What a sweep of one target carries from its first table to its last batch. Frozen:
    only `progress` (where the sweep stands, which every level moves on) changes under it."""

    target: str
    """The target's name: its ledger rows and partition marks are keyed by it."""
    now_ms: int
    """The pass's instant (the caller's clock, never the server's)."""
    settings: SweepSettings
    partitions: PartitionPolicy
    progress: Progress
    """Where the sweep stands: resumed from, moved on by every batch, heartbeated."""
    on_batch: OnBatch = ignore_batch
    """Called with `progress` after every batch and every partition taken out."""
    deadline: float = float("inf")
    """The `time.monotonic()` at which the sweep stops between batches: its time budget."""
    ledger: Ledger | None = None
    """The pass's ledger, when `purge_progress` counts the batches (each adds its count in its
    own transaction); None: counted from heartbeats."""
    remember: bool = False
    """Whether each table's share removed is recorded in `purge_shares` (and the partition
    advice reads the day's passes from it): only in a pass, where the table is there."""
    stopping: Callable[[], bool] = never
    """Whether the sweep must end now, between batches, as at its deadline (its worker is
    stopping, for one: the activity then hands the rest to another worker)."""

    @staticmethod
    def deadline_in(budget_ms: int) -> float:
        """The deadline `budget_ms` from now."""
        return time.monotonic() + budget_ms / 1000

    def out_of_time(self) -> bool:
        """Whether the time budget is spent, or the sweep must end now (`stopping`)."""
        return time.monotonic() >= self.deadline or self.stopping()
