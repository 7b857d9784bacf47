"""Compatibility alias of `activities.engine.attempt`, this module's name before the rooms were
renamed. It holds nothing of its own: new code imports from `activities.engine`."""

from activities.engine.attempt import TargetSweeper

__all__ = ["TargetSweeper"]
