"""The activity and what it stands on: the contract (payloads, errors, targets), the sweep
activity with its guards, and the SQL engine of the built-in kinds (`activities.engine`).

The names below load their module when first used, not with the package: a workflow that
imports `activities.inputs` or `activities.results` must not load the driver or the engine with it.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from activities.errors import (
        BadPurgeInput,
        BadPurgeTarget,
        DryRunUnsupported,
        DuplicatePurgeTarget,
        PurgeError,
        PurgeGuardRefused,
        PurgeTargetsFailed,
        UnknownPurgeTarget,
    )
    from activities.inputs import PurgeInput, PurgeStep
    from activities.progress import LedgerKey, Progress, SweepStats
    from activities.registry import (
        BatchedTarget,
        CountingTarget,
        PurgeTarget,
        TargetFactory,
        TargetRegistry,
    )
    from activities.results import PurgeReport, PurgeSweep
    from activities.sweep import PurgeActivities, contract_errors

_HOME = {
    # The wire: one dataclass in and one out for the workflow and the activity.
    "PurgeInput": "inputs",
    "PurgeStep": "inputs",
    "PurgeSweep": "results",
    "PurgeReport": "results",
    # The contract's errors, by their Temporal type names.
    "PurgeError": "errors",
    "DuplicatePurgeTarget": "errors",
    "UnknownPurgeTarget": "errors",
    "BadPurgeTarget": "errors",
    "BadPurgeInput": "errors",
    "DryRunUnsupported": "errors",
    "PurgeGuardRefused": "errors",
    "PurgeTargetsFailed": "errors",
    # Targets, and how a worker finds one by name.
    "PurgeTarget": "registry",
    "CountingTarget": "registry",
    "BatchedTarget": "registry",
    "TargetFactory": "registry",
    "TargetRegistry": "registry",
    # The activity, its edge, and what a batched sweep reports to it.
    "PurgeActivities": "sweep",
    "contract_errors": "sweep",
    "Progress": "progress",
    "LedgerKey": "progress",
    "SweepStats": "progress",
}

__all__ = [  # noqa: RUF022 (grouped by role, the order a reader learns the package in)
    # The wire
    "PurgeInput",
    "PurgeStep",
    "PurgeSweep",
    "PurgeReport",
    # The contract's errors
    "PurgeError",
    "DuplicatePurgeTarget",
    "UnknownPurgeTarget",
    "BadPurgeTarget",
    "BadPurgeInput",
    "DryRunUnsupported",
    "PurgeGuardRefused",
    "PurgeTargetsFailed",
    # Targets
    "PurgeTarget",
    "CountingTarget",
    "BatchedTarget",
    "TargetFactory",
    "TargetRegistry",
    # The activity
    "PurgeActivities",
    "contract_errors",
    "Progress",
    "LedgerKey",
    "SweepStats",
]


def __getattr__(name: str) -> object:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"activities.{home}"), name)
