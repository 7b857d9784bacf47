"""The archive a table's rows move to: checked against the catalog before anything moves.

The archive table is the user's: the sweep never creates or alters it. Each batch moves its rows
in one statement (`DELETE ... RETURNING` feeding an `INSERT` into the archive, see
`activities.engine.batch_sql`), so a row is in exactly one of the two tables at any instant.
That only holds if every insert can succeed, so the shapes are compared first: every column of
the source must be in the archive with the same type, any other archive column must fill itself
(nullable, a default, identity or generated), and the role must be allowed to insert.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection, errors, sql

from activities.engine import catalog
from activities.engine.errors import BadTable, MissingRights
from activities.engine.nearest import nearest_table
from purge_config.names import TableName


@dataclass(frozen=True)
class Archive:
    """Where a table's deleted rows are inserted, and how."""

    table: TableName
    columns: tuple[str, ...]
    """The source's columns copied, in the source's order (an archive column that is generated
    computes its own value and is left out)."""
    overriding: bool
    """Whether the insert needs OVERRIDING SYSTEM VALUE: a copied column is an identity column
    GENERATED ALWAYS in the archive, which would otherwise refuse the row's own value."""


@dataclass(frozen=True)
class _Column:
    type: str
    not_null: bool
    has_default: bool
    identity: str
    generated: str


async def bind_archive(
    conn: AsyncConnection[Any],
    source: TableName,
    source_rel: sql.Identifier,
    archive: TableName,
    archive_rel: sql.Identifier,
) -> Archive:
    """The archive of `source`, checked; BadTable (or MissingRights) naming what does not fit."""
    names = {"src": source_rel.as_string(conn), "arc": archive_rel.as_string(conn)}
    try:
        # The fetch inside too: in a pipeline (`TableAccess.prepare`) the error comes with it.
        cur = await conn.execute(catalog.archive_target(), names)
        row = await cur.fetchone()
    except errors.InsufficientPrivilege as err:
        # A schema this role may not use: to_regclass() raises rather than saying NULL.
        raise MissingRights(
            f"archive {archive} of {source}: {str(err).strip()}; the worker's role needs "
            f"USAGE on schema {archive.schema} and INSERT on {archive}; nothing was deleted"
        ) from err
    assert row is not None
    source_oid, archive_oid, relkind, may_insert, role, cascading, one_tree = row
    if archive_oid is None:
        # A misspelt name is the likelier mistake than a table not made: said first.
        near = await nearest_table(conn, archive)
        raise BadTable(
            f"archive table {archive} of {source} does not exist (looked for "
            f"{names['arc']}){near}; the sweep never creates it: create it, e.g. "
            f"CREATE TABLE {names['arc']} (LIKE {names['src']} INCLUDING IDENTITY); nothing "
            "was deleted"
        )
    if relkind not in ("r", "p"):
        raise BadTable(f"archive {archive} of {source} is not a table (relkind {relkind!r})")
    if archive_oid == source_oid:
        raise BadTable(f"archive {archive} of {source} is the table itself")
    if one_tree:
        # A row moved there is in the swept tree again, still expired: every batch would
        # find it, move it and count it once more, until the time budget ran out.
        raise BadTable(
            f"archive {archive} of {source} is in the same partition tree as it (one a "
            "partition of the other, or both of one table): a moved row would be swept again "
            "and counted again; archive into a table outside the tree; nothing was deleted"
        )
    if not may_insert:
        raise MissingRights(
            f"the worker's role {role} may not insert into archive {archive} of {source}: "
            f"GRANT INSERT ON {names['arc']} TO {sql.Identifier(role).as_string(conn)}; "
            "nothing was deleted"
        )
    if cascading:
        # A cascade deletes the rows that point at a moved row, and RETURNING names only the
        # source's own: they would go with it, copied nowhere.
        verb = "references" if len(cascading) == 1 else "reference"
        raise BadTable(
            f"archive {archive} of {source}: {', '.join(cascading)} {verb} {source} ON DELETE "
            "CASCADE, so their rows that point at a moved row would be "
            "deleted with it and copied nowhere; archive a table no foreign key cascades from "
            "(ON DELETE RESTRICT or NO ACTION keeps such rows, and fails the batch instead); "
            "nothing was deleted"
        )
    ours, theirs = await _columns(conn, source_oid, archive_oid)
    return _fit(source, archive, ours, theirs)


async def _columns(
    conn: AsyncConnection[Any], source_oid: int, archive_oid: int
) -> tuple[dict[str, _Column], dict[str, _Column]]:
    """The source's columns and the archive's, by name, in their tables' order."""
    cur = await conn.execute(catalog.archive_columns(), {"src": source_oid, "arc": archive_oid})
    theirs: dict[str, _Column] = {}
    ours: dict[str, _Column] = {}
    for is_source, name, kind, not_null, has_default, identity, generated in await cur.fetchall():
        (ours if is_source else theirs)[str(name)] = _Column(
            str(kind), bool(not_null), bool(has_default), str(identity), str(generated)
        )
    return ours, theirs


def _fit(
    source: TableName, archive: TableName, ours: dict[str, _Column], theirs: dict[str, _Column]
) -> Archive:
    columns: list[str] = []
    overriding = False
    for name, column in ours.items():
        kept = theirs.get(name)
        if kept is None:
            raise BadTable(
                f"archive {archive} has no column {name!r} ({column.type}) of {source}: every "
                "column of a moved row must have a place; nothing was deleted"
            )
        if kept.type != column.type:
            raise BadTable(
                f"column {name!r} is {column.type} in {source} but {kept.type} in archive "
                f"{archive}: the types must be the same; nothing was deleted"
            )
        if kept.generated:
            if not column.generated:
                raise BadTable(
                    f"column {name!r} of archive {archive} is generated, so it cannot keep the "
                    f"value {source}.{name} holds; nothing was deleted"
                )
            continue  # generated on both sides: the archive computes it from the same row
        columns.append(name)
        overriding = overriding or kept.identity == "a"
    if not columns:
        raise BadTable(f"archive {archive} of {source} would take none of its columns")
    for name, column in theirs.items():
        fills_itself = column.has_default or column.identity or column.generated
        if name not in ours and column.not_null and not fills_itself:
            raise BadTable(
                f"column {name!r} of archive {archive} is NOT NULL with no default, and "
                f"{source} has no such column to fill it; nothing was deleted"
            )
    return Archive(archive, tuple(columns), overriding)
