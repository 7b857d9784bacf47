"""Who may take partitions out, and where taking them out can do nothing: checked before
anything is detached, so a role that could detach but not finish is refused with the grant it
lacks, never left halfway."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection, sql

from activities.engine.errors import BadTable, MissingRights
from activities.engine.partitions import Layout
from activities.engine.rules import Predicate, ident
from purge_config.names import TableName
from purge_config.settings import PartitionPolicy


async def check_partitions(
    conn: AsyncConnection[Any], pred: Predicate, layout: Layout | None, policy: PartitionPolicy
) -> str:
    """Before anything is detached: refuse a role that could not finish (see `check_rights`),
    and say why `partitions = "drop"` (or detach) can take nothing out of this table, if it
    cannot (returned as advice; empty when it can, or when the setting is `delete`)."""
    if not policy.removes:
        return ""
    setting = f"partitions = {policy.mode!r}"
    if pred.row_filter is not None or pred.archive is not None:
        # A target built in code (a config refuses both): rules.py gives such a rule no key.
        reason = (
            "a row filter, which no partition's bounds can answer for"
            if pred.row_filter is not None
            else "an archive table, and a partition leaving whole would skip the copy"
        )
        return (
            f"{pred.table}: {setting} has no effect: the target has {reason}; its rows are "
            "deleted in batches"
        )
    if pred.range_key is None:
        return (
            f"{pred.table}: {setting} has no effect: its rule is not a comparison of one column "
            "with the cutoff (a rate-limit bucket expires when it is full again), so no "
            "partition's bounds can say all its rows are expired; its rows are deleted in batches"
        )
    if layout is None:
        return f"{pred.table}: {setting} has no effect: the table is not partitioned"
    if not layout.judged:
        return (
            f"{pred.table}: {setting} has no effect: it is partitioned by {layout.key}, not by "
            f"RANGE on {pred.range_key.column} alone; each partition is swept in batches"
        )
    await check_rights(conn, layout, policy)
    return ""


async def check_rights(conn: AsyncConnection[Any], layout: Layout, policy: PartitionPolicy) -> None:
    """Refuse, before anything is detached, a role that could detach but not finish: DETACH
    needs the table's owner, DROP and SET SCHEMA each partition's, a move CREATE on the schema
    (and no table of the same name there)."""
    verb = "drop" if policy.mode == "drop" else "detach"
    missing = [(str(layout.table), layout.owner)] if not layout.owned else []
    missing += [(str(c.table), c.owner) for c in layout.children if not c.owned]
    if missing:
        owners = sorted({owner for _, owner in missing})
        tables = ", ".join(f"{table} (owner {owner})" for table, owner in missing)
        grant = "; ".join(f"GRANT {owner} TO {layout.role}" for owner in owners)
        does = "detaches" if verb == "detach" else f"detaches and {verb}s"
        raise MissingRights(
            f"table {layout.table}: partitions = {verb!r} {does} whole partitions, "
            f"which needs their owner, and role {layout.role} is not a member of the owner of "
            f"{tables}; {grant} (or set partitions = 'delete'); nothing was detached"
        )
    if policy.mode != "detach":
        return
    schema = policy.detached_schema
    cur = await conn.execute(schema_ready(), {"schema": _quoted(conn, schema)})
    exists, may_create = await cur.fetchone() or (False, False)
    if not exists:
        raise BadTable(
            f"table {layout.table}: detached_schema {schema!r} does not exist; create it "
            f"(CREATE SCHEMA {_quoted(conn, schema)}); nothing was detached"
        )
    if not may_create:
        raise MissingRights(
            f"table {layout.table}: moving detached partitions to schema {schema!r} needs CREATE "
            f"on it: GRANT CREATE ON SCHEMA {_quoted(conn, schema)} TO {layout.role}; nothing was "
            "detached"
        )
    for child in layout.expired:
        if child.table.schema == schema:
            continue
        there = TableName(child.table.table, schema)
        cur = await conn.execute(name_taken(), {"name": ident(there).as_string(conn)})
        row = await cur.fetchone()
        if row and row[0]:
            raise BadTable(
                f"table {layout.table}: partition {child.table} cannot move to {there}: a table "
                "of that name is already there; rename or drop it; nothing was detached"
            )


def _quoted(conn: AsyncConnection[Any], schema: str) -> str:
    return ident(TableName(schema)).as_string(conn)


# What moving a partition to another schema needs.


def schema_ready() -> sql.SQL:
    """One row: whether schema `%(schema)s` (a quoted name) exists, and whether this role may
    create in it (what moving a table there needs)."""
    return sql.SQL(
        "SELECT s.oid IS NOT NULL,"
        " CASE WHEN s.oid IS NULL THEN false ELSE has_schema_privilege(s.oid, 'CREATE') END"
        " FROM (SELECT to_regnamespace(%(schema)s)::oid AS oid) s"
    )


def name_taken() -> sql.SQL:
    """Whether a relation `%(name)s` (quoted, schema-qualified) exists."""
    return sql.SQL("SELECT to_regclass(%(name)s) IS NOT NULL")
