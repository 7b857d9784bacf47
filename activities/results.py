"""What a sweep, a pass and a failed target report: the activity's result, the workflow's, and
the lines a report is made of.

Plain types, no side effects: the workflow imports this module. Every field added later gets a
default, so a history recorded before it existed still decodes. A batched sweep's figures come
from its `SweepStats` through `PurgeSweep.take_figures`, the one place a stats field meets its
report field.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal, cast

if TYPE_CHECKING:
    from activities.progress import SweepStats

SweepStatus = Literal["ok", "skipped", "busy", "gone"]
"""How a sweep ended, on the wire as the string itself. `ok`: it ran. `skipped`: the pass's
budget was spent before it started (or, for a dry run, while it counted). `busy`: another
sweep held one of its tables. `gone`: a pattern's match was dropped before its sweep. None of
the last three is a failure, and none of them measured anything."""


@dataclass
class PurgeSweep:
    """The activity's result, and one row of the report."""

    name: str
    removed: int
    """Rows deleted (or, in a dry run, rows that would be)."""
    dry_run: bool = False
    seconds: float = 0.0
    """Wall time the sweep took on the worker (this attempt)."""
    strategy: str = ""
    """How the built-in target deleted: `index`, `range` (or both, `index+range`), led by
    `partitions` when whole partitions went (`partitions+index`); `custom` for an application's
    own target; `count` for a dry run."""
    batches: int = 0
    p95_batch_ms: float = 0.0
    """The 95th percentile of the batches' durations: how long any lock was held, at most."""
    backlog: int = 0
    """Expired rows left when the time budget ended the sweep; the next pass continues."""
    backlog_estimated: bool = False
    """True when `backlog` is an estimate, not a count: a walked table's (from the density of
    expired rows in the pages walked), or a count that ran out of time (from the planner's
    estimate). A count stops at 1,000,000 rows: `backlog` is then at least that."""
    advice: str = ""
    """A warning for the operator, such as the index that would let the sweep skip live rows."""
    lower_bound: bool = False
    """True when `removed` may be short of the rows really removed: a worker died during an
    attempt and the target's database has no `purge_progress` ledger to count from."""
    oldest_expired_age_s: float | None = 0.0
    """How long the oldest expired row still there after the sweep has been expired, in
    seconds: 0 when none is left, None when it could not be read in time."""
    dead_tuple_share: float | None = 0.0
    """The tables' dead tuples as a share of all their tuples after the sweep (statistics);
    None when the live rows are unknown (`live_rows_from`)."""
    live_rows_from: str = "stats"
    """Where the live rows after the sweep (behind `dead_tuple_share` and every share of the
    table the advice gives) came from: `stats`, the statistics views; `estimate`, the
    planner's row estimate less the rows removed, where the views held no count of a table (a
    database made from a template or restored, after crash recovery or pg_stat_reset());
    `unknown`, neither, and then no share is given."""
    analyzed: bool = False
    """Whether `analyze_after` ran ANALYZE on a table this sweep removed a large share of."""
    status: SweepStatus = "ok"
    """How it ended (see `SweepStatus`): only an `ok` sweep ran."""
    reason: str = ""
    """Why it was skipped or busy, or why pacing left a backlog."""
    paused_s: float = 0.0
    """How long pacing (max_replica_lag, max_wal_rate) held the sweep between batches."""
    partitions_dropped: int = 0
    """Partitions of its tables dropped whole, their every possible row expired
    (`partitions = "drop"`); in a dry run, that would be."""
    partitions_detached: int = 0
    """Partitions detached whole and kept in `detached_schema` (`partitions = "detach"`)."""
    partition_rows: int = 0
    """The rows those partitions held, counted after each detach: part of `removed`."""
    edge_removed: int = 0
    """The rest of `removed`: rows deleted in batches (the partition straddling the cutoff,
    the DEFAULT one, a table that is not partitioned)."""
    partition_names: list[str] = field(default_factory=list)
    """The partitions dropped or detached, schema-qualified, as they were named in the table."""
    archived: int = 0
    """Rows moved into the target's archive tables, each in the same transaction as its
    delete: `removed` itself when every table of the target has an archive; 0 in a dry run."""
    worker: str = ""
    """The identity of the worker that swept it (the SDK's default: pid@host)."""
    unchecked_guards: dict[str, str] = field(default_factory=dict)
    """The target's guards that had nothing to compare with, so did not check this sweep, each
    with why (`max_clock_jump` with no previous pass): they did not refuse it either."""

    def take_figures(self, stats: SweepStats) -> None:
        """A batched sweep's figures, from what its sweep (or dry run) reported. A new figure
        is a field of the stats's name here and one line below. Where a name differs, the
        report's is the one committed histories and the JSON already hold; it is mapped here
        and nowhere else."""
        self.strategy, self.batches = stats.strategy, stats.batches
        if stats.busy:
            self.status, self.reason = "busy", stats.busy
        elif stats.reason:
            self.reason = stats.reason  # a backlog left because pacing spent the budget
        self.p95_batch_ms, self.backlog = stats.p95_batch_ms, stats.backlog
        self.backlog_estimated = stats.backlog_estimated
        self.archived = stats.archived
        age = stats.oldest_expired_age_ms
        self.oldest_expired_age_s = None if age is None else round(age / 1000, 3)
        self.dead_tuple_share, self.live_rows_from = stats.dead_share, stats.live_from
        self.paused_s = round(stats.paused_s, 3)
        self.analyzed = stats.analyzed
        if stats.partition_action == "dropped":
            self.partitions_dropped = len(stats.partitions)
        elif stats.partition_action == "detached":
            self.partitions_detached = len(stats.partitions)
        self.partition_names = list(stats.partitions)
        self.partition_rows = stats.partition_rows
        self.edge_removed = stats.edge_removed
        # Each advice starts with its table's name; " | " keeps where one ends visible.
        self.advice = " | ".join(stats.advice)


@dataclass(frozen=True)
class FailedTarget:
    """A target that failed after its retries, as the report names it."""

    name: str
    type: str
    """The Temporal error type, e.g. `UnknownPurgeTarget` or `BadPurgeTarget`."""
    message: str


@dataclass
class PatternLine:
    """One pattern target in a report: how its matches fared, as one line."""

    name: str
    tables: int = 0
    removed: int = 0
    failed: int = 0
    busy: int = 0
    gone: int = 0
    """Tables matched, then dropped before their sweep: reported, not failed."""
    skipped: int = 0
    largest_backlog: int = 0

    def add(self, outcome: PurgeSweep | FailedTarget) -> None:
        self.tables += 1
        if isinstance(outcome, FailedTarget):
            self.failed += 1
            return
        self.removed += outcome.removed
        self.busy += outcome.status == "busy"
        self.gone += outcome.status == "gone"
        self.skipped += outcome.status == "skipped"
        self.largest_backlog = max(self.largest_backlog, outcome.backlog)

    def merge(self, other: PatternLine) -> None:
        self.tables += other.tables
        self.removed += other.removed
        self.failed += other.failed
        self.busy += other.busy
        self.gone += other.gone
        self.skipped += other.skipped
        self.largest_backlog = max(self.largest_backlog, other.largest_backlog)


@dataclass
class PurgeReport:
    """The workflow's result: `{"swept": [{"name": ..., "removed": n}], "removed": total}`."""

    swept: list[PurgeSweep] = field(default_factory=list)
    """Targets that completed, in input order."""
    removed: int = 0
    now_ms: int = 0
    """The instant every target measured expiry against."""
    dry_run: bool = False
    failed: list[FailedTarget] = field(default_factory=list)
    """Targets that failed; the workflow then fails with `PurgeTargetsFailed` carrying this.
    In a compact report, the first FAILED_CAP of them (see `failed_total`)."""
    compact: bool = False
    """True for a pass spread over child workflows (a pattern, or over INLINE_TARGETS
    targets): `swept` then holds only the sweeps that removed the most, `failed` the first
    failures, and each table's own record is in the history of the child named in
    `children` that swept it."""
    targets: int = 0
    """In a compact report: the targets swept, patterns expanded."""
    statuses: dict[SweepStatus, int] = field(default_factory=dict)
    """In a compact report: how many sweeps ended each way."""
    patterns: list[PatternLine] = field(default_factory=list)
    """In a compact report: one line per pattern target, in input order."""
    failed_total: int = 0
    """In a compact report: every failed target, named in `failed` or not."""
    children: list[str] = field(default_factory=list)
    """In a compact report: the ids of the child workflows that swept the targets."""

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> PurgeReport:
        """Rebuild a report from the plain dict a client or an error's details hand back."""
        return cls(
            swept=[PurgeSweep(**known_fields(PurgeSweep, s)) for s in raw.get("swept", [])],
            removed=int(raw.get("removed", 0)),
            now_ms=int(raw.get("now_ms", 0)),
            dry_run=bool(raw.get("dry_run", False)),
            failed=[FailedTarget(**known_fields(FailedTarget, f)) for f in raw.get("failed", [])],
            compact=bool(raw.get("compact", False)),
            targets=int(raw.get("targets", 0)),
            # Read as written: a status a newer worker added is shown, not refused.
            statuses={
                cast("SweepStatus", str(k)): int(v) for k, v in raw.get("statuses", {}).items()
            },
            patterns=[PatternLine(**known_fields(PatternLine, p)) for p in raw.get("patterns", [])],
            failed_total=int(raw.get("failed_total", 0)),
            children=[str(c) for c in raw.get("children", [])],
        )


def known_fields(kind: type, raw: dict[str, Any]) -> dict[str, Any]:
    # A newer worker may have added fields this caller does not know; keep what it does know.
    names = {f.name for f in fields(kind)}
    return {key: value for key, value in raw.items() if key in names}
