"""Pattern targets on a worker: their matches read from the catalog, and each match built into
a target of its own when a step names it (`sessions@tenant_0042`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from psycopg import sql

from activities.engine.pipelines import settled_pipeline
from activities.engine.small_tables import SMALL_PAGES
from activities.errors import BadPurgeTarget
from activities.registry import PurgeTarget
from activities.spread_steps import EXPAND_PAGE, PatternPage, PatternStep
from purge_config.patterns import TablePattern
from purge_config.specs import TargetSpec

#: Ordinary and partitioned tables, never a partition (its parent's target sweeps it), in a
#: schema that is no catalog, TOAST or temporary one, and that the role may see.
#: With each, whether it is small as `small_tables` tells a table it sweeps in one statement (its
#: heap's size exact, from its file), for the page's rows alone: one file's size a table.
#: Foreign keys in one hashed set, not a scan of pg_constraint per table.
_CANDIDATES = sql.SQL("""
SELECT m.nspname, m.relname,
  m.relkind = 'r' AND NOT m.relhassubclass AND NOT m.relhasrules
  AND pg_catalog.pg_relation_size(m.oid)
    <= %(small_pages)s * pg_catalog.current_setting('block_size')::int
  AND m.oid NOT IN (SELECT f.confrelid FROM pg_catalog.pg_constraint f WHERE f.contype = 'f')
FROM (
  SELECT c.oid, n.nspname, c.relname, c.relkind, c.relhassubclass, c.relhasrules
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
  WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
    AND n.nspname !~ '^pg_' AND n.nspname <> 'information_schema'
    AND c.relname ~ %(table_re)s
    AND {where_schema}
    AND pg_catalog.has_schema_privilege(n.oid, 'USAGE')
    AND pg_catalog.has_table_privilege(c.oid, 'SELECT')
    AND {after}
  ORDER BY {order}
  LIMIT %(limit)s
) m
ORDER BY {outer_order}
""")

#: Hash joins for the matches' read, local to its transaction. On catalog statistics older
#: than the tenants (thousands of schemas made since pg_class was last analyzed) the planner
#: expects one schema, and joins by a nested loop that reads every tenant's table once per
#: tenant: 19 s a page of 2,000 among 5,000 tenants, against 0.05 s hashed (why:
#: docs/decisions/spread-passes.md). Hashed, the read is linear in the catalog whatever its
#: statistics say.
HASH_JOINS = sql.SQL("SELECT set_config('enable_nestloop', 'off', true)")

#: Whether a matched table is still there (to tell a dropped tenant from a broken target).
_EXISTS = sql.SQL("SELECT pg_catalog.to_regclass(%s) IS NOT NULL")


class PatternTargets:
    """The pattern targets of one worker's config, each with the pool of its database."""

    def __init__(
        self, specs: list[tuple[TargetSpec, Any]], build: Callable[[TargetSpec, Any], PurgeTarget]
    ) -> None:
        self._specs = {spec.name: (spec, pool) for spec, pool in specs if spec.pattern}
        self._build = build
        self._built: dict[str, PurgeTarget] = {}

    @property
    def names(self) -> list[str]:
        return sorted(self._specs)

    def is_pattern(self, name: str) -> bool:
        return name in self._specs

    def resolve(self, name: str) -> PurgeTarget | None:
        """The target of the match `name`, or None when `name` is no match of a pattern here
        (BadPurgeTarget as `_match`).
        Built once per worker: its table's plan caches survive from pass to pass."""
        found = self._built.get(name)
        if found is not None:
            return found
        match = self._match(name)
        if match is None:
            return None
        target = self._build(*match)
        self._built[name] = target
        return target

    def _match(self, name: str) -> tuple[TargetSpec, Any] | None:
        """The config entry of the match `name` (its tables filled in) and its pool, or None
        when `name` is no match of a pattern here; BadPurgeTarget where a table filled in from
        its stars would be longer than PostgreSQL keeps (`_refuse_long_companions`)."""
        entry = self._specs.get(name.rpartition("@")[0])
        matched = entry[0].matched(name) if entry else None
        if matched is None or entry is None:
            return None
        _refuse_long_companions(name, matched)
        return matched, entry[1]

    def _pattern(self, name: str) -> tuple[TargetSpec, TablePattern, Any]:
        entry = self._specs.get(name)
        if entry is None:
            raise BadPurgeTarget(
                f"no table pattern named {name!r} on this worker; it has: "
                f"{', '.join(self.names) or 'none'}"
            )
        spec, pool = entry
        assert spec.pattern is not None
        return spec, spec.pattern, pool

    async def expand(self, step: PatternStep) -> PatternPage:
        """One page of the matches of pattern target `step.name`, sorted by name."""
        spec, pattern, pool = self._pattern(step.name)
        by_schema = pattern.name.schema is not None
        query, params = candidates(pattern, step)
        async with pool.connection() as conn:
            # One round trip: pipelined up to one Sync, the setting and the read are one
            # implicit transaction, the setting local to it.
            async with settled_pipeline(conn):
                await conn.execute(HASH_JOINS)
                cur = await conn.execute(query, params)
            rows = await cur.fetchall()
        more = len(rows) > min(step.limit, EXPAND_PAGE)
        rows = rows[: min(step.limit, EXPAND_PAGE)]
        matches, small = [], []
        for schema, table, is_small in rows:
            # A second check in Python of what the catalog matched (and never a system schema).
            match = pattern.match(schema if by_schema else None, table)
            if match is None:
                continue
            matches.append(f"{spec.name}@{pattern.suffix(match)}")
            small.append(bool(is_small))
        last = [rows[-1][0], rows[-1][1]] if rows else []
        return PatternPage(name=step.name, matches=matches, last=last, more=more, small=small)

    async def gone(self, name: str) -> bool:
        """Whether `name` is a match of a pattern here whose table has been dropped since."""
        try:
            match = self._match(name)
        except BadPurgeTarget:
            return False  # refused as it is, dropped or not: the refusal stands
        if match is None:
            return False
        matched, pool = match
        table = matched.tables[0]
        qualified = sql.Identifier(*([table.schema] if table.schema else []), table.table)
        async with pool.connection() as conn:
            row = await (await conn.execute(_EXISTS, (qualified.as_string(conn),))).fetchone()
        return row is not None and not row[0]


def candidates(pattern: TablePattern, step: PatternStep) -> tuple[sql.Composed, dict[str, Any]]:
    """The catalog read of one page of `pattern`'s matches after `step.after`, and its
    parameters (run with HASH_JOINS set: see there)."""
    by_schema = pattern.name.schema is not None
    params: dict[str, Any] = {
        "table_re": pattern.table_regex,
        "schema_re": pattern.schema_regex,
        "limit": min(step.limit, EXPAND_PAGE) + 1,
        "small_pages": SMALL_PAGES,
    }
    if by_schema:
        where_schema = sql.SQL("n.nspname ~ %(schema_re)s")
        order = sql.SQL("n.nspname, c.relname")
        outer_order = sql.SQL("m.nspname, m.relname")
    else:
        # Unqualified: the tables the search path finds, as an unqualified name would.
        where_schema = sql.SQL("pg_catalog.pg_table_is_visible(c.oid)")
        order = sql.SQL("c.relname")
        outer_order = sql.SQL("m.relname")
    after = sql.SQL("true")
    if step.after:
        # `name` sorts in "C" order: the keyset continues exactly where the page ended.
        if by_schema:
            after = sql.SQL("(n.nspname, c.relname) > (%(after_schema)s, %(after_table)s)")
            params["after_schema"], params["after_table"] = step.after[0], step.after[-1]
        else:
            after = sql.SQL("c.relname > %(after_table)s")
            params["after_table"] = step.after[-1]
    query = _CANDIDATES.format(
        where_schema=where_schema, after=after, order=order, outer_order=outer_order
    )
    return query, params


#: PostgreSQL's longest name, in bytes: a longer one is cut to it (NAMEDATALEN - 1).
LONGEST_NAME = 63


def _refuse_long_companions(name: str, matched: TargetSpec) -> None:
    """BadPurgeTarget when a table the match fills in from the pattern's stars (its archive, a
    second table, `age_from`'s) has a part longer than PostgreSQL keeps: the server would cut
    it, and two matches whose names differ only past the cut would share one table (two
    tenants' rows in one archive). Refused with nothing moved; the other matches sweep."""
    filled = [*matched.tables[1:], *(a for a in matched.archives if a), matched.age_from]
    for table in filled:
        if table is None:
            continue
        for part in (table.schema, table.table):
            if part is not None and len(part.encode()) > LONGEST_NAME:
                raise BadPurgeTarget(
                    f"target {name!r}: {part!r}, filled in from the pattern's match, is "
                    f"{len(part.encode())} bytes, past the {LONGEST_NAME} PostgreSQL keeps: "
                    "matches whose names differ only past that would share one table; give "
                    "it fewer characters of its own"
                )
