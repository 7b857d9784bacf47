"""Names as a config writes them: target names, and SQL names used exactly as written.

Checked here, as text; turned into quoted SQL identifiers (`psycopg.sql.Identifier`) only in
`activities/`, never by formatting them into SQL text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from purge_config.errors import ConfigError
from purge_config.values import quoted

#: A target name: what a person types after `--target` and reads in a metric label; `@` for a
#: target of a named database (`x_idempotency@shard1`).
TARGET_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@-]{0,99}")

#: A target name as a pass carries it: a config's name, or a pattern match's (`sessions@` and
#: its schema and table, each at most 63 characters).
STEP_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@-]{0,227}")

#: A Temporal task queue (or schedule id) as a config names it.
QUEUE_NAME = re.compile(r"[A-Za-z0-9_.:/-]{1,200}")

#: A SQL name as this package accepts it: plain ASCII, at most PostgreSQL's 63 bytes. Quotes,
#: semicolons, dots and spaces are refused rather than escaped so a config reads as it runs.
SQL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


@dataclass(frozen=True)
class TableName:
    """A table, optionally schema-qualified, always quoted exactly as written."""

    table: str
    schema: str | None = None

    @classmethod
    def parse(cls, text: str) -> TableName:
        """`"sessions"` or `"app.sessions"`; anything else raises ConfigError."""
        parts = text.split(".")
        if len(parts) > 2 or not all(SQL_NAME.fullmatch(part) for part in parts):
            raise ConfigError(
                f"{quoted(text)} is not a table name: want table or schema.table, each part "
                "letters, digits and _, starting with a letter or _, at most 63 characters"
            )
        return cls(table=parts[-1], schema=parts[0] if len(parts) == 2 else None)

    def __str__(self) -> str:
        return f"{self.schema}.{self.table}" if self.schema else self.table
