"""Settings both the config and the activities use: plain dataclasses, no dependencies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args


@dataclass(frozen=True)
class SweepSettings:
    """The bounds on one target's sweep (`[sweep]`, overridden per target)."""

    lock_timeout_ms: int = 2_000
    """A row lock held longer than this by someone else fails the batch; Temporal retries the
    target, which resumes where its last heartbeat said."""
    statement_timeout_ms: int = 10_000
    """No batch runs longer than this, whatever the plan."""
    batch_target_ms: int = 15
    """Each batch is resized to take about this long: short enough that no lock outlives it,
    long enough that the per-batch overhead stays small (why: docs/decisions/short-batches.md)."""
    time_budget_ms: int = 600_000
    """A target's sweep ends cleanly after this long and reports its backlog; the next pass
    continues. Well inside an hourly schedule's period."""
    busy_wait_ms: int = 10_000
    """How long a sweep waits for another sweep of the same table (the advisory lock every
    sweep holds on its table) before reporting the target `busy`."""
    max_replica_lag_ms: int | None = None
    """Between batches, pause while a streaming replica's replay lag exceeds this."""
    max_wal_rate: int | None = None
    """Between batches, wait as needed to keep the WAL written under this many bytes a second."""
    refuse_unindexed_children: bool = False
    """Fail the target, before deleting, when a foreign key into its table has no index on the
    child's columns (otherwise: one warning per pass naming the index to create)."""
    analyze_after: bool = False
    """ANALYZE a table after a sweep removed more than a tenth of it (needs MAINTAIN or
    ownership; without them, one warning, never a failure)."""


#: What `partitions` may say: rows deleted as before, or whole expired partitions dropped, or
#: detached and kept.
PartitionMode = Literal["delete", "drop", "detach"]
PARTITION_MODES: tuple[PartitionMode, ...] = get_args(PartitionMode)

#: The unit of an integer epoch column (`unit` of an `expiring` target): what a stored value
#: counts since 1970.
EpochUnit = Literal["ms", "s", "us"]
EPOCH_UNITS: tuple[EpochUnit, ...] = get_args(EpochUnit)


@dataclass(frozen=True)
class PartitionPolicy:
    """What a sweep does with a range partition of its table whose every possible row is expired
    (`partitions` and `detached_schema` of a target)."""

    mode: PartitionMode = "delete"
    """`delete`: its rows are deleted in batches like any others; `drop`: it is detached, then
    dropped; `detach`: it is detached and moved to `detached_schema`, kept as a plain table."""
    detached_schema: str = ""
    """Where `detach` moves a detached partition; empty for the other modes."""

    @property
    def removes(self) -> bool:
        """Whether whole partitions leave the table (`drop` or `detach`)."""
        return self.mode != "delete"


@dataclass(frozen=True)
class Guards:
    """Limits on one target's sweep, each refusing it before the first delete; None means off.

    They stand against a retention sweep's worst days: a unit bug that makes every row look
    expired, a clock that jumped, a config pointed at the wrong table.
    """

    max_rows: int | None = None
    """Refuse a sweep that would remove more rows than this."""
    max_fraction: float | None = None
    """Refuse a sweep that would remove more than this share of the target's rows."""
    max_clock_jump_ms: int | None = None
    """Refuse when this pass's instant is earlier than the previous pass's, or later by more
    than this: a clock that jumped makes everything (or nothing) look expired."""

    @property
    def counts(self) -> bool:
        """Whether a guard needs the expired and total counts before the sweep."""
        return self.max_rows is not None or self.max_fraction is not None
