"""The reference DDL shipped with the package, for migrations, `dev` mode, `pg-purge schema` and
tests: the whole of `activities/schema.sql`, or the part that creates one table."""

from __future__ import annotations

import re
from importlib.resources import files

#: The sweep's ledger: exact counts through worker deaths (docs/sweeping.md).
LEDGER_TABLE = "purge_progress"
#: The partition advice's memory (docs/partitions.md).
ADVICE_TABLE = "purge_shares"

_CREATE_TABLE = re.compile(r"^CREATE TABLE (\w+)", re.MULTILINE)


def reference_ddl() -> str:
    """The text of `activities/schema.sql`: the built-in targets' tables and indexes, the
    ledger and the advice table."""
    return files("activities").joinpath("schema.sql").read_text(encoding="utf-8")


def table_ddl() -> dict[str, str]:
    """Each table of `schema.sql` to the paragraph that creates it: its comments, its CREATE
    TABLE and its indexes, in file order. The file's paragraphs (blank-line separated) each
    create one table, after a header that creates none."""
    parts: dict[str, str] = {}
    for paragraph in reference_ddl().strip().split("\n\n"):
        names = _CREATE_TABLE.findall(paragraph)
        if len(names) > 1:
            raise ValueError(f"schema.sql: a paragraph creates {len(names)} tables: {names}")
        if names:
            parts[names[0]] = paragraph.strip() + "\n"
    return parts
