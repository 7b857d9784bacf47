"""The task queue names a config's passes use (`PurgeConfig.own_queue`, `routed_queues`) from
one release to the next: an unchanged config's stay as they were, so a rolling deploy of a
release that changes no rule keeps old and new workers on the same queues (docs/fleets.md,
"Rolling deploys"). A field a release adds to a part of a rule (guards, partitions, a row
filter) moves no queue while it holds its default, and moves them once a config sets it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from activities.routing import is_own_queue
from purge_config import PurgeConfig, parse_config
from purge_config.filters import RowFilter
from purge_config.settings import Guards, PartitionPolicy

RAW: dict[str, Any] = {
    "task_queue": "purge",
    "database_url": "postgresql://app@db.internal/app",
    "databases": {"eu": {"url_env": "EU_URL", "task_queue": "purge-eu"}},
    "targets": [
        {"kind": "idempotency", "max_rows": 50000, "max_fraction": 0.5},
        {
            "kind": "expiring",
            "name": "events",
            "table": "app.events",
            "column": "at",
            "max_age": "30d",
            "unit": "s",
            "match": {"state": ["done", "failed"]},
            "match_null": ["held_by"],
            "archive_table": "app.events_archive",
            "max_clock_jump": "2h",
        },
        {
            "kind": "expiring",
            "name": "logs",
            "table": "logs",
            "column": "at",
            "database": "eu",
            "partitions": "detach",
            "detached_schema": "old",
        },
    ],
}
ENV = {"EU_URL": "postgresql://app@eu.internal/app"}


def config() -> PurgeConfig:
    return parse_config(RAW, env=ENV)


def test_an_unchanged_config_names_the_queues_the_release_before_named() -> None:
    """Pinned as the releases since the digest took each entry's rule have named them: a change
    to these names moves every deployed fleet's queues at its deploy, old and new workers
    sharing none until the old stop (say so in the release's upgrade notes, or keep them)."""
    made = config()

    assert made.own_queue == "purge:81d9ba67bb04"
    assert made.routed_queues == {"eu": "purge-eu:b74f69630758"}


def later(part: object, field: str, value: object = None) -> object:
    """`part` as a later release would make it: its class with one more field, defaulting to
    None, set to `value`."""
    cls = type(part)
    grown = dataclasses.make_dataclass(
        f"Later{cls.__name__}",
        [(field, Any, dataclasses.field(default=None))],
        bases=(cls,),
        frozen=True,
    )
    return grown(
        **{f.name: getattr(part, f.name) for f in dataclasses.fields(cls)}, **{field: value}
    )


@pytest.mark.parametrize(
    ("attribute", "kind"),
    [("guards", Guards), ("partitions", PartitionPolicy), ("row_filter", RowFilter)],
)
def test_a_field_a_later_release_adds_moves_no_queue_until_set(attribute: str, kind: type) -> None:
    made = config()
    index = 1 if attribute != "partitions" else 2
    spec = made.targets[index]
    assert isinstance(getattr(spec, attribute), kind)

    def with_part(value: object) -> PurgeConfig:
        grown = dataclasses.replace(
            spec, **{attribute: later(getattr(spec, attribute), "x", value)}
        )
        targets = tuple(grown if t is spec else t for t in made.targets)
        return dataclasses.replace(made, targets=targets)

    unset, was = with_part(None), config()
    assert (unset.own_queue, unset.routed_queues) == (was.own_queue, was.routed_queues)

    moved = with_part(7)
    if index == 2:
        assert moved.routed_queues != was.routed_queues
        assert moved.own_queue == was.own_queue
    else:
        assert moved.own_queue != was.own_queue
        assert moved.routed_queues == was.routed_queues


def test_a_field_a_later_release_adds_with_a_dataclass_default_moves_no_queue() -> None:
    """A later field whose default is made by a factory (another part, say): compared as the
    value it is, not as the dict the digest's text holds."""
    made = config()
    spec = made.targets[1]
    grown_class = dataclasses.make_dataclass(
        "LaterGuards",
        [("limits", Any, dataclasses.field(default_factory=Guards))],
        bases=(Guards,),
        frozen=True,
    )
    fields = {f.name: getattr(spec.guards, f.name) for f in dataclasses.fields(Guards)}
    grown = dataclasses.replace(spec, guards=grown_class(**fields))
    targets = tuple(grown if t is spec else t for t in made.targets)

    assert dataclasses.replace(made, targets=targets).own_queue == made.own_queue


@pytest.mark.parametrize(
    ("queue", "own"),
    [
        ("purge:8a0f2d493aa3", True),  # PurgeConfig.own_queue's form
        ("purge:eu:8a0f2d493aa3", False),  # a database's own queue named `purge:eu`
        ("purge-eu:8a0f2d493aa3", False),
        ("purge", False),
        ("purge:8A0F2D493AA3", False),  # a digest is lower-case hex
        ("purge:8a0f2d493aa", False),
        ("other:8a0f2d493aa3", False),
    ],
)
def test_a_config_s_own_queue_is_told_from_a_database_s(queue: str, own: bool) -> None:
    assert is_own_queue(queue, "purge") is own


def test_the_queues_a_config_makes_are_told_apart() -> None:
    config = parse_config(
        {**RAW, "databases": {"eu": {"url_env": "EU_URL", "task_queue": "purge:eu"}}},
        env={"EU_URL": "postgresql://app@eu.internal/app"},
    )
    assert config.own_queue is not None
    assert is_own_queue(config.own_queue, config.task_queue)
    assert not is_own_queue(config.routed_queues["eu"], config.task_queue)
