"""The pass's one clock: every target measures expiry against the instant the workflow hands it.

The workflow reads `workflow.now()` once per pass and hands every target the same integer epoch
milliseconds (`epoch_ms`); a target compares against that and never against the database's
`now()`. The activity refuses an instant that cannot be milliseconds (`check_now_ms`). No side
effects: the workflow imports this module.
"""

from __future__ import annotations

from datetime import UTC, datetime

from activities.errors import BadPurgeInput
from activities.shown import shown

#: The instants a pass may run at. A `now_ms` outside them is almost surely seconds or microseconds
#: sent where milliseconds belong, and at microseconds every row on every table looks expired.
EARLIEST_NOW_MS = 946_684_800_000  # 2000-01-01T00:00:00Z
LATEST_NOW_MS = 7_258_118_400_000  # 2200-01-01T00:00:00Z


def epoch_ms(instant: datetime) -> int:
    """Integer epoch milliseconds of an aware datetime, exact (no float on the way)."""
    delta = instant - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def iso_ms(now_ms: int) -> str:
    """A millisecond instant as ISO 8601 UTC, for messages a person reads."""
    return datetime.fromtimestamp(now_ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def check_now_ms(now_ms: object) -> int:
    """Return `now_ms` if it is a plausible epoch-millisecond instant, else raise BadPurgeInput."""
    if isinstance(now_ms, bool) or not isinstance(now_ms, int):
        raise BadPurgeInput(f"now_ms must be an integer of epoch milliseconds, got {shown(now_ms)}")
    if now_ms < EARLIEST_NOW_MS:
        raise BadPurgeInput(
            f"now_ms {now_ms} is before 2000-01-01 ({iso_ms(max(now_ms, 0))}): "
            "seconds sent where milliseconds belong?"
        )
    if now_ms >= LATEST_NOW_MS:
        raise BadPurgeInput(
            f"now_ms {now_ms} is after 2200-01-01: microseconds sent where milliseconds belong?"
        )
    return now_ms
