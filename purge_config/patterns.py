"""Table patterns: `table = "tenant_*.sessions"` names every matching table, each a target.

A `*` stands for one run of identifier characters (letters, digits, `_`), at most one in the
schema part and one in the table part. The pattern is expanded from the target database's
catalog once per pass (`activities.pattern_matches`); each match is a target of its own, named
`NAME@SUFFIX`, where SUFFIX is what the stars matched the names of:

| pattern                | a match              | its target            |
|------------------------|----------------------|-----------------------|
| `tenant_*.sessions`    | `tenant_0042.sessions` | `sessions@tenant_0042` |
| `app.sessions_*`       | `app.sessions_2026`  | `sessions@sessions_2026` |
| `tenant_*.sess_*`      | `tenant_7.sess_a`    | `sessions@tenant_7.sess_a` |

The suffix is the schema when only the schema part has a star, the table when only the table
part has one, and `schema.table` when both do: one match, one name, and back again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from purge_config.errors import ConfigError
from purge_config.names import SQL_NAME, TableName
from purge_config.values import quoted

#: What one `*` matches: one run of the characters an identifier here may hold.
STAR_MATCHES = "[A-Za-z0-9_]+"
#: One part of a pattern: identifier characters and at most one `*`.
_PART = re.compile(r"[A-Za-z_*][A-Za-z0-9_*]{0,62}")
#: Wildcards of other syntaxes (glob, LIKE, regex) a user might reach for: refused by name.
_OTHER_WILDCARDS = "?[]%"
#: Schemas a pattern never matches in: the catalogs, TOAST and temporary schemas.
SYSTEM_SCHEMA = re.compile(r"pg_.*|information_schema")


def is_pattern(text: str) -> bool:
    """Whether a table name as written in a config is a pattern."""
    return "*" in text


def parse_table(text: str) -> TableName:
    """`table` or `schema.table` where each part may hold one `*`; a ConfigError otherwise."""
    if not is_pattern(text) and not any(c in text for c in _OTHER_WILDCARDS):
        return TableName.parse(text)
    other = sorted({c for c in text if c in _OTHER_WILDCARDS})
    if other:
        raise ConfigError(
            f"{quoted(text)}: a pattern takes only '*' (one run of letters, digits and _), "
            f"not {' '.join(other)}"
        )
    parts = text.split(".")
    if len(parts) > 2 or not all(_PART.fullmatch(p) for p in parts):
        raise ConfigError(
            f"{quoted(text)} is not a table pattern: want table or schema.table, each part "
            "letters, digits, _ and one '*', at most 63 characters"
        )
    if any(p.count("*") > 1 for p in parts):
        raise ConfigError(
            f"{quoted(text)}: at most one '*' in the schema part and one in the table part"
        )
    return TableName(table=parts[-1], schema=parts[0] if len(parts) == 2 else None)


def pattern_of(table: TableName) -> TablePattern | None:
    """The pattern `table` is, or None when it names one table."""
    if is_pattern(table.table) or (table.schema is not None and is_pattern(table.schema)):
        return TablePattern(table)
    return None


def _part_regex(part: str) -> str:
    # Identifier characters need no escaping in either regex dialect (Python's, PostgreSQL's).
    return "^" + part.replace("*", "(" + STAR_MATCHES + ")") + "$"


@dataclass(frozen=True)
class Match:
    """One table a pattern matched, and what its stars stood for."""

    table: TableName
    schema_star: str | None = None
    table_star: str | None = None


@dataclass(frozen=True)
class TablePattern:
    """A table name with a `*` in its schema part, its table part, or both."""

    name: TableName

    @property
    def schema_wild(self) -> bool:
        return self.name.schema is not None and is_pattern(self.name.schema)

    @property
    def table_wild(self) -> bool:
        return is_pattern(self.name.table)

    @property
    def matches_everything(self) -> bool:
        """Whether it could match every table the role can see (`*.*`, or `*` alone, which
        matches every table on the search path)."""
        return self.name.table == "*" and self.name.schema in (None, "*")

    @property
    def schema_regex(self) -> str | None:
        """A regex (anchored, PostgreSQL and Python alike) for the schema part; None for an
        unqualified pattern, which matches the tables visible on the search path."""
        return None if self.name.schema is None else _part_regex(self.name.schema)

    @property
    def table_regex(self) -> str:
        return _part_regex(self.name.table)

    def match(self, schema: str | None, table: str) -> Match | None:
        """The match of `schema.table` (an unqualified pattern: `schema` None), or None."""
        if SQL_NAME.fullmatch(table) is None:
            return None
        schema_star = None
        if self.name.schema is None:
            if schema is not None:
                return None
        else:
            if schema is None or SQL_NAME.fullmatch(schema) is None:
                return None
            if SYSTEM_SCHEMA.fullmatch(schema):
                return None
            found = re.fullmatch(self.schema_regex or "", schema)
            if found is None:
                return None
            schema_star = found.group(1) if self.schema_wild else None
        found_table = re.fullmatch(self.table_regex, table)
        if found_table is None:
            return None
        table_star = found_table.group(1) if self.table_wild else None
        return Match(TableName(table, schema), schema_star, table_star)

    def suffix(self, match: Match) -> str:
        """The part after `@` in the name of the target `match` is."""
        table = match.table
        if self.schema_wild and self.table_wild:
            return f"{table.schema}.{table.table}"
        if self.schema_wild:
            return str(table.schema)
        return table.table

    def from_suffix(self, suffix: str) -> Match | None:
        """The match a target name's suffix stands for, if it is one of this pattern's."""
        if self.schema_wild and self.table_wild:
            schema, dot, table = suffix.partition(".")
            return self.match(schema, table) if dot else None
        if self.schema_wild:
            return self.match(suffix, str(self.name.table))
        return self.match(self.name.schema, suffix)

    def fill(self, other: TableName, match: Match) -> TableName:
        """`other` (another table of the same target, such as its archive) with its stars
        replaced by what this pattern's stars matched: a star in a schema part takes the
        match's schema star, one in a table part its table star (`check_companion` made sure
        there is one)."""
        schema = other.schema
        if schema is not None and match.schema_star is not None:
            schema = schema.replace("*", match.schema_star)
        table = other.table
        if match.table_star is not None:
            table = table.replace("*", match.table_star)
        return replace(other, schema=schema, table=table)

    def check_companion(self, other: TableName, where: str) -> None:
        """A ConfigError unless every star of `other` has a star of this pattern to take its
        value from (see `fill`)."""
        if other.schema is not None and is_pattern(other.schema) and not self.schema_wild:
            raise ConfigError(
                f"{where}: {other}: '*' in the schema part, but the pattern {self.name} has none "
                "there to fill it from"
            )
        if is_pattern(other.table) and not self.table_wild:
            raise ConfigError(
                f"{where}: {other}: '*' in the table part, but the pattern {self.name} has none "
                "there to fill it from"
            )


def split_match_name(name: str) -> tuple[str, str] | None:
    """(pattern target's name, suffix) of a name like `sessions@tenant_0042`, or None. The
    suffix holds no `@` (SQL names cannot), so the last `@` divides them."""
    base, at, suffix = name.rpartition("@")
    return (base, suffix) if at and base and suffix else None
