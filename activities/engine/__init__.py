"""The SQL engine of the built-in kinds: rules bound to real tables, the plan of each sweep,
the batches, the ledger that counts them, and what a sweep leaves. Each room keeps the SQL it
runs (a batch's in `batch_sql`, the ledger's in `ledger`), but for the reads of the catalog that
bind a rule or choose a plan, all in `catalog`. It knows nothing of Temporal: it raises its own
errors, which the activity turns into the contract's at its edge."""

from activities.engine.access import ConnectionSource, TableAccess
from activities.engine.context import SweepContext
from activities.engine.errors import BadTable, EngineError, MissingRights, SweepRefused
from activities.engine.rules import (
    INSTANT_TYPES,
    MS_TYPES,
    ExpiryRule,
    FullBucketRule,
    Predicate,
    Rule,
)
from activities.engine.sql_target import SqlTarget
from activities.engine.target_tables import TargetSweeper

__all__ = [  # noqa: RUF022 (grouped by role, the order a reader learns the package in)
    # A target: what the activity asks of the built-in kinds.
    "SqlTarget",
    "ConnectionSource",
    # Rules: which rows of a table are expired, bound to the table as it is.
    "Rule",
    "ExpiryRule",
    "FullBucketRule",
    "Predicate",
    "MS_TYPES",
    "INSTANT_TYPES",
    # One sweep: its context carried down, its tables reached and swept in order.
    "SweepContext",
    "TableAccess",
    "TargetSweeper",
    # Errors: a target it cannot or will not sweep as configured.
    "EngineError",
    "BadTable",
    "MissingRights",
    "SweepRefused",
]
