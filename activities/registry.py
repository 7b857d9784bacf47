"""What a target is, and how a worker finds one by name when a step asks for it."""

from __future__ import annotations

import functools
import inspect
import logging
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeGuard, runtime_checkable

from activities.errors import (
    BadPurgeTarget,
    DuplicatePurgeTarget,
    TargetFactoryFailed,
    UnknownPurgeTarget,
)
from activities.progress import LedgerKey, OnBatch, Progress, SweepStats
from purge_config.settings import Guards

if TYPE_CHECKING:
    from activities.pattern_matches import PatternTargets

log = logging.getLogger("purge.targets")


@runtime_checkable
class PurgeTarget(Protocol):
    """Anything with a name that can delete its expired rows as of a caller's instant.

    Structural: an application registers its own targets without importing anything from here.
    """

    @property
    def name(self) -> str:
        """The name passes refer to it by."""
        ...

    async def purge_expired(self, now_ms: int) -> int:
        """Delete rows expired at `now_ms` (the caller's epoch milliseconds); return how many."""
        ...


@runtime_checkable
class CountingTarget(PurgeTarget, Protocol):
    """A target that can also say how many rows a purge would remove, for dry runs."""

    async def count_expired(self, now_ms: int) -> int:
        """Count rows expired at `now_ms` without deleting any."""
        ...


@runtime_checkable
class BatchedTarget(CountingTarget, Protocol):
    """A target that deletes in short batches the activity can guard, resume and report: every
    built-in kind (`activities.engine.sql_target.SqlTarget`). The activity talks to this protocol,
    and to `PurgeTarget` for everything else."""

    @property
    def guards(self) -> Guards:
        """The limits checked before its first delete."""
        ...

    async def measure(self, now_ms: int) -> tuple[int, int]:
        """(rows expired at `now_ms`, all rows), for the guards."""
        ...

    async def preview(self, now_ms: int) -> SweepStats:
        """What a sweep at `now_ms` would remove, removing nothing: for a dry run's report."""
        ...

    async def sweep(
        self,
        now_ms: int,
        resume: Progress | None = None,
        on_batch: OnBatch | None = None,
        ledger: LedgerKey | None = None,
        budget_ms: int | None = None,
    ) -> SweepStats:
        """Delete in batches from where `resume` says, calling `on_batch` after each; with
        `ledger`, count every batch into that pass's `purge_progress` row as well; end by
        `budget_ms` if that comes before the target's own time budget."""
        ...


@runtime_checkable
class TimedTarget(BatchedTarget, Protocol):
    """A batched target whose guards' counts, dry run and sweep end by one deadline: every
    built-in kind. A `BatchedTarget` without it (one written before it) is swept as before,
    each count and the sweep with a time budget of its own: a protocol it now fails would
    have dropped it to a plain target's path, unguarded."""

    def deadline(self, budget_ms: int | None = None) -> float:
        """When a step begun now ends (a `time.monotonic()`): its own time budget from now, or
        `budget_ms` where sooner."""
        ...

    async def measure(self, now_ms: int, *, deadline: float | None = None) -> tuple[int, int]:
        """(rows expired at `now_ms`, all rows), for the guards, counted by `deadline`."""
        ...

    async def preview(self, now_ms: int, *, deadline: float | None = None) -> SweepStats:
        """What a sweep at `now_ms` would remove, counted by `deadline`."""
        ...


@runtime_checkable
class ListedTarget(TimedTarget, Protocol):
    """A timed target that names its tables and ends a sweep between batches when asked:
    every built-in kind. A retry whose earlier attempt ran where the tables were listed
    otherwise starts again from the first, its guards counted again; a stopping worker's sweep
    ends after its batch. A `TimedTarget` without it (one written before it) is swept as
    before."""

    def tables_listed(self) -> list[str]:
        """Its tables, in the order it sweeps them, as its config names them."""
        ...

    async def sweep(
        self,
        now_ms: int,
        resume: Progress | None = None,
        on_batch: OnBatch | None = None,
        ledger: LedgerKey | None = None,
        budget_ms: int | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> SweepStats:
        """As `BatchedTarget.sweep`; ends between batches once `stop()` says so, as at its
        time budget (`complete` False)."""
        ...


def is_target(target: object) -> TypeGuard[PurgeTarget]:
    """`isinstance(target, PurgeTarget)`, quicker (`_conforms`)."""
    return _conforms(target, PurgeTarget)


def is_counting(target: object) -> TypeGuard[CountingTarget]:
    """`isinstance(target, CountingTarget)`, quicker (`_conforms`)."""
    return _conforms(target, CountingTarget)


def is_batched(target: object) -> TypeGuard[BatchedTarget]:
    """`isinstance(target, BatchedTarget)`, quicker (`_conforms`)."""
    return _conforms(target, BatchedTarget)


def is_timed(target: object) -> TypeGuard[TimedTarget]:
    """`isinstance(target, TimedTarget)`, quicker (`_conforms`)."""
    return _conforms(target, TimedTarget)


def is_listed(target: object) -> TypeGuard[ListedTarget]:
    """`isinstance(target, ListedTarget)`, quicker (`_conforms`)."""
    return _conforms(target, ListedTarget)


def _conforms(target: object, protocol: type) -> bool:
    """`isinstance(target, protocol)` for a runtime-checkable protocol of this module. Python
    3.11 walks the protocol's classes for its members twice at every such check; a sweep makes
    up to ten, and in a pass of small tables they were 3.4% of the busy samples of a py-spy
    profile of bench case 11 (bench/README.md). Its members are read once here and each looked
    for as 3.11 does (present, and a method not set to None); an object that lacks one, or whose
    attribute raised as it was read (3.11 reads them in a set's order, so which one it reads
    first is not ours to copy), is asked of `isinstance` itself, which alone says False (or True
    for a registered class or a subclass). 3.12 keeps a protocol's members, and reads them
    otherwise (statically): asked there."""
    if sys.version_info >= (3, 12):
        return isinstance(target, protocol)
    try:
        found = all(
            hasattr(target, name) and (not method or getattr(target, name) is not None)
            for name, method in _members(protocol)
        )
    except Exception:
        found = False
    return found or isinstance(target, protocol)


@functools.cache
def _members(protocol: type) -> tuple[tuple[str, bool], ...]:
    """The protocol's members (every public name its protocol classes define or annotate) and
    whether each is a method: what 3.11's `isinstance` reads again at every check.
    `tests/test_target_protocols.py` checks them against `typing`'s own reading."""
    names = {
        name
        for cls in protocol.__mro__
        if cls.__dict__.get("_is_protocol") and cls is not Protocol
        for name in (*cls.__dict__, *inspect.get_annotations(cls))
        if not name.startswith("_")
    }
    return tuple((name, callable(getattr(protocol, name, None))) for name in sorted(names))


#: A callable an application hands the worker instead of targets, called each time a step needs
#: a target that is not registered directly: a store built after the worker started is found.
TargetFactory = Callable[[], Iterable[PurgeTarget]]


class TargetRegistry:
    """The targets one worker may sweep: fixed ones, plus those its factories return on demand."""

    def __init__(
        self,
        targets: Iterable[PurgeTarget] = (),
        factories: Iterable[TargetFactory] = (),
        patterns: PatternTargets | None = None,
        elsewhere: Mapping[str, str] | None = None,
    ) -> None:
        self.patterns = patterns
        """The table patterns, whose matches are targets too (`sessions@tenant_0042`)."""
        self.elsewhere = dict(elsewhere or {})
        """Targets of this worker's config that sweep a database it has no URL for, by name:
        the database's name."""
        self._targets: dict[str, PurgeTarget] = {}
        for target in targets:
            if target.name in self._targets:
                raise DuplicatePurgeTarget(f"two targets are named {target.name!r}")
            self._targets[target.name] = target
        self._factories = list(factories)

    def resolve(self, name: str) -> PurgeTarget:
        """The target called `name`. Factories are asked every time, even when a fixed target
        has the name, so a factory target that shadows another is refused, never run. A
        factory that raises, or returns what is not a target, fails only the names no fixed
        target, pattern or other factory gives (`TargetFactoryFailed`, naming it): the
        others are found, its error logged. Two targets under one name fail that name alone."""
        asked = self.ask_factories()
        failed = "; ".join(message for message, _ in asked.failed)
        # The first factory's own error, with its traceback (none for one that returned a
        # non-target).
        raised = next((err for _, err in asked.failed if err is not None), None)
        if failed:
            # Whatever this step meets next: logged here.
            log.warning("%s (asked for target %s)", failed, name, exc_info=raised)
        if name in asked.clashes:
            raise DuplicatePurgeTarget(asked.clashes[name])
        found = self._targets.get(name) or asked.found.get(name)
        if found is None and self.patterns is not None:
            found = self.patterns.resolve(name)
            if found is None and self.patterns.is_pattern(name):
                raise BadPurgeTarget(
                    f"target {name!r} is a table pattern: a pass expands it into its matches "
                    f"when the input lists it under 'patterns' (pg-purge sweep does)"
                )
        if failed and found is None and name not in self.elsewhere:
            raise TargetFactoryFailed(failed) from raised
        if found is None and name in self.elsewhere:
            database = self.elsewhere[name]
            raise UnknownPurgeTarget(
                f"target {name!r} sweeps database {database!r}, which this worker has no URL "
                "for: the pass's input does not route it to that database's workers (a pass "
                'typed by hand needs the config\'s "databases" and "queues": '
                "`pg-purge schedule --print-input` prints them)"
            )
        if found is None:
            wild = [f"{p}@..." for p in self.patterns.names] if self.patterns else []
            known = sorted({*self._targets, *asked.found, *wild})
            # A factory that gave nothing is most often one whose store is never built in the
            # worker's process (docs/own-targets.md).
            said = f" ({'; '.join(asked.gave)})" if asked.gave else ""
            raise UnknownPurgeTarget(
                f"no target named {name!r} on this worker; it knows: {', '.join(known) or 'none'}"
                + said
            )
        return found

    def describe(self) -> str:
        """The fixed names and how many factories, without calling any factory."""
        wild = [f"{p}@... (a pattern)" for p in self.patterns.names] if self.patterns else []
        text = ", ".join([*sorted(self._targets), *wild]) or "no fixed targets"
        count = len(self._factories)
        if count:
            text += f" and {count} target {'factory' if count == 1 else 'factories'}"
        return text

    def ask_factories(self) -> FactoryAnswers:
        """Every factory asked, each on its own: one that fails leaves the others' targets.
        A step asks them each time it resolves a name; `pg-purge check` asks them once."""
        asked = FactoryAnswers()
        for factory in self._factories:
            described = _describe(factory)
            try:
                made = list(factory())
            except Exception as err:
                said = f"target factory {described} raised {type(err).__name__}: {err}"
                asked.failed.append((said, err))
                continue
            strays = [target for target in made if not is_target(target)]
            if strays:
                said = (
                    f"target factory {described} returned {strays[0]!r}, which has no name and "
                    "purge_expired"
                )
                asked.failed.append((said, None))
                continue
            for target in made:
                if target.name in asked.found or target.name in self._targets:
                    asked.clashes[target.name] = (
                        f"two targets are named {target.name!r} (one from {described})"
                    )
                asked.found[target.name] = target
            names = ", ".join(sorted(target.name for target in made)) or "no target"
            asked.gave.append(f"{described}, asked now, gave {names}")
        return asked


@dataclass
class FactoryAnswers:
    """What the factories gave when asked once (for one step, or by `pg-purge check`)."""

    found: dict[str, PurgeTarget] = field(default_factory=dict)
    failed: list[tuple[str, Exception | None]] = field(default_factory=list)
    """One line for each factory that raised (with its error) or returned what is not a
    target."""
    gave: list[str] = field(default_factory=list)
    """For each other factory, the names it gave."""
    clashes: dict[str, str] = field(default_factory=dict)
    """The names two targets share (a factory's and a fixed one's, or two factories'), with
    the refusal that names them."""


def _describe(factory: TargetFactory) -> str:
    module = getattr(factory, "__module__", "?")
    return f"{module}:{getattr(factory, '__qualname__', repr(factory))}"
