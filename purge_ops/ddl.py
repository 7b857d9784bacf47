"""`pg-purge schema`: the tables a config needs and the sweep never creates itself, printed or
applied: the ledger (`purge_progress`) and the advice table (`purge_shares`) in every database
the config sweeps, and, only when asked, the built-in kinds' reference tables."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from activities.schema import ADVICE_TABLE, LEDGER_TABLE, table_ddl
from purge_config.file import PurgeConfig
from purge_config.kinds import BUILTIN_KINDS

#: Where a CREATE TABLE with no schema would go, and whether the role may create there: read by
#: `_check` on a connection of its own before anything is created, and again after the DDL in
#: the transaction that created (to say where the tables went).
_WHERE = sql.SQL(
    "SELECT current_database(), current_schema(),"
    " current_schema() IS NOT NULL AND has_schema_privilege(current_schema(), 'CREATE'),"
    " current_user"
)
_EXISTS = sql.SQL("SELECT to_regclass(%s) IS NOT NULL")


class SchemaRefused(Exception):
    """A database where `--apply` may not create what it needs; nothing was created anywhere."""


@dataclass(frozen=True)
class Needed:
    """What one config needs: the tables, in file order, and the databases (config name, "" for
    `database_url`) that need them."""

    tables: tuple[str, ...]
    databases: tuple[str, ...]
    notes: tuple[str, ...] = ()
    """Lines for the reader: a built-in kind's table renamed in the config, a database whose
    URL is not set here."""


def needed(config: PurgeConfig, kinds: bool) -> Needed:
    """The tables `config` needs: the ledger and the advice table, then (with `kinds`) the
    reference table of each built-in kind it sweeps under the table's default name."""
    tables = [LEDGER_TABLE, ADVICE_TABLE]
    notes: list[str] = []
    for target in config.targets:
        kind = BUILTIN_KINDS.get(target.kind)
        if kind is None or not kinds:
            continue
        for default, named in zip(
            kind.default_tables, target.tables or kind.default_tables, strict=True
        ):
            if str(named) != str(default):
                notes.append(
                    f"target {target.name} sweeps {named}: the reference DDL below is for "
                    f"{default}; create {named} with that shape yourself"
                )
            elif default.table not in tables:
                tables.append(default.table)
    databases: list[str] = []
    for target in config.targets:
        if target.kind == "python" or target.database in databases:
            continue
        if target.database and target.database not in config.databases:
            notes.append(
                f"database {target.database}: its URL is not set here (url_env); run this "
                "where it is"
            )
            continue
        databases.append(target.database)
    return Needed(tuple(tables), tuple(databases), tuple(dict.fromkeys(notes)))


def ddl_text(tables: tuple[str, ...]) -> str:
    """The DDL that creates `tables`, each with its comments and indexes."""
    parts = table_ddl()
    return "\n".join(parts[table] for table in tables)


def _url(config: PurgeConfig, database: str) -> str:
    return config.databases[database] if database else config.require_database_url()


def _label(database: str) -> str:
    return database or "the default database (database_url)"


async def apply(config: PurgeConfig, need: Needed, say: Callable[[str], None]) -> int:
    """Create what `need` lists in each of its databases, skipping tables that exist. Every
    database is checked first (the role may create in its schema); if one refuses, nothing is
    created anywhere and `SchemaRefused` says where and why."""
    missing: dict[str, list[str]] = {}
    for database in need.databases:
        async with await psycopg.AsyncConnection.connect(_url(config, database)) as conn:
            missing[database] = await _check(conn, database, need.tables)
    for database in need.databases:
        if not missing[database]:
            say(f"{_label(database)}: every table is there ({', '.join(need.tables)})")
            continue
        url = _url(config, database)
        async with await psycopg.AsyncConnection.connect(url) as conn, conn.transaction():
            # The paragraphs of the shipped file, whose text is ours; no config text is in it.
            await conn.execute(ddl_text(tuple(missing[database])).encode())
            row = await (await conn.execute(_WHERE)).fetchone()
        kept = [t for t in need.tables if t not in missing[database]]
        where = f"schema {row[1]}" if row else "its schema"
        say(
            f"{_label(database)}: created {', '.join(missing[database])} in {where}"
            + (f"; kept {', '.join(kept)}" if kept else "")
        )
    return 0


async def _check(
    conn: psycopg.AsyncConnection[Any], database: str, tables: tuple[str, ...]
) -> list[str]:
    """The tables of `tables` that `database` lacks, after checking the role may create them."""
    row = await (await conn.execute(_WHERE)).fetchone()
    assert row is not None
    name, schema, may_create, role = row
    missing = []
    for table in tables:
        seen = await (await conn.execute(_EXISTS, (table,))).fetchone()
        if not (seen and seen[0]):
            missing.append(table)
    if missing and schema is None:
        raise SchemaRefused(
            f"{_label(database)}: no schema of the search_path exists for role {role} in "
            f"database {name}; nothing was created"
        )
    if missing and not may_create:
        raise SchemaRefused(
            f"{_label(database)}: role {role} may not create tables in schema {schema} of "
            f"database {name} (GRANT CREATE ON SCHEMA {schema} TO {role}, or run as its "
            "owner); nothing was created"
        )
    return missing
