"""Reading and checking single config values: keys of a TOML table, durations, crons.

Every refusal is a ConfigError whose message names where (file and key) and the value."""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from purge_config.errors import ConfigError, did_you_mean

HOUR_MS = 3_600_000

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_AGE_PART = re.compile(r"([0-9]+)(ms|s|m|h|d|w)")
#: A century: far beyond any retention period, and small enough that no instant overflows.
MAX_AGE_LIMIT_MS = 36_525 * 86_400_000

_CRON_NUMBER = re.compile(r"[0-9]{1,4}")
_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august",
           "september", "october", "november", "december")  # fmt: skip
_WEEKDAYS = ("sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday")
#: The five cron fields as Temporal's server reads them: lowest and highest value, and the names
#: it takes for a value (a prefix of at least 3 letters of a month, 2 of a weekday). It has no
#: `L`, `W`, `#` or `?`: a cron it would refuse is refused here, before anything starts.
_CRON_FIELDS: tuple[tuple[int, int, tuple[str, ...], int], ...] = (
    (0, 59, (), 0),
    (0, 23, (), 0),
    (1, 31, (), 0),
    (1, 12, _MONTHS, 3),
    (0, 7, _WEEKDAYS, 2),
)


_Choice = TypeVar("_Choice", bound=str)


def one_of(value: object, choices: tuple[_Choice, ...]) -> _Choice | None:
    """`value` as the member of the closed set `choices` it equals, else None: how a string read
    from the file becomes one of a `Literal`'s values, checked once, at the config's edge."""
    return next((choice for choice in choices if choice == value), None)


def parse_duration(text: str) -> int:
    """Any duration of the config (`max_age`, timeouts, budgets, jitter): `"30d"`, `"1h30m"`,
    `"0s"` to milliseconds; ConfigError (without the key) otherwise."""
    pos, total, seen = 0, 0, set()
    # Each part is matched where the last one ended: a search (finditer) would rescan a long
    # run of digits from every position in it, quadratic in the length of the value.
    while match := _AGE_PART.match(text, pos):
        unit = match.group(2)
        if unit in seen:
            raise ConfigError(f"unit {quoted(unit)} appears twice in {quoted(text)}")
        seen.add(unit)
        # More than 20 significant digits is past the century anyway, and int() raises a
        # ValueError (not a ConfigError, so a traceback) on a string of over 4300 digits.
        digits = match.group(1).lstrip("0") or "0"
        if len(digits) > 20:
            raise ConfigError(f"{quoted(text)} is longer than 100 years")
        total += int(digits) * _UNITS_MS[unit]
        pos = match.end()
    if not text or pos != len(text):
        raise ConfigError(
            f"not a duration, got {quoted(text)}; want a number and a unit (ms s m h d w), "
            "or several: '30d', '1h30m', '0s'"
        )
    if total > MAX_AGE_LIMIT_MS:
        raise ConfigError(f"{quoted(text)} is longer than 100 years")
    return total


def duration_text(ms: int) -> str:
    """Milliseconds as the config would write them: `90s`, `5m`, `250ms`, `2h`, `1d`."""
    if ms == 0:
        return "0m"
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def default_catchup_ms(cron: str) -> int:
    """About one period of `cron`: a day for a daily schedule, else an hour (the default
    schedule is hourly; a finer cron with an hour's window still runs at most one late pass,
    since the schedule skips overlaps)."""
    minute, hour, day, month, weekday = cron.split()
    fixed = all(part.isdigit() for part in (minute, hour))
    if fixed and day == month == weekday == "*":
        return 24 * HOUR_MS
    return HOUR_MS


def cron_ok(cron: str) -> bool:
    """Five fields, each a comma list of `*`, `n` or `n-m`, each optionally `/step`, in range."""
    fields = cron.split()
    return len(fields) == 5 and all(
        _cron_field_ok(text, *spec) for text, spec in zip(fields, _CRON_FIELDS, strict=True)
    )


def _cron_field_ok(text: str, low: int, high: int, names: tuple[str, ...], shortest: int) -> bool:
    for part in text.split(","):
        span, slash, step = part.partition("/")
        if slash and not (_CRON_NUMBER.fullmatch(step) and int(step) >= 1):
            return False
        if span == "*":
            continue
        first, dash, last = span.partition("-")
        start = _cron_value(first, low, high, names, shortest)
        end = _cron_value(last, low, high, names, shortest) if dash else start
        if start is None or end is None or end < start:
            return False
    return True


def _cron_value(
    text: str, low: int, high: int, names: tuple[str, ...], shortest: int
) -> int | None:
    if _CRON_NUMBER.fullmatch(text):
        value = int(text)
    elif names and len(text) >= shortest:
        lowered = text.lower()
        value = next((low + i for i, name in enumerate(names) if name.startswith(lowered)), -1)
    else:
        return None
    return value if low <= value <= high else None


def read_duration(where: str, key: str, raw: Mapping[str, Any], field_name: str) -> int:
    """The duration at `raw[field_name]`, in ms; a ConfigError naming `where` and `key`."""
    value = raw[field_name]
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {key}: must be a string like '30d', got {quoted(value)}")
    try:
        return parse_duration(value)
    except ConfigError as err:
        raise ConfigError(f"{where}: {key}: {err}") from None


def no_unknown(where: str, prefix: str, raw: Mapping[str, Any], allowed: frozenset[str]) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        # A quoted TOML key may hold a newline; shown as written it would split the line.
        key = unknown[0] if unknown[0].isprintable() else repr(unknown[0])
        hint = did_you_mean(unknown[0], allowed)
        raise ConfigError(
            f"{where}: {prefix}{key}: unknown key{hint}; allowed here: {', '.join(sorted(allowed))}"
        )


def opt_str(
    where: str,
    key: str,
    raw: Mapping[str, Any],
    field_name: str | None = None,
    secret: bool = False,
) -> str | None:
    """The key's string, None when absent. With `secret` (a connection string, which may hold
    a password), a refusal names the value's type, never the value."""
    value = raw.get(field_name or key.rsplit(".", 1)[-1])
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        # A number, a boolean or nothing holds no secret; a string or a value holding one may.
        harmless = isinstance(value, bool | int | float) or value == ""
        got = repr(value) if harmless or not secret else type_of(value)
        raise ConfigError(f"{where}: {key}: must be a non-empty string, got {got}")
    return value


def shown(text: str) -> str:
    """`text` as a message shows it: quoted where it holds what would break the line (a
    newline, a control character)."""
    return text if text.isprintable() else repr(text)


#: What a connection string, or a piece of one, holds where it may hold a secret: a URL's `://`
#: (its user info may hold a password, in forms no pattern could end rightly: raw `@`, quotes,
#: spaces, `/`), or a keyword of libpq's secrets (`dsn.SECRET_KEYS`; `sslpassword` and
#: `pgpassword` included).
_SECRET_HINT = re.compile(
    r"://|password|oauth_client_secret|scram_client_key|scram_server_key", re.I
)


def masked(text: str) -> str:
    """`text` as an error quotes a value typed by hand, but where it may hold a connection
    string's secret (one pasted into the wrong field): then only its length, so that an error
    (and the log, stderr or history it is written to) never repeats a password. A value of the
    right shape is never quoted: only the wrong ones, where the shape matters less than what
    they may hold."""
    if _SECRET_HINT.search(text) is None:
        return text
    return hidden(text)


def hidden(text: str) -> str:
    """What a message says of `text` where it may hold a password: its length alone."""
    return f"<{len(text)} characters not shown: may hold a password>"


def quoted(value: object) -> str:
    """`value`'s repr as a refusal quotes it, `masked`."""
    return masked(repr(value))


def type_of(value: object) -> str:
    """What a TOML value is, by its type alone: for a refusal that must not quote it."""
    if isinstance(value, str):
        return "an empty string" if not value else "a string"
    names = {bool: "a boolean", int: "an integer", float: "a float", list: "an array",
             dict: "a table"}  # fmt: skip
    for kind, name in names.items():
        if isinstance(value, kind):
            return name
    return f"a {type(value).__name__}"


def req_str(where: str, key: str, raw: Mapping[str, Any]) -> str:
    value = opt_str(where, key, raw)
    if value is None:
        raise ConfigError(f"{where}: {key}: missing")
    return value


def cron_period_ms(cron: str) -> int | None:
    """The shortest time between two fire times of `cron` (a valid one), found by walking five
    weeks of minutes; None when it fires less than twice in them (a monthly or yearly cron)."""
    fields = _cron_fields(cron)
    minutes, hours = fields[0], fields[1]
    fires: list[int] = []
    for day in range(35):
        if _fires_on(fields, _START + timedelta(days=day)):
            fires += [day * 1440 + h * 60 + m for h in sorted(hours) for m in sorted(minutes)]
    if len(fires) < 2:
        return None
    return min(b - a for a, b in itertools.pairwise(fires)) * 60_000


def cron_fires(cron: str) -> bool:
    """Whether `cron` (a valid one) ever fires: a day no month has (`0 0 31 2 *`), or a date
    that never falls on the weekday asked for, passes every field's own range check, and
    Temporal's server takes it and never fires. 28 years of days hold every date on every
    weekday, February 29 among them (the century's leap years have no exception before 2100)."""
    fields = _cron_fields(cron)
    return any(_fires_on(fields, _START + timedelta(days=day)) for day in range(28 * 366))


def _cron_fields(cron: str) -> list[set[int]]:
    """The values each of a (valid) cron's five fields takes, its weekdays 0-6 (7 is Sunday,
    as 0 is)."""
    fields = [
        _cron_values(text, *spec) for text, spec in zip(cron.split(), _CRON_FIELDS, strict=True)
    ]
    fields[4] = {d % 7 for d in fields[4]}
    return fields


#: Where the walks over a cron's days begin: a Monday, in a leap year.
_START = datetime(2024, 1, 1, tzinfo=UTC)


def _fires_on(fields: list[set[int]], date: datetime) -> bool:
    """Whether a cron of `fields`' values (`_cron_fields`) fires on `date`'s day. As Temporal's
    server reads it: the day of the month and the weekday must both match (Vixie cron fires
    when either does, with both restricted; Temporal's `0 0 13 * 5` fires only on a Friday the
    13th)."""
    _, _, days, months, weekdays = fields
    return date.month in months and date.day in days and date.isoweekday() % 7 in weekdays


def _cron_values(text: str, low: int, high: int, names: tuple[str, ...], shortest: int) -> set[int]:
    values: set[int] = set()
    for part in text.split(","):
        span, _, step = part.partition("/")
        if span == "*":
            first, last = low, high
        else:
            a, dash, b = span.partition("-")
            # `is None`, not `or`: a range may start or end at 0 (`0-0`, `sun-sun`).
            start = _cron_value(a, low, high, names, shortest)
            first = low if start is None else start
            end = _cron_value(b, low, high, names, shortest) if dash else first
            last = high if end is None else end
            if step and not dash:
                last = high
        values.update(range(first, last + 1, int(step) if step else 1))
    return values


_RATE = re.compile(r"([0-9]{1,9}(?:\.[0-9]{1,3})?)\s*(B|kB|KB|MB|GB)/s")
_RATE_BYTES = {"B": 1, "kB": 1024, "KB": 1024, "MB": 1024**2, "GB": 1024**3}


def read_rate(where: str, key: str, raw: Mapping[str, Any], field_name: str) -> int:
    """A byte rate like "32MB/s" (B, kB, MB, GB; 1024-based as PostgreSQL's units), in bytes a
    second; a ConfigError naming `where` and `key`."""
    value = raw[field_name]
    match = _RATE.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ConfigError(
            f"{where}: {key}: want a rate like '32MB/s' (B kB MB GB), got {quoted(value)}"
        )
    rate = int(float(match.group(1)) * _RATE_BYTES[match.group(2)])
    if rate < 64 * 1024:
        raise ConfigError(f"{where}: {key}: at least 64kB/s, got {quoted(value)}")
    return rate


def duration_within(
    where: str, key: str, raw: Mapping[str, Any], bounds: tuple[int, int], default: int
) -> int:
    """The duration at `raw[key]` in ms (`default` when absent), or a ConfigError naming
    `key` when it is outside `bounds`."""
    name = key.rpartition(".")[2]
    if name not in raw:
        return default
    value = read_duration(where, key, raw, name)
    low, high = bounds
    if not low <= value <= high:
        raise ConfigError(
            f"{where}: {key}: must be from {duration_text(low)} to {duration_text(high)}, "
            f"got {quoted(raw[name])}"
        )
    return value
