"""What a target is, and how a worker finds one by name when a step asks for it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

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
        factory that raises fails only the names no fixed target or pattern gives
        (`TargetFactoryFailed`, naming it): the others are found, its error logged."""
        try:
            dynamic = self._from_factories()
        except TargetFactoryFailed as err:
            fixed = self._targets.get(name)
            if fixed is None and self.patterns is not None:
                fixed = self.patterns.resolve(name)
            if fixed is None and name not in self.elsewhere:
                raise
            log.warning("%s; target %s is not a factory's", err.message, name)
            if fixed is not None:
                return fixed
            dynamic = {}  # a target of another database's workers: said so below
        found = self._targets.get(name) or dynamic.get(name)
        if found is None and self.patterns is not None:
            found = self.patterns.resolve(name)
            if found is None and self.patterns.is_pattern(name):
                raise BadPurgeTarget(
                    f"target {name!r} is a table pattern: a pass expands it into its matches "
                    f"when the input lists it under 'patterns' (pg-purge sweep does)"
                )
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
            known = sorted({*self._targets, *dynamic, *wild})
            asked = ""
            if self._factories:
                # A factory that gave nothing is most often one whose store is never built in
                # the worker's process (docs/own-targets.md).
                given = ", ".join(sorted(dynamic)) or "no target"
                asked = f" ({', '.join(map(_describe, self._factories))}, asked now, gave {given})"
            raise UnknownPurgeTarget(
                f"no target named {name!r} on this worker; it knows: {', '.join(known) or 'none'}"
                + asked
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

    def _from_factories(self) -> dict[str, PurgeTarget]:
        found: dict[str, PurgeTarget] = {}
        for factory in self._factories:
            try:
                made = list(factory())
            except Exception as err:
                raise TargetFactoryFailed(
                    f"target factory {_describe(factory)} raised {type(err).__name__}: {err}"
                ) from err
            for target in made:
                if not isinstance(target, PurgeTarget):
                    raise BadPurgeTarget(
                        f"factory {_describe(factory)} returned {target!r}, "
                        "which has no name and purge_expired"
                    )
                if target.name in found or target.name in self._targets:
                    raise DuplicatePurgeTarget(
                        f"two targets are named {target.name!r} (one from {_describe(factory)})"
                    )
                found[target.name] = target
        return found


def _describe(factory: TargetFactory) -> str:
    module = getattr(factory, "__module__", "?")
    return f"{module}:{getattr(factory, '__qualname__', repr(factory))}"
