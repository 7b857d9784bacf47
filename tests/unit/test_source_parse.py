"""`tests.support.source.parse` holds when a collection would run a finalizer that parses."""

from __future__ import annotations

import ast
import gc
from collections.abc import Iterator

import pytest

from tests.support.procs import REPO
from tests.support.source import parse


class _ParsesWhenCollected:
    """Cyclic garbage whose finalizer parses, as formatting a logged traceback does on 3.11."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        ast.parse("a + b")


@pytest.fixture
def collecting_often() -> Iterator[None]:
    thresholds = gc.get_threshold()
    gc.set_threshold(1)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.collect()


def test_a_finalizer_that_parses_does_not_break_the_tree_being_built(
    collecting_often: None,
) -> None:
    source = (REPO / "activities" / "engine" / "detaching.py").read_text()
    for _ in range(200):
        _ParsesWhenCollected()
    tree = parse(source)
    assert any(isinstance(node, ast.ClassDef) and node.name == "Beside" for node in tree.body)
    assert gc.isenabled()
