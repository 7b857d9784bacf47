"""A pass too large for one history: patterns expanded, targets spread over child workflows.

The pass reads its clock, refuses repeated names, expands each pattern on a worker of its
database, refuses repeated names again (a match may take an explicit target's name), and only
then starts children: each some targets of one database (`workflows.chunk`), all measuring
against the pass's instant and ending by the pass's deadline. At most one child runs per
database, so `max_per_database` holds inside each child; children of different databases run
side by side while their targets at once stay within `max_concurrent`. A pattern's matches the
catalog showed small (one statement each) go to children of their own, which sweep up to
SMALL_AT_ONCE of them at once on one database (within `max_concurrent`) where
`max_per_database` is lower.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ChildWorkflowError, FailureError

with workflow.unsafe.imports_passed_through():
    from activities.clock import epoch_ms
    from activities.errors import DuplicatePurgeTarget, PurgeTargetsFailed, failure_of
    from activities.input_checks import duplicate_names
    from activities.inputs import PurgeInput
    from activities.results import FailedTarget, PatternLine, PurgeReport
    from activities.routing import Route, is_own_queue
    from activities.spread_steps import ChunkInput, ChunkReport, PatternStep
    from activities.sweep import PurgeActivities
    from activities.wire import read
    from purge_config.fleet import MAX_BUDGET_MS
    from workflows.chunk import CHUNK_WORKFLOW
    from workflows.outcome_attributes import record_outcome
    from workflows.steps import (
        TARGET_RETRY,
        counted,
        ends_run,
        not_tried,
        routed,
        skipped,
        unpolled,
    )

#: Up to this many targets, and with no pattern, a pass sweeps its targets itself, as the first
#: rounds did (500 was the most an input could list then); a larger pass, or one with a pattern,
#: spreads its targets over child workflows (`workflows.chunk`).
INLINE_TARGETS = 500
#: Targets one child workflow sweeps, and how many of them one run of it sweeps before it
#: continues as new: each run's history stays near 1,200 events, far inside Temporal's
#: warning at 10,240, and a child's input near 30 KB.
DEFAULT_CHILD_SIZE = 1000
DEFAULT_RUN_SIZE = 250
#: Limits a pass with some but not all of them takes for the others (the config's defaults).
DEFAULT_MAX_CONCURRENT = 4
DEFAULT_MAX_PER_DATABASE = 1
#: One page of a pattern's matches: a catalog read, seconds at most even on a slow database.
EXPAND_START_TO_CLOSE = timedelta(minutes=5)
#: Failures a failed pass's message names before it says how many more there are.
NAMED_IN_MESSAGE = 10
#: The most of each named failure's message the pass's message quotes.
REASON_CHARS = 200
#: The patch under which a child runs on its database's queue (`_placed`); histories from
#: before it replay with every child on the pass's queue.
CHUNK_ON_QUEUE = "chunk-on-database-queue"
#: The patch under which a pass spread over children fails at once what it would send to a task
#: queue no worker took an activity from within worker_wait earlier in the pass: a pattern's
#: expansion, or a child of targets there (`_run_children`). Histories from before it replay
#: with each waiting worker_wait again, one after another.
SPREAD_UNPOLLED_ONCE = "spread-unpolled-queue-once"
#: How long past the pass's deadline a child on its database's queue may run: its targets'
#: sweeps end at the deadline (their budget), then write their counts and report.
CHUNK_GRACE = timedelta(minutes=30)
#: The patch under which a pattern's small matches go to children of their own that sweep
#: several of them at once (`_chunks`); histories from before it replay with every match at
#: `max_per_database`.
SMALL_TOGETHER = "small-tables-together"
#: Small matches swept at once on one database where `max_per_database` is lower (within
#: `max_concurrent`): the connections a worker's pool holds for each database at least
#: (`purge_ops.runner._pools`), so they never queue for the pool behind one another.
SMALL_AT_ONCE = 4


def spreads(order: PurgeInput) -> bool:
    """Whether a pass spreads its targets over child workflows: it has a pattern, or more
    targets than a pass of the first rounds could have."""
    return bool(order.patterns) or len(order.targets) > INLINE_TARGETS


async def spread_pass(order: PurgeInput, now_ms: int) -> PurgeReport:
    """Sweep every target of `order` (patterns expanded) through child workflows; the compact
    report of the whole pass."""
    patterns = set(order.patterns)
    report = ChunkReport(patterns={name: PatternLine(name) for name in order.patterns})
    entries: list[str | FailedTarget] = []
    # The routed queues whose workers run children too, as the workers that read a pattern's
    # matches there said (`PatternPage.runs_chunks`).
    chunk_queues: set[str] = set()
    small: set[str] = set()  # matches the catalog showed small
    # Task queues from which no worker took an activity within worker_wait in this pass: the
    # expansions run one after another, and each would wait that long again before any child
    # started, spending the budget of every other database's targets.
    unpolled_queues: set[str] = set()
    for name in order.targets:
        if name in patterns:
            route = order.route_of(name)
            if _known_unpolled(route, unpolled_queues):
                assert route is not None
                entries.append(not_tried(name, route))
                continue
            found = await _matches(name, now_ms, route)
            if isinstance(found, Matches):
                if not found.names:
                    workflow.logger.warning("purge pattern %s matched no table", name)
                if found.runs_chunks and route is not None:
                    chunk_queues.add(route.queue)
                entries += found.names
                small |= found.small
            else:
                entries.append(counted(found))
                _note_unpolled(found, route, unpolled_queues)
        else:
            entries.append(name)
    names = [e for e in entries if isinstance(e, str)]
    repeated = duplicate_names(names)
    if repeated:
        raise DuplicatePurgeTarget(
            f"target names repeated in one pass (a pattern's match among them): "
            f"{', '.join(repeated[:NAMED_IN_MESSAGE])}; each target is swept once per pass"
        )
    for entry in entries:
        if isinstance(entry, FailedTarget):
            report.add(-1, entry, patterns)

    chunks = _chunks(order, names, now_ms, small)
    children = await _run_children(order, chunks, report, chunk_queues, unpolled_queues)
    return _finish(order, now_ms, report, children)


def _known_unpolled(route: Route | None, unpolled_queues: set[str]) -> bool:
    """Whether what goes to `route` would go to a queue no worker took an activity from
    earlier in the pass (and the pass runs under the patch that then fails it at once)."""
    return (
        route is not None
        and route.queue in unpolled_queues
        and workflow.patched(SPREAD_UNPOLLED_ONCE)
    )


def _note_unpolled(failed: FailedTarget, route: Route | None, unpolled_queues: set[str]) -> None:
    """Note `route`'s queue in `unpolled_queues` when `failed` says no worker of it took the
    activity within worker_wait (`workflows.steps.unpolled`)."""
    if route is not None and failed.type == "NoPurgeWorker":
        unpolled_queues.add(route.queue)


@dataclass
class Matches:
    """A pattern's matches, and whether every page came from a worker that runs children on
    the queue it read them from."""

    names: list[str] = field(default_factory=list)
    runs_chunks: bool = True
    small: set[str] = field(default_factory=set)
    """The matches its pages showed small (`PatternPage.small`)."""


async def _matches(name: str, now_ms: int, route: Route | None) -> Matches | FailedTarget:
    """Every match of pattern target `name`, page by page, read by a worker of its database, or
    why it could not be read."""
    found = Matches()
    after: list[str] = []
    while True:
        try:
            page = await workflow.execute_activity_method(
                PurgeActivities.expand_pattern,
                PatternStep(name=name, now_ms=now_ms, after=after),
                start_to_close_timeout=EXPAND_START_TO_CLOSE,
                retry_policy=TARGET_RETRY,
                summary=f"expand {name}",
                **routed(route),
            )
        except ActivityError as err:
            if ends_run(err):
                raise
            failure = unpolled(err, route) or failure_of(err)
            return FailedTarget(name=name, type=failure.type, message=failure.message)
        found.names += page.matches
        found.runs_chunks = found.runs_chunks and page.runs_chunks
        found.small.update(m for m, small in zip(page.matches, page.small, strict=False) if small)
        if not page.more:
            return found
        after = page.last


def _chunks(
    order: PurgeInput, names: list[str], now_ms: int, small: set[str]
) -> dict[str, list[ChunkInput]]:
    """Each database's children, in the order the databases first appear in the pass.

    A database's `small` matches (the catalog showed each small: one statement of a few
    milliseconds sweeps it) go to children of their own after its other targets' children,
    sweeping up to SMALL_AT_ONCE at once (never more than `max_concurrent`) where
    `max_per_database` is lower: `max_per_database` bounds the sweeps that hold a database for
    seconds, and at its default of 1 it left a pattern of small tables one at a time, 50 ms a
    table (docs/decisions/spread-passes.md)."""
    patterns = set(order.patterns)

    def database_of(name: str) -> str:
        base = name.rpartition("@")[0]
        return order.database_of(base if base in patterns else name)

    most, per_database = _limits(order)
    alone_at, together_at = min(most, per_database), min(most, max(per_database, SMALL_AT_ONCE))
    # Only where the small matches would sweep more at once than the rest: otherwise (a pass
    # without limits, or max_per_database at SMALL_AT_ONCE or above) the children and their
    # order stay as they were.
    together = bool(small) and together_at > alone_at and workflow.patched(SMALL_TOGETHER)
    by_database: dict[str, tuple[list[str], list[str]]] = {}
    for name in names:
        others, smalls = by_database.setdefault(database_of(name), ([], []))
        (smalls if together and name in small else others).append(name)
    budget_ms = order.budget_ms or MAX_BUDGET_MS
    size = order.child_size or DEFAULT_CHILD_SIZE
    chunks: dict[str, list[ChunkInput]] = {}
    first = 0
    for database, (others, smalls) in by_database.items():
        for targets, concurrency in ((others, alone_at), (smalls, together_at)):
            for start in range(0, len(targets), size):
                share = targets[start : start + size]
                chunks.setdefault(database, []).append(
                    ChunkInput(
                        targets=share,
                        now_ms=now_ms,
                        deadline_ms=now_ms + budget_ms,
                        budget_ms=budget_ms,
                        concurrency=concurrency,
                        dry_run=order.dry_run,
                        patterns=list(order.patterns),
                        run_size=order.run_size or DEFAULT_RUN_SIZE,
                        first=first,
                        route=_told(order.route_for(database)),
                        local=all(name in small for name in share),
                    )
                )
                first += len(share)
    return chunks


def _limits(order: PurgeInput) -> tuple[int, int]:
    """(targets at once, targets at once on one database): the input's limits, the config's
    defaults for those it lacks, or one at a time for a pass without limits."""
    if not order.limited:
        return 1, 1
    return (
        order.max_concurrent or DEFAULT_MAX_CONCURRENT,
        order.max_per_database or DEFAULT_MAX_PER_DATABASE,
    )


async def _run_children(
    order: PurgeInput,
    chunks: dict[str, list[ChunkInput]],
    report: ChunkReport,
    chunk_queues: set[str],
    unpolled_queues: set[str],
) -> list[str]:
    """Run the children, one at a time per database and as many databases at once as
    `max_concurrent` allows; merge each one's report into `report`. Their ids, in order.

    A child whose database's queue no worker took an activity from earlier in the pass (a
    pattern's expansion there, or an earlier child's first target, waited worker_wait:
    `unpolled_queues`, which this adds to) is not started: its targets fail at once, as
    `sweep_limited` fails the later targets of such a queue inside one run.

    A child whose database's queue is in `chunk_queues` runs on that queue, by the workers next
    to its database, which said so when they read its pattern's matches: its activities are
    then dispatched with the workflow task that schedules them, not each through the server's
    matching (38 ms a target, docs/decisions/spread-passes.md). Its run is bounded by the
    pass's deadline and CHUNK_GRACE, so that one no worker takes (its workers gone since)
    fails its targets instead of holding the pass."""
    info = workflow.info()
    most, _ = _limits(order)
    started: list[str] = []
    running: dict[asyncio.Task[ChunkReport], tuple[str, ChunkInput]] = {}
    patterns = set(order.patterns)
    while any(chunks.values()) or running:
        for database, waiting in chunks.items():
            busy = any(db == database for db, _ in running.values())
            if busy or not waiting:
                continue
            chunk = waiting[0]
            if sum(c.concurrency for _, c in running.values()) + chunk.concurrency > max(
                most, chunk.concurrency
            ):
                break
            waiting.pop(0)
            if epoch_ms(workflow.now()) >= chunk.deadline_ms:
                for i, name in enumerate(chunk.targets):
                    gone = skipped(name, order.dry_run, chunk.budget_ms)
                    report.add(chunk.first + i, gone, patterns)
                continue
            if _known_unpolled(chunk.route, unpolled_queues):
                assert chunk.route is not None
                for i, name in enumerate(chunk.targets):
                    report.add(chunk.first + i, not_tried(name, chunk.route), patterns)
                continue
            # From the run id, not the workflow id: a history saved under another name (what
            # `pg-purge replay FILE` reads) must replay to the same child ids.
            child_id = f"purge-chunk-{info.run_id}-{len(started):04d}"
            started.append(child_id)
            placed = _placed(chunk, chunk_queues)
            if chunk.local and not placed:
                # On the pass's queue, a worker may run workflows and no activity
                # (`new_worker(sweeps=False)`): its small matches stay activity tasks.
                chunk = replace(chunk, local=False)
            task = asyncio.ensure_future(_child(chunk, child_id, placed))
            running[task] = (database, chunk)
        if not running:
            continue
        done, _ = await workflow.wait(list(running), return_when=asyncio.FIRST_COMPLETED)
        for task in sorted(done, key=lambda t: running[t][1].first):
            _, chunk = running.pop(task)
            _merge_child(task, chunk, report, patterns)
            if not task.exception():
                # Every target of a child is on its route: one that no worker took says so
                # for the queue. The report keeps only the first FAILED_CAP failures: where
                # others fill them, the next child there waits worker_wait once more.
                for ranked in task.result().failures:
                    _note_unpolled(ranked.failure, chunk.route, unpolled_queues)
    return started


def _told(route: Route | None) -> Route | None:
    """`route` saying whether its queue is the config's own (`Route.own_config`), which only
    the pass, on the config's queue, can tell."""
    if route is None or not is_own_queue(route.queue, workflow.info().task_queue):
        return route
    return replace(route, own_config=True)


async def _child(chunk: ChunkInput, child_id: str, placed: dict[str, Any]) -> ChunkReport:
    """Run one child and read its report leniently: the child may have run on a worker of a
    later release, mid-deploy (activities.wire)."""
    raw = await workflow.execute_child_workflow(
        CHUNK_WORKFLOW, chunk, id=child_id, result_type=dict, **placed
    )
    return read(ChunkReport, raw)


def _placed(chunk: ChunkInput, chunk_queues: set[str]) -> dict[str, Any]:
    """The options that run a child on its database's queue (see `_run_children`); none where
    that queue's workers did not say they run children, as before."""
    route = chunk.route
    if route is None or route.queue not in chunk_queues or not workflow.patched(CHUNK_ON_QUEUE):
        return {}
    left = max(chunk.deadline_ms - epoch_ms(workflow.now()), 0)
    return {
        "task_queue": route.queue,
        "execution_timeout": timedelta(milliseconds=left) + CHUNK_GRACE,
    }


def _merge_child(
    task: asyncio.Task[ChunkReport], chunk: ChunkInput, report: ChunkReport, patterns: set[str]
) -> None:
    """A finished child's report merged into the pass's; a child that failed as a whole
    (terminated, say) leaves its targets failed, the other children's sweeps standing."""
    try:
        report.merge(task.result())
    except ChildWorkflowError as err:
        if ends_run(err):
            raise
        cause = err.cause
        kind = type(cause).__name__ if cause else type(err).__name__
        message = cause.message if isinstance(cause, FailureError) else str(err)
        for i, name in enumerate(chunk.targets):
            failed = FailedTarget(name=name, type=kind, message=f"child failed: {message}")
            report.add(chunk.first + i, counted(failed), patterns)


def _finish(
    order: PurgeInput, now_ms: int, report: ChunkReport, children: list[str]
) -> PurgeReport:
    """The pass's compact report; a failed pass's error carries it."""
    result = PurgeReport(
        swept=[r.sweep for r in sorted(report.largest, key=lambda r: r.position)],
        removed=report.removed,
        now_ms=now_ms,
        dry_run=order.dry_run,
        failed=[f.failure for f in report.failures],
        targets=report.targets,
        statuses=report.statuses,
        patterns=[report.patterns[name] for name in order.patterns],
        failed_total=report.failed_total,
        children=children,
        compact=True,
    )
    verb = "would remove" if order.dry_run else "removed"
    workflow.logger.info(
        "purge pass %s %d rows over %d targets in %d children",
        verb,
        result.removed,
        result.targets,
        len(children),
    )
    record_outcome(result)
    if result.failed_total:
        named = "; ".join(
            f"{f.name} ({f.type}: {_reason(f.message)})" for f in result.failed[:NAMED_IN_MESSAGE]
        )
        more = result.failed_total - min(len(result.failed), NAMED_IN_MESSAGE)
        raise PurgeTargetsFailed(
            f"purge targets failed: {named}" + (f"; and {more} more" if more else ""), result
        )
    return result


def _reason(message: str) -> str:
    """A failed target's message as the pass's own names it: as a pass of listed targets does,
    each with its reason, but at most REASON_CHARS of it, since ten are named."""
    return message if len(message) <= REASON_CHARS else message[: REASON_CHARS - 1] + "…"
