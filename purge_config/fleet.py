"""The fleet keys: `[databases.NAME]` (where each target's database is) and `[pass]` (how many
targets a pass sweeps at once, and its time budget)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from purge_config.dsn import BadDsn, Misread, parse_dsn, redact
from purge_config.errors import ConfigError
from purge_config.names import QUEUE_NAME
from purge_config.values import (
    duration_text,
    duration_within,
    hidden,
    no_unknown,
    opt_str,
    quoted,
    read_duration,
    shown,
    type_of,
)

#: A database's name in the config, in target keys, in the workflow input and in metric labels.
DATABASE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,62}")
#: An environment variable's name, as a shell or Kubernetes (`-` and `.` too, not a digit first)
#: gives one: what `url_env` holds. Anything else (`:`, `/`, `@`, `=`, a space) may be the
#: connection string itself, pasted there.
VARIABLE_NAME = re.compile(r"[A-Za-z_.-][A-Za-z0-9_.-]*")
#: What a refused `url_env` may show of itself: nothing a password could hide in.
_PLAIN = re.compile(r"[\w .-]*")
#: The name a pass's input gives the default database (`database_url`, and a `python` target's
#: own) when it routes that database's activities: the input's `queues` maps names to task
#: queues, and every version of the workflow reads only names that DATABASE_NAME accepts.
DEFAULT_DATABASE_KEY = "_default"
#: The database `database_url` names; a target without `database` sweeps it.
DEFAULT_DATABASE = ""

#: The most target names one pass input may list (patterns count once): about 400 KB of names,
#: inside Temporal's 512 KB payload warning. More tables than this belong in a pattern.
MAX_TARGETS_PER_PASS = 15_000

DEFAULT_MAX_CONCURRENT = 4
DEFAULT_MAX_PER_DATABASE = 1
DEFAULT_BUDGET_MS = 50 * 60_000
#: A pass this short cannot even schedule its first activities.
MIN_BUDGET_MS = 10_000
#: A pass's budget is at most a day: any longer is a unit mistake (the workflow's input refuses
#: it too, `activities.input_checks`).
MAX_BUDGET_MS = 86_400_000

_DATABASE_KEYS = frozenset({"url", "url_env", "task_queue"})
_PASS_KEYS = frozenset({"max_concurrent", "max_per_database", "budget", "worker_wait"})
#: How long a routed target's activity may wait for a worker of its queue before it fails.
DEFAULT_WORKER_WAIT_MS = 5 * 60_000
WORKER_WAIT_RANGE_MS = (1_000, 86_400_000)


@dataclass(frozen=True)
class PassLimits:
    """`[pass]`: what travels in the workflow input of every pass this config starts."""

    max_concurrent: int = DEFAULT_MAX_CONCURRENT
    """Targets swept at once, over all databases."""
    max_per_database: int = DEFAULT_MAX_PER_DATABASE
    """Targets swept at once on one database."""
    budget_ms: int = DEFAULT_BUDGET_MS
    """The whole pass's time: targets not started by then are reported skipped."""
    worker_wait_ms: int = DEFAULT_WORKER_WAIT_MS
    """How long a target on a database's own task queue waits for a worker of that queue."""


def check_dsn(where: str, key: str, dsn: str) -> None:
    """A ConfigError, never quoting the password, when `dsn` is no connection string."""
    if not dsn.strip():
        # libpq reads it as no setting at all and connects to its defaults (a local socket,
        # the PG* variables): never what a key or a variable set to spaces meant.
        raise ConfigError(f"{where}: {key}: must be a connection string, got an empty or blank one")
    try:
        parse_dsn(dsn)
    except BadDsn as err:
        scheme = _OTHER_SCHEME.match(dsn)
        # Another database's URL (mysql://...): its scheme says what is wrong, and the rest,
        # which libpq cannot parse, is not shown at all.
        got = f"a {scheme.group(1)}:// URL" if scheme else repr(redact(dsn))
        # The reason where it names the fix (it never quotes the string).
        fix = f" ({err})" if isinstance(err, Misread) else ""
        raise ConfigError(
            f"{where}: {key}: not a PostgreSQL connection string (postgresql://...), got {got}{fix}"
        ) from None


#: A URL scheme other than libpq's own (postgresql://, postgres://).
_OTHER_SCHEME = re.compile(r"(?!postgres(?:ql)?://)([A-Za-z][A-Za-z0-9+.-]{0,30})://")


def parse_queues(where: str, raw: object, main_queue: str) -> dict[str, str]:
    """Each `[databases.NAME]` with a `task_queue`: NAME to that queue (the entries are checked
    whole by `parse_databases`)."""
    queues: dict[str, str] = {}
    if not isinstance(raw, dict):
        return queues
    for name, entry in raw.items():
        if not isinstance(entry, dict) or "task_queue" not in entry:
            continue
        queue = entry["task_queue"]
        if not isinstance(queue, str) or not QUEUE_NAME.fullmatch(queue):
            at = f"databases.{name}" if str(name).isprintable() else f"databases.{quoted(name)}"
            raise ConfigError(
                f"{where}: {at}.task_queue: not a task queue name (1 to 200 of letters, digits "
                f"and _ . : / -), got {quoted(queue)}"
            )
        if queue != main_queue:
            queues[name] = queue
    return queues


def parse_databases(
    where: str, raw: object, env: Mapping[str, str], routed: set[str] | None = None
) -> dict[str, str]:
    """`[databases.NAME]` tables: each NAME to its URL (from `url`, or the variable `url_env`).
    A database of `routed` (it has its own task queue) whose variable is not set is left out:
    the workers next to it set it, others never need it."""
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{where}: databases: must be [databases.NAME] tables, got {type_of(raw)}"
        )
    urls: dict[str, str] = {}
    for name, entry in raw.items():
        at = f"databases.{name}" if name.isprintable() else f"databases.{quoted(name)}"
        if not DATABASE_NAME.fullmatch(name):
            raise ConfigError(
                f"{where}: {at}: not a database name (letters, digits, _ and -, starting with a "
                "letter or _)"
            )
        if name == DEFAULT_DATABASE_KEY:
            raise ConfigError(
                f"{where}: {at}: the name is reserved for the default database (database_url)"
            )
        if not isinstance(entry, dict):
            raise ConfigError(
                f"{where}: {at}: must be a table with url or url_env, got {type_of(entry)}"
            )
        no_unknown(where, f"{at}.", entry, _DATABASE_KEYS)
        url = opt_str(where, f"{at}.url", entry, "url", secret=True)
        variable = opt_str(where, f"{at}.url_env", entry, "url_env", secret=True)
        if variable is not None and not VARIABLE_NAME.fullmatch(variable):
            # Refused here, before a database of another worker's queue is passed over: a URL
            # written where its variable's name belongs would otherwise be quoted whole in the
            # error below, password and all, or leave that database unswept without a word.
            got = repr(variable) if _PLAIN.fullmatch(variable) else hidden(variable)
            raise ConfigError(
                f"{where}: {at}.url_env: must name an environment variable (letters, digits, "
                f"_, - and ., not starting with a digit), got {got}: a connection string goes "
                "in that variable, or in url"
            )
        if (url is None) == (variable is None):
            raise ConfigError(
                f"{where}: {at}: give exactly one of url and url_env (the variable holding "
                f"the URL), got {'both' if url else 'neither'}"
            )
        if variable is not None:
            # A variable of only spaces is as unset: libpq would connect to its defaults.
            value = env.get(variable, "")
            url = value if value.strip() else None
            if url is None and name in (routed or set()):
                continue
            if url is None:
                raise ConfigError(
                    f"{where}: {at}.url_env: the variable {shown(variable)} is not set (or empty)"
                )
            check_dsn(where, f"{at}.url_env ({variable})", url)
        else:
            assert url is not None
            check_dsn(where, f"{at}.url", url)
        urls[name] = url
    return urls


def parse_pass(where: str, raw: object, period_ms: int | None) -> PassLimits:
    """`[pass]`; the budget must end before the schedule fires again (`period_ms`)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: pass: must be a [pass] table, got {quoted(raw)}")
    no_unknown(where, "pass.", raw, _PASS_KEYS)
    counts = {key: _at_least_one(where, key, raw) for key in ("max_concurrent", "max_per_database")}
    worker_wait = duration_within(
        where, "pass.worker_wait", raw, WORKER_WAIT_RANGE_MS, DEFAULT_WORKER_WAIT_MS
    )
    if "budget" in raw:
        budget = read_duration(where, "pass.budget", raw, "budget")
        if budget < MIN_BUDGET_MS:
            raise ConfigError(f"{where}: pass.budget: at least 10s, got {quoted(raw['budget'])}")
        if budget > MAX_BUDGET_MS:
            raise ConfigError(f"{where}: pass.budget: at most 1d, got {quoted(raw['budget'])}")
        if period_ms is not None and budget >= period_ms:
            raise ConfigError(
                f"{where}: pass.budget: must end before the schedule fires again (every "
                f"{duration_text(period_ms)}), got {quoted(raw['budget'])}"
            )
    else:
        # 50 minutes, or five sixths of a shorter period, so a pass never meets the next.
        budget = DEFAULT_BUDGET_MS
        if period_ms is not None:
            budget = min(budget, max(MIN_BUDGET_MS, period_ms * 5 // 6))
    return PassLimits(
        max_concurrent=counts["max_concurrent"] or DEFAULT_MAX_CONCURRENT,
        max_per_database=counts["max_per_database"] or DEFAULT_MAX_PER_DATABASE,
        budget_ms=budget,
        worker_wait_ms=worker_wait,
    )


def _at_least_one(where: str, key: str, raw: Mapping[str, Any]) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1000:
        raise ConfigError(
            f"{where}: pass.{key}: must be a whole number from 1 to 1000, got {quoted(value)}"
        )
    return value
