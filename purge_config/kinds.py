"""The one table of built-in kinds: each kind's default target name and default tables.

The rule each kind's tables follow (which rows are expired) is SQL, in
`activities.builtin_targets`; everything a config needs to know about a kind is here.
"""

from __future__ import annotations

from dataclasses import dataclass

from purge_config.names import TableName


@dataclass(frozen=True)
class BuiltinKind:
    """A kind whose tables have a fixed shape (see activities/schema.sql)."""

    default_name: str
    tables: tuple[tuple[str, str], ...]
    """(config key, default table), in the order the kind sweeps them."""

    @property
    def table_keys(self) -> frozenset[str]:
        return frozenset(key for key, _ in self.tables)

    @property
    def archive_keys(self) -> tuple[str, ...]:
        """The key naming each table's archive, in the order of `tables`: `table` takes
        `archive_table`, `failures_table` takes `failures_archive_table`."""
        return tuple(key.removesuffix("table") + "archive_table" for key, _ in self.tables)

    @property
    def default_tables(self) -> tuple[TableName, ...]:
        return tuple(TableName(table) for _, table in self.tables)


BUILTIN_KINDS: dict[str, BuiltinKind] = {
    "idempotency": BuiltinKind("x_idempotency", (("table", "x_idempotency"),)),
    "rate_limit": BuiltinKind("x_rate_limit", (("table", "x_rate_limit"),)),
    "auth": BuiltinKind(
        "x_auth", (("failures_table", "x_auth_failures"), ("lockouts_table", "x_auth_lockouts"))
    ),
}

#: Every `kind` a `[[targets]]` entry may name.
KINDS = (*BUILTIN_KINDS, "expiring", "python")
