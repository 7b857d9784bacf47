"""Routing: a database swept by workers of its own gets its activities on its own task queue.

A config that gives a database a `task_queue` hands the pass `queues` (database name to queue);
every activity on that database goes there and may wait up to `worker_wait_ms` for a worker of
that queue before its target fails alone. Any other database's activities run on the pass's own
queue. No side effects: the workflow imports this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from purge_config.fleet import DEFAULT_WORKER_WAIT_MS


@dataclass(frozen=True)
class Route:
    """A database swept by workers of its own: the task queue its activities go to."""

    queue: str
    database: str
    worker_wait_ms: int = DEFAULT_WORKER_WAIT_MS
    """How long an activity may wait there for a worker before its target fails alone."""
    own_config: bool = False
    """Set by a pass for its children: `queue` is the config's own targets' queue
    (`is_own_queue` of the pass's queue), which a child placed on that queue cannot tell from
    its own task queue. A release before it sends none (False: told from the child's queue)."""


def is_own_queue(queue: str, task_queue: str) -> bool:
    """Whether `queue` is the queue of a config's own targets (`PurgeConfig.own_queue`: its
    `task_queue` and 12 hex digits), as opposed to a database's own queue (its `task_queue`
    and the digits: a region's named `purge:eu` makes `purge:eu:` and the digits)."""
    prefix, colon, digest = queue.rpartition(":")
    return (
        colon == ":"
        and prefix == task_queue
        and len(digest) == 12
        and all(c in "0123456789abcdef" for c in digest)
    )


def route_for(queues: Mapping[str, str], database: str, worker_wait_ms: int | None) -> Route | None:
    """Where activities on `database` go, when not to the pass's own queue."""
    queue = queues.get(database)
    if queue is None:
        return None
    return Route(queue, database, worker_wait_ms or DEFAULT_WORKER_WAIT_MS)
