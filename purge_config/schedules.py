"""When passes fire: the single `[schedule]` (every target, one cron), or `[schedules.NAME]`
tables, each its own Temporal schedule over the targets it names, so a table that fills in
minutes and one swept daily need not share a cron (docs/operating.md#schedule)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from purge_config.errors import ConfigError
from purge_config.names import QUEUE_NAME, STEP_NAME
from purge_config.values import (
    HOUR_MS,
    cron_fires,
    cron_ok,
    default_catchup_ms,
    no_unknown,
    opt_str,
    quoted,
    read_duration,
)

DEFAULT_SCHEDULE_ID = "purge-hourly"
DEFAULT_CRON = "23 * * * *"
DEFAULT_TIME_ZONE = "UTC"
#: Spread fire times a little, so deployments sharing a cluster or a database do not all start
#: at :23:00 sharp.
DEFAULT_JITTER_MS = 30_000
#: Temporal refuses a catch-up window under 10 s.
MIN_CATCHUP_MS = 10_000

_KEYS = frozenset({"id", "cron", "time_zone", "catchup_window", "jitter", "ensure"})
_NAMED_KEYS = _KEYS | {"targets"}


@dataclass(frozen=True)
class ScheduleConfig:
    """The `[schedule]` table, or one `[schedules.NAME]` table."""

    id: str = DEFAULT_SCHEDULE_ID
    cron: str = DEFAULT_CRON
    time_zone: str = DEFAULT_TIME_ZONE
    catchup_window_ms: int = HOUR_MS
    """How late a missed pass may still run after an outage: about one period, so at most one."""
    jitter_ms: int = DEFAULT_JITTER_MS
    ensure: bool = False
    """Whether `run` creates or updates the schedule at start."""
    name: str = ""
    """The NAME of `[schedules.NAME]`; empty for the single `[schedule]`."""
    targets: tuple[str, ...] = ()
    """The target names its passes sweep, in the config's order; empty: every target."""


#: The zones every Temporal server knows, checked against no zone file: the default, on a host
#: with no time zone database (a slim container image), must not stop a worker's start.
ALWAYS_ZONES = frozenset({"UTC", "Etc/UTC"})


def parse_schedule(where: str, raw: object) -> ScheduleConfig:
    """The single `[schedule]`: every target on one cron."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: schedule: must be a [schedule] table, got {quoted(raw)}")
    no_unknown(where, "schedule.", raw, _KEYS)
    return _parse_one(where, "schedule", raw, DEFAULT_SCHEDULE_ID)


def parse_schedules(where: str, raw: object) -> tuple[ScheduleConfig, ...]:
    """`[schedules.NAME]` tables, each with its cron and the targets it sweeps (checked
    against the config's targets by `check_membership`)."""
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{where}: schedules: must be [schedules.NAME] tables, got {quoted(raw)}")
    found: list[ScheduleConfig] = []
    for name, entry in raw.items():
        at = f"schedules.{name}" if name.isprintable() else f"schedules.{quoted(name)}"
        if not STEP_NAME.fullmatch(name):
            raise ConfigError(
                f"{where}: {at}: not a schedule name (letters, digits and _ . : @ -, starting "
                "with a letter, digit or _)"
            )
        if not isinstance(entry, dict):
            raise ConfigError(
                f"{where}: {at}: must be a table with cron and targets, got {quoted(entry)}"
            )
        no_unknown(where, f"{at}.", entry, _NAMED_KEYS)
        targets = entry.get("targets")
        if (
            not isinstance(targets, list)
            or not targets
            or not all(isinstance(t, str) for t in targets)
        ):
            raise ConfigError(
                f"{where}: {at}.targets: want a list of target names, got {quoted(targets)}"
            )
        spec = _parse_one(where, at, entry, f"purge-{name}")
        found.append(replace(spec, name=name, targets=tuple(targets)))
    ids = [s.id for s in found]
    for spec in found:
        if ids.count(spec.id) > 1:
            raise ConfigError(
                f"{where}: schedules.{spec.name}.id: {quoted(spec.id)} is the id of another "
                "schedule too"
            )
    return tuple(found)


def check_membership(
    where: str, schedules: Sequence[ScheduleConfig], names: Sequence[str]
) -> tuple[ScheduleConfig, ...]:
    """Each named schedule with its targets in the config's order, after refusing a name that
    is no target, a target in two schedules, and a target in none."""
    owner: dict[str, str] = {}
    for spec in schedules:
        for target in spec.targets:
            if target not in names:
                raise ConfigError(
                    f"{where}: schedules.{spec.name}.targets: {quoted(target)} is not a target "
                    "of this config"
                )
            if target in owner and owner[target] != spec.name:
                raise ConfigError(
                    f"{where}: schedules.{spec.name}.targets: {quoted(target)} is in schedules."
                    f"{owner[target]} too; a target belongs to one schedule"
                )
            owner[target] = spec.name
    for name in names:
        if name not in owner:
            raise ConfigError(
                f"{where}: targets: {quoted(name)} is in no schedule; with [schedules.NAME] every "
                "target is in exactly one (its targets list)"
            )
    return tuple(
        replace(s, targets=tuple(n for n in names if owner[n] == s.name)) for s in schedules
    )


def _parse_one(where: str, at: str, raw: Mapping[str, Any], default_id: str) -> ScheduleConfig:
    cron = opt_str(where, f"{at}.cron", raw, "cron") or DEFAULT_CRON
    if not cron_ok(cron):
        raise ConfigError(
            f"{where}: {at}.cron: want five cron fields (minute hour day month weekday) "
            f"like '23 * * * *', got {quoted(cron)}"
        )
    if not cron_fires(cron):
        raise ConfigError(
            f"{where}: {at}.cron: {quoted(cron)} never fires: no date matches its day, month and "
            "weekday at once (Temporal's server asks all three), so no pass would ever start"
        )
    ensure = raw.get("ensure", False)
    if not isinstance(ensure, bool):
        raise ConfigError(f"{where}: {at}.ensure: must be true or false, got {quoted(ensure)}")
    spec = ScheduleConfig(
        id=opt_str(where, f"{at}.id", raw, "id") or default_id,
        cron=cron,
        time_zone=opt_str(where, f"{at}.time_zone", raw, "time_zone") or DEFAULT_TIME_ZONE,
        catchup_window_ms=read_duration(where, f"{at}.catchup_window", raw, "catchup_window")
        if "catchup_window" in raw
        else default_catchup_ms(cron),
        jitter_ms=read_duration(where, f"{at}.jitter", raw, "jitter")
        if "jitter" in raw
        else DEFAULT_JITTER_MS,
        ensure=ensure,
    )
    _check(where, at, raw, spec)
    return spec


def _check(where: str, at: str, raw: Mapping[str, Any], spec: ScheduleConfig) -> None:
    """The bounds Temporal (or a pass's timeliness) sets on a schedule's values."""
    if spec.catchup_window_ms < MIN_CATCHUP_MS:
        raise ConfigError(
            f"{where}: {at}.catchup_window: at least 10s (Temporal's minimum), "
            f"got {quoted(raw['catchup_window'])}"
        )
    if spec.jitter_ms > HOUR_MS:
        raise ConfigError(
            f"{where}: {at}.jitter: at most 1h, so a pass stays near its time, "
            f"got {quoted(raw['jitter'])}"
        )
    if not QUEUE_NAME.fullmatch(spec.id):
        # A name may hold what an id may not (@): the default id, purge- and the name, then fails.
        given = "" if "id" in raw else " (purge- and the schedule's name: give it an id)"
        raise ConfigError(
            f"{where}: {at}.id: not a schedule id (letters, digits and _ . : / -), "
            f"got {quoted(spec.id)}{given}"
        )
    if spec.time_zone in ALWAYS_ZONES:
        return  # Temporal's server knows it, whatever this machine's zone files
    try:
        ZoneInfo(spec.time_zone)
    except (ZoneInfoNotFoundError, ValueError):
        if not available_timezones():
            # A slim container image without zone files (and no tzdata package): the zone may
            # be right; this machine cannot tell.
            raise ConfigError(
                f"{where}: {at}.time_zone: {quoted(spec.time_zone)} cannot be checked: this "
                "machine has no time zone database (install its tzdata, or `pip install tzdata`), "
                "or "
                'use "UTC"'
            ) from None
        raise ConfigError(
            f"{where}: {at}.time_zone: not an IANA time zone, got {quoted(spec.time_zone)}"
        ) from None
