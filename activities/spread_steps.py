"""What travels in a pass spread over child workflows: a pattern's matches, a child's share of
the targets, and the compact report each child returns and the pass merges.

A pass of thousands of targets cannot report every sweep in its result (Temporal warns at a
512 KB payload): it reports totals, each pattern's line, the failures up to a cap and the
largest sweeps. Every table's own record stays in the history of the child that swept it.
Like `activities.inputs` and `activities.results`, this module has no side effects, so the
workflows pass it through.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from activities.results import FailedTarget, PatternLine, PurgeSweep, SweepStatus
from activities.routing import Route
from purge_config.patterns import split_match_name

#: The most failures a compact report names; the rest are counted in `failed_total`.
FAILED_CAP = 100
#: The most sweeps a compact report keeps: those that removed the most.
LARGEST_CAP = 20
#: Matches one expansion activity returns at once: at most ~260 KB of names per page.
EXPAND_PAGE = 2000


@dataclass(frozen=True)
class PatternStep:
    """The expansion activity's input: one page of a pattern target's matches."""

    name: str
    """The pattern target's name, as the config gives it."""
    now_ms: int
    """The pass's instant: the expansion happens after the pass read its clock."""
    after: list[str] = field(default_factory=list)
    """Where the previous page ended (`PatternPage.last`); empty for the first page."""
    limit: int = EXPAND_PAGE


@dataclass
class PatternPage:
    """One page of a pattern's matches, as target names, sorted."""

    name: str
    matches: list[str] = field(default_factory=list)
    """`NAME@SUFFIX` of each matched table (see purge_config.patterns)."""
    last: list[str] = field(default_factory=list)
    """The catalog key of the last match, to ask for the next page after it."""
    more: bool = False
    """Whether another page may follow."""
    runs_chunks: bool = False
    """Whether the worker that read this page also runs `PurgeChunk` on the task queue it read
    it from (the pattern's database's): a child sweeping the matches may then run there, its
    activities dispatched eagerly with its workflow tasks. False from a worker that does not
    (one of an older release), whose page leaves the child on the pass's queue."""
    small: list[bool] = field(default_factory=list)
    """For each of `matches`, whether the catalog showed its table small when the page was read
    (`activities.engine.small_tables.SMALL_PAGES` heap pages at most, a plain table, with no
    inheritance child or rule, that no foreign key references): one statement sweeps it, and
    the pass runs such tables beside each other (`workflows.spread`). Empty from a worker of an
    older release: none is taken for small."""


@dataclass
class RankedSweep:
    """A sweep and its target's position in the pass, to report sweeps in input order."""

    position: int
    sweep: PurgeSweep


@dataclass
class RankedFailure:
    position: int
    failure: FailedTarget


@dataclass
class ChunkReport:
    """What some targets of a spread pass did, compactly; children return it, the pass merges
    them with `merge`, in any order, to the same report."""

    targets: int = 0
    removed: int = 0
    statuses: dict[SweepStatus, int] = field(default_factory=dict)
    """How many sweeps ended each way (failures are not here)."""
    failures: list[RankedFailure] = field(default_factory=list)
    """The first FAILED_CAP failures, by position."""
    failed_total: int = 0
    largest: list[RankedSweep] = field(default_factory=list)
    """The LARGEST_CAP sweeps that removed the most (ties: the earlier target)."""
    patterns: dict[str, PatternLine] = field(default_factory=dict)
    lower_bound: bool = False
    """Whether any sweep's count is only a lower bound (see PurgeSweep.lower_bound)."""

    def add(self, position: int, outcome: PurgeSweep | FailedTarget, patterns: set[str]) -> None:
        """One target's outcome; `patterns` names the pattern targets of the pass."""
        self.targets += 1
        split = split_match_name(outcome.name)
        if split is not None and split[0] in patterns:
            self.patterns.setdefault(split[0], PatternLine(split[0])).add(outcome)
        if isinstance(outcome, FailedTarget):
            self.failed_total += 1
            self.failures = _first([*self.failures, RankedFailure(position, outcome)])
            return
        self.removed += outcome.removed
        counts: Counter[SweepStatus] = Counter(self.statuses)
        counts[outcome.status] += 1
        self.statuses = dict(counts)
        self.lower_bound = self.lower_bound or outcome.lower_bound
        self.largest = _largest([*self.largest, RankedSweep(position, outcome)])

    def merge(self, other: ChunkReport) -> None:
        self.targets += other.targets
        self.removed += other.removed
        self.statuses = dict(Counter(self.statuses) + Counter(other.statuses))
        self.failed_total += other.failed_total
        self.failures = _first(self.failures + other.failures)
        self.largest = _largest(self.largest + other.largest)
        for name, line in other.patterns.items():
            self.patterns.setdefault(name, PatternLine(name)).merge(line)
        self.lower_bound = self.lower_bound or other.lower_bound


def _first(failures: list[RankedFailure]) -> list[RankedFailure]:
    return sorted(failures, key=lambda f: f.position)[:FAILED_CAP]


def _largest(sweeps: list[RankedSweep]) -> list[RankedSweep]:
    # A skipped target removed nothing and is counted in `statuses`: it takes no place here.
    swept = [s for s in sweeps if s.sweep.status != "skipped"]
    return sorted(swept, key=lambda s: (-s.sweep.removed, s.position))[:LARGEST_CAP]


@dataclass(frozen=True)
class ChunkInput:
    """A child workflow's input: some targets of one database, swept as of the pass's instant
    and inside the pass's budget."""

    targets: list[str]
    now_ms: int
    """The pass's one instant: every child measures expiry against it."""
    deadline_ms: int
    """When the pass's budget ends (epoch ms): targets not started by then are skipped."""
    budget_ms: int
    """The pass's whole budget, for the message of a skipped target."""
    concurrency: int = 1
    """Targets of this child swept at once (all on one database)."""
    dry_run: bool = False
    patterns: list[str] = field(default_factory=list)
    """The pass's pattern targets, whose matches' outcomes add up to one line each."""
    run_size: int = 250
    """Targets one run sweeps; the rest go to the next run, continued as new."""
    first: int = 0
    """The position in the pass of `targets[0]`."""
    carried: ChunkReport | None = None
    """What this child's earlier runs swept."""
    route: Route | None = None
    """The task queue of its database's activities, when workers of their own sweep it."""
    local: bool = False
    """Sweep its targets as local activities (workflows.chunk): every one a match the catalog
    showed small (`PatternPage.small`), and the child on its database's queue, whose workers
    all run its activities."""

    def next_run(self, report: ChunkReport) -> ChunkInput:
        """The input of the run that continues after this one's targets."""
        done = min(self.run_size, len(self.targets))
        return replace(self, targets=self.targets[done:], first=self.first + done, carried=report)
