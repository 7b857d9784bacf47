"""`activities.registry`'s quick protocol checks (`is_target`, `is_counting`, `is_batched`,
`is_timed`, `is_listed`) answer as `isinstance` does, for every shape of target an application
may hand a worker: the activity decides by them which path a target takes (a dry run refused,
batches guarded and resumed, one deadline, a retry that resumes by table), and a factory's
answer by the first (`TargetRegistry.ask_factories`)."""

from __future__ import annotations

import sys
import typing
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
    _members,
    is_batched,
    is_counting,
    is_listed,
    is_target,
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


class RaisingGuards(Timed):
    """A timed target with no `tables_listed` whose `guards` raises as it is read: `isinstance`
    raises or says False by the order it reads the members in (a set's)."""

    @property
    def guards(self) -> Any:  # type: ignore[override]
        raise RuntimeError("no guards yet")


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
    "listed (guards None: a property's value, not a method)": Listed,
    "no name": NoName,
    "listed, tables_listed blocked": lambda: _blocked(Listed, "tables_listed"),
    "listed, deadline blocked": lambda: _blocked(Listed, "deadline"),
    "guards raises": RaisingGuards,
    "built-in kind": lambda: kinds.idempotency(object()),  # type: ignore[arg-type]
    "not a target": object,
}

CHECKS: list[tuple[Callable[[object], bool], type]] = [
    (is_target, PurgeTarget),
    (is_counting, CountingTarget),
    (is_batched, BatchedTarget),
    (is_timed, TimedTarget),
    (is_listed, ListedTarget),
]


def _answer(ask: Callable[..., bool], *args: object) -> object:
    """What a check says: True, False, or the type of what it raised."""
    try:
        return ask(*args)
    except Exception as err:
        return type(err)


@pytest.mark.parametrize("shape", TARGETS)
def test_the_quick_checks_answer_as_isinstance(shape: str) -> None:
    target = TARGETS[shape]()
    for check, protocol in CHECKS:
        said = _answer(check, target)
        assert said == _answer(isinstance, target, protocol), (shape, protocol.__name__)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="from 3.12 the checks are isinstance")
@pytest.mark.parametrize("protocol", [protocol for _, protocol in CHECKS], ids=lambda p: p.__name__)
def test_the_members_are_those_typing_reads(protocol: type) -> None:
    """A member a protocol gains (a method, a property, an annotation) is looked for."""
    read = typing._get_protocol_attrs(protocol)  # type: ignore[attr-defined]
    assert [name for name, _ in _members(protocol)] == sorted(read)


def test_the_shapes_cover_each_answer() -> None:
    """The table above reaches every path: each protocol both held and missed."""
    made = [make() for make in TARGETS.values()]
    for check, protocol in CHECKS:
        answers = {_answer(check, target) for target in made}
        assert {True, False} <= answers, protocol.__name__
    assert isinstance(kinds.idempotency(object()), ListedTarget)  # type: ignore[arg-type]
    assert not isinstance(NoName(), PurgeTarget)
