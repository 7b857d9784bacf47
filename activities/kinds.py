"""The built-in kinds of target, and a worker's registry built from its config."""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool

from activities.config import PurgeConfig
from activities.guards import Guards
from activities.sqltarget import SqlTarget, SweepSettings
from activities.tables import (
    INSTANT_TYPES,
    MS_TYPES,
    ExpiryRule,
    FullBucketRule,
    Rule,
    TableName,
)
from activities.target_config import TargetSpec
from activities.targets import PurgeTarget, TargetFactory, TargetRegistry

# Frozen, so one shared default each is safe.
IDEMPOTENCY_TABLE = TableName("x_idempotency")
RATE_LIMIT_TABLE = TableName("x_rate_limit")
AUTH_FAILURES_TABLE = TableName("x_auth_failures")
AUTH_LOCKOUTS_TABLE = TableName("x_auth_lockouts")


def idempotency(
    pool: AsyncConnectionPool[Any],
    name: str = "x_idempotency",
    table: TableName = IDEMPOTENCY_TABLE,
    settings: SweepSettings | None = None,
    guards: Guards | None = None,
) -> SqlTarget:
    """Stored responses whose `expires_at_ms <= now_ms`."""
    return SqlTarget(name, pool, [ExpiryRule(table, "expires_at_ms")], settings, guards)


def rate_limit(
    pool: AsyncConnectionPool[Any],
    name: str = "x_rate_limit",
    table: TableName = RATE_LIMIT_TABLE,
    settings: SweepSettings | None = None,
    guards: Guards | None = None,
) -> SqlTarget:
    """Token buckets that are full again at `now_ms`, and only those."""
    return SqlTarget(name, pool, [FullBucketRule(table)], settings, guards)


def auth(
    pool: AsyncConnectionPool[Any],
    name: str = "x_auth",
    failures: TableName = AUTH_FAILURES_TABLE,
    lockouts: TableName = AUTH_LOCKOUTS_TABLE,
    settings: SweepSettings | None = None,
    guards: Guards | None = None,
) -> SqlTarget:
    """Failed logins past `expires_at_ms` and lockouts past `until_ms`: one target, both tables."""
    rules: list[Rule] = [ExpiryRule(failures, "expires_at_ms"), ExpiryRule(lockouts, "until_ms")]
    return SqlTarget(name, pool, rules, settings, guards)


def expiring(
    pool: AsyncConnectionPool[Any],
    name: str,
    table: TableName,
    column: str,
    max_age_ms: int = 0,
    settings: SweepSettings | None = None,
    guards: Guards | None = None,
) -> SqlTarget:
    """Any table whose `column + max_age <= now`: epoch ms, timestamptz or timestamp (as UTC)."""
    rule = ExpiryRule(table, column, max_age_ms, accepts=(*MS_TYPES, *INSTANT_TYPES))
    return SqlTarget(name, pool, [rule], settings, guards)


def build_target(spec: TargetSpec, pool: AsyncConnectionPool[Any]) -> PurgeTarget:
    """The target a non-`python` config entry describes."""
    if spec.kind == "idempotency":
        return idempotency(pool, spec.name, spec.tables[0], spec.settings, spec.guards)
    if spec.kind == "rate_limit":
        return rate_limit(pool, spec.name, spec.tables[0], spec.settings, spec.guards)
    if spec.kind == "auth":
        return auth(pool, spec.name, spec.tables[0], spec.tables[1], spec.settings, spec.guards)
    if spec.kind == "expiring":
        return expiring(
            pool,
            spec.name,
            spec.tables[0],
            spec.column,
            spec.max_age_ms,
            spec.settings,
            spec.guards,
        )
    raise ValueError(f"no built-in kind {spec.kind!r}")


def build_registry(config: PurgeConfig, pool: AsyncConnectionPool[Any]) -> TargetRegistry:
    """Every target of `config`: built-ins now, `python` factories each time a step asks."""
    fixed = [build_target(spec, pool) for spec in config.targets if spec.kind != "python"]
    factories: list[TargetFactory] = [
        spec.factory for spec in config.targets if spec.factory is not None
    ]
    return TargetRegistry(fixed, factories)
