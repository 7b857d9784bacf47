"""What `pg-purge discover` found, as a commented config to paste or as JSON for tools.

The config uses only keys the config reader takes today (`[[targets]]` of kind `expiring`, with
`unit`, `match` and table patterns, or a framework preset's one line, `kind = "django_sessions"`,
with only the keys that differ from the preset's); what no target can say yet is printed as
comments only.
"""

from __future__ import annotations

import json
import textwrap
from datetime import UTC, datetime
from typing import Any

from purge_config.dsn import redact
from purge_config.kinds import BUILTIN_KINDS
from purge_config.presets import PRESETS
from purge_ops.discover import Discovery, Family, Finding

#: Findings and family members named one by one in a comment, before "and N more".
SHOWN = 3
_WIDTH = 100


def target_keys(finding: Finding, name: str, table: str) -> dict[str, Any]:
    """The `[[targets]]` entry for `finding` (or its family, whose `table` is the pattern), in
    the order it is printed."""
    if finding.preset is not None and finding.preset.kind in BUILTIN_KINDS:
        return _builtin_keys(finding.preset.kind, name, finding.schema)
    if finding.preset is not None and finding.preset.kind:
        return _preset_keys(finding.preset.kind, finding.max_age, name, table)
    keys: dict[str, Any] = {
        "kind": "expiring",
        "name": name,
        "table": table,
        "column": finding.column,
        "max_age": finding.max_age,
    }
    if finding.unit is not None and finding.unit != "ms":
        keys["unit"] = finding.unit
    if finding.preset is not None and finding.preset.match:
        keys["match"] = {
            column: values[0] if len(values) == 1 else list(values)
            for column, values in finding.preset.match
        }
    return keys


def _builtin_keys(kind: str, name: str, schema: str) -> dict[str, Any]:
    """A built-in kind's entry: its kind, its name where not the kind's own, and its tables
    where not in `public` (a kind's tables are one schema's, as activities/schema.sql makes
    them)."""
    builtin = BUILTIN_KINDS[kind]
    keys: dict[str, Any] = {"kind": kind}
    if name != builtin.default_name:
        keys["name"] = name
    if schema != "public":
        keys.update({key: f"{schema}.{default}" for key, default in builtin.tables})
    return keys


def _preset_keys(kind: str, max_age: str, name: str, table: str) -> dict[str, Any]:
    """A preset's entry: its kind, and each key whose value is not the preset's own (the table
    in `public` is the preset's, as the framework names it: unqualified)."""
    preset = PRESETS[kind]
    keys: dict[str, Any] = {"kind": kind}
    if name != kind:
        keys["name"] = name
    if table != f"public.{preset.table}":
        keys["table"] = table
    if max_age != preset.max_age:
        keys["max_age"] = max_age
    return keys


def as_toml(found: Discovery, url: str) -> str:
    """A config to paste: every live entry starts a worker as it is; each says why it is there."""
    lines = _header(found, url)
    framework = [f for f in found.singles if f.source == "framework" and f.is_live]
    expiry = [f for f in found.singles if f.source == "expiry" and f.is_live]
    # A problem (a table the sweep refuses) outranks a caution: no entry is offered for it.
    cautioned = [f for f in found.singles if f.caution and not f.problem and not f.is_live]
    others = [f for f in found.singles if not f.is_live and (f.problem or not f.caution)]
    if framework:
        lines += _section("Tables recognised by their framework's documented schema")
        for finding in framework:
            lines += _entry(found, finding)
    if found.families:
        lines += _section("Families: one pattern entry covers many tables of one shape")
        for family in found.families:
            lines += _family(found, family)
    if expiry:
        lines += _section("Other tables with an expiry-like column")
        for finding in expiry:
            lines += _entry(found, finding)
    if cautioned:
        lines += _section("Found, kept as comments: read each caution before you make it live")
        lines += _comment(
            "Each of these could be swept as it is, but something says its rows may be "
            "records rather than expiring entries, or hold what a sweep would misread. To sweep "
            "one, uncomment its entry (the lines after its comment)."
        )
        for finding in cautioned:
            lines += _cautioned(found, finding)
    if others:
        lines += _section("Found, but no entry sweeps them as they are (comments only)")
        for finding in others:
            lines += _other(finding)
    if found.skipped:
        lines += _section("Not nameable in a config")
        lines += [f"# {line}" for line in found.skipped]
    if found.made_only:
        lines += _section("Perhaps short-lived by their name, dated by when a row was made")
        lines += _comment(
            "No entry: how long to keep these rows is your policy. For each you keep, add an "
            "`expiring` entry on that column with the max_age it says (docs/discover.md)."
        )
        lines += [f"#   {line}" for line in found.made_only]
    if not (framework or expiry or found.families):
        lines += ["", "# Nothing found that an entry could sweep."]
    return "\n".join(lines) + "\n"


def _header(found: Discovery, url: str) -> list[str]:
    at = datetime.fromtimestamp(found.now_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    lines = [
        f"# pg-purge discover: {found.database} as {found.user}, at {at} (this machine's clock)",
        *_comment(
            "Read in one read-only transaction: nothing was written. Keep the entries you want, "
            "set each max_age to your own policy, then `pg-purge schema --apply --config FILE` "
            "(the sweep's ledger), `pg-purge check --config FILE` and `pg-purge run --config "
            "FILE --schedule`. Expiry is inclusive here: a row whose column plus max_age is "
            "exactly now goes (the frameworks' own cleanups use <, so that one row goes one "
            "pass sooner)."
        ),
        "",
    ]
    shown = redact(url)
    if shown != url:
        lines.append(f'# database_url = "{shown}"   # the password is not printed: set it here')
        lines.append("#                                 or in PURGE_DATABASE_URL")
    else:
        lines.append(f"database_url = {toml_value(url)}   # PURGE_DATABASE_URL overrides it")
    return lines


def _section(title: str) -> list[str]:
    return ["", "", f"# ---- {title} ----"]


def _comment(text: str, indent: str = "") -> list[str]:
    return textwrap.wrap(
        text,
        _WIDTH,
        initial_indent=f"# {indent}",
        subsequent_indent=f"# {indent}",
        break_on_hyphens=False,
        break_long_words=False,
    )


def _entry(found: Discovery, finding: Finding) -> list[str]:
    name = _name(found, finding)
    lines = ["", *_comment(_title(finding))]
    lines += _comment(_why(finding), "  ")
    lines += _comment(_figures(finding), "  ")
    lines += _comment(_index(finding), "  ")
    return lines + _toml_entry(target_keys(finding, name, finding.qualified))


def _cautioned(found: Discovery, finding: Finding) -> list[str]:
    """An entry printed commented out, with the caution that kept it so."""
    name = _name(found, finding)
    lines = ["", *_comment(_title(finding))]
    lines += _comment(_why(finding), "  ")
    lines += _comment(f"Careful: {finding.caution}.", "  ")
    lines += _comment(_figures(finding), "  ")
    lines += _comment(_index(finding), "  ")
    return lines + [
        f"# {line}" for line in _toml_entry(target_keys(finding, name, finding.qualified))
    ]


def _name(found: Discovery, finding: Finding) -> str:
    """The finding's target name, as discover named each live entry; one never named (not
    printed live) by its preset's name, else its table's."""
    key = f"{finding.qualified}:{finding.column}"
    if key in found.names:
        return found.names[key]
    return finding.preset.name if finding.preset and finding.preset.name else finding.table


def _title(finding: Finding) -> str:
    if finding.preset is not None and finding.preset.treatment == "preset":
        return f'{finding.preset.framework}: {finding.qualified} (kind = "{finding.preset.kind}")'
    unit = f", epoch {finding.unit}" if finding.unit else ""
    where = f"{finding.qualified}.{finding.column} ({finding.column_type}{unit})"
    return f"{finding.preset.framework}: {where}" if finding.preset else where


def _why(finding: Finding) -> str:
    preset = finding.preset
    if preset is not None and not preset.cleanup:
        return f"Why: {preset.meaning}. Schema: {preset.documented}."
    if preset is not None:
        return (
            f"Why: {preset.meaning}. The framework's cleanup this replaces: {preset.cleanup}. "
            f"Schema: {preset.documented}."
            + (f" Unit: {finding.unit_note}." if finding.unit_note else "")
        )
    text = (
        f"Why: its name says it holds an expiry; max_age {finding.max_age}: a row goes at the "
        "instant in the column. If it holds when the row was made instead, set max_age to how "
        "long rows are kept."
    )
    return text + (f" Unit: {finding.unit_note}." if finding.unit_note else "")


def _figures(finding: Finding) -> str:
    if finding.estimated:
        if finding.rows is None:
            return f"Rows: not counted ({finding.unread}), and never analyzed: no estimate."
        return f"Rows: ~{finding.rows:,}, the planner's estimate ({finding.unread})."
    if finding.preset is not None and finding.preset.treatment == "preset":
        # Its age is in another table: counted by `sweep --dry-run`, not here.
        rows = f"Rows: {finding.rows or 0:,}"
        return f"{rows}; `pg-purge sweep --dry-run` counts those that would go."
    if finding.expired is None:
        return f"Rows: {finding.rows or 0:,}."
    return f"Rows: {finding.rows or 0:,}; would go now: {finding.expired or 0:,}."


def _index(finding: Finding) -> str:
    index = finding.index
    if index is None:
        return ""
    if index.serves:
        return f"Index: {index.serves} serves the sweep."
    note = f" ({index.note})" if index.note else ""
    how = f" ({index.how})" if index.how else ""
    return f"No index serves the sweep{note}: it walks the table; to serve it: {index.create}{how}"


def _family(found: Discovery, family: Family) -> list[str]:
    first = family.first
    name = found.names[family.key]
    members = [m.qualified for m in family.members]
    listed = ", ".join(members[:SHOWN]) + (
        f" and {len(members) - SHOWN} more" if len(members) > SHOWN else ""
    )
    lines = ["", *_comment(f"Family {family.pattern}: {len(members)} tables ({listed})")]
    lines += _comment(_why(first), "  ")
    rows = sum(m.rows or 0 for m in family.members)
    expired = sum(m.expired or 0 for m in family.members)
    estimated = any(m.estimated for m in family.members)
    # A member not counted (no SELECT right, or its count ran out of time: the largest, most
    # likely) adds nothing to the sum: the figure is a floor, and says which it left out.
    uncounted = [m.qualified for m in family.members if m.expired is None]
    would_go = f"{expired:,}"
    if uncounted:
        more = f" and {len(uncounted) - SHOWN} more" if len(uncounted) > SHOWN else ""
        would_go = (
            f"at least {expired:,} ({len(uncounted)} of {len(members)} not counted: "
            f"{', '.join(uncounted[:SHOWN])}{more})"
        )
    lines += _comment(
        f"Rows: {'~' if estimated else ''}{rows:,} in all; would go now: {would_go}.", "  "
    )
    unserved = [m for m in family.members if m.index is not None and not m.index.serves]
    if not unserved:
        lines += _comment("Index: every table has one that serves the sweep.", "  ")
    else:
        shown = "; ".join(str(m.index.create) for m in unserved[:SHOWN] if m.index)
        more = f"; and {len(unserved) - SHOWN} more" if len(unserved) > SHOWN else ""
        lines += _comment(
            f"No index serves the sweep in {len(unserved)} of {len(members)}: {shown}{more}",
            "  ",
        )
    if family.strays:
        lines += _comment(
            f"The pattern also matches {', '.join(family.strays[:SHOWN])}"
            + (f" and {len(family.strays) - SHOWN} more" if len(family.strays) > SHOWN else "")
            + f", without {first.column}: each such sweep would fail alone.",
            "  ",
        )
    return lines + _toml_entry(target_keys(first, name, family.pattern))


def _other(finding: Finding) -> list[str]:
    preset = finding.preset
    if preset is not None and preset.treatment == "not_expressible":
        head = f"{preset.framework}: {finding.qualified}: no entry can say this today."
        body = (
            f"Why: {preset.meaning}. It needs {preset.needs}. Keep until then: "
            f"{preset.cleanup}. Schema: {preset.documented}."
        )
    elif preset is not None:
        head = (
            f"{preset.framework}: {finding.qualified}.{finding.column}: left to {preset.framework}."
        )
        body = f"Why: {preset.meaning}; {preset.cleanup}: {preset.needs}."
    else:
        head = f"{_title(finding)}: not swept as it is."
        body = f"Why: {finding.problem}."
    lines = ["", *_comment(head), *_comment(body, "  ")]
    if finding.rows is not None and (preset is None or preset.treatment != "leave"):
        lines += _comment(_figures(finding), "  ")
    return lines


def _toml_entry(keys: dict[str, Any]) -> list[str]:
    return ["[[targets]]", *(f"{key} = {toml_value(value)}" for key, value in keys.items())]


def toml_value(value: object) -> str:
    """A TOML value: strings as JSON writes them (a TOML basic string), lists, inline tables."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)


def as_json(found: Discovery) -> str:
    """The same findings for tools: each with its figures, index, and the entry it would be."""
    return json.dumps(
        {
            "database": found.database,
            "user": found.user,
            "now_ms": found.now_ms,
            "findings": [_finding_json(found, f) for f in found.singles],
            "families": [_family_json(found, f) for f in found.families],
            "skipped": list(found.skipped),
            "made_only": list(found.made_only),
        },
        indent=2,
    )


def _finding_json(found: Discovery, finding: Finding) -> dict[str, Any]:
    preset = finding.preset
    data: dict[str, Any] = {
        "source": finding.source,
        "table": finding.qualified,
        "column": finding.column,
        "type": finding.column_type,
        "unit": finding.unit,
        "rows": finding.rows,
        "rows_estimated": finding.estimated,
        "would_go_now": finding.expired,
        "index": None,
        "framework": None,
        "problem": finding.problem or None,
        "caution": finding.caution or None,
        "rows_before_1973": finding.sentinels or None,
        "target": None,
        "commented_target": None,
    }
    if finding.index is not None:
        data["index"] = {
            "serves": finding.index.serves,
            "create": finding.index.create,
            "note": finding.index.note or None,
            "how": finding.index.how or None,
        }
    if preset is not None:
        data["framework"] = {
            "name": preset.framework,
            "treatment": preset.treatment,
            "meaning": preset.meaning,
            "cleanup": preset.cleanup,
            "documented": preset.documented,
            "needs": preset.needs or None,
        }
    if finding.is_live:
        name = _name(found, finding)
        data["target"] = target_keys(finding, name, finding.qualified)
    elif finding.caution and not finding.problem:
        name = _name(found, finding)
        data["commented_target"] = target_keys(finding, name, finding.qualified)
    return data


def _family_json(found: Discovery, family: Family) -> dict[str, Any]:
    return {
        "pattern": family.pattern,
        "members": [_finding_json(found, m) | {"target": None} for m in family.members],
        "strays": list(family.strays),
        "target": target_keys(family.first, found.names[family.key], family.pattern),
    }
