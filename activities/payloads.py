"""What travels between the workflow, its activity and its callers.

This module has no side effects and imports nothing that does I/O, so the workflow sandbox can pass
it through. Every payload is a dataclass whose new fields get defaults: a history recorded before a
field existed still decodes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from activities.errors import BadPurgeInput
from purge_config.fleet import DATABASE_NAME, DEFAULT_WORKER_WAIT_MS, MAX_TARGETS_PER_PASS
from purge_config.names import QUEUE_NAME, STEP_NAME

#: Up to this many targets, and with no pattern, a pass sweeps its targets itself, as the first
#: rounds did (500 was the most an input could list then); a larger pass, or one with a pattern,
#: spreads its targets over child workflows (`workflows.chunk`).
INLINE_TARGETS = 500
#: Targets one child workflow sweeps, and how many of them one run of it sweeps before it
#: continues as new: each run's history stays near 1,200 events, far inside Temporal's
#: warning at 10,240, and a child's input near 30 KB.
DEFAULT_CHILD_SIZE = 1000
DEFAULT_RUN_SIZE = 250

#: The instants a pass may run at. A `now_ms` outside them is almost surely seconds or microseconds
#: sent where milliseconds belong, and at microseconds every row on every table looks expired.
EARLIEST_NOW_MS = 946_684_800_000  # 2000-01-01T00:00:00Z
LATEST_NOW_MS = 7_258_118_400_000  # 2200-01-01T00:00:00Z


def epoch_ms(instant: datetime) -> int:
    """Integer epoch milliseconds of an aware datetime, exact (no float on the way)."""
    delta = instant - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def iso_ms(now_ms: int) -> str:
    """A millisecond instant as ISO 8601 UTC, for messages a person reads."""
    return datetime.fromtimestamp(now_ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def check_now_ms(now_ms: object) -> int:
    """Return `now_ms` if it is a plausible epoch-millisecond instant, else raise BadPurgeInput."""
    if isinstance(now_ms, bool) or not isinstance(now_ms, int):
        raise BadPurgeInput(f"now_ms must be an integer of epoch milliseconds, got {now_ms!r}")
    if now_ms < EARLIEST_NOW_MS:
        raise BadPurgeInput(
            f"now_ms {now_ms} is before 2000-01-01 ({iso_ms(max(now_ms, 0))}): "
            "seconds sent where milliseconds belong?"
        )
    if now_ms >= LATEST_NOW_MS:
        raise BadPurgeInput(
            f"now_ms {now_ms} is after 2200-01-01: microseconds sent where milliseconds belong?"
        )
    return now_ms


def duplicate_names(names: Sequence[str]) -> list[str]:
    """The names that appear more than once, each once, in order of first appearance."""
    counts = Counter(names)
    return [name for name in counts if counts[name] > 1]


@dataclass(frozen=True)
class Route:
    """A database swept by workers of its own: the task queue its activities go to."""

    queue: str
    database: str
    worker_wait_ms: int = DEFAULT_WORKER_WAIT_MS
    """How long an activity may wait there for a worker before its target fails alone."""


@dataclass(frozen=True)
class PurgeInput:
    """The workflow's input: `{"targets": [...], "dry_run": false}`, and, from a config, the
    pass's limits: `max_concurrent`, `max_per_database`, `budget_ms` and `databases` (target
    name to its database's name). Without the limits a pass is the sequential pass of old."""

    targets: list[str]
    """Target names: started in this order, reported in this order."""
    dry_run: bool = False
    """Count what each target would remove, remove nothing."""
    max_concurrent: int | None = None
    max_per_database: int | None = None
    budget_ms: int | None = None
    databases: dict[str, str] = field(default_factory=dict)
    patterns: list[str] = field(default_factory=list)
    """The names in `targets` that are table patterns, each expanded into its matches."""
    child_size: int | None = None
    """Targets per child workflow of a large pass (default DEFAULT_CHILD_SIZE)."""
    run_size: int | None = None
    """Targets a child's run sweeps before it continues as new (default DEFAULT_RUN_SIZE)."""
    queues: dict[str, str] = field(default_factory=dict)
    """Database name to the task queue of its activities, for databases swept by workers of
    their own; any other database's activities run on the pass's own queue."""
    worker_wait_ms: int | None = None
    """How long a routed activity may wait for a worker of its queue (schedule-to-start)."""

    def route_of(self, name: str) -> Route | None:
        """Where target `name`'s activity goes, when not to the pass's own queue."""
        return self.route_for(self.database_of(name))

    def route_for(self, database: str) -> Route | None:
        """Where activities on `database` go, when not to the pass's own queue."""
        queue = self.queues.get(database)
        if queue is None:
            return None
        return Route(queue, database, self.worker_wait_ms or DEFAULT_WORKER_WAIT_MS)

    @property
    def spread(self) -> bool:
        """Whether this pass spreads its targets over child workflows: it has a pattern, or
        more targets than a pass of the first rounds could have."""
        return bool(self.patterns) or len(self.targets) > INLINE_TARGETS

    @property
    def limited(self) -> bool:
        """Whether this pass runs its targets concurrently, under limits and a budget."""
        return any(
            v is not None for v in (self.max_concurrent, self.max_per_database, self.budget_ms)
        )

    def database_of(self, name: str) -> str:
        """The database `name` sweeps ("" for the default one)."""
        return self.databases.get(name, "")

    @classmethod
    def parse(cls, raw: object) -> PurgeInput:
        """Validate input sent by any caller (the CLI, a schedule, `temporal workflow start`)."""
        if isinstance(raw, PurgeInput):
            raw = {f.name: getattr(raw, f.name) for f in fields(raw)}
            raw = {k: v for k, v in raw.items() if v is not None}
        if not isinstance(raw, dict):
            raise BadPurgeInput(
                f'input must be an object like {{"targets": ["x_idempotency"]}}, got {_show(raw)}'
            )
        _known_keys(raw, "input", INPUT_KEYS)
        if "targets" not in raw:
            raise BadPurgeInput("input has no 'targets' list")
        targets = raw["targets"]
        if not isinstance(targets, list):
            raise BadPurgeInput(f"input 'targets' must be a list of names, got {_show(targets)}")
        if len(targets) > MAX_TARGETS_PER_PASS:
            raise BadPurgeInput(
                f"input 'targets' has {len(targets)} names, at most {MAX_TARGETS_PER_PASS} "
                'allowed; name tables by a pattern (table = "tenant_*.sessions") instead'
            )
        for name in targets:
            if not isinstance(name, str) or not STEP_NAME.fullmatch(name):
                raise BadPurgeInput(
                    f"input 'targets' holds {_show(name)}, not a target name "
                    f"(letters, digits, _ . : @ -, at most 228)"
                )
        patterns = raw.get("patterns", [])
        if not isinstance(patterns, list) or not set(patterns) <= set(targets):
            raise BadPurgeInput(
                f"input 'patterns' must list names of 'targets', got {_show(patterns)}"
            )
        return cls(
            targets=list(targets),
            dry_run=_dry_run(raw, "input"),
            max_concurrent=_count(raw, "max_concurrent", 1, 1000),
            max_per_database=_count(raw, "max_per_database", 1, 1000),
            budget_ms=_count(raw, "budget_ms", 1, MAX_BUDGET_MS),
            databases=_databases(raw, len(targets)),
            patterns=list(dict.fromkeys(patterns)),
            child_size=_count(raw, "child_size", 1, 2000),
            run_size=_count(raw, "run_size", 1, 1000),
            queues=_queues(raw),
            worker_wait_ms=_count(raw, "worker_wait_ms", 1000, MAX_BUDGET_MS),
        )


#: The keys a workflow input may have.
INPUT_KEYS = (
    "targets",
    "dry_run",
    "max_concurrent",
    "max_per_database",
    "budget_ms",
    "databases",
    "database_ranges",
    "patterns",
    "child_size",
    "run_size",
    "queues",
    "worker_wait_ms",
)
#: A pass's budget is at most a day: any longer is a unit mistake.
MAX_BUDGET_MS = 86_400_000


def _count(raw: dict[Any, Any], key: str, low: int, high: int) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadPurgeInput(
            f"input '{key}' must be a whole number from {low} to {high}, got {_show(value)}"
        )
    return value


def _databases(raw: dict[Any, Any], count: int) -> dict[str, str]:
    value = raw.get("databases", {})
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and DATABASE_NAME.fullmatch(v)
        for k, v in value.items()
    ):
        raise BadPurgeInput(
            f"input 'databases' must map target names to database names, got {_show(value)}"
        )
    found = dict(value)
    ranges = raw.get("database_ranges", [])
    bad = BadPurgeInput(
        "input 'database_ranges' must be a list of [database, start, stop] over the "
        f"positions of 'targets', got {_show(ranges)}"
    )
    if not isinstance(ranges, list):
        raise bad
    targets = raw["targets"]
    for entry in ranges:
        if not (
            isinstance(entry, list)
            and len(entry) == 3
            and isinstance(entry[0], str)
            and DATABASE_NAME.fullmatch(entry[0])
            and all(isinstance(n, int) and not isinstance(n, bool) for n in entry[1:])
            and 0 <= entry[1] < entry[2] <= count
        ):
            raise bad
        found.update(dict.fromkeys(targets[entry[1] : entry[2]], entry[0]))
    return found


def _queues(raw: dict[Any, Any]) -> dict[str, str]:
    value = raw.get("queues", {})
    if not isinstance(value, dict) or not all(
        isinstance(k, str)
        and DATABASE_NAME.fullmatch(k)
        and isinstance(v, str)
        and QUEUE_NAME.fullmatch(v)
        for k, v in value.items()
    ):
        raise BadPurgeInput(
            f"input 'queues' must map database names to task queue names, got {_show(value)}"
        )
    return dict(value)


def _known_keys(raw: dict[Any, Any], what: str, allowed: tuple[str, ...]) -> None:
    unknown = sorted(str(key) for key in raw if key not in allowed)
    if unknown:
        raise BadPurgeInput(f"{what} has unknown keys {unknown}, allowed: {', '.join(allowed)}")


def _dry_run(raw: dict[Any, Any], what: str) -> bool:
    dry_run = raw.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise BadPurgeInput(f"{what} 'dry_run' must be true or false, got {_show(dry_run)}")
    return dry_run


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class PurgeStep:
    """The activity's input: sweep one target as of the pass's single instant."""

    name: str
    now_ms: int
    """The workflow's clock at the start of the pass, epoch milliseconds; never the database's."""
    dry_run: bool = False
    budget_ms: int | None = None
    """What is left of the pass's budget: the sweep's time budget is at most this."""

    @classmethod
    def parse(cls, raw: object) -> PurgeStep:
        """Validate a step, whoever sent it: this workflow, or a caller of the activity itself."""
        if isinstance(raw, PurgeStep):
            raw = {f.name: getattr(raw, f.name) for f in fields(raw)}
        if not isinstance(raw, dict):
            raise BadPurgeInput(
                f'step must be an object like {{"name": ..., "now_ms": ...}}, got {_show(raw)}'
            )
        _known_keys(raw, "step", ("name", "now_ms", "dry_run", "budget_ms"))
        name = raw.get("name")
        if not isinstance(name, str) or not STEP_NAME.fullmatch(name):
            raise BadPurgeInput(f"step 'name' is not a target name, got {_show(name)}")
        return cls(
            name=name,
            now_ms=check_now_ms(raw.get("now_ms")),
            dry_run=_dry_run(raw, "step"),
            budget_ms=_count(raw, "budget_ms", 0, MAX_BUDGET_MS),
        )


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
    dead_tuple_share: float = 0.0
    """The tables' dead tuples as a share of all their tuples after the sweep (statistics)."""
    analyzed: bool = False
    """Whether `analyze_after` ran ANALYZE on a table this sweep removed a large share of."""
    status: str = "ok"
    """`ok`; `skipped` (the pass's budget was spent before it started); `busy` (another sweep
    held one of its tables); `gone` (a pattern's match dropped before its sweep). None of the
    last three is a failure."""
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
    statuses: dict[str, int] = field(default_factory=dict)
    """In a compact report: how many sweeps ended `ok`, `skipped`, `busy` or `gone`."""
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
            statuses={str(k): int(v) for k, v in raw.get("statuses", {}).items()},
            patterns=[PatternLine(**known_fields(PatternLine, p)) for p in raw.get("patterns", [])],
            failed_total=int(raw.get("failed_total", 0)),
            children=[str(c) for c in raw.get("children", [])],
        )


def known_fields(kind: type, raw: dict[str, Any]) -> dict[str, Any]:
    # A newer worker may have added fields this caller does not know; keep what it does know.
    names = {f.name for f in fields(kind)}
    return {key: value for key, value in raw.items() if key in names}
