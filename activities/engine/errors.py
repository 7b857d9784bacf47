"""Every error the engine raises on purpose: a target it cannot or will not sweep, each found
before anything is deleted (or, for a table changed under a sweep, before anything more is).

The engine knows nothing of Temporal: the activity turns these into the contract's errors at
its edge (`activities.sweep`). Transient server errors (a lock not available, a statement
cancelled, a dropped connection) are not these: they stay psycopg's, and are retried.
"""

from __future__ import annotations

# One first-line rule for every layer: configuration may not import the engine, so it lives
# there. Re-exported here for the engine's modules.
from purge_config.errors import first_line

__all__ = ["BadTable", "EngineError", "MissingRights", "SweepRefused", "first_line"]


class EngineError(Exception):
    """A target the engine cannot or will not sweep as configured; retrying changes nothing."""


class BadTable(EngineError):
    """A table, column, archive or schema that is missing or does not fit the target's rule."""


class MissingRights(EngineError):
    """The worker's role lacks a privilege or an ownership the sweep needs."""


class SweepRefused(EngineError):
    """A setting of the target forbids the sweep of a table as it is."""
