"""`activities.registry`'s quick protocol checks (`is_counting`, `is_batched`, `is_timed`,
`is_listed`) answer as `isinstance` does, for every shape of target an application may hand a
worker: the activity decides by them which path a target takes (a dry run refused, batches
guarded and resumed, one deadline, a retry that resumes by table)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from activities import builtin_kinds as kinds
from activities.registry import (
    BatchedTarget,
    CountingTarget,
    ListedTarget,
    PurgeTarget,
    TimedTarget,
    is_batched,
    is_counting,
    is_listed,
    is_timed,
)


class Plain:
    name = "plain"

    async def purge_expired(self, now_ms: int) -> int:
        return 0


class Counting(Plain):
    async def count_expired(self, now_ms: int) -> int:
        return 0


class Batched(Counting):
    """A `BatchedTarget` written before `TimedTarget`: no `deadline`."""

    guards = None

    async def measure(self, now_ms: int) -> tuple[int, int]:
        return 0, 0

    async def preview(self, now_ms: int) -> Any:
        return None

    async def sweep(self, now_ms: int, *args: Any, **kwargs: Any) -> Any:
        return None


class Timed(Batched):
    def deadline(self, budget_ms: int | None = None) -> float:
        return 0.0


class Listed(Timed):
    def tables_listed(self) -> list[str]:
        return []


class NoName:
    """Every method, no name."""

    purge_expired = Plain.purge_expired
    count_expired = Counting.count_expired


def _blocked(cls: type, member: str) -> Any:
    """An instance of `cls` with `member` set to None on it alone: a method so blocked is
    absent to `isinstance` (a class's other instances keep it)."""
    target = cls()
    setattr(target, member, None)
    return target


TARGETS: dict[str, Callable[[], object]] = {
    "plain": Plain,
    "counting": Counting,
    "batched, no deadline": Batched,
    "timed": Timed,
    "listed": Listed,
    "no name": NoName,
    "listed, tables_listed blocked": lambda: _blocked(Listed, "tables_listed"),
    "listed, deadline blocked": lambda: _blocked(Listed, "deadline"),
    "listed, guards None (a property's value, not a method)": Listed,
    "built-in kind": lambda: kinds.idempotency(object()),  # type: ignore[arg-type]
    "not a target": object,
}

CHECKS: list[tuple[Callable[[object], bool], type]] = [
    (is_counting, CountingTarget),
    (is_batched, BatchedTarget),
    (is_timed, TimedTarget),
    (is_listed, ListedTarget),
]


@pytest.mark.parametrize("shape", TARGETS)
def test_the_quick_checks_answer_as_isinstance(shape: str) -> None:
    target = TARGETS[shape]()
    for check, protocol in CHECKS:
        assert check(target) is isinstance(target, protocol), (shape, protocol.__name__)


def test_the_shapes_cover_each_answer() -> None:
    """The table above reaches every path: each protocol both held and missed."""
    made = [make() for make in TARGETS.values()]
    for check, protocol in CHECKS:
        answers = {check(target) for target in made}
        assert answers == {True, False}, protocol.__name__
    assert isinstance(kinds.idempotency(object()), ListedTarget)  # type: ignore[arg-type]
    assert not isinstance(NoName(), PurgeTarget)
