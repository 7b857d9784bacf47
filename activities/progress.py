"""What a batched sweep reports as it goes and when it ends: plain data, no I/O.

The contract between the activity (which heartbeats `Progress` and resumes from it) and any
target that sweeps in batches (the built-in kinds, in `activities.engine`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

Strategy = Literal["index", "range", "single"]
"""How a table's batches find its expired rows (`activities.engine.planning`), or `single`: a
small table's in one statement (`activities.engine.small_tables`)."""
SweptBy = Literal["index", "range", "single", "partitions"]
"""What took a table's rows out: a batched strategy, or whole partitions."""
PartitionAction = Literal["dropped", "detached"]
"""What became of the partitions that left their table whole."""


@dataclass(frozen=True)
class LedgerKey:
    """Which `purge_progress` row a sweep's batches add to: one per pass (the workflow's run)
    and target (`activities.engine.ledger`)."""

    workflow_id: str
    run_id: str
    target: str
    now_ms: int
    """The pass's instant: old ledger rows are removed by it, never by the server's clock."""


@dataclass
class Progress:
    """Where a target's sweep stands: the heartbeat details after every batch, and what a
    retried attempt resumes from. With the ledger (`purge_progress`) the count is read from
    it instead, exact whatever died; without it, rows a killed worker deleted after its last
    heartbeat reached the server are not counted (the report then says "lower bound")."""

    table: int = 0
    """Which of the target's tables is being swept."""
    tables: list[str] = field(default_factory=list)
    """The target's tables as the sweeping worker's config lists them (`TableName`s, in order):
    an attempt on a worker whose config lists them otherwise starts again from the first
    (empty from a release before it: unchecked)."""
    page: int = 0
    """For a range walk: the first page not yet walked."""
    removed: int = 0
    batches: int = 0
    strategy: Strategy | Literal[""] = ""
    """The strategy of the table being swept; empty before its first batch."""
    batch_ms: float = 0.0
    """The last batch's duration."""
    batch_removed: int = 0
    """The last batch's deleted rows."""
    archived: int = 0
    """Rows this pass's batches moved into archive tables (every one of them also removed)."""
    clean_exit: bool = False
    """Set by an attempt that failed without dying, on its way out: its count is complete."""
    short: bool = False
    """Without the ledger: an earlier attempt died, so `removed` may be short of the truth."""
    leaf: int = 0
    """For a partitioned table, swept partition by partition: the OID of the partition being
    swept (`page` is within it); 0 before the first."""
    partition: str = ""
    """Set only on the heartbeat sent when a partition has just left the table (dropped or
    detached, its rows `batch_removed`): that heartbeat is not a batch."""
    partition_rows: int = 0
    """Rows of the partitions dropped or detached so far in this pass."""
    partition_names: list[str] = field(default_factory=list)
    """Those partitions, schema-qualified."""
    final: bool = False
    """Set with the batch after which the sweep has nothing left to do (a small table's one
    statement that found less than a batch): the result follows at once, so the activity
    sends no heartbeat for it. Not a heartbeat detail."""

    def start_over_unless_on(self, tables: list[str]) -> bool:
        """Start again from the first table, and say so, unless this (an earlier attempt's
        progress) is a position among `tables`, the target's tables as this worker lists them:
        its index within them, and its list theirs (or none, from a release before the list:
        taken as it stands). An attempt on a worker whose config named them otherwise (mid-
        deploy, on a queue workers of two configs poll) would skip tables never swept, or walk
        from a page of another table. Sweeping a table again is harmless: its rows deleted are
        counted by the ledger or the progress, not by where the sweep starts."""
        if self.table < len(tables) and self.tables in ([], tables):
            return False
        self.table, self.page, self.leaf = 0, 0, 0
        return True

    def details(self) -> dict[str, Any]:
        """The heartbeat details (plain JSON)."""
        details = asdict(self)
        del details["final"]
        return details

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
    """What one attempt at a sweep did, at every level: a batch run, a table, a target. Each
    level builds its own and adds what it called into it with `merge`."""

    removed: int = 0
    """Rows deleted. For a target, counting those of earlier attempts this one resumed from
    (the ledger's or the heartbeats' count); below it, this attempt's batches only."""
    batches: int = 0
    strategies: list[SweptBy] = field(default_factory=list)
    batch_ms: list[float] = field(default_factory=list)
    backlog: int = 0
    """Expired rows left when the time budget ended the sweep (0 when it finished)."""
    backlog_estimated: bool = False
    """Whether `backlog` is an estimate rather than a count: a walk's (from the density of the
    pages it walked), or a count of the rows left that ran out of time (from the plan)."""
    advice: list[str] = field(default_factory=list)
    ledger: bool = False
    """Whether `removed` came from the ledger (exact), rather than heartbeats."""
    ledger_start: int = 0
    """What the ledger held when this attempt started: the earlier attempts' rows."""
    oldest_expired_age_ms: int | None = 0
    """How long the oldest expired row still there has been expired (0: none; None: not
    known, the query ran out of time)."""
    live_rows: int = 0
    dead_rows: int = 0
    """The tables' live and dead tuples after the sweep, from the statistics views."""
    live_from: str = "stats"
    """Where `live_rows` came from: `stats` (the views), `estimate` (the planner's, where the
    views held no count of a table), `unknown` (neither: no share of the table is given)."""
    analyzed: bool = False
    busy: str = ""
    """Why the sweep stopped at a table another sweep held (empty when it did not)."""
    reason: str = ""
    """Why pacing ended the sweep before its end, leaving a backlog (empty when it did not)."""
    paused_s: float = 0.0
    """How long pacing (replica lag, WAL rate) held the sweep between batches."""
    partitions: list[str] = field(default_factory=list)
    """Partitions dropped or detached whole (in a dry run: that would be), schema-qualified."""
    partition_rows: int = 0
    """Their rows, counted after the detach and before the drop (in a dry run: now)."""
    partition_action: PartitionAction | None = None
    """Set when any partition left its table whole."""

    @property
    def edge_removed(self) -> int:
        """Rows deleted in batches: every row removed that was not in a whole partition."""
        return max(self.removed - self.partition_rows, 0)

    archived: int = 0
    """Rows moved into archive tables: `removed` itself when every table has an archive."""
    complete: bool = True
    """False when the time budget (or pacing) ended the sweep before every expired row, or
    every wholly expired partition, was out."""

    def merge(self, other: SweepStats) -> SweepStats:
        """Add what `other` (a part of this sweep, done after what this one holds) did: counts
        add up, lists follow on (advice said once), the first reason stays; this, updated."""
        self.removed += other.removed
        self.batches += other.batches
        self.strategies += other.strategies
        self.batch_ms += other.batch_ms
        self.backlog += other.backlog
        # A sum with any estimated part is an estimate.
        self.backlog_estimated = self.backlog_estimated or other.backlog_estimated
        self.advice += [a for a in other.advice if a not in self.advice]
        self.ledger = self.ledger or other.ledger
        self.ledger_start = max(self.ledger_start, other.ledger_start)
        mine, theirs = self.oldest_expired_age_ms, other.oldest_expired_age_ms
        # Unknown for any part is unknown for the whole.
        self.oldest_expired_age_ms = None if mine is None or theirs is None else max(mine, theirs)
        self.live_rows += other.live_rows
        self.dead_rows += other.dead_rows
        # The least sure source of any part is the whole's.
        order = ("stats", "estimate", "unknown")
        self.live_from = max(self.live_from, other.live_from, key=order.index)
        self.analyzed = self.analyzed or other.analyzed
        self.busy = self.busy or other.busy
        self.reason = self.reason or other.reason
        self.paused_s += other.paused_s
        self.partitions += other.partitions
        self.partition_rows += other.partition_rows
        self.partition_action = self.partition_action or other.partition_action
        self.archived += other.archived
        self.complete = self.complete and other.complete
        return self

    @property
    def dead_share(self) -> float | None:
        """Dead tuples as a share of all tuples after the sweep (0 when the views know none;
        None when the live rows are unknown)."""
        if self.live_from == "unknown":
            return None
        total = self.live_rows + self.dead_rows
        return round(self.dead_rows / total, 4) if total else 0.0

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
