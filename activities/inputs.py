"""What the workflow and its activity are handed: the pass's input and one target's step.

Plain types, no side effects: the workflow imports this module. Whoever receives one checks it
first (`activities.input_checks`); every field added later gets a default, so a history recorded
before it existed still decodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from activities.routing import Route, route_for


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
    """Targets per child workflow of a spread pass (default: `workflows.spread`'s sizing)."""
    run_size: int | None = None
    """Targets a child's run sweeps before it continues as new (default: as `child_size`'s)."""
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
        return route_for(self.queues, database, self.worker_wait_ms)

    @property
    def limited(self) -> bool:
        """Whether this pass runs its targets concurrently, under limits and a budget."""
        return any(
            v is not None for v in (self.max_concurrent, self.max_per_database, self.budget_ms)
        )

    def database_of(self, name: str) -> str:
        """The database `name` sweeps ("" for the default one)."""
        return self.databases.get(name, "")


@dataclass(frozen=True)
class PurgeStep:
    """The activity's input: sweep one target as of the pass's single instant."""

    name: str
    now_ms: int
    """The workflow's clock at the start of the pass, epoch milliseconds; never the database's."""
    dry_run: bool = False
    budget_ms: int | None = None
    """What is left of the pass's budget: the sweep's time budget is at most this."""
