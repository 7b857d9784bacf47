"""The `[[targets]]` entries of the config: each checked into a TargetSpec (built into a target
with a pool in activities.builtin_kinds)."""

from __future__ import annotations

import contextlib
import io
import json
import pkgutil
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Any, TypedDict

from purge_config.errors import ConfigError, did_you_mean, first_line
from purge_config.filters import FILTER_KEYS, RowFilter, archive_table, parse_filter
from purge_config.fleet import DATABASE_NAME
from purge_config.kinds import BUILTIN_KINDS, KINDS
from purge_config.names import SQL_NAME, TARGET_NAME, TableName
from purge_config.patterns import TablePattern, parse_table, pattern_of, split_match_name
from purge_config.presets import FIXED_KEYS, PRESETS, expand
from purge_config.settings import (
    EPOCH_UNITS,
    PARTITION_MODES,
    EpochUnit,
    Guards,
    PartitionPolicy,
    SweepSettings,
)
from purge_config.values import (
    duration_text,
    no_unknown,
    one_of,
    opt_str,
    quoted,
    read_duration,
    read_rate,
    req_str,
)

#: A `python` target's factory: called when a step needs its targets (see activities.registry).
Factory = Callable[[], Iterable[object]]

#: What a built-in target does with its table's wholly expired range partitions.
_PARTITION_KEYS = frozenset({"partitions", "detached_schema"})
#: Keys each kind takes beside `kind`; anything else is a typo worth stopping for.
_TARGET_KEYS: dict[str, frozenset[str]] = {
    **{
        kind: spec.table_keys | {"name", "database", "allow_any", *_PARTITION_KEYS}
        for kind, spec in BUILTIN_KINDS.items()
    },
    "expiring": frozenset(
        {"name", "table", "column", "max_age", "database", "unit", "allow_any", "age_from"}
        | _PARTITION_KEYS
    ),
    "python": frozenset({"factory", "names"}),
}
#: Keys that narrow or archive what a kind deletes (purge_config.filters): an archive for each
#: table of a built-in kind, and row filters and an archive for an `expiring` target.
_ROW_KEYS: dict[str, frozenset[str]] = {
    **{kind: frozenset(spec.archive_keys) for kind, spec in BUILTIN_KINDS.items()},
    "expiring": FILTER_KEYS | {"archive_table"},
    "python": frozenset(),
}
#: Guards a built-in target may carry (see purge_config.settings.Guards); all off unless set.
_GUARD_KEYS = frozenset({"max_rows", "max_fraction", "max_clock_jump"})

#: The `[sweep]` keys (also allowed in any built-in target, to override them there), the
#: SweepSettings field each sets, and its bounds in ms. The time budget stays well inside the
#: activity's 30-minute start-to-close, so a sweep always ends by its own budget.
SWEEP_KEYS: dict[str, tuple[str, int, int]] = {
    "lock_timeout": ("lock_timeout_ms", 1, 60_000),
    "statement_timeout": ("statement_timeout_ms", 100, 600_000),
    "batch_target": ("batch_target_ms", 1, 10_000),
    "time_budget": ("time_budget_ms", 1_000, 20 * 60_000),
    "busy_wait": ("busy_wait_ms", 0, 10 * 60_000),
}

#: The `[sweep]` keys that are true or false (also allowed per target), each the SweepSettings
#: field of its name.
SWEEP_FLAGS = ("analyze_after", "refuse_unindexed_children")
#: The pacing keys of `[sweep]` (also allowed per target).
SWEEP_PACING = ("max_replica_lag", "max_wal_rate")
#: Every key an entry of each kind may hold.
_ENTRY_KEYS: dict[str, frozenset[str]] = {
    kind: _TARGET_KEYS[kind]
    | _ROW_KEYS[kind]
    | {"kind"}
    | (
        frozenset({*SWEEP_KEYS, *SWEEP_FLAGS, *SWEEP_PACING, *_GUARD_KEYS})
        if kind != "python"
        else frozenset()
    )
    for kind in _TARGET_KEYS
}
# A framework preset takes an `expiring` entry's keys but those it fixes (purge_config.presets).
_ENTRY_KEYS |= {kind: _ENTRY_KEYS["expiring"] - FIXED_KEYS for kind in PRESETS}

_FACTORY = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


@dataclass(frozen=True)
class TargetSpec:
    """One `[[targets]]` entry, checked; building it into a target needs a pool (see kinds)."""

    kind: str
    name: str
    """The target's name; for `python`, the factory's path (its targets carry their own names)."""
    tables: tuple[TableName, ...] = ()
    column: str = ""
    max_age_ms: int = 0
    unit: EpochUnit = "ms"
    """For `expiring` over an integer column: the epoch unit it holds (ms, s, us)."""
    factory: Factory | None = None
    names: tuple[str, ...] = ()
    """For `python`: the names its factory provides that a scheduled pass should sweep."""
    settings: SweepSettings = field(default_factory=SweepSettings)
    """The bounds of this target's sweep: `[sweep]`, overridden by the entry's own keys."""
    guards: Guards = field(default_factory=Guards)
    """max_rows, max_fraction, max_clock_jump: off unless set."""
    database: str = ""
    """The `[databases.NAME]` it sweeps; empty for the default database (`database_url`)."""
    partitions: PartitionPolicy = field(default_factory=PartitionPolicy)
    """`partitions` and `detached_schema`: what happens to a wholly expired range partition."""
    row_filter: RowFilter | None = None
    """For `expiring`: `match`, `match_null`, `match_not_null`; None when it has none."""
    archives: tuple[TableName | None, ...] = ()
    """Each table's archive (in the order of `tables`), where its rows move; None for none."""
    allow_any: bool = False
    """Whether its table pattern may match every schema and table (`*.*`)."""
    age_from: TableName | None = None
    """For `expiring`: the table whose rows, through their foreign key to `tables[0]`, hold
    each row's age in `column` (its newest); None when the age is the table's own column."""

    @property
    def rule(self) -> str:
        """What this entry says of the rows it deletes, as text: everything but its sweep's
        bounds (`settings`: batch sizes, timeouts, pacing), which change how it deletes, never
        what. Two configs whose entries of one name differ here would delete different rows;
        the task queues of their passes differ with it (`PurgeConfig.own_queue`). The same
        entry reads the same here in every release (`_said`): a key added to this text must be
        left out where its value is its default, or every queue of every config moves at that
        release's deploy, and its workers share no queue with the last release's."""
        said = {
            "kind": self.kind,
            "name": self.name,
            "names": list(self.names),
            "tables": [str(t) for t in self.tables],
            "column": self.column,
            "max_age_ms": self.max_age_ms,
            "unit": self.unit,
            "guards": _said(self.guards),
            "database": self.database,
            "partitions": _said(self.partitions),
            "row_filter": _said(self.row_filter) if self.row_filter else None,
            "archives": [str(a) if a else None for a in self.archives],
            "allow_any": self.allow_any,
            "age_from": str(self.age_from) if self.age_from else None,
        }
        return json.dumps(said, sort_keys=True, default=str)

    @property
    def pattern(self) -> TablePattern | None:
        """The pattern its first table is (the others fill their stars from its matches), or
        None when it names its tables one by one."""
        return pattern_of(self.tables[0]) if self.tables else None

    def matched(self, name: str) -> TargetSpec | None:
        """The target of one of this pattern's matches, named `name` (`sessions@tenant_0042`),
        with every table and archive filled in; None when `name` is no match of it."""
        pattern = self.pattern
        split = split_match_name(name)
        if pattern is None or split is None or split[0] != self.name:
            return None
        match = pattern.from_suffix(split[1])
        if match is None:
            return None
        tables = (match.table, *(pattern.fill(t, match) for t in self.tables[1:]))
        archives = tuple(a and pattern.fill(a, match) for a in self.archives)
        age_from = self.age_from and pattern.fill(self.age_from, match)
        return replace(
            self, name=name, tables=tables, archives=archives, age_from=age_from, allow_any=False
        )


#: The fields of each part of a rule (`TargetSpec.rule`) when its text was first hashed into
#: task queue names: said always, as they were. A field added to one of these classes since is
#: said only where it is not at its default, so that a release adding one names every queue of
#: an unchanged config as the release before it did (docs/fleets.md, "Rolling deploys").
_RULE_FIELDS: dict[type, frozenset[str]] = {
    Guards: frozenset({"max_rows", "max_fraction", "max_clock_jump_ms"}),
    PartitionPolicy: frozenset({"mode", "detached_schema"}),
    RowFilter: frozenset({"match", "null", "not_null"}),
}


def _said(part: Guards | PartitionPolicy | RowFilter) -> dict[str, Any]:
    """One part of a rule as its text holds it: its fields of `_RULE_FIELDS`, and any other of
    its fields whose value is not the field's default."""
    [first] = [names for kind, names in _RULE_FIELDS.items() if isinstance(part, kind)]
    defaults = {
        f.name: f.default_factory() if f.default_factory is not MISSING else f.default
        for f in fields(part)
    }
    return {
        name: value
        for name, value in asdict(part).items()
        if name in first or getattr(part, name) != defaults[name]
    }


def sweep_settings(where: str, prefix: str, raw: object, base: SweepSettings) -> SweepSettings:
    """`base` with the sweep keys of `raw` applied (only those keys are read here)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: {prefix.rstrip('.')}: must be a table, got {quoted(raw)}")
    changes: dict[str, Any] = {}
    for key in SWEEP_FLAGS:
        if key in raw:
            if not isinstance(raw[key], bool):
                raise ConfigError(
                    f"{where}: {prefix}{key}: must be true or false, got {quoted(raw[key])}"
                )
            changes[key] = raw[key]
    for key, (attr, low, high) in SWEEP_KEYS.items():
        if key not in raw:
            continue
        value = read_duration(where, prefix + key, raw, key)
        if not low <= value <= high:
            raise ConfigError(
                f"{where}: {prefix}{key}: must be from {duration_text(low)} to "
                f"{duration_text(high)}, got {quoted(raw[key])}"
            )
        changes[attr] = value
    if "max_replica_lag" in raw:
        lag = read_duration(where, prefix + "max_replica_lag", raw, "max_replica_lag")
        if not 100 <= lag <= 3_600_000:
            raise ConfigError(
                f"{where}: {prefix}max_replica_lag: must be from 100ms to 60m, "
                f"got {quoted(raw['max_replica_lag'])}"
            )
        changes["max_replica_lag_ms"] = lag
    if "max_wal_rate" in raw:
        changes["max_wal_rate"] = read_rate(where, prefix + "max_wal_rate", raw, "max_wal_rate")
    # Most entries override nothing: a config of thousands of targets then copies no settings.
    settings = replace(base, **changes) if changes else base
    if settings.batch_target_ms * 10 > settings.statement_timeout_ms:
        raise ConfigError(
            f"{where}: {prefix}statement_timeout: must be at least 10 times batch_target "
            f"({duration_text(settings.batch_target_ms)}), "
            f"got {duration_text(settings.statement_timeout_ms)}"
        )
    return settings


def _guards(at: str, raw: Mapping[str, Any]) -> Guards:
    max_rows = raw.get("max_rows")
    if max_rows is not None and (
        isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1
    ):
        raise ConfigError(
            f"{at}: max_rows: must be a whole number of at least 1, got {quoted(max_rows)}"
        )
    fraction = raw.get("max_fraction")
    if fraction is not None and (
        isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction <= 1
    ):
        raise ConfigError(
            f"{at}: max_fraction: must be a share above 0 and at most 1 (0.25 for a quarter), "
            f"got {quoted(fraction)}"
        )
    jump = None
    if "max_clock_jump" in raw:
        jump = read_duration(at, "max_clock_jump", raw, "max_clock_jump")
        if jump < 1000:
            raise ConfigError(
                f"{at}: max_clock_jump: at least 1s, got {quoted(raw['max_clock_jump'])}"
            )
    return Guards(
        max_rows=max_rows,
        max_fraction=float(fraction) if fraction is not None else None,
        max_clock_jump_ms=jump,
    )


def _partitions(at: str, raw: Mapping[str, Any]) -> PartitionPolicy:
    mode = one_of(raw.get("partitions", "delete"), PARTITION_MODES)
    if mode is None:
        raise ConfigError(
            f"{at}: partitions: must be one of {', '.join(map(repr, PARTITION_MODES))}, "
            f"got {quoted(raw['partitions'])}"
        )
    schema = raw.get("detached_schema")
    if schema is None:
        if mode == "detach":
            raise ConfigError(
                f"{at}: detached_schema: missing; partitions = 'detach' moves each detached "
                "partition to this schema"
            )
        return PartitionPolicy(mode)
    if not isinstance(schema, str) or not SQL_NAME.fullmatch(schema):
        raise ConfigError(
            f"{at}: detached_schema: not a schema name (letters, digits and _, starting with a "
            f"letter or _, at most 63), got {quoted(schema)}"
        )
    if mode != "detach":
        # Said out loud: an operator who names an archive schema but leaves `drop` (or the
        # default) would lose the partitions they meant to keep.
        raise ConfigError(
            f"{at}: detached_schema: only with partitions = 'detach' (partitions is "
            f"{quoted(mode)}: "
            f"nothing would be kept in {quoted(schema)}), got {quoted(schema)}"
        )
    return PartitionPolicy(mode, schema)


def parse_target(where: str, index: int, raw: object, defaults: SweepSettings) -> TargetSpec:
    at, kind, raw = _entry(where, index, raw)
    if kind == "python":
        return _python_spec(at, raw)
    name = opt_str(at, "name", raw) if kind != "expiring" else req_str(at, "name", raw)
    name = name or BUILTIN_KINDS[kind].default_name
    if not TARGET_NAME.fullmatch(name):
        raise ConfigError(
            f"{at}: name: letters, digits and _ . : @ - (at most 100), starting with a letter, "
            f"digit or _, got {quoted(name)}"
        )
    settings = sweep_settings(at, "", raw, defaults)
    guards, partitions = _guards(at, raw), _partitions(at, raw)
    database = opt_str(at, "database", raw) or ""
    if database and not DATABASE_NAME.fullmatch(database):
        raise ConfigError(f"{at}: database: not a database name, got {quoted(database)}")
    common = _Common(
        kind=kind, name=name, settings=settings, guards=guards, database=database,
        partitions=partitions,
    )  # fmt: skip
    builtin = BUILTIN_KINDS.get(kind)
    if builtin is not None:
        tables = tuple(_table(at, key, raw, default) for key, default in builtin.tables)
        if len(set(tables)) < len(tables):
            # Each of a kind's tables has its own rule: one table under two would lose rows
            # to whichever rule says they are old.
            keys = [key for key, _ in builtin.tables]
            raise ConfigError(
                f"{at}: {keys[-1]}: the same table as {keys[0]}, got {quoted(str(tables[-1]))}; "
                "each is swept by its own rule"
            )
        archives = tuple(
            archive_table(at, key, raw, table)
            for key, table in zip(builtin.archive_keys, tables, strict=True)
        )
        return TargetSpec(
            **common,
            tables=tables,
            archives=_copied(at, partitions, archives),
            allow_any=_check_pattern(at, raw, tables, archives),
        )
    return _expiring_spec(at, raw, common)


class _Common(TypedDict):
    """The fields every kind but `python` reads alike; each spec is made once, from these and
    its kind's own (not made and then replaced: a config may list thousands)."""

    kind: str
    name: str
    settings: SweepSettings
    guards: Guards
    database: str
    partitions: PartitionPolicy


def _entry(where: str, index: int, raw: object) -> tuple[str, str, dict[str, Any]]:
    """A `[[targets]]` entry's label for messages (its name once it is a valid one), its kind,
    and the entry itself, refused for a key its kind does not take."""
    at = f"{where}: [[targets]] #{index}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{at}: must be a table, got {quoted(raw)}")
    kind = raw.get("kind")
    if kind is None:
        raise ConfigError(f"{at}: kind: missing; want one of {', '.join(KINDS)}")
    if kind not in KINDS:
        hint = did_you_mean(kind, KINDS) if isinstance(kind, str) else ""
        raise ConfigError(
            f"{at}: kind: must be one of {', '.join(KINDS)}, got {quoted(kind)}{hint}"
        )
    name_hint = raw.get("name")
    # Only a valid name labels the entry: an invalid one (a newline, say) is shown, quoted, by
    # the check of `name` below, and would otherwise break the one-line message here.
    if isinstance(name_hint, str) and TARGET_NAME.fullmatch(name_hint):
        at = f"{at} ({name_hint})"
    fixed = sorted(FIXED_KEYS & set(raw)) if kind in PRESETS else []
    if fixed:
        # Said with the reason: "unknown key" reads like a typo of a key `expiring` takes.
        preset = PRESETS[kind]
        raise ConfigError(
            f"{at}: {fixed[0]}: a preset fixes its framework's column ({preset.table}."
            f"{preset.column}) and its type; for another column, write an `expiring` entry"
        )
    no_unknown(at, "", raw, _ENTRY_KEYS[kind])
    if kind in PRESETS:
        return at, "expiring", expand(at, kind, raw)
    return at, kind, raw


def _python_spec(at: str, raw: Mapping[str, Any]) -> TargetSpec:
    path = req_str(at, "factory", raw)
    names = raw.get("names", [])
    if not isinstance(names, list) or not all(
        isinstance(n, str) and TARGET_NAME.fullmatch(n) for n in names
    ):
        raise ConfigError(f"{at}: names: must be a list of target names, got {quoted(names)}")
    factory = _resolve_factory(at, path)
    return TargetSpec(kind="python", name=path, factory=factory, names=tuple(names))


def _expiring_spec(at: str, raw: Mapping[str, Any], common: _Common) -> TargetSpec:
    """An `expiring` entry: one table, its column, and the rule's age and unit."""
    table = _table(at, "table", raw, None)
    column = req_str(at, "column", raw)
    if not SQL_NAME.fullmatch(column):
        raise ConfigError(
            f"{at}: column: not a column name (letters, digits and _, starting with a letter "
            f"or _, at most 63), got {quoted(column)}"
        )
    max_age_ms = 0
    if "max_age" in raw:
        max_age_ms = read_duration(at, "max_age", raw, "max_age")
    unit = one_of(raw.get("unit", "ms"), EPOCH_UNITS)
    if unit is None:
        raise ConfigError(
            f"{at}: unit: the unit of an integer epoch column, one of {', '.join(EPOCH_UNITS)}, "
            f"got {quoted(raw['unit'])}"
        )
    archive = archive_table(at, "archive_table", raw, table)
    partitions = common["partitions"]
    age_from = _age_from(at, raw, table, archive, partitions)
    # The related table's column is no column of the table: a filter may name one alike.
    own = column if age_from is None else ""
    return TargetSpec(
        **common,
        tables=(table,),
        column=column,
        max_age_ms=max_age_ms,
        unit=unit,
        row_filter=_filtered(at, partitions, parse_filter(at, raw, own)),
        archives=_copied(at, partitions, (archive,)),
        allow_any=_check_pattern(at, raw, (table,), (archive, age_from)),
        age_from=age_from,
    )


def _age_from(
    at: str,
    raw: Mapping[str, Any],
    table: TableName,
    archive: TableName | None,
    partitions: PartitionPolicy,
) -> TableName | None:
    """`age_from`, the table holding each row's age, checked against the entry's other keys."""
    if "age_from" not in raw:
        return None
    related = _table(at, "age_from", raw, None)
    value = raw["age_from"]
    if related == table:
        raise ConfigError(
            f"{at}: age_from: the table itself ({table}); for a row's own column leave "
            f"age_from out, got {quoted(value)}"
        )
    if archive is not None:
        raise ConfigError(
            f"{at}: age_from: with archive_table, the rows of {related} that each delete "
            f"cascades to would be lost, not archived; remove one of them, got {quoted(value)}"
        )
    if partitions.removes:
        raise ConfigError(
            f"{at}: partitions: {quoted(partitions.mode)} judges a partition by its bounds, but "
            "with age_from a row's age is in another table; keep partitions = 'delete'"
        )
    return related


def _check_pattern(
    at: str,
    raw: Mapping[str, Any],
    tables: tuple[TableName, ...],
    archives: tuple[TableName | None, ...],
) -> bool:
    """`allow_any`, once the tables are checked as a pattern: the first table is the pattern
    (or no table is one), and every star of the others (the archives', and `age_from`'s, passed
    among `archives`) has one of its stars to fill it."""
    allow_any = raw.get("allow_any", False)
    if not isinstance(allow_any, bool):
        raise ConfigError(f"{at}: allow_any: must be true or false, got {quoted(allow_any)}")
    pattern = pattern_of(tables[0])
    companions = [*tables[1:], *(a for a in archives if a is not None)]
    if pattern is None:
        starred = [t for t in companions if pattern_of(t) is not None]
        if starred:
            raise ConfigError(
                f"{at}: {starred[0]}: a pattern, but the target's first table {tables[0]} is "
                "not; its stars would have nothing to fill them"
            )
        if allow_any:
            raise ConfigError(f"{at}: allow_any: only for a table pattern (a '*' in the table)")
        return False
    if len(tables) > 1 and any(pattern_of(t) is None for t in tables[1:]):
        raise ConfigError(
            f"{at}: {tables[0]} is a pattern, so each other table of the target must be one "
            "too, matched by the same schema (like tenant_*.x_auth_lockouts)"
        )
    for other in companions:
        pattern.check_companion(other, at)
    if pattern.matches_everything and not allow_any:
        raise ConfigError(
            f"{at}: {tables[0]}: this pattern matches every table the role can see; "
            "set allow_any = true if that is meant"
        )
    return allow_any


def _filtered(
    at: str, partitions: PartitionPolicy, row_filter: RowFilter | None
) -> RowFilter | None:
    """`row_filter`, unless partitions would leave whole with rows it keeps."""
    if partitions.removes and row_filter is not None:
        raise ConfigError(
            f"{at}: partitions: {quoted(partitions.mode)} takes a partition out whole, judged "
            "by its bounds alone, with every row the filter (match, match_null, match_not_null) "
            "keeps; "
            "with a filter, keep partitions = 'delete'"
        )
    return row_filter


def _copied(
    at: str, partitions: PartitionPolicy, archives: tuple[TableName | None, ...]
) -> tuple[TableName | None, ...]:
    """`archives`, unless partitions would leave whole without their rows' copy."""
    if partitions.removes and any(archives):
        raise ConfigError(
            f"{at}: partitions: {quoted(partitions.mode)} takes partitions out without copying "
            "their rows to the archive table; with an archive, keep partitions = 'delete'"
        )
    return archives


def _table(at: str, key: str, raw: Mapping[str, Any], default: str | None) -> TableName:
    text = opt_str(at, key, raw) if default is not None else req_str(at, key, raw)
    try:
        return parse_table(text or str(default))
    except ConfigError as err:
        raise ConfigError(f"{at}: {key}: {err}") from None


def _resolve_factory(at: str, path: str) -> Factory:
    if not _FACTORY.fullmatch(path):
        raise ConfigError(f"{at}: factory: want 'package.module:function', got {quoted(path)}")
    module_name, _, attr_path = path.partition(":")
    # What the module prints as it is imported is held back: stdout may be a command's own
    # output (`schema` prints SQL), and a refusal is one line. Said on stderr if it imports.
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            obj: Any = pkgutil.resolve_name(path)
    except AttributeError:
        if module_name in sys.modules:  # imported: it is the name that is missing
            raise ConfigError(
                f"{at}: factory: {quoted(module_name)} has no {quoted(attr_path)}"
            ) from None
        raise ConfigError(f"{at}: factory: cannot import {quoted(module_name)}") from None
    except (Exception, SystemExit) as err:
        # Any error of the module's own import (a SyntaxError, a failing top-level call, a
        # sys.exit() at its top level, as a script's) is a bad factory for this config: one
        # line, not a traceback, and never the end of the process. A module not found is most
        # often beside the config, or in the application's own environment: the worker imports
        # from its own, and neither its working directory nor the config's is searched.
        hint = (
            " (the worker imports it, and what it imports, from its own Python environment: "
            "install it there, or put the directory that holds it on PYTHONPATH)"
            if isinstance(err, ModuleNotFoundError)
            else ""
        )
        raise ConfigError(
            f"{at}: factory: cannot import {quoted(module_name)}: {type(err).__name__}: "
            f"{first_line(err)}{hint}"
        ) from None
    if printed.getvalue():
        sys.stderr.write(printed.getvalue())
    if not callable(obj):
        raise ConfigError(f"{at}: factory: {quoted(path)} is not callable")
    factory: Factory = obj
    return factory
