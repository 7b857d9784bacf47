"""The one table of built-in kinds: each kind's default target name, its tables (the config key
naming each, its default, the column its rule reads) and the shape of that rule.

The config reads it for keys and defaults (`purge_config.specs`); the worker reads it to build
each table's rule (`activities.builtin_kinds`), the SQL of each shape living there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from purge_config.names import TableName
from purge_config.presets import PRESETS

#: How a table's expired rows are told: one epoch-ms column at or before now, or a token bucket
#: full again at now (see activities.engine.rules).
RuleShape = Literal["expiry", "full_bucket"]


@dataclass(frozen=True)
class TableRole:
    """One table of a kind."""

    key: str
    """The config key naming it (`table`, `failures_table`)."""
    default: str
    """The table when the config names none (activities/schema.sql)."""
    rule: RuleShape = "expiry"
    column: str = ""
    """The epoch-ms column an `expiry` rule reads."""

    @property
    def archive_key(self) -> str:
        """The key naming its archive: `table` takes `archive_table`, `failures_table` takes
        `failures_archive_table`."""
        return self.key.removesuffix("table") + "archive_table"


@dataclass(frozen=True)
class BuiltinKind:
    """A kind whose tables have a fixed shape (see activities/schema.sql)."""

    default_name: str
    roles: tuple[TableRole, ...]
    """Its tables, in the order the kind sweeps them."""

    @property
    def tables(self) -> tuple[tuple[str, str], ...]:
        """(config key, default table) of each table, in order."""
        return tuple((role.key, role.default) for role in self.roles)

    @property
    def table_keys(self) -> frozenset[str]:
        return frozenset(role.key for role in self.roles)

    @property
    def archive_keys(self) -> tuple[str, ...]:
        """The key naming each table's archive, in the order of `tables`."""
        return tuple(role.archive_key for role in self.roles)

    @property
    def default_tables(self) -> tuple[TableName, ...]:
        return tuple(TableName(role.default) for role in self.roles)


BUILTIN_KINDS: dict[str, BuiltinKind] = {
    "idempotency": BuiltinKind(
        "x_idempotency", (TableRole("table", "x_idempotency", column="expires_at_ms"),)
    ),
    "rate_limit": BuiltinKind(
        "x_rate_limit", (TableRole("table", "x_rate_limit", rule="full_bucket"),)
    ),
    "auth": BuiltinKind(
        "x_auth",
        (
            TableRole("failures_table", "x_auth_failures", column="expires_at_ms"),
            TableRole("lockouts_table", "x_auth_lockouts", column="until_ms"),
        ),
    ),
}

#: Every `kind` a `[[targets]]` entry may name; a framework preset is read as `expiring`.
KINDS = (*BUILTIN_KINDS, "expiring", "python", *PRESETS)
