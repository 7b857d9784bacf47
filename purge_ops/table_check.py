"""`pg-purge check`: each target's tables against its database now, as a pass would find them
before its first delete, with nothing deleted or counted and no Temporal asked anything.

A target is checked as its sweep checks it (the table exists; its columns, their types and
epoch units; with `partitions` set, the rights to take them out) and for the rights its batches
need (SELECT and DELETE on each table, INSERT on an archive), which a sweep learns only at its
first DELETE. A pattern is checked for every table it matches now. A `python` target's
factory is asked once, as a worker asks it for every step, for the names the config gives it;
its targets' own code is not run. A database whose URL this config lacks (a region's, known
only to the workers next to it) is not reached.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import cast

import psycopg

from activities.builtin_kinds import build_match, build_target
from activities.engine.access import ConnectionSource
from activities.engine.errors import EngineError
from activities.engine.rules import ident
from activities.engine.sql_target import SqlTarget
from activities.errors import BadPurgeTarget
from activities.pattern_matches import PatternTargets
from activities.registry import CountingTarget, FactoryAnswers, TargetFactory, TargetRegistry
from activities.spread_steps import PatternStep
from purge_config.errors import first_line
from purge_config.file import PurgeConfig
from purge_config.specs import TargetSpec
from purge_ops.connect import open_pool

#: The failing matches of one pattern a check names; past them it counts.
NAMED_FAILURES = 20
#: The tables two targets share that one line of advice names; past them it counts.
SHARED_NAMED = 3


@dataclass
class Verdict:
    """One target's check: its name, the tables checked, what is wrong (one line each), and
    the advice a pass would give."""

    name: str
    tables: int = 0
    problems: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)
    skipped: str = ""
    """Why it was not checked (a database this config has no URL for, a python entry whose
    factory gave no target)."""
    label: str = ""
    """What its line says of it in place of its tables: a python target's, the names its
    factory gave."""


async def check_config(
    config: PurgeConfig, names: Sequence[str], say: Callable[[str], None]
) -> int:
    """Check `names` (every target of `config` when empty), one line each, advice below; the
    exit status: 0 when every checked target would be swept, 1 when any would be refused."""
    # A python target is named by its factory's `names` (its own name is the factory's path).
    specs = [
        s
        for s in config.targets
        if not names or s.name in names or (s.kind == "python" and set(s.names) & set(names))
    ]
    now_ms = int(time.time() * 1000)
    async with AsyncExitStack() as stack:
        pools: dict[str, ConnectionSource] = {}
        for database in sorted({s.database for s in specs if s.kind != "python"}):
            # The default database's URL is required (a config error without it); a named
            # one's may be known only to the workers next to it.
            url = (
                config.require_database_url() if database == "" else config.databases.get(database)
            )
            if url:
                wait_s = config.database_wait_ms / 1000
                pool = await open_pool(url, wait_seconds=wait_s)
                pools[database] = await stack.enter_async_context(pool)
        verdicts = []
        swept: list[tuple[Verdict, str, SqlTarget]] = []
        python = any(s.kind == "python" for s in config.targets)
        answers, givers = _asked(config) if python else ({}, {})
        for spec in specs:
            if spec.kind == "python":
                wanted = [n for n in spec.names if not names or n in names]
                verdict = _check_factory(spec, answers[spec.name], wanted, givers)
            elif spec.database not in pools:
                verdict = Verdict(
                    spec.name,
                    skipped=f"database {spec.database!r} has no URL in this config (its workers' "
                    "configs have it)",
                )
            elif spec.pattern is not None:
                verdict = await _check_pattern(spec, pools[spec.database], now_ms, swept)
            else:
                verdict = Verdict(spec.name)
                if len(givers.get(spec.name, ())) > 1:
                    verdict.problems.append(_given_twice(spec.name, givers, spec.name))
                target = build_target(spec, pools[spec.database])
                checked = await _check_target(target, now_ms, verdict)
                if checked is not None:
                    swept.append((verdict, spec.database, checked))
            verdicts.append(verdict)
        await _shared_tables(swept, pools)
    for verdict in verdicts:
        say(_line(verdict))
        for line in verdict.advice:
            say(f"        advice: {line}")
    return 1 if any(v.problems for v in verdicts) else 0


def _asked(config: PurgeConfig) -> tuple[dict[str, FactoryAnswers], dict[str, list[str]]]:
    """Every python entry's factory asked once, as a worker asks it at every step, checked
    entry or not (a name two of them give, or one of them and an entry, fails on the worker
    whichever is checked): each one's answer by the entry's name, and each name given with the
    entries that give it."""
    answers: dict[str, FactoryAnswers] = {}
    givers: dict[str, list[str]] = {}
    for spec in config.targets:
        if spec.pattern is not None:
            continue  # its matches' names are `NAME@...`; a factory's target wins over one
        if spec.kind == "python":
            # Checked against the PurgeTarget protocol as it is asked, as by a worker's registry.
            factory = cast(TargetFactory, spec.factory)
            answers[spec.name] = TargetRegistry(factories=[factory]).ask_factories()
        given = answers[spec.name].found if spec.kind == "python" else (spec.name,)
        for name in given:
            givers.setdefault(name, []).append(spec.name)
    return answers, givers


def _check_factory(
    spec: TargetSpec, asked: FactoryAnswers, wanted: list[str], givers: dict[str, list[str]]
) -> Verdict:
    """A python entry's factory's answer (`_asked`): whether it gives a target for each of
    `wanted`, whether a name it gives is given twice (by it, by another factory or an entry
    of the config, `givers`: the worker refuses such a name, `DuplicatePurgeTarget`), and
    which of `wanted` a dry run could count. One that gives no target at all is said skipped,
    not failed: a factory whose targets the application's own start-up builds gives them only
    in a worker built in code (docs/own-targets.md), which `check` is not; `pg-purge run` runs
    none of that start-up either."""
    verdict = Verdict(spec.name, label="python")
    if asked.failed:
        verdict.problems += [message for message, _ in asked.failed]
        return verdict
    if not asked.found:
        verdict.skipped = (
            "its factory gave no target when asked: a pass's step on a worker that runs it so "
            "(`pg-purge run`) fails UnknownPurgeTarget; one whose targets your application's "
            "start-up builds gives them only in a worker built in code"
        )
        return verdict
    for name in sorted(asked.found):
        if name in asked.clashes or len(givers.get(name, ())) > 1:
            verdict.problems.append(_given_twice(name, givers, spec.name))
    gave = ", ".join(sorted(asked.found))
    given = []
    for name in wanted:
        target = asked.found.get(name)
        if target is None:
            verdict.problems.append(
                f"it gives no target named {name!r} (asked now, it gave {gave}); a pass's step "
                "for it would fail UnknownPurgeTarget"
            )
            continue
        given.append(name)
        if not isinstance(target, CountingTarget):
            verdict.advice.append(
                f"{name} has no count_expired: a dry run of it fails (DryRunUnsupported)"
            )
    if given:
        verdict.label = f"python, gives {', '.join(given)}"
    return verdict


def _given_twice(name: str, givers: dict[str, list[str]], own: str) -> str:
    """The problem of a target name more than one target gives (`_asked`), on entry `own`."""
    others = list(givers.get(name, []))
    if own in others:
        others.remove(own)  # once: a factory named by two entries is named again
    by = f"it and {', '.join(others)}" if others else "it, twice"
    return f"{name!r} is given by {by}: a pass's step for it would fail DuplicatePurgeTarget"


async def _check_target(
    target: object, now_ms: int, verdict: Verdict, match: str | None = None
) -> SqlTarget | None:
    """`target` checked into `verdict`, and returned where a pass would sweep it; a pattern's
    `match` named in what is wrong."""
    assert isinstance(target, SqlTarget)  # every kind but python is built as one
    verdict.tables += len(target.rules)
    label = f"{match}: " if match else ""
    try:
        verdict.advice += await target.check(now_ms)
    except EngineError as err:
        verdict.problems.append(f"{label}{first_line(err)}")
    except psycopg.Error as err:
        # A statement the server refused (a lock held past lock_timeout, a timeout): said as
        # the server said it, on its first line (never a DETAIL, which may quote a row).
        verdict.problems.append(f"{label}{type(err).__name__}: {first_line(err)}")
    else:
        return target
    return None


async def _shared_tables(
    swept: list[tuple[Verdict, str, SqlTarget]], pools: dict[str, ConnectionSource]
) -> None:
    """Advice under each target that sweeps, with no filter, a table an earlier one also
    sweeps with none (a listed target or a pattern's match alike): a row then goes as soon as
    either rule holds (of two ages, the shorter), most often an entry copied and its table left
    as it was. Tables are told apart as the database resolves their names, so `sessions` and
    `public.sessions` are one."""
    plain = [
        (verdict, database, rule.table)
        for verdict, database, target in swept
        for rule in target.rules
        if getattr(rule, "row_filter", None) is None
    ]
    # Per target, per earlier target: the tables they share, said in one line.
    shared: dict[tuple[str, str], tuple[Verdict, list[str]]] = {}
    for database in dict.fromkeys(database for _, database, _ in plain):
        tables = [(verdict, table) for verdict, where, table in plain if where == database]
        # One read a database: each name resolved as its sweep's connection resolves it.
        async with pools[database].connection() as conn:
            names = [ident(table).as_string(conn) for _, table in tables]
            cur = await conn.execute(
                "SELECT to_regclass(t)::oid FROM unnest(%s::text[]) WITH ORDINALITY u(t, o)"
                " ORDER BY o",
                (names,),
            )
            oids = [row[0] for row in await cur.fetchall()]
        seen: dict[int, list[str]] = {}
        for (verdict, table), oid in zip(tables, oids, strict=True):
            if oid is None:
                continue
            names_of = seen.setdefault(int(oid), [])
            for earlier in names_of:
                if earlier != verdict.name:
                    shared.setdefault((verdict.name, earlier), (verdict, []))[1].append(str(table))
            if verdict.name not in names_of:
                names_of.append(verdict.name)
    for (_, earlier), (verdict, both) in shared.items():
        if len(both) == 1:
            verdict.advice.append(
                f"{both[0]} is also swept by {earlier} with no filter: each of its rows goes "
                "as soon as either target's rule holds"
            )
            continue
        shown = ", ".join(both[:SHARED_NAMED])
        more = f" and {len(both) - SHARED_NAMED} more" if len(both) > SHARED_NAMED else ""
        verdict.advice.append(
            f"{len(both)} of its tables ({shown}{more}) are also swept by {earlier} with no "
            "filter: each of their rows goes as soon as either target's rule holds"
        )


async def _check_pattern(
    spec: TargetSpec,
    pool: ConnectionSource,
    now_ms: int,
    swept: list[tuple[Verdict, str, SqlTarget]],
) -> Verdict:
    """Every table the pattern matches now, each as a listed target is checked; those a pass
    would sweep added to `swept`."""
    patterns = PatternTargets([(spec, pool)], build_match)
    verdict = Verdict(spec.name)
    after: list[str] = []
    while True:
        page = await patterns.expand(PatternStep(spec.name, now_ms, after=after))
        for name in page.matches:
            try:
                resolved = patterns.resolve(name)
            except BadPurgeTarget as err:
                # Refused as its match's sweep is (a companion name PostgreSQL would cut).
                verdict.tables += 1
                verdict.problems.append(f"{name}: {err.message}")
                continue
            target = await _check_target(resolved, now_ms, verdict, name)
            if target is not None:
                swept.append((verdict, spec.database, target))
        if not page.more:
            break
        after = page.last
    if verdict.tables == 0:
        # Not refused (a pass of it sweeps nothing and fails nothing: a new application may
        # have no tenant yet), but most often a misspelt schema or table part.
        verdict.advice.append(
            f"the pattern {spec.tables[0]} matches no table now: a pass sweeps nothing for it "
            "(is its schema or table part misspelt?)"
        )
    return verdict


def _line(verdict: Verdict) -> str:
    if verdict.skipped:
        return f"skipped {verdict.name}: {verdict.skipped}"
    tables = verdict.label or f"{verdict.tables} table{'s' if verdict.tables != 1 else ''}"
    if not verdict.problems:
        return f"ok      {verdict.name} ({tables})"
    shown = verdict.problems[:NAMED_FAILURES]
    more = len(verdict.problems) - len(shown)
    tail = f"; and {more} more" if more else ""
    return f"FAILED  {verdict.name} ({tables}): {'; '.join(shown)}{tail}"
