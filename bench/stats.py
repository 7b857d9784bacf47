"""What one measured form produced, and the arithmetic over its statement times."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..1): a value that was really observed, never interpolated.

    With one statement, p50, p99 and max are all that statement, which is the honest answer.
    """
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


@dataclass
class FormRun:
    """What a form reports about itself: rows it removed and how long each statement took."""

    removed: int
    seconds: float
    statement_ms: list[float]
    notes: dict[str, object] = field(default_factory=dict)
    """Form-specific facts for the report: our sweep's strategy, batches, backlog."""


@dataclass
class WriterRun:
    """What the concurrent single-row writer saw while one form ran."""

    latencies_ms: list[float]
    """Each upsert's statement time, for upserts sent while the form ran."""
    late_ms: list[float]
    """Each upsert's completion measured from when it was due at the fixed rate."""
    renewed: list[str]
    """Every key the writer moved into the future (each must still exist after the form)."""
    errors: int
    wal_bytes: int | None
    """WAL the writer's own backend generated, when the server can say (PostgreSQL 18+)."""


@dataclass
class FormResult:
    """One row of the report: one form on one copy of one dataset."""

    case: str
    dataset: str
    form: str
    rows: int
    expired: int
    removed: int
    left: int
    """Rows still expired at now_ms after the form: anything but 0 is unfinished work."""
    seconds: float
    ratio: float | None
    """seconds / seconds of the single DELETE on the same dataset, in the same run."""
    statements: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    wal_bytes: int
    """WAL of the form alone: the LSN distance over the form minus the writer's own WAL."""
    wal_total_bytes: int
    writer_wal_bytes: int | None
    writer_ops: int
    writer_errors: int
    writer_p50_ms: float | None
    writer_p99_ms: float | None
    writer_max_ms: float | None
    writer_late_p99_ms: float | None
    """p99 measured from each upsert's due time: what an application at that rate sees."""
    renewed: int
    renewed_lost: int
    notes: dict[str, object] = field(default_factory=dict)
    statement_ms: list[float] = field(default_factory=list, repr=False)
    seconds_all: list[float] = field(default_factory=list)
    """Every repeat's total, when the form ran more than once; this row is the median one."""


def median_of(runs: Sequence[FormResult]) -> FormResult:
    """The run with the median total (the lower one of an even count), carrying every repeat's
    total, and the renewed and lost rows summed over all of them: one loss in any run counts."""
    ordered = sorted(runs, key=lambda r: r.seconds)
    # A copy: the runs themselves stay as measured for the JSON.
    chosen = replace(ordered[(len(ordered) - 1) // 2])
    chosen.seconds_all = [r.seconds for r in runs]
    chosen.renewed = sum(r.renewed for r in runs)
    chosen.renewed_lost = sum(r.renewed_lost for r in runs)
    chosen.left = max(r.left for r in runs)
    return chosen


def summarize(
    case: str,
    dataset: str,
    form: str,
    rows: int,
    expired: int,
    run: FormRun,
    writer: WriterRun,
    *,
    left: int,
    lost: int,
    wal_total: int,
) -> FormResult:
    """Fold a form's run, its writer's run and the after-checks into one report row."""
    writer_wal = writer.wal_bytes
    return FormResult(
        case=case,
        dataset=dataset,
        form=form,
        rows=rows,
        expired=expired,
        removed=run.removed,
        left=left,
        seconds=run.seconds,
        ratio=None,
        statements=len(run.statement_ms),
        p50_ms=percentile(run.statement_ms, 0.50),
        p99_ms=percentile(run.statement_ms, 0.99),
        max_ms=max(run.statement_ms, default=None),
        wal_bytes=wal_total - (writer_wal or 0),
        wal_total_bytes=wal_total,
        writer_wal_bytes=writer_wal,
        writer_ops=len(writer.latencies_ms),
        writer_errors=writer.errors,
        writer_p50_ms=percentile(writer.latencies_ms, 0.50),
        writer_p99_ms=percentile(writer.latencies_ms, 0.99),
        writer_max_ms=max(writer.latencies_ms, default=None),
        writer_late_p99_ms=percentile(writer.late_ms, 0.99),
        renewed=len(set(writer.renewed)),
        renewed_lost=lost,
        notes=run.notes,
        statement_ms=run.statement_ms,
    )
