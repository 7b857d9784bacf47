"""The name a misspelt table most likely meant, for the message that refuses it."""

from __future__ import annotations

import difflib
from typing import Any

from psycopg import AsyncConnection

from activities.engine import catalog
from purge_config.names import TableName


async def nearest_table(conn: AsyncConnection[Any], table: TableName) -> str:
    """` (did you mean 'x'?)` for the table of that schema (or of the search_path) nearest a
    name that was not found, or ''; a name that differs only in case says that names are
    exact. One catalog read, on the error path only."""
    cur = await conn.execute(catalog.table_names_in(), {"schema": table.schema})
    names = [str(row[0]) for row in await cur.fetchall()]
    same = [name for name in names if name.lower() == table.table.lower()]
    near = same or difflib.get_close_matches(table.table, names, n=1)
    if not near:
        return ""
    named = str(TableName(near[0], table.schema))
    return f" (did you mean {named!r}?{' names are case-sensitive' if same else ''})"
