"""purge_ops/discover_render.py without a server: what a family's comment says of its figures."""

from __future__ import annotations

from purge_ops.discover import Discovery, Family, Finding
from purge_ops.discover_render import as_toml


def member(table: str, rows: int, expired: int | None) -> Finding:
    return Finding(
        source="expiring",
        schema=table.split(".")[0],
        table=table.split(".")[1],
        column="expires_at",
        column_type="timestamp with time zone",
        max_age="0s",
        rows=rows,
        expired=expired,
        estimated=expired is None,
        unread="the count ran past 5 s" if expired is None else "",
    )


def family_text(members: list[Finding]) -> str:
    """The printed config of one family of `members`, its comments' lines joined."""
    family = Family("tenant_*.sessions", tuple(members))
    found = Discovery(
        database="postgresql://app@db/app",
        now_ms=1_700_000_000_000,
        user="app",
        families=(family,),
        names={family.key: "sessions"},
    )
    return " ".join(ln.lstrip("#").strip() for ln in as_toml(found, found.database).splitlines())


def test_a_family_counted_whole_says_how_many_would_go() -> None:
    members = [member(f"tenant_{i}.sessions", 10, 4) for i in range(3)]
    assert "Rows: 30 in all; would go now: 12. " in family_text(members)


def test_a_family_with_tables_not_counted_gives_a_floor_and_names_them() -> None:
    """A member whose count ran out of time (the largest, most likely) or that the role may not
    read adds nothing to the sum: the figure says it is a floor, naming what it left out."""
    members = [member(f"tenant_{i}.sessions", 10, 4) for i in range(2)]
    members += [member(f"tenant_{i}.sessions", 1000, None) for i in range(2, 6)]
    assert (
        "Rows: ~4,020 in all; would go now: at least 8 (4 of 6 not counted: "
        "tenant_2.sessions, tenant_3.sessions, tenant_4.sessions and 1 more). "
    ) in family_text(members)
