"""Every metric the package records, declared once: its name, description, unit and kind.

The activity, the workflow and the worker's interceptor each record some of them, and the
deployed alert rules and dashboard read them by name (docs/operating.md lists them): one
declaration each, so two layers adding to one series cannot describe it two ways. Pure data
(temporalio's types only for mypy), so workflow code imports it inside its sandbox.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from temporalio.common import (
        MetricCounter,
        MetricGauge,
        MetricGaugeFloat,
        MetricHistogramFloat,
        MetricMeter,
    )


@dataclass(frozen=True)
class Instrument:
    """One metric as a meter creates it; the subclass is its kind."""

    name: str
    description: str
    unit: str | None = None
    #: Its kind, as Prometheus's `# TYPE` line and docs/operating.md's table name it.
    kind: ClassVar[str]


@dataclass(frozen=True)
class Counter(Instrument):
    kind: ClassVar[str] = "counter"

    def on(self, meter: MetricMeter) -> MetricCounter:
        return meter.create_counter(self.name, self.description, self.unit)


@dataclass(frozen=True)
class Gauge(Instrument):
    kind: ClassVar[str] = "gauge"

    def on(self, meter: MetricMeter) -> MetricGauge:
        return meter.create_gauge(self.name, self.description, self.unit)


@dataclass(frozen=True)
class GaugeFloat(Instrument):
    kind: ClassVar[str] = "gauge"

    def on(self, meter: MetricMeter) -> MetricGaugeFloat:
        return meter.create_gauge_float(self.name, self.description, self.unit)


@dataclass(frozen=True)
class HistogramFloat(Instrument):
    kind: ClassVar[str] = "histogram"

    def on(self, meter: MetricMeter) -> MetricHistogramFloat:
        return meter.create_histogram_float(self.name, self.description, self.unit)


# -- each target's sweep (the activity; label `target`) ---------------------------------------

ROWS_REMOVED = Counter("purge_rows_removed", "rows deleted by retention sweeps", "rows")
TARGET_SECONDS = HistogramFloat("purge_target_seconds", "wall time of one target's sweep", "s")
BACKLOG_ROWS = Gauge("purge_backlog_rows", "expired rows left after the last sweep", "rows")
OLDEST_EXPIRED_AGE = GaugeFloat(
    "purge_oldest_expired_age_seconds",
    "how long the oldest expired row left after the last sweep has been expired",
    "s",
)
PAUSED_SECONDS = Counter(
    "purge_paused_seconds", "time sweeps waited for replicas or the WAL rate", "s"
)
PARTITIONS_REMOVED = Counter(
    "purge_partitions_removed",
    "partitions dropped or detached whole by retention sweeps",
    "partitions",
)
# The worker's interceptor sets these two after a sweep that ran.
LAST_SWEEP_TIMESTAMP = GaugeFloat(
    "purge_target_last_sweep_timestamp_seconds",
    "when this worker last finished a sweep of the target (Unix time)",
    "s",
)
BATCH_P95 = GaugeFloat(
    "purge_batch_p95_seconds", "95th percentile of the last sweep's batch durations", "s"
)

# -- each pass (the workflow and the worker's interceptor) -------------------------------------

#: Added to by the workflow per failed target, started at 0 by the interceptor.
TARGET_FAILURES = Counter("purge_target_failures", "targets that failed a pass after their retries")
PASSES_COMPLETED = Counter(
    "purge_passes_completed", "Purge passes that completed (every target swept)"
)
PASSES_FAILED = Counter("purge_passes_failed", "Purge passes that failed (a target or the input)")
PASSES_SKIPPING = Counter(
    "purge_passes_skipping",
    "Purge passes that ended with targets skipped (their budget spent before those started)",
)
PASSES_WHOLE = Counter(
    "purge_passes_whole", "Purge passes (not dry runs) that ended with no target skipped"
)
PASS_SECONDS = HistogramFloat("purge_pass_seconds", "a Purge pass from its start to its end", "s")

#: Every instrument above, for the tests that hold the served page and the docs to them.
ALL: tuple[Instrument, ...] = (
    ROWS_REMOVED,
    TARGET_SECONDS,
    BACKLOG_ROWS,
    OLDEST_EXPIRED_AGE,
    PAUSED_SECONDS,
    PARTITIONS_REMOVED,
    LAST_SWEEP_TIMESTAMP,
    BATCH_P95,
    TARGET_FAILURES,
    PASSES_COMPLETED,
    PASSES_FAILED,
    PASSES_SKIPPING,
    PASSES_WHOLE,
    PASS_SECONDS,
)
