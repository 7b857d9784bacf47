"""The moment a statement's error in a pipeline meets a read that finds the rest not yet there.

Once in CI psycopg's pipeline exit failed with "cannot exit pipeline mode while busy" in place of
the statement's error; as far as its code shows, its exit reads the results the server owes
until a read finds none waiting, so one that arrives after that read is left (see
activities.engine.pipelines). `LateResults` makes that moment happen on any machine: the read
after a statement's error finds nothing, once per error, as if the rest were late.
"""

from __future__ import annotations

from typing import Any

import pytest
from psycopg import _pipeline_base, generators, pq
from psycopg.abc import PQGen


class LateResults:
    """psycopg's pipeline reads, with the one after each statement error finding nothing."""

    def __init__(self) -> None:
        self.late = 0
        """Reads made to find nothing after a statement's error."""
        self._owed = False

    def fetch_many(self, pgconn: Any) -> PQGen[list[Any]]:
        if self._owed:
            self._owed = False
            self.late += 1
            return []
        results = yield from generators.fetch_many(pgconn)
        self._owed = any(r.status == pq.ExecStatus.FATAL_ERROR for r in results)
        return results


def results_late(monkeypatch: pytest.MonkeyPatch) -> LateResults:
    """From now on, every pipeline's read after a statement's error finds the rest late
    (`LateResults`)."""
    late = LateResults()
    monkeypatch.setattr(_pipeline_base, "fetch_many", late.fetch_many)
    return late
