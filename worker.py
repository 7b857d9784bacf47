"""The command line: `python worker.py COMMAND` (run, schedule, sweep, report, replay, check,
dev, schema, discover: `--help`).

Installed as `pg-purge`. Also the entry point for teams that build their worker in code: see
`new_worker`.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import logging
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NoReturn

PROG = "pg-purge"

# This distribution's top-level names. They are common ones (many Temporal applications have
# `workflows` and `activities`), and every one of them sits beside this file: in a checkout, in
# an editable install (setuptools maps them to the checkout) and in site-packages.
OUR_TOP_LEVEL = ("workflows", "activities", "purge_config", "purge_ops", "purge_dev", "worker")


def foreign_top_level() -> str | None:
    """Why our own packages would not be the ones imported, or None when they would.

    Another package of one of our names earlier on sys.path (an application's `activities`, say)
    would be imported in place of ours, and this program would fail deep in an import, or run
    someone else's code. The answer is one line that names what was found instead."""
    here = Path(__file__).resolve().parent
    foreign: list[tuple[str, str]] = []  # (name, where it was found)
    missing: list[str] = []
    for name in OUR_TOP_LEVEL:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):  # ValueError: imported already, without a spec
            spec = None
        if spec is None:
            missing.append(name)
            continue
        if spec.origin is not None and spec.has_location:
            found = Path(spec.origin)  # a package's origin is its __init__.py
            if spec.submodule_search_locations is not None:
                found = found.parent
        elif spec.submodule_search_locations:  # a namespace package: a folder without __init__
            found = Path(next(iter(spec.submodule_search_locations)))
        else:
            foreign.append((name, spec.origin or "?"))
            continue
        if found.resolve().parent != here:
            foreign.append((name, str(found)))
    if foreign:
        names = ", ".join(name for name, _ in foreign)
        paths = ", ".join(path for _, path in foreign)
        other = "another package named" if len(foreign) == 1 else "other packages named"
        comes = "comes" if len(foreign) == 1 else "come"
        return (
            f"{PROG}: {other} {names} {comes} first on the path ({paths}), not this "
            f"distribution's (in {here}); run {PROG} in its own virtual environment "
            "(README: 'Its own service')"
        )
    if missing:
        return f"{PROG}: {', '.join(missing)} not found beside {here}; reinstall temporal-pg-purge"
    return None


def _started_as_command() -> bool:
    """True in `python worker.py`, `python -m worker` and the `pg-purge` script, which imports
    this module before it calls `cli` (the script's name as pip's wrapper reads it)."""
    script = re.sub(r"(-script\.pyw?|\.exe)?$", "", Path(sys.argv[0] if sys.argv else "").name)
    return __name__ == "__main__" or script == PROG


# Before anything of ours is imported: the command says what is wrong in one line and exits 2; an
# application that imports this module gets an ImportError that says the same.
if (_clash := foreign_top_level()) is not None:
    if _started_as_command():
        print(_clash, file=sys.stderr)
        raise SystemExit(2)
    raise ImportError(_clash, name=__name__, path=__file__)

import psycopg
from temporalio.service import RPCError, RPCStatusCode

from activities.input_checks import duplicate_names
from purge_config.errors import ConfigError, first_line
from purge_config.file import (
    PurgeConfig,
    check_metrics_address,
    config_path,
    database_url_only,
    load_config,
    path_shown,
)
from purge_config.names import STEP_NAME
from purge_config.patterns import split_match_name
from purge_config.specs import TargetSpec
from purge_config.values import hidden, masked
from purge_ops import ddl, discover_render, logs
from purge_ops import discover as discovery
from purge_ops.checks import check_passes, check_targets
from purge_ops.connect import connect_temporal
from purge_ops.passes import (
    SweepInterrupted,
    UnreadableHistory,
    passes_json,
    passes_table,
    pattern_tables,
    recent_passes,
    replay,
    schedules_report,
    sweep,
    tables_json,
    tables_table,
)
from purge_ops.runner import new_worker, run_worker
from purge_ops.schedule import ScheduleConflict, ensure_schedules, pass_timeout
from purge_ops.table_check import check_config

if TYPE_CHECKING:
    from temporalio.client import Client

__all__ = ["cli", "main", "new_worker"]

COMMANDS = ("run", "schedule", "sweep", "report", "replay", "schema", "check", "discover", "dev")


class _Parser(argparse.ArgumentParser):
    """argparse's parser, but a usage error is one line on stderr, as every other bad input is
    (argparse's own is the usage, then the error), and exits 2."""

    def error(self, message: str) -> NoReturn:
        # argparse quotes the arguments it refuses ('x', or every one it did not expect, bare):
        # a connection string typed where another argument goes (`pg-purge check URL`, as
        # `discover` takes one) is said by its length, never its password; from its first word
        # that may hold one to the end, since a keyword string's password may follow a space
        # (`password = s3cret`, `password='my secret'`).
        said = message
        for word in re.finditer(r"'[^']*'|\S+", message):
            if masked(word.group()) != word.group():
                said = message[: word.start()] + hidden(message[word.start() :])
                break
        self.exit(2, f"{self.prog}: {said} (see {self.prog} --help)\n")


def parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    top: argparse.ArgumentParser = _Parser(
        prog=PROG,
        description="Retention sweeps for PostgreSQL, run as Temporal workflows.",
        epilog="Temporal: TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TEMPORAL_PROFILE "
        "(default localhost:7233). Database: database_url in the config or PURGE_DATABASE_URL.",
    )
    sub = top.add_subparsers(dest="command", metavar="command")
    _worker_commands(sub)
    _reading_commands(sub)
    _schema_command(sub)
    _check_command(sub)
    _discover_command(sub)
    dev = sub.add_parser(
        "dev",
        help="embedded Temporal and PostgreSQL with demo rows, a worker, and one pass now",
    )
    dev.add_argument("--once", action="store_true", help="exit after the first pass")
    return top


def _worker_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The commands that run or start work: run, schedule, sweep."""
    run = sub.add_parser("run", help="run a worker on the task queue until SIGINT/SIGTERM")
    _config_option(run)
    run.add_argument(
        "--schedule",
        action="store_true",
        help="create or update the schedule at start (also: [schedule] ensure = true)",
    )
    run.add_argument(
        "--metrics",
        metavar="HOST:PORT",
        type=_metrics_address,
        help="serve Prometheus metrics at http://HOST:PORT/metrics (also: metrics = ...)",
    )
    run.add_argument(
        "--max-sweeps",
        type=_positive,
        metavar="N",
        help="run at most N sweeps at once on each queue this worker polls (default: the SDK's "
        "100); a machine's own size, where [pass] limits are the whole pass's",
    )

    schedule = sub.add_parser("schedule", help="create or update the schedule from the config")
    _config_option(schedule)
    schedule.add_argument(
        "--print-input",
        nargs="?",
        const="",
        metavar="NAME",
        help="print the input of its passes as JSON (of [schedules.NAME] where there are named "
        "schedules), for `temporal schedule create --input`, and change nothing",
    )

    sweep = sub.add_parser("sweep", help="one pass now, through Temporal; prints the report")
    _config_option(sweep)
    sweep.add_argument("--dry-run", action="store_true", help="count, delete nothing")
    sweep.add_argument(
        "--target",
        action="append",
        metavar="NAME",
        type=_target_name,
        help="sweep only this target (repeatable); default: every target of the config",
    )
    sweep.add_argument(
        "--schedule",
        metavar="NAME",
        type=_target_name,
        help="the targets of [schedules.NAME], through that schedule (its overlap policy; a"
        " --dry-run starts a pass of its own)",
    )


def _reading_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The commands that read what passes did: report, replay."""
    report = sub.add_parser("report", help="recent passes, removed per target, as a table")
    _config_option(report)
    report.add_argument("--last", type=_positive, default=10, metavar="N", help="default 10")
    report.add_argument(
        "--json",
        action="store_true",
        help="print the passes (or, with --tables, the matches) as JSON, for scripts",
    )
    report.add_argument(
        "--tables",
        metavar="NAME",
        type=_target_name,
        help="each table a pattern target matched in its newest pass, from the child workflows",
    )

    replay = sub.add_parser(
        "replay",
        help="replay recent passes' histories (or history files) against this code",
    )
    _config_option(replay)
    replay.add_argument("--last", type=_positive, default=20, metavar="N", help="default 20")
    replay.add_argument(
        "files",
        nargs="*",
        type=Path,
        metavar="FILE",
        help="history JSON (as `temporal workflow show -o json` writes it) instead of the cluster",
    )


def _schema_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    schema = sub.add_parser(
        "schema",
        help="print (or --apply) the tables the config needs: the ledger and the advice table",
    )
    _config_option(schema)
    schema.add_argument(
        "--apply",
        action="store_true",
        help="create the missing ones in every database the config sweeps (the role's right to "
        "create is checked in each first)",
    )
    schema.add_argument(
        "--kinds",
        action="store_true",
        help="also the reference tables of the built-in kinds the config sweeps",
    )


def _check_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = sub.add_parser(
        "check",
        help="check each target's tables against its database now, as a pass would before its "
        "first delete: nothing deleted or counted, no Temporal",
    )
    _config_option(check)
    check.add_argument(
        "--target",
        action="append",
        metavar="NAME",
        type=_target_name,
        help="check only this target (repeatable); default: every target of the config",
    )


def _discover_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    discover = sub.add_parser(
        "discover",
        help="read a database (read-only) and print a commented config to start from",
    )
    discover.add_argument(
        "url",
        nargs="?",
        metavar="URL",
        help="the database (default: $PURGE_DATABASE_URL, else the config's database_url)",
    )
    _config_option(discover)
    discover.add_argument("--json", action="store_true", help="the findings as JSON, for tools")


def _config_option(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--config",
        metavar="FILE",
        help="the TOML config (default: $PURGE_CONFIG, else ./purge.toml)",
    )


def _metrics_address(text: str) -> str:
    """`--metrics`, checked as the config's `metrics` is (`HOST:PORT`, a port from 1)."""
    try:
        return check_metrics_address(text, "--metrics")
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--metrics: ")) from None


def _target_name(text: str) -> str:
    if not STEP_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(f"not a target name: {text!r}")
    return text


#: The most `--max-sweeps` and `--last` take: the SDK's slots and a history's listing are
#: sized from them, and a larger number is a typo.
MOST = 100_000


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MOST:
        raise argparse.ArgumentTypeError(f"want a whole number from 1 to {MOST:,}, got {text!r}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; the exit status: 0 done, 1 failed, 2 bad config or usage, 130
    interrupted (Ctrl-C)."""
    args = list(sys.argv[1:] if argv is None else argv)
    # `run` is the default command: `python worker.py --config F` runs a worker.
    if not args or (args[0] not in COMMANDS and args[0] not in ("-h", "--help")):
        args.insert(0, "run")
    opts = parser().parse_args(args)
    # `dev` prints its own report; only warnings from the worker belong on that screen.
    logs.configure(logging.INFO if opts.command == "run" else logging.WARNING)
    try:
        return asyncio.run(_dispatch(opts))
    except ConfigError as err:
        print(f"{PROG}: config error: {err}", file=sys.stderr)
        return 2
    except UnreadableHistory as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    except (ConnectionError, OSError) as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 1
    except psycopg.DatabaseError as err:
        # A server's refusal a command met after it connected (a catalog read past discover's
        # statement_timeout, say): its first line, never a DETAIL that may quote a row.
        print(f"{PROG}: the database refused: {first_line(err)}", file=sys.stderr)
        return 1
    except RuntimeError as err:
        # The Temporal client reports an unreachable server as a RuntimeError.
        if "connect" not in str(err).lower():
            raise
        print(f"{PROG}: cannot reach Temporal: {err}", file=sys.stderr)
        return 1
    except ScheduleConflict as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 1
    except RPCError as err:
        # A refusal from the server (a namespace that does not exist, a permission): its own
        # message names what it refused.
        hint = ""
        if err.status == RPCStatusCode.NOT_FOUND and "namespace" in err.message.lower():
            hint = " (set TEMPORAL_NAMESPACE, or create it: temporal operator namespace create)"
        print(f"{PROG}: Temporal refused: {err.message}{hint}", file=sys.stderr)
        return 1
    except SweepInterrupted as err:
        # Only this command stops: a pass it started or waited on goes on in Temporal.
        print(f"{PROG}: interrupted; {err}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        # Before `sweep` waited on anything, or a second Ctrl-C while it wound down.
        went_on = "; a pass it started goes on in Temporal (`report` shows it)"
        print(f"{PROG}: interrupted{went_on if opts.command == 'sweep' else ''}", file=sys.stderr)
        return 130


def _say(text: str) -> None:
    print(text, flush=True)


async def _dispatch(opts: argparse.Namespace) -> int:
    command: str = opts.command
    if command == "dev":
        return await _dev(opts.once)
    if command == "replay" and opts.files:
        return await replay(None, "", opts.last, opts.files, _say)
    if command == "discover":
        return await _discover(opts)

    config = load_config(config_path(opts.config))
    if command == "schema":
        return await _schema(config, opts)
    if command == "check":
        # What run, schedule and sweep refuse before connecting, check says too.
        check_targets(config, "there is nothing to check")
        check_passes(config)
        return await _check(config, opts.target or [])
    if command in ("run", "schedule", "sweep"):
        check_passes(config)
    if command == "schedule" and opts.print_input is None:
        check_targets(config, "every pass of its schedule would sweep nothing")
    if command == "sweep":
        check_targets(config, "a sweep of it would sweep nothing")
    if command == "schedule" and opts.print_input is not None:
        return _print_input(config, opts.print_input)
    if command == "run":
        return await _run(config, opts)
    # What is wrong with the command line is said before Temporal is asked anything.
    planned = _sweep_plan(config, opts) if command == "sweep" else None
    if isinstance(planned, int):
        return planned
    if command == "report" and opts.tables and opts.tables not in config.pattern_targets:
        # A typo would otherwise read like a pattern target no pass swept yet.
        print(
            f"{PROG}: report --tables: the config names no pattern target {opts.tables!r} "
            f"(its pattern targets: {', '.join(config.pattern_targets) or 'none'})",
            file=sys.stderr,
        )
        return 2
    client = await connect_temporal()
    if command == "schedule":
        for outcome in await ensure_schedules(client, config):
            _say(f"{outcome.action} {outcome.summary}")
        return 0
    if planned is not None:
        request, schedule_id = planned
        ends_by = pass_timeout(config, request)
        return await sweep(client, config.task_queue, request, _say, schedule_id, ends_by)
    if command == "report":
        return await _report(client, config, opts)
    return await replay(client, config.task_queue, opts.last, [], _say)


def _print_input(config: PurgeConfig, name: str) -> int:
    """The input of the passes of the config's schedule (`[schedules.NAME]`'s with a name), as
    one line of JSON: what the temporal CLI's `--input` takes to start the passes the config
    would, routes and limits included. 2, said in one line, for a name the config lacks."""
    named = {spec.name: spec for spec in config.named_schedules}
    refused = ""
    if named and name not in named:
        refused = f"name one of the config's schedules ({', '.join(named)})"
    elif not named and name:
        refused = f"the config has one [schedule], no {name!r}: give no NAME"
    if refused:
        print(f"{PROG}: schedule --print-input: {refused}", file=sys.stderr)
        return 2
    spec = named[name] if name else config.schedule
    print(json.dumps(config.scheduled_input(spec), separators=(",", ":")))
    return 0


async def _dev(once: bool) -> int:
    # The dev harness only here: a production worker never loads it.
    from purge_dev.dev import run_dev
    from purge_dev.servers import EmbeddedServerError

    try:
        return await run_dev(once=once)
    except EmbeddedServerError as err:
        # The servers could not start: the message says why and what to do, no traceback.
        print(f"{PROG}: {err}", file=sys.stderr)
        return 1


async def _schema(config: PurgeConfig, opts: argparse.Namespace) -> int:
    need = ddl.needed(config, opts.kinds)
    if not opts.apply:
        # Quoted where it holds a newline: a line of the comment must not become SQL.
        what = path_shown(config.path) if config.path else "the config"
        _say(f"-- pg-purge schema: the tables {what} needs, which the sweep never creates")
        _say("".join(f"-- note: {line}\n" for line in need.notes) + ddl.ddl_text(need.tables))
        return 0
    for line in need.notes:
        _say(f"note: {line}")
    try:
        return await ddl.apply(config, need, _say)
    except ddl.SchemaRefused as err:
        print(f"{PROG}: schema: {err}", file=sys.stderr)
        return 1
    except psycopg.Error as err:
        # psycopg's own first line: it names host and port, never the password.
        print(f"{PROG}: schema: {str(err).strip().splitlines()[0]}", file=sys.stderr)
        return 1


async def _check(config: PurgeConfig, names: list[str]) -> int:
    unknown = [name for name in names if name not in config.target_names]
    if unknown:
        print(f"{PROG}: check --target: {_no_such_target(config, unknown[0])}", file=sys.stderr)
        return 2
    return await check_config(config, names, _say)


def _sweep_plan(
    config: PurgeConfig, opts: argparse.Namespace
) -> tuple[dict[str, object], str | None] | int:
    """`sweep`'s pass: its input and the schedule it goes through (if one starts this very
    pass); or 2, said in one line, for a bad request."""
    if opts.schedule is not None and opts.target:
        print(f"{PROG}: sweep: give --schedule or --target, not both", file=sys.stderr)
        return 2
    if opts.target and (refused := _unknown_targets(config, opts.target)):
        print(f"{PROG}: sweep --target: {refused}", file=sys.stderr)
        return 2
    if opts.schedule is not None:
        spec = next((s for s in config.named_schedules if s.name == opts.schedule), None)
        if spec is None:
            names = ", ".join(s.name for s in config.named_schedules) or "none: it has [schedule]"
            print(
                f"{PROG}: sweep --schedule: the config names no schedule {opts.schedule!r} "
                f"(its schedules: {names})",
                file=sys.stderr,
            )
            return 2
        request = config.scheduled_input(spec)
        if opts.dry_run:
            request["dry_run"] = True
    else:
        request = config.pass_input(opts.target, opts.dry_run)
    # The schedule that starts this very pass, if one does: the pass then goes through it.
    through = next((s for s in config.schedules if config.scheduled_input(s) == request), None)
    if through is None and not config.named_schedules:
        through = config.schedule  # it says why it starts a pass of its own
    return request, through.id if through else None


def _unknown_targets(config: PurgeConfig, names: list[str]) -> str:
    """Why `--target names` cannot be a pass of this config (empty when they can): a name given
    twice, a pattern target's `NAME@SUFFIX` whose suffix no table of the pattern could have or
    whose pattern is given too, or one the config does not name (known only where no `python`
    target's factory may provide more than its `names`)."""
    twice = duplicate_names(names)
    if twice:
        return f"{twice[0]!r} given twice"
    known = set(config.target_names)
    unknown: list[str] = []
    for name in names:
        if name in known:
            continue
        split = split_match_name(name)
        pattern = config.pattern_targets.get(split[0]) if split else None
        if pattern is None:
            unknown.append(name)
        elif refused := _misfit_table(pattern, name, names):
            # Whatever else the config holds: the pass takes `NAME@SUFFIX` as its pattern's.
            return refused
    if not unknown or any(t.kind == "python" for t in config.targets):
        # A python target's factory may provide targets beyond its `names`, known only to the
        # worker that builds them: a name the config does not list may be one of those.
        return ""
    return _no_such_target(config, unknown[0])


def _misfit_table(pattern: TargetSpec, name: str, names: list[str]) -> str:
    """Why `name`, a table of `pattern` named by hand, cannot be swept beside `names` (empty
    when it can)."""
    if pattern.matched(name) is None:
        # `sessions@tenant_0042` is one table of a pattern target; its suffix must fit.
        return (
            f"{name!r} names no table the pattern {pattern.name!r} "
            f"({pattern.tables[0]}) could match"
        )
    if pattern.name in names:
        # The pass would fail with DuplicatePurgeTarget once the pattern is expanded.
        return f"{name!r} is a table of {pattern.name!r}, which is given too"
    return ""


def _no_such_target(config: PurgeConfig, name: str) -> str:
    """The refusal of `name`, which the config does not name, listing what it does."""
    listed = ", ".join(config.target_names[:10])
    more = len(config.target_names) - 10
    return f"the config names no target {name!r} (its targets: {listed}" + (
        f" and {more} more)" if more > 0 else ")"
    )


async def _discover(opts: argparse.Namespace) -> int:
    # The conventions of every command: $PURGE_DATABASE_URL, else the config's database_url;
    # a URL given on the line comes first, since a new user may have no config yet.
    url = opts.url or os.environ.get("PURGE_DATABASE_URL") or None
    path = config_path(opts.config)
    # With no config named and none where one is looked for, a new user is told of the URL
    # first (resolve_url's line), not of a config file they may not need.
    if url is None and (opts.config or os.environ.get("PURGE_CONFIG") or path.exists()):
        try:
            url = load_config(path).database_url
        except ConfigError as err:
            # A config being written (an entry not right yet) must not keep discover, which
            # helps write it, from its database: the URL alone is read, and the error said.
            url = database_url_only(path)
            print(f"{PROG}: discover: {err} (reading only its database_url)", file=sys.stderr)
    url = discovery.resolve_url(opts.url, url)
    found = await discovery.discover(url)
    _say(discover_render.as_json(found) if opts.json else discover_render.as_toml(found, url))
    return 0


async def _report(client: Client, config: PurgeConfig, opts: argparse.Namespace) -> int:
    if opts.tables:
        found = await pattern_tables(client, config.task_queue, opts.tables, opts.last)
        if found is None:
            _say(f"no pass of the last {opts.last} swept a pattern target {opts.tables!r}")
            return 1
        _say(tables_json(*found) if opts.json else tables_table(*found))
        return 0
    if config.named_schedules and not opts.json:
        return await _report_schedules(client, config, opts.last)
    passes = await recent_passes(client, config.task_queue, opts.last)
    if opts.json:
        _say(passes_json(passes))
    elif not passes:
        _say(f"no passes on task queue {config.task_queue!r} yet")
    else:
        _say(passes_table(passes, config.target_names))
    return 0


async def _report_schedules(client: Client, config: PurgeConfig, last: int) -> int:
    schedules = config.named_schedules
    _say(await schedules_report(client, config.task_queue, schedules, config.target_names, last))
    return 0


async def _run(config: PurgeConfig, opts: argparse.Namespace) -> int:
    # `--schedule` writes every schedule of the config; else each that says `ensure = true`.
    ensure: bool | Literal["ensured"] = opts.schedule or (
        "ensured" if any(s.ensure for s in config.schedules) else False
    )
    if ensure:
        check_targets(config, "every pass of the schedule it writes at start would sweep nothing")
    if config.needs_default_database:
        config.require_database_url()
    await run_worker(
        config,
        ensure_schedule=ensure,
        metrics=opts.metrics or config.metrics,
        max_sweeps=opts.max_sweeps,
    )
    return 0


def cli() -> NoReturn:
    """The process entry point (`python worker.py`, the `pg-purge` script): `main`, then exit
    without interpreter teardown.

    The Temporal client's core threads can outlive CPython's finalization and abort the
    process ("PyGILState_Release ... finalizing", temporalio/sdk-python#300), seen here on short
    commands like `schedule`. Everything this program starts is stopped in `finally` blocks
    before `main` returns, so skipping teardown loses nothing once the streams are flushed.
    """
    status = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    cli()
