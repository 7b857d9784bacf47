"""Every name the operator is handed exists: the config keys, metric names and commands that the
alert rules' runbooks and expressions, the Grafana dashboard and the docs (README.md, docs/*.md)
name are keys the config parser accepts, metrics a real worker serves, and subcommands (with
their options) of `pg-purge`. A runbook once said to raise `batch_size`, a key no config takes.

The accepted names are read from the code itself (the parser's key sets, worker.py's argparse
parser, a real worker's /metrics), never from a copy of them here."""

from __future__ import annotations

import argparse
import json
import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import psycopg
import yaml
from temporalio.client import Client

import worker
from activities.registry import PurgeTarget
from purge_config.file import _TOP_KEYS
from purge_config.fleet import _DATABASE_KEYS, _PASS_KEYS
from purge_config.schedules import _NAMED_KEYS
from purge_config.specs import _ENTRY_KEYS, SWEEP_FLAGS, SWEEP_KEYS, SWEEP_PACING
from tests.support.servers import RunningTemporal
from tests.test_ops_deploy import PROMETHEUS_METRICS, Uses, recorded_names, rule_expressions
from tests.test_ops_metrics import pages_around_passes

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "deploy" / "prometheus" / "purge-rules.yml"
DASHBOARDS = sorted((REPO / "deploy" / "grafana").glob("*.json"))
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# -- what the code accepts ------------------------------------------------------------------

#: Each config table's keys, as the parser checks them (`databases` is `[databases.NAME]`,
#: `targets` is `[[targets]]`, whose entries take every kind's keys).
SECTION_KEYS: dict[str, frozenset[str]] = {
    "schedule": _NAMED_KEYS - {"targets"},
    "schedules": _NAMED_KEYS,
    "sweep": frozenset({*SWEEP_KEYS, *SWEEP_FLAGS, *SWEEP_PACING}),
    "pass": _PASS_KEYS,
    "databases": _DATABASE_KEYS,
    "targets": frozenset().union(*_ENTRY_KEYS.values()),
}
CONFIG_KEYS = _TOP_KEYS.union(*SECTION_KEYS.values())

#: `key = value` in the docs that is not a key of our config, each with what it is instead.
NOT_CONFIG = {
    "synchronous_commit": "a PostgreSQL setting the sweep's transactions use (docs/sweeping.md)",
    "strategy": "a field of a sweep's report (PurgeSweep.strategy), not something to configure",
    "pool_mode": "PgBouncer's own setting (docs/operating.md, Through a connection pooler)",
}
#: `[name]` in the docs that is a pip extra of the package, not a config table.
EXTRAS = frozenset(
    tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
)

#: Metrics named in the docs that no test's worker can serve, each with why. Empty: every one
#: the docs name is served from 0 after one ordinary pass (tests/test_ops_metrics.py).
NOT_PRODUCED: dict[str, str] = {}

#: `purge_...` names in the docs that are not metrics: the package's directories, the tables
#: activities/schema.sql creates, and the method a target implements.
PACKAGES = frozenset(p.name for p in REPO.iterdir() if (p / "__init__.py").exists())
TABLES = frozenset(
    re.findall(r"^CREATE TABLE (\w+)", (REPO / "activities" / "schema.sql").read_text(), re.M)
)
TARGET_METHODS = frozenset(name for name in vars(PurgeTarget) if name.startswith("purge_"))


def subcommands() -> dict[str, frozenset[str]]:
    """worker.py's subcommands, each with its option strings."""
    [sub] = [a for a in worker.parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return {
        name: frozenset(command._option_string_actions) for name, command in sub.choices.items()
    }


# -- what the files name --------------------------------------------------------------------


#: What a name in a file claims to be.
What = Literal["key", "section", "metric", "command"]


@dataclass(frozen=True)
class Named:
    """One name a file hands the operator: what it claims to be, the name, and where."""

    what: What
    name: str
    where: str


_SPAN = re.compile(r"`([^`]+)`")
_FENCE = re.compile(r"^\s*```")
#: `[sweep]`, `[[targets]]`, `[databases.NAME]`
_SECTION = re.compile(r"\[\[?([a-z_]+)(?:\.[A-Za-z_]+)?\]\]?")
#: `[pass] budget`, or the same in a runbook's prose
_SECTION_KEY = re.compile(r"\[([a-z_]+)(?:\.[A-Za-z_]+)?\]\s+([a-z_][a-z0-9_]*)\b(?!\s*=\s*\S)")
#: `max_wal_rate = "32MB/s"`, `[sweep] busy_wait = "0s"`
_ASSIGNED = re.compile(r"^(?:\[\[?([a-z_]+)(?:\.[A-Za-z_]+)?\]\]?\s+)?([a-z_][a-z0-9_]*) = ")
#: purge_rows_removed, but not purge_ops/ or purge_config.specs (paths, modules) or a call
_PURGE_NAME = re.compile(r"(?<![\w/.])(purge_[a-z0-9_]+)\b(?![/.(\w])")
#: Every snake_case word of a runbook or a panel's description.
_SNAKE = re.compile(r"(?<![\w/.$])([a-z][a-z0-9]*(?:_[a-z0-9]+)+)\b(?![/.(])")
_COMMAND = re.compile(r"(?<![\w-])(?:pg-purge|worker\.py)[ \t]+([a-z][a-z-]*)([^`#|;&\n]*)")


def _commands(text: str, where: str) -> Iterator[Named]:
    for match in _COMMAND.finditer(text):
        options = [w.split("=", 1)[0] for w in match[2].split() if w.startswith("--")]
        yield Named("command", " ".join([match[1], *options]), where)


def _in_span(span: str, where: str) -> Iterator[Named]:
    """The names one code span of the docs or a runbook holds."""
    if table := _SECTION.fullmatch(span):
        yield Named("section", table[1], where)
    elif keyed := _SECTION_KEY.fullmatch(span):
        yield Named("key", f"{keyed[1]}.{keyed[2]}", where)
    elif assigned := _ASSIGNED.match(span):
        section, key = assigned[1], assigned[2]
        yield Named("key", f"{section}.{key}" if section else key, where)
    for name in _PURGE_NAME.findall(span):
        yield Named("metric", name, where)
    yield from _commands(span, where)


def in_docs() -> Iterator[Named]:
    """Code spans of README.md and docs/*.md, and the commands of their code blocks."""
    for page in PAGES:
        fenced = False
        for number, line in enumerate(page.read_text().splitlines(), 1):
            where = f"{page.relative_to(REPO)}:{number}"
            if _FENCE.match(line):
                fenced = not fenced
                continue
            if fenced:
                yield from _commands(line, where)
                continue
            for span in _SPAN.findall(line):
                yield from _in_span(span, where)


def _prose(text: str, where: str) -> Iterator[Named]:
    """A runbook or a panel's description: every `[section] key`, and every snake_case word,
    which there is a config key or a metric."""
    for section, key in _SECTION_KEY.findall(text):
        yield Named("key", f"{section}.{key}", where)
    bare = _SECTION_KEY.sub(" ", text)
    for word in _SNAKE.findall(bare):
        yield Named("metric" if word.startswith("purge_") else "key", word, where)
    for span in _SPAN.findall(text):
        yield from _commands(span, where)


def in_rules() -> Iterator[Named]:
    """The rules' runbooks, and the metrics their expressions read."""
    recorded = recorded_names()
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            where = f"{RULES.relative_to(REPO)}: {rule.get('alert') or rule.get('record')}"
            runbook = rule.get("annotations", {}).get("runbook", "")
            yield from _prose(runbook, f"{where} runbook")
    for expr in rule_expressions():
        for metric in Uses(expr).metrics - PROMETHEUS_METRICS - recorded:
            yield Named("metric", metric, f"{RULES.relative_to(REPO)}: {expr.strip()!r}")


def in_dashboards() -> Iterator[Named]:
    """Each panel's queries' metrics, and its title's and description's names."""
    for path in DASHBOARDS:
        for where, key, text in _strings(json.loads(path.read_text()), path.name):
            if key == "expr":
                for metric in Uses(text).metrics - PROMETHEUS_METRICS:
                    yield Named("metric", metric, where)
            elif key in ("title", "description"):
                yield from _prose(text, where)


def _strings(node: Any, where: str, key: str = "") -> Iterator[tuple[str, str, str]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _strings(v, f"{where}.{k}", k)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _strings(v, f"{where}[{i}]", key)
    elif isinstance(node, str):
        yield where, key, node


def everything() -> list[Named]:
    return [*in_rules(), *in_dashboards(), *in_docs()]


# -- the checks -----------------------------------------------------------------------------


def wrong_keys(names: list[Named]) -> list[str]:
    wrong: list[str] = []
    for n in names:
        if n.what == "section" and n.name not in SECTION_KEYS and n.name not in EXTRAS:
            wrong.append(f"{n.where}: [{n.name}] is no config table")
        elif n.what == "key" and "." in n.name:
            section, key = n.name.split(".", 1)
            if key not in SECTION_KEYS.get(section, ()):
                wrong.append(f"{n.where}: [{section}] takes no key {key!r}")
        elif n.what == "key" and n.name not in CONFIG_KEYS and n.name not in NOT_CONFIG:
            wrong.append(f"{n.where}: no config takes a key {n.name!r}")
    return wrong


def wrong_commands(names: list[Named]) -> list[str]:
    known = subcommands()
    wrong: list[str] = []
    for n in names:
        if n.what != "command":
            continue
        command, *options = n.name.split()
        if command not in known:
            wrong.append(f"{n.where}: pg-purge has no command {command!r} (only {sorted(known)})")
        else:
            wrong += [
                f"{n.where}: pg-purge {command} has no {o}"
                for o in options
                if o not in known[command]
            ]
    return wrong


def wrong_metrics(names: list[Named], served: set[str]) -> list[str]:
    others = PACKAGES | TABLES | TARGET_METHODS
    return [
        f"{n.where}: {n.name} is no metric a worker serves"
        for n in names
        if n.what == "metric"
        and n.name not in others
        and n.name not in NOT_PRODUCED
        and not {n.name, f"{n.name}_bucket"} & served
    ]


class TestNamedThings:
    """Each name the rules, the dashboard and the docs hand an operator is a real one."""

    def test_every_config_key_and_table_named_is_one_the_parser_accepts(self) -> None:
        wrong = wrong_keys(everything())
        assert not wrong, "\n".join(wrong)

    def test_every_command_named_is_a_subcommand_with_those_options(self) -> None:
        wrong = wrong_commands(everything())
        assert not wrong, "\n".join(wrong)

    async def test_every_metric_named_is_served_by_a_real_worker(
        self,
        tmp_path: Path,
        temporal_server: RunningTemporal,
        client: Client,
        schema_url: str,
        task_queue: str,
        db: psycopg.Connection[Any],
        real_now: int,
    ) -> None:
        pages = await pages_around_passes(
            tmp_path, temporal_server, client, schema_url, task_queue, db, real_now
        )
        served = set().union(*pages)
        wrong = wrong_metrics(everything(), served)
        assert not wrong, "\n".join(wrong)


class TestTheReader:
    """The checks above are not vacuous: the reader finds the names the files use, and the
    runbook's old mistakes."""

    def test_it_finds_keys_metrics_and_commands_in_each_kind_of_file(self) -> None:
        found = {(n.what, n.name) for n in everything()}
        assert {
            ("key", "pass.budget"),  # a runbook's prose
            ("key", "sweep.time_budget"),
            ("key", "max_wal_rate"),  # a panel's description
            ("metric", "purge_backlog_rows"),  # an expression
            ("metric", "purge_batch_p95_seconds"),  # the dashboard
            ("section", "sweep"),  # the docs
            ("key", "partitions"),
            ("command", "report --last"),  # a runbook and the docs
            ("command", "schedule --print-input"),  # a runbook's, and the docs' own
        } <= found

    def test_it_flags_the_runbook_that_named_batch_size(self) -> None:
        old = (
            "last sweeps (`pg-purge report --last 6`): raise [pass] budget or batch_size, lift"
            " pacing (max_wal_rate, max_replica_lag); `pg-purge reports --lats 3`"
        )
        names = list(_prose(old, "old runbook"))
        assert wrong_keys(names) == ["old runbook: no config takes a key 'batch_size'"]
        assert wrong_commands(names) == [
            f"old runbook: pg-purge has no command 'reports' (only {sorted(subcommands())})"
        ]
        assert wrong_commands([Named("command", "report --lats", "x")]) == [
            "x: pg-purge report has no --lats"
        ]
        assert wrong_metrics([Named("metric", "purge_batch_p99_seconds", "x")], {"purge_x"})

    def test_the_allow_lists_hold_only_names_the_docs_use(self) -> None:
        """An entry nothing names any more goes, so the lists cannot grow stale."""
        named = {n.name for n in in_docs()}
        assert set(NOT_CONFIG) | set(NOT_PRODUCED) <= named
        assert set(SECTION_KEYS) <= _TOP_KEYS
        assert "purge_expired" in TARGET_METHODS
