"""The built-in kinds as targets (their rules in SQL), and a worker's registry from its config."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

from activities.engine.rules import (
    INSTANT_TYPES,
    MS_TYPES,
    ExpiryRule,
    FullBucketRule,
    NewestRelatedRule,
    Rule,
)
from activities.engine.sql_target import ConnectionSource, SqlTarget
from activities.pattern_matches import PatternTargets
from activities.registry import PurgeTarget, TargetFactory, TargetRegistry
from purge_config import PurgeConfig
from purge_config.filters import RowFilter
from purge_config.kinds import BUILTIN_KINDS
from purge_config.names import TableName
from purge_config.settings import EpochUnit, Guards, PartitionPolicy, SweepSettings
from purge_config.specs import TargetSpec

# Each kind's default tables, from the one table of kinds (frozen, so shared defaults are safe).
(IDEMPOTENCY_TABLE,) = BUILTIN_KINDS["idempotency"].default_tables
(RATE_LIMIT_TABLE,) = BUILTIN_KINDS["rate_limit"].default_tables
AUTH_FAILURES_TABLE, AUTH_LOCKOUTS_TABLE = BUILTIN_KINDS["auth"].default_tables


def builtin_rules(
    kind: str, tables: Sequence[TableName], archives: Sequence[TableName | None] = ()
) -> list[Rule]:
    """The rule of each table of built-in `kind`, as its declaration (purge_config.kinds) says:
    an epoch-ms column at or before now, or a token bucket full again at now."""
    archives = archives or (None,) * len(tables)
    rules: list[Rule] = []
    for role, table, archive in zip(BUILTIN_KINDS[kind].roles, tables, archives, strict=True):
        if role.rule == "full_bucket":
            rules.append(FullBucketRule(table, archive))
        else:
            rules.append(ExpiryRule(table, role.column, archive=archive))
    return rules


def idempotency(
    pool: ConnectionSource,
    name: str = BUILTIN_KINDS["idempotency"].default_name,
    table: TableName = IDEMPOTENCY_TABLE,
    settings: SweepSettings | None = None,
    guards: Guards | None = None,
    partitions: PartitionPolicy | None = None,
    archive: TableName | None = None,
) -> SqlTarget:
    """Stored responses whose `expires_at_ms <= now_ms` (moved to `archive` if given)."""
    rules = builtin_rules("idempotency", (table,), (archive,))
    return SqlTarget(name, pool, rules, settings, guards, partitions)


def rate_limit(
    pool: ConnectionSource,
    name: str = BUILTIN_KINDS["rate_limit"].default_name,
    table: TableName = RATE_LIMIT_TABLE,
    settings: SweepSettings | None = None,
    guards: Guards | None = None,
    partitions: PartitionPolicy | None = None,
    archive: TableName | None = None,
) -> SqlTarget:
    """Token buckets that are full again at `now_ms`, and only those. Its rule is not one
    column's comparison, so `partitions` can take no partition out whole (the sweep says so)."""
    rules = builtin_rules("rate_limit", (table,), (archive,))
    return SqlTarget(name, pool, rules, settings, guards, partitions)


def auth(
    pool: ConnectionSource,
    name: str = BUILTIN_KINDS["auth"].default_name,
    failures: TableName = AUTH_FAILURES_TABLE,
    lockouts: TableName = AUTH_LOCKOUTS_TABLE,
    settings: SweepSettings | None = None,
    guards: Guards | None = None,
    partitions: PartitionPolicy | None = None,
    failures_archive: TableName | None = None,
    lockouts_archive: TableName | None = None,
) -> SqlTarget:
    """Failed logins past `expires_at_ms` and lockouts past `until_ms`: one target, both tables."""
    rules = builtin_rules("auth", (failures, lockouts), (failures_archive, lockouts_archive))
    return SqlTarget(name, pool, rules, settings, guards, partitions)


def expiring(
    pool: ConnectionSource,
    name: str,
    table: TableName,
    column: str,
    max_age_ms: int = 0,
    settings: SweepSettings | None = None,
    guards: Guards | None = None,
    partitions: PartitionPolicy | None = None,
    unit: EpochUnit = "ms",
    row_filter: RowFilter | None = None,
    archive: TableName | None = None,
    age_from: TableName | None = None,
) -> SqlTarget:
    """Any table whose `column + max_age <= now`: epoch ms (or `unit`), timestamptz or
    timestamp (as UTC); only its rows that match `row_filter`, if given; moved to `archive`, if
    given. With `age_from`, `column` is that table's, and a row's age is its newest related
    row's (the rows whose foreign key, ON DELETE CASCADE, points at it)."""
    rule = _expiring_rule(table, column, max_age_ms, unit, row_filter, archive, age_from)
    return SqlTarget(name, pool, [rule], settings, guards, partitions)


def _expiring_rule(
    table: TableName,
    column: str,
    max_age_ms: int,
    unit: EpochUnit,
    row_filter: RowFilter | None,
    archive: TableName | None,
    age_from: TableName | None = None,
) -> Rule:
    if age_from is not None:
        if archive is not None:
            # As the config refuses it: the cascaded rows would go without their copy.
            raise ValueError(f"{table}: age_from and an archive cannot go together")
        return NewestRelatedRule(table, age_from, column, max_age_ms, unit, row_filter)
    return ExpiryRule(
        table,
        column,
        max_age_ms,
        accepts=(*MS_TYPES, *INSTANT_TYPES),
        unit=unit,
        row_filter=row_filter,
        archive=archive,
    )


def build_target(
    spec: TargetSpec, pool: ConnectionSource, small_tables: bool = False
) -> PurgeTarget:
    """The target a non-`python` config entry describes; with `small_tables` (a pattern's
    matches), a table the catalog shows small is swept in one statement."""
    if spec.kind == "expiring":
        archive = spec.archives[0] if spec.archives else None
        rules: list[Rule] = [
            _expiring_rule(
                spec.tables[0],
                spec.column,
                spec.max_age_ms,
                spec.unit,
                spec.row_filter,
                archive,
                spec.age_from,
            )
        ]
    elif spec.kind in BUILTIN_KINDS:
        rules = builtin_rules(spec.kind, spec.tables, spec.archives)
    else:
        raise ValueError(f"no built-in kind {spec.kind!r}")
    return SqlTarget(
        spec.name, pool, rules, spec.settings, spec.guards, spec.partitions, small_tables
    )


def build_match(spec: TargetSpec, pool: ConnectionSource) -> PurgeTarget:
    """The target of one of a pattern's matches: thousands of tables a pass, most of them
    small, each swept in one statement when it is (`activities.engine.small_tables`)."""
    return build_target(spec, pool, small_tables=True)


def build_registry(
    config: PurgeConfig,
    pool: ConnectionSource | None,
    databases: Mapping[str, ConnectionSource] | None = None,
) -> TargetRegistry:
    """Every target of `config` this worker can sweep: built-ins now, `python` factories each
    time a step asks. A target with `database` sweeps through that database's pool, any other
    through `pool`; a target of a database this worker has no pool for (a routed database
    whose URL only the workers next to it have) is not this worker's."""
    pools: dict[str, ConnectionSource] = dict(databases or {})
    if pool is not None:
        pools[""] = pool
    here = [s for s in config.targets if s.kind != "python" and s.database in pools]
    fixed = [build_target(spec, pools[spec.database]) for spec in here if spec.pattern is None]
    # A factory's targets are checked against the PurgeTarget protocol when it is called.
    factories = [cast(TargetFactory, spec.factory) for spec in config.targets if spec.factory]
    patterns = PatternTargets(
        [(spec, pools[spec.database]) for spec in here if spec.pattern is not None], build_match
    )
    # Named, so that a step for one of them that reaches this worker says why it is not here.
    elsewhere = {
        spec.name: spec.database
        for spec in config.targets
        if spec.kind != "python" and spec.database not in pools
    }
    return TargetRegistry(fixed, factories, patterns, elsewhere=elsewhere)
