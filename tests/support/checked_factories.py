"""Factories of `kind = "python"` entries as `pg-purge check` finds them: one whose target
cannot count (no dry run), one that raises, one that returns what is not a target. None of
their targets' code may run in a check: each method says so by raising."""

from __future__ import annotations


class Uncounted:
    name = "no_count"

    async def purge_expired(self, now_ms: int) -> int:
        raise AssertionError("check ran a target's purge_expired")


def uncounted() -> list[Uncounted]:
    return [Uncounted()]


def raising() -> list[object]:
    raise RuntimeError("the application's store is not built")


def stray() -> list[object]:
    return ["tmp_uploads"]
