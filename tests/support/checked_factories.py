"""Factories of `kind = "python"` entries as `pg-purge check` finds them: one whose target
cannot count (no dry run), one that raises, one that returns what is not a target, one that
gives a name twice, one that gives a name an entry of the config has. None of their targets'
code may run in a check: each method says so by raising."""

from __future__ import annotations


class Named:
    """A target with a name and purge_expired alone (no count_expired)."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def purge_expired(self, now_ms: int) -> int:
        raise AssertionError("check ran a target's purge_expired")


def uncounted() -> list[Named]:
    return [Named("no_count")]


def raising() -> list[object]:
    raise RuntimeError("the application's store is not built")


def stray() -> list[object]:
    return ["tmp_uploads"]


def doubled() -> list[Named]:
    return [Named("dup"), Named("dup")]


def shadowing() -> list[Named]:
    return [Named("own_rows"), Named("tokens")]  # tokens: the config's expiring entry too
