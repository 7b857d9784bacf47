"""The one TOML file a deployment is described by, checked whole before anything connects.

Every refusal is a ConfigError whose message is one line naming the file, the key and the value.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from purge_config.errors import ConfigError
from purge_config.fleet import (
    DEFAULT_DATABASE_KEY,
    PassLimits,
    check_dsn,
    parse_databases,
    parse_pass,
    parse_queues,
)
from purge_config.names import QUEUE_NAME
from purge_config.patterns import split_match_name
from purge_config.schedules import (
    ScheduleConfig,
    check_membership,
    parse_schedule,
    parse_schedules,
)
from purge_config.settings import SweepSettings
from purge_config.specs import (
    SWEEP_FLAGS,
    SWEEP_KEYS,
    SWEEP_PACING,
    TargetSpec,
    parse_target,
    sweep_settings,
)
from purge_config.values import (
    cron_period_ms,
    duration_within,
    hidden,
    masked,
    no_unknown,
    opt_str,
    quoted,
    shown,
)

DEFAULT_PATH = Path("purge.toml")
DEFAULT_TASK_QUEUE = "purge"

_TOP_KEYS = frozenset(
    {
        "database_url",
        "database_wait",
        "databases",
        "task_queue",
        "metrics",
        "schedule",
        "schedules",
        "sweep",
        "pass",
        "targets",
    }
)

#: How long a starting worker waits for its first database connection before it gives up.
DEFAULT_DATABASE_WAIT_MS = 30_000
DATABASE_WAIT_RANGE_MS = (1_000, 3_600_000)
_METRICS = re.compile(r"(?P<host>[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\]):(?P<port>[0-9]{1,5})")

_QUEUE = QUEUE_NAME


@dataclass(frozen=True)
class PurgeConfig:
    """A whole deployment: where to delete, which targets, when."""

    path: Path | None = None
    database_url: str | None = None
    task_queue: str = DEFAULT_TASK_QUEUE
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    targets: tuple[TargetSpec, ...] = ()
    metrics: str | None = None
    """HOST:PORT where a worker serves Prometheus metrics, if anywhere."""
    databases: Mapping[str, str] = field(default_factory=dict)
    """`[databases.NAME]`: each named database's URL (the default one is `database_url`); a
    database with its own task queue whose `url_env` is not set here is not in it (another
    worker, next to it, sweeps it)."""
    queues: Mapping[str, str] = field(default_factory=dict)
    """`[databases.NAME] task_queue`: the queue of each routed database's activities."""
    limits: PassLimits = field(default_factory=PassLimits)
    """`[pass]`: concurrency and the pass's time budget (under named schedules, the budget
    that ends before the most frequent one fires again)."""
    database_wait_ms: int = DEFAULT_DATABASE_WAIT_MS
    """How long a starting worker waits for its first database connection."""
    named_schedules: tuple[ScheduleConfig, ...] = ()
    """`[schedules.NAME]`, each over its own targets; empty when the config has `[schedule]`
    (or neither)."""
    budgets_ms: Mapping[str, int] = field(default_factory=dict)
    """Each named schedule's pass budget: `[pass] budget`, else five sixths of its period, at
    most 50 minutes (and at least 10 s)."""

    @property
    def schedules(self) -> tuple[ScheduleConfig, ...]:
        """Every schedule the config declares: its named ones, else the single `[schedule]`."""
        return self.named_schedules or (self.schedule,)

    def scheduled_input(self, spec: ScheduleConfig) -> dict[str, Any]:
        """The input of the passes `spec` starts: its targets (every one for `[schedule]`)."""
        return self.pass_input(list(spec.targets) or None, budget_ms=self.budgets_ms.get(spec.name))

    @property
    def target_names(self) -> list[str]:
        """The names a scheduled pass sweeps, in file order; a factory's come from its `names`."""
        return [n for t in self.targets for n in (t.names if t.kind == "python" else (t.name,))]

    @property
    def own_names(self) -> list[str]:
        """The names this config's workers run from its own activity queue: every target but
        those on a database with a task queue of its own."""
        return [
            n
            for t in self.targets
            if t.database not in self.queues
            for n in (t.names if t.kind == "python" else (t.name,))
        ]

    @functools.cached_property
    def pattern_targets(self) -> dict[str, TargetSpec]:
        """The targets that are table patterns, by name, in file order."""
        return {t.name: t for t in self.targets if t.pattern is not None}

    @functools.cached_property
    def own_queue(self) -> str | None:
        """The task queue of the activities of `own_names` (None when there are none): the
        config's queue and a digest of those targets and what each says of its rows (its
        `TargetSpec.rule`), so that only a worker whose config says the same of every one of
        them polls it. Mid-deploy, a worker with an older or newer list of targets, or another
        rule for one of them (a `max_age` changed), polls a queue of its own and never takes a
        target it does not know, nor sweeps one by another rule (docs/fleets.md). Computed
        once: a digest of ten thousand entries' rules takes a sixth of a second."""
        own = [t for t in self.targets if t.database not in self.queues]
        if not own:
            return None
        return f"{self.task_queue}:{_digest(own)}"

    @functools.cached_property
    def routed_queues(self) -> dict[str, str]:
        """Each database with a task queue of its own (`[databases.NAME] task_queue`) to the
        queue its activities go to: that queue and a digest of this config's targets on every
        database routed there, as `own_queue`'s, so that only a regional worker whose config
        says the same of those targets polls it."""
        routed: dict[str, str] = {}
        for queue in sorted(set(self.queues.values())):
            databases = {db for db, q in self.queues.items() if q == queue}
            digest = _digest([t for t in self.targets if t.database in databases])
            routed |= {db: f"{queue}:{digest}" for db in databases}
        return routed

    def pass_input(
        self, names: list[str] | None = None, dry_run: bool = False, budget_ms: int | None = None
    ) -> dict[str, Any]:
        """The workflow input of a pass over `names` (default: every target): the limits and
        each target's database travel with it, so the workflow needs no config of its own;
        so do the names of the targets that are table patterns, expanded by the pass, and the
        task queue of each database's activities (`own_queue` for this config's own)."""
        names = self.target_names if names is None else names
        on = {t.name: t.database for t in self.targets if t.database}
        # One table of a pattern named by hand (`sessions@tenant_0042`) is on its pattern's
        # database, and its activity goes to that database's queue.
        for name in names:
            split = split_match_name(name)
            pattern = self.pattern_targets.get(split[0]) if split else None
            if pattern is not None and pattern.database and name not in on:
                on[name] = pattern.database
        own = self.own_queue
        if own is not None:
            # Named, so that `queues` can route the default database's activities too.
            on = {name: on.get(name) or DEFAULT_DATABASE_KEY for name in names} | on
        request: dict[str, Any] = {
            "targets": names,
            "max_concurrent": self.limits.max_concurrent,
            "max_per_database": self.limits.max_per_database,
            "budget_ms": budget_ms or self.limits.budget_ms,
        }
        if len(names) <= INLINE_DATABASES:
            request["databases"] = {name: on[name] for name in names if name in on}
        else:
            # Each name once: thousands of targets listed with their database twice would
            # pass Temporal's 512 KB payload warning long before its limits.
            request["database_ranges"] = database_ranges([on.get(name, "") for name in names])
        patterns = [name for name in names if name in self.pattern_targets]
        if patterns:
            request["patterns"] = patterns
        used = {on.get(name, "") for name in names}
        queues = {db: queue for db, queue in self.routed_queues.items() if db in used}
        if own is not None:
            queues |= {db: own for db in used if db not in self.queues}
        if queues:
            # A pass typed by hand without them (`temporal workflow start`) runs every activity
            # on the pass's own queue, as the first rounds' passes did.
            request["queues"] = queues
            request["worker_wait_ms"] = self.limits.worker_wait_ms
        if dry_run:
            request["dry_run"] = True
        return request

    @property
    def needs_default_database(self) -> bool:
        """Whether a target of this config sweeps the default database (`database_url`)."""
        return any(t.kind != "python" and not t.database for t in self.targets)

    @property
    def where(self) -> str:
        """The config's file as its messages name it (on one line whatever its name holds)."""
        return path_shown(self.path or DEFAULT_PATH)

    def require_database_url(self) -> str:
        """The database URL, or a ConfigError saying where to put one."""
        if not self.database_url:
            raise ConfigError(
                f"{self.where}: database_url: missing; set it in the file or in PURGE_DATABASE_URL"
            )
        return self.database_url


def _digest(specs: list[TargetSpec]) -> str:
    """12 hex digits naming `specs`' target names and what each says of its rows."""
    said = sorted(
        f"{name}\t{spec.rule}"
        for spec in specs
        for name in (spec.names if spec.kind == "python" else (spec.name,))
    )
    return hashlib.sha256("\n".join(said).encode()).hexdigest()[:12]


#: Up to this many targets, a pass input maps each target to its database by name (the form of
#: the first rounds); above it, by ranges of positions.
INLINE_DATABASES = 500


def database_ranges(databases: list[str]) -> list[list[Any]]:
    """`[database, start, stop]` for each run of consecutive targets on one named database
    (positions as in Python slices); the default database ("") needs none."""
    ranges: list[list[Any]] = []
    for i, database in enumerate(databases):
        if not database:
            continue
        if ranges and ranges[-1][0] == database and ranges[-1][2] == i:
            ranges[-1][2] = i + 1
        else:
            ranges.append([database, i, i + 1])
    return ranges


def config_path(explicit: str | None, env: Mapping[str, str] = os.environ) -> Path:
    """`--config`, else PURGE_CONFIG, else ./purge.toml."""
    return Path(explicit or env.get("PURGE_CONFIG") or DEFAULT_PATH)


def load_config(path: Path, env: Mapping[str, str] = os.environ) -> PurgeConfig:
    """Read and check `path`; PURGE_DATABASE_URL in `env` overrides the file's database_url."""
    return parse_config(read_toml(path), path, env)


def database_url_only(path: Path, env: Mapping[str, str] = os.environ) -> str | None:
    """The database URL of `path` (or PURGE_DATABASE_URL), checked, whatever the rest of the
    file holds: for `discover`, which helps write a config that may not yet be right."""
    return _database_url(path_shown(path), read_toml(path), env)


def read_toml(path: Path) -> dict[str, Any]:
    """The TOML document at `path`; a ConfigError of one line where it is none."""
    shown = path_shown(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"{shown}: no such file; pass --config, set PURGE_CONFIG, or create ./purge.toml"
        ) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{shown}: cannot read: {err}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{shown}: not valid TOML: {err}") from None
    except (ValueError, RecursionError) as err:
        # Past tomllib's grammar: an integer of over 4,300 digits (Python's own limit), arrays
        # or tables nested thousands deep.
        limit = "nested too deep" if isinstance(err, RecursionError) else "a number too long"
        raise ConfigError(f"{shown}: not a TOML file this reader takes: {limit}") from None
    return raw


def path_shown(path: Path) -> str:
    """`path` as a message shows it: quoted where it holds what would break the line (a
    newline, a control character), and by its length alone where it may hold a connection
    string's secret (a URL pasted where the config's file goes: `masked`, and the URL's `//`
    that `Path` folds into one `/`)."""
    text = shown(str(path))
    return hidden(text) if _FOLDED_URL.match(str(path)) else masked(text)


#: A URL with user info after `Path()` has folded its `//`: `postgresql:/user:secret@host/db`
#: (a path that only begins like a scheme, `C:/cfg/purge.toml`, has no `@`).
_FOLDED_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:/[^@]*@")


def parse_config(
    raw: Mapping[str, Any], path: Path | None = None, env: Mapping[str, str] = os.environ
) -> PurgeConfig:
    """Check an already-parsed TOML document."""
    where = path_shown(path) if path else "<config>"
    no_unknown(where, "", raw, _TOP_KEYS)

    database_url = _database_url(where, raw, env)

    database_wait_ms = _parse_database_wait(where, raw)

    task_queue = opt_str(where, "task_queue", raw) or DEFAULT_TASK_QUEUE
    if not _QUEUE.fullmatch(task_queue):
        raise ConfigError(f"{where}: task_queue: not a task queue name, got {quoted(task_queue)}")

    if "schedule" in raw and "schedules" in raw:
        raise ConfigError(
            f"{where}: schedules: give [schedule] (every target, one cron) or [schedules.NAME] "
            "tables, not both"
        )
    schedule = parse_schedule(where, raw.get("schedule", {}))
    named = parse_schedules(where, raw["schedules"]) if "schedules" in raw else ()

    metrics = opt_str(where, "metrics", raw)
    if metrics is not None:
        check_metrics_address(metrics, f"{where}: metrics")

    queues = parse_queues(where, raw.get("databases", {}), task_queue)
    databases = parse_databases(where, raw.get("databases", {}), env, routed=set(queues))
    periods = {s.name: cron_period_ms(s.cron) for s in named or (schedule,)}
    known = [p for p in periods.values() if p is not None]
    limits = parse_pass(where, raw.get("pass", {}), min(known) if known else None)
    budgets = {
        name: parse_pass(where, raw.get("pass", {}), period).budget_ms
        for name, period in periods.items()
        if named
    }
    targets = _parse_targets(where, raw)
    _check_targets(where, targets, {*databases, *queues})
    if named:
        names = [n for t in targets for n in (t.names if t.kind == "python" else (t.name,))]
        named = check_membership(where, named, names)
    return PurgeConfig(
        path=path,
        database_url=database_url,
        task_queue=task_queue,
        schedule=schedule,
        targets=targets,
        metrics=metrics,
        databases=databases,
        queues=queues,
        limits=limits,
        database_wait_ms=database_wait_ms,
        named_schedules=named,
        budgets_ms=budgets,
    )


def _parse_targets(where: str, raw: Mapping[str, Any]) -> tuple[TargetSpec, ...]:
    """Every [[targets]] entry, under the `[sweep]` defaults."""
    entries = raw.get("targets", [])
    if not isinstance(entries, list):
        raise ConfigError(
            f"{where}: targets: must be an array of [[targets]] tables, got {quoted(entries)}"
        )
    sweep = raw.get("sweep", {})
    if isinstance(sweep, dict):
        no_unknown(where, "sweep.", sweep, frozenset({*SWEEP_KEYS, *SWEEP_FLAGS, *SWEEP_PACING}))
    defaults = sweep_settings(where, "sweep.", sweep, SweepSettings())
    return tuple(parse_target(where, i, entry, defaults) for i, entry in enumerate(entries, 1))


def _database_url(where: str, raw: Mapping[str, Any], env: Mapping[str, str]) -> str | None:
    """`PURGE_DATABASE_URL` if set, else the file's `database_url`; both checked."""
    # The file's own value is checked even when the environment overrides it: the file is
    # checked whole, and it is what the next deployment without the variable will use.
    file_url = opt_str(where, "database_url", raw, secret=True)
    if file_url is not None:
        check_dsn(where, "database_url", file_url)
    env_url = env.get("PURGE_DATABASE_URL") or None
    if env_url is not None:
        check_dsn(where, "PURGE_DATABASE_URL", env_url)
    database_url = env_url or file_url
    return database_url


def _check_targets(where: str, targets: tuple[TargetSpec, ...], known_databases: set[str]) -> None:
    """Across entries: no name twice, none a pattern's match could take, every `database` one
    this file defines."""
    seen: dict[str, int] = {}
    wild = [spec for spec in targets if spec.pattern is not None]
    for i, spec in enumerate(targets, 1):
        key = "names" if spec.kind == "python" else "name"
        for name in spec.names if spec.kind == "python" else (spec.name,):
            if name in seen:
                raise ConfigError(
                    f"{where}: [[targets]] #{i}: {key}: {quoted(name)} is already a name of "
                    f"[[targets]] #{seen[name]}; two targets cannot share a name"
                )
            seen[name] = i
        _check_not_a_match(where, i, spec, wild)
        if spec.database and spec.database not in known_databases:
            known = ", ".join(sorted(known_databases)) or "none"
            raise ConfigError(
                f"{where}: [[targets]] #{i} ({spec.name}): database: no [databases.{spec.database}]"
                f" in this file (it has: {known})"
            )


def _check_not_a_match(
    where: str, index: int, spec: TargetSpec, patterns: list[TargetSpec]
) -> None:
    """Refuse a target whose name a pattern target's match could also take: every pass that
    matched that table would be refused for a repeated name."""
    for other in patterns:
        if other is spec:
            continue
        match = other.matched(spec.name)
        if match is not None:
            raise ConfigError(
                f"{where}: [[targets]] #{index}: name: {quoted(spec.name)} is also the name of the "
                f"pattern {other.name}'s match {match.tables[0]}; rename one of them"
            )


def _parse_database_wait(where: str, raw: Mapping[str, Any]) -> int:
    return duration_within(
        where, "database_wait", raw, DATABASE_WAIT_RANGE_MS, DEFAULT_DATABASE_WAIT_MS
    )


def check_metrics_address(text: str, where: str) -> str:
    """`HOST:PORT` for the metrics endpoint, or a ConfigError naming `where`."""
    match = _METRICS.fullmatch(text)
    if not match or not 1 <= int(match.group("port")) <= 65535:
        raise ConfigError(f"{where}: want HOST:PORT like '0.0.0.0:9464', got {quoted(text)}")
    return text
