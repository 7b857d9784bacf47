"""Compatibility alias of `activities.engine.sql_target`, this module's name before the rooms were
renamed. It holds nothing of its own: new code imports from `activities.engine`."""

from activities.engine.sql_target import ConnectionSource, SqlTarget

__all__ = ["ConnectionSource", "SqlTarget"]
