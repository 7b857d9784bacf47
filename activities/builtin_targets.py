"""Compatibility alias of `activities.builtin_kinds`, this module's name before the rooms were
renamed (code that builds a worker in code imports from here). It holds nothing of its own: new
code imports from `activities.builtin_kinds`."""

from activities.builtin_kinds import (
    AUTH_FAILURES_TABLE,
    AUTH_LOCKOUTS_TABLE,
    IDEMPOTENCY_TABLE,
    RATE_LIMIT_TABLE,
    auth,
    build_registry,
    build_target,
    builtin_rules,
    expiring,
    idempotency,
    rate_limit,
)

__all__ = [
    "AUTH_FAILURES_TABLE",
    "AUTH_LOCKOUTS_TABLE",
    "IDEMPOTENCY_TABLE",
    "RATE_LIMIT_TABLE",
    "auth",
    "build_registry",
    "build_target",
    "builtin_rules",
    "expiring",
    "idempotency",
    "rate_limit",
]
