"""Compatibility alias of `activities.registry`, this module's name before the rooms were renamed
(docs and factories written against it import from here). It holds nothing of its own: new code
imports from `activities.registry` or the `activities` front door."""

from activities.registry import (
    BatchedTarget,
    CountingTarget,
    PurgeTarget,
    TargetFactory,
    TargetRegistry,
)

__all__ = ["BatchedTarget", "CountingTarget", "PurgeTarget", "TargetFactory", "TargetRegistry"]
