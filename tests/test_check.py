"""`pg-purge check`: each target's tables against its database, as a pass would find them
before its first delete, with nothing deleted or counted and Temporal never asked."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool

from activities import builtin_kinds as kinds
from activities.errors import BadPurgeTarget
from activities.inputs import PurgeStep
from activities.registry import TargetRegistry
from activities.sweep import PurgeActivities
from purge_config.names import TableName
from tests.conftest import Pools
from tests.support import ownpool_targets
from tests.support.activity import activity_env
from tests.support.procs import Done, clean_env, run_main, worker_config
from tests.support.rows import HOUR

#: No Temporal there: a check that asked it anything would fail to connect.
NO_TEMPORAL = clean_env(TEMPORAL_ADDRESS="127.0.0.1:1")

TOKENS = (
    '[[targets]]\nkind = "expiring"\nname = "tokens"\ntable = "tokens"\ncolumn = "expires_at"\n'
)


def tokens(db: psycopg.Connection[Any]) -> None:
    """Ten tokens, four expired by the wall clock (the check's own), and an id column of
    integers that read as no instant."""
    now_ms = int(time.time() * 1000)
    db.execute(
        "CREATE TABLE tokens (id bigint PRIMARY KEY, expires_at timestamptz NOT NULL,"
        " user_id bigint NOT NULL)"
    )
    db.execute(
        "INSERT INTO tokens SELECT g, to_timestamp((%s + (g - 5) * %s) / 1000.0), 100000 + g"
        " FROM generate_series(1, 10) g",
        (now_ms, HOUR),
    )


def count(db: psycopg.Connection[Any], table: str) -> int:
    row = db.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(row[0]) if row else 0


#: A python entry whose factory gives no target in `check`'s process.
GAVE_NOTHING = (
    "its factory gave no target when asked: a pass's step on a worker that runs it so "
    "(`pg-purge run`) fails UnknownPurgeTarget; one whose targets your application's start-up "
    "builds gives them only in a worker built in code"
)


async def check(path: Path, *args: str, **env: str) -> Done:
    return await asyncio.to_thread(
        run_main, "check", "--config", str(path), *args, env={**NO_TEMPORAL, **env}
    )


async def test_targets_that_a_pass_would_sweep_are_ok_and_nothing_is_deleted(
    tmp_path: Path, schema_url: str, db: psycopg.Connection[Any]
) -> None:
    tokens(db)
    targets = f'{TOKENS}\n[[targets]]\nkind = "idempotency"\n\n[[targets]]\nkind = "auth"\n'
    path = worker_config(tmp_path / "purge.toml", schema_url, "purge", targets)

    done = await check(path)

    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "ok      tokens (1 table)",
        "ok      x_idempotency (1 table)",
        "ok      x_auth (2 tables)",
    ]
    assert count(db, "tokens") == 10


async def test_a_python_target_named_by_its_names_is_said_skipped(
    tmp_path: Path, schema_url: str, db: psycopg.Connection[Any]
) -> None:
    """`check --target tmp_uploads`, a name a python target's `names` gives, whose factory gives
    nothing until an application's start-up builds its store (a worker built in code): its
    line says why it was skipped, where it once printed nothing and said 0."""
    tokens(db)
    targets = TOKENS + (
        '[[targets]]\nkind = "python"\nfactory = "tests.support.apptargets:targets"\n'
        'names = ["tmp_uploads"]\n'
    )
    path = worker_config(tmp_path / "purge.toml", schema_url, "purge", targets)

    done = await check(path, "--target", "tmp_uploads")

    assert done.returncode == 0, done.stdout + done.stderr
    [line] = done.stdout.splitlines()
    assert line == f"skipped tests.support.apptargets:targets: {GAVE_NOTHING}"


async def test_a_python_entrys_factory_is_asked_for_the_names_the_config_gives_it(
    tmp_path: Path, schema_url: str, db: psycopg.Connection[Any]
) -> None:
    """`check` asks each python entry's factory once, as a worker asks it at every step, and
    runs none of its targets' code: the documented factory gives tmp_uploads (ok); one whose
    target has no count_expired is ok, with the advice that a dry run of it fails; one that
    lacks a name the config gives it, one that raises, one that returns what is not a target,
    one that gives a name twice and one that gives the name of an entry of the config fail,
    one line each, as a pass's step would fail; so does that entry, checked alone or not.
    Exit 1."""
    tokens(db)

    def entry(factory: str, *names: str) -> str:
        listed = ", ".join(f'"{n}"' for n in names)
        return (
            f'[[targets]]\nkind = "python"\nfactory = "tests.support.{factory}"\n'
            f"names = [{listed}]\n"
        )

    targets = (
        entry("ownpool_targets:targets", "tmp_uploads")
        + entry("checked_factories:uncounted", "no_count", "no_such")
        + entry("checked_factories:raising", "app_rows")
        + entry("checked_factories:stray", "strays")
        + entry("checked_factories:doubled", "dup")
        + entry("checked_factories:shadowing", "own_rows")
        + TOKENS
    )
    path = worker_config(tmp_path / "purge.toml", schema_url, "purge", targets)

    # The documented factory's module builds its pool of APP_DATABASE_URL (never opened here),
    # once a process: forgotten after, or a later test of this process would find this one's.
    try:
        every = await check(path, APP_DATABASE_URL=schema_url)
        named = await check(path, "--target", "no_count", APP_DATABASE_URL=schema_url)
        tokens_only = await check(path, "--target", "tokens", APP_DATABASE_URL=schema_url)
    finally:
        ownpool_targets._built.clear()

    assert every.returncode == 1, every.stdout + every.stderr
    assert every.stderr == ""
    assert every.stdout.splitlines() == [
        "ok      tests.support.ownpool_targets:targets (python, gives tmp_uploads)",
        "FAILED  tests.support.checked_factories:uncounted (python, gives no_count): it gives "
        "no target named 'no_such' (asked now, it gave no_count); a pass's step for it would "
        "fail UnknownPurgeTarget",
        "        advice: no_count has no count_expired: a dry run of it fails (DryRunUnsupported)",
        "FAILED  tests.support.checked_factories:raising (python): target factory "
        "tests.support.checked_factories:raising raised RuntimeError: the application's store "
        "is not built",
        "FAILED  tests.support.checked_factories:stray (python): target factory "
        "tests.support.checked_factories:stray returned 'tmp_uploads', which has no name and "
        "purge_expired",
        "FAILED  tests.support.checked_factories:doubled (python, gives dup): 'dup' is given by "
        "it, twice: a pass's step for it would fail DuplicatePurgeTarget",
        "        advice: dup has no count_expired: a dry run of it fails (DryRunUnsupported)",
        "FAILED  tests.support.checked_factories:shadowing (python, gives own_rows): 'tokens' is "
        "given by it and tokens: a pass's step for it would fail DuplicatePurgeTarget",
        "        advice: own_rows has no count_expired: a dry run of it fails (DryRunUnsupported)",
        "FAILED  tokens (1 table): 'tokens' is given by it and "
        "tests.support.checked_factories:shadowing: a pass's step for it would fail "
        "DuplicatePurgeTarget",
    ]
    # Only the names asked for: no_such is not checked where no_count alone is.
    assert named.returncode == 0, named.stdout + named.stderr
    assert named.stdout.splitlines()[0] == (
        "ok      tests.support.checked_factories:uncounted (python, gives no_count)"
    )
    # An entry checked alone is still judged against every factory's names.
    assert tokens_only.returncode == 1, tokens_only.stdout + tokens_only.stderr
    assert tokens_only.stdout.splitlines() == every.stdout.splitlines()[-1:]


async def test_what_a_pass_would_refuse_is_one_line_a_target_and_exit_1(
    tmp_path: Path, schema_url: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    """A misspelt column, a table that is not there (misspelt, in another case, in a schema
    named), an id column taken for the expiry, and a python target (its own code's to check),
    beside a good one: each said in one line, the status 1, every row still there."""
    tokens(db)
    targets = (
        TOKENS
        + TOKENS.replace('"tokens"\ntable', '"typo"\ntable').replace("expires_at", "expire_at")
        + TOKENS.replace('"tokens"\ntable', '"ids"\ntable').replace("expires_at", "user_id")
        + TOKENS.replace('"tokens"\ntable = "tokens"', '"gone"\ntable = "tokenz"')
        + TOKENS.replace('"tokens"\ntable = "tokens"', '"case"\ntable = "Tokens"')
        + TOKENS.replace('"tokens"\ntable = "tokens"', f'"named"\ntable = "{schema}.tokns"')
        + TOKENS.replace('"tokens"\ntable = "tokens"', '"far"\ntable = "sessions_zz"')
        + '[[targets]]\nkind = "python"\nfactory = "tests.support.apptargets:targets"\n'
    )
    path = worker_config(tmp_path / "purge.toml", schema_url, "purge", targets)

    done = await check(path)

    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[:7] == [
        "ok      tokens (1 table)",
        "FAILED  typo (1 table): table tokens has no column 'expire_at' (did you mean "
        "'expires_at'?)",
        "FAILED  ids (1 table): table tokens column user_id: its values do not look like epoch "
        "milliseconds (e.g. 100005, which reads as a time before 1973), nor like an instant in "
        "any unit (s, ms, us, ns). Nothing was deleted; is user_id the column that says when a "
        "row expires? (An expiring target names it with column =.)",
        'FAILED  gone (1 table): table tokenz does not exist (looked for "tokenz") (did you '
        "mean 'tokens'?)",
        'FAILED  case (1 table): table Tokens does not exist (looked for "Tokens") (did you '
        "mean 'tokens'? names are case-sensitive)",
        f'FAILED  named (1 table): table {schema}.tokns does not exist (looked for "{schema}".'
        f"\"tokns\") (did you mean '{schema}.tokens'?)",
        'FAILED  far (1 table): table sessions_zz does not exist (looked for "sessions_zz")',
    ]
    assert lines[7] == f"skipped tests.support.apptargets:targets: {GAVE_NOTHING}", lines
    assert len(lines) == 8, lines
    assert done.stderr == ""
    assert count(db, "tokens") == 10


async def test_a_role_without_delete_on_a_table_is_refused_before_any_pass_meets_it(
    tmp_path: Path,
    pg_url: str,
    schema: str,
    db: psycopg.Connection[Any],
    role: str,
) -> None:
    """A sweep meets a missing DELETE right only at its first DELETE; the check finds it with
    none run, naming the role and the right."""
    tokens(db)
    db.execute(f'GRANT SELECT ON tokens TO "{role}"')
    url = make_conninfo(pg_url, user=role, options=f"-c search_path={schema}")
    path = worker_config(tmp_path / "purge.toml", url, "purge", TOKENS)

    done = await check(path)

    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        f'FAILED  tokens (1 table): table tokens: role {role} lacks DELETE on "tokens"; the '
        "worker's role needs SELECT and DELETE on each table it sweeps (and INSERT on an archive)"
    ]

    db.execute(f'GRANT DELETE ON tokens TO "{role}"')
    assert (await check(path)).stdout.splitlines() == ["ok      tokens (1 table)"]


async def test_a_dry_run_is_refused_where_the_role_lacks_delete_as_the_sweep_would_be(
    pg_url: str,
    schema: str,
    db: psycopg.Connection[Any],
    role: str,
    pools: Pools,
) -> None:
    """A dry run that counted the rows of a table the worker's role may not DELETE from would
    promise what no sweep can do: it fails as the sweep would, with the check's line."""
    tokens(db)
    db.execute(f'GRANT SELECT ON tokens TO "{role}"')
    pool = await pools(make_conninfo(pg_url, user=role, options=f"-c search_path={schema}"))
    target = kinds.expiring(pool, "tokens", TableName("tokens"), "expires_at")
    activities = PurgeActivities(TargetRegistry([target]))
    now_ms = int(time.time() * 1000)

    with pytest.raises(BadPurgeTarget) as refused:
        await activity_env().run(
            activities.purge_target, PurgeStep(name="tokens", now_ms=now_ms, dry_run=True)
        )

    assert refused.value.message == (
        f'table tokens: role {role} lacks DELETE on "tokens"; the worker\'s role needs SELECT '
        "and DELETE on each table it sweeps (and INSERT on an archive)"
    )
    db.execute(f'GRANT DELETE ON tokens TO "{role}"')
    counted = await activity_env().run(
        activities.purge_target, PurgeStep(name="tokens", now_ms=now_ms, dry_run=True)
    )
    assert (counted.removed, counted.dry_run) == (5, True)  # expired at or before now_ms
    assert count(db, "tokens") == 10


async def test_a_pattern_is_checked_table_by_table_naming_each_that_fails(
    tmp_path: Path, schema_url: str, db: psycopg.Connection[Any]
) -> None:
    for n in range(3):
        db.execute(f"CREATE TABLE ck_{n} (id bigint PRIMARY KEY, expires_at timestamptz)")
    db.execute("ALTER TABLE ck_1 RENAME COLUMN expires_at TO expired_at")
    pattern = '[[targets]]\nkind = "expiring"\nname = "ck"\ntable = "ck_*"\ncolumn = "expires_at"\n'
    path = worker_config(tmp_path / "purge.toml", schema_url, "purge", pattern)

    done = await check(path)

    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "FAILED  ck (3 tables): ck@ck_1: table ck_1 has no column 'expires_at' (did you mean "
        "'expired_at'?)"
    ]


async def test_a_pattern_and_the_targets_that_sweep_its_tables_too_are_said(
    tmp_path: Path, schema_url: str, db: psycopg.Connection[Any]
) -> None:
    """A pattern's matches are compared with listed targets and other patterns as listed
    tables are: under the pattern, the one table a listed target before it sweeps too; under a
    second pattern over the same tables, one line counting what the two share."""
    for n in range(5):
        db.execute(f"CREATE TABLE ck_{n} (id bigint PRIMARY KEY, expires_at timestamptz)")

    def entry(name: str, table: str) -> str:
        return (
            f'[[targets]]\nkind = "expiring"\nname = "{name}"\ntable = "{table}"\n'
            'column = "expires_at"\n'
        )

    targets = entry("one", "ck_2") + entry("ck", "ck_*") + entry("ck_again", "ck_*")
    path = worker_config(tmp_path / "purge.toml", schema_url, "purge", targets)

    done = await check(path)

    assert done.returncode == 0, done.stdout + done.stderr
    # Pattern matches are named as the pattern finds them, schema-qualified.
    lines = [re.sub(r"\b\w+\.(ck_\d)", r"\1", line) for line in done.stdout.splitlines()]
    assert lines == [
        "ok      one (1 table)",
        "ok      ck (5 tables)",
        "        advice: ck_2 is also swept by one with no filter: each of its rows goes as soon "
        "as either target's rule holds",
        "ok      ck_again (5 tables)",
        "        advice: 5 of its tables (ck_0, ck_1, ck_2 and 2 more) are also swept by ck with "
        "no filter: each of their rows goes as soon as either target's rule holds",
        "        advice: ck_2 is also swept by one with no filter: each of its rows goes as soon "
        "as either target's rule holds",
    ]


async def test_a_pattern_that_matches_no_table_is_not_refused_but_said(
    tmp_path: Path, schema_url: str
) -> None:
    """A misspelt pattern sweeps nothing, pass after pass, and fails nothing: the check says
    so under its line (status 0: a new application may have no tenant yet)."""
    pattern = (
        '[[targets]]\nkind = "expiring"\nname = "nm"\ntable = "no_such_zz_*"\n'
        'column = "expires_at"\n'
    )
    path = worker_config(tmp_path / "purge.toml", schema_url, "purge", pattern)

    done = await check(path)

    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "ok      nm (0 tables)",
        "        advice: the pattern no_such_zz_* matches no table now: a pass sweeps nothing "
        "for it (is its schema or table part misspelt?)",
    ]


async def test_check_refuses_an_unknown_target_and_an_unreachable_database_in_one_line(
    tmp_path: Path, schema_url: str
) -> None:
    path = worker_config(tmp_path / "purge.toml", schema_url, "purge", TOKENS)

    typo = await check(path, "--target", "token")

    assert typo.returncode == 2
    assert typo.stderr.splitlines() == [
        "pg-purge: check --target: the config names no target 'token' (its targets: tokens)"
    ]
    bare = tmp_path / "bare.toml"
    bare.write_text('task_queue = "purge"\n' + TOKENS, encoding="utf-8")
    no_url = await check(bare)
    assert no_url.returncode == 2
    [line] = no_url.stderr.splitlines()
    assert line.startswith("pg-purge: config error: "), line
    assert "database_url: missing" in line, line
    down = worker_config(
        tmp_path / "down.toml",
        "postgresql://purge:secret@127.0.0.1:1/app",
        "purge",
        'database_wait = "1s"\n' + TOKENS,
    )
    unreachable = await check(down)
    assert unreachable.returncode == 1
    [line] = unreachable.stderr.splitlines()
    assert line.startswith("pg-purge: cannot connect to postgresql://purge:***@127.0.0.1:1/app")
    assert "secret" not in unreachable.stdout + unreachable.stderr


async def test_check_and_a_dry_run_give_the_index_advice_before_the_first_sweep(
    tmp_path: Path, schema_url: str, pool: AsyncConnectionPool[Any], db: psycopg.Connection[Any]
) -> None:
    """A large table with a small share expired and no index on its expiry: the sweep's plan
    advises the index, and `check` and a dry run say so before the first sweep walks it."""
    now_ms = int(time.time() * 1000)
    db.execute("CREATE TABLE audit (id bigint, expires_ms bigint NOT NULL, body text)")
    db.execute(
        "INSERT INTO audit SELECT i, CASE WHEN i %% 100 = 0 THEN %s ELSE %s END, repeat('x', 120)"
        " FROM generate_series(1, 80000) i",
        (now_ms - HOUR, now_ms + 24 * HOUR),
    )
    db.execute("ANALYZE audit")
    entry = '[[targets]]\nkind = "expiring"\nname = "audit"\ntable = "audit"\n'
    path = worker_config(
        tmp_path / "purge.toml", schema_url, "purge", entry + 'column = "expires_ms"\n'
    )
    create = 'create one: CREATE INDEX CONCURRENTLY ON "audit" ("expires_ms")'

    done = await check(path)
    target = kinds.expiring(pool, "audit", TableName("audit"), "expires_ms")
    activities = PurgeActivities(TargetRegistry([target]))
    dry = await activity_env().run(
        activities.purge_target, PurgeStep(name="audit", now_ms=now_ms, dry_run=True)
    )

    assert done.returncode == 0, done.stdout + done.stderr
    [line, advice] = done.stdout.splitlines()
    assert line == "ok      audit (1 table)"
    assert advice.startswith("        advice: audit: about "), advice
    assert advice.endswith(create), advice
    assert (dry.removed, dry.advice) == (800, advice.removeprefix("        advice: "))
    assert count(db, "audit") == 80000


async def test_two_targets_that_sweep_one_table_with_no_filter_are_said(
    tmp_path: Path, schema_url: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    """An entry copied with its table left as it was: two ages on one table, the shorter
    deleting what the longer keeps. `check` says so under the second, whichever way each names
    the table; targets on one table told apart by filters, and a table of another name, say
    nothing."""
    tokens(db)
    db.execute("ALTER TABLE tokens ADD COLUMN kind text")
    db.execute("CREATE TABLE other_tokens (LIKE tokens)")

    def entry(name: str, table: str, extra: str = "") -> str:
        return (
            f'[[targets]]\nkind = "expiring"\nname = "{name}"\ntable = "{table}"\n'
            f'column = "expires_at"\n{extra}\n'
        )

    targets = (
        entry("tokens_30d", "tokens", 'max_age = "30d"\n')
        + entry("tokens_1d", f"{schema}.tokens", 'max_age = "1d"\n')
        + entry("api", "tokens", 'match = { kind = "api" }\n')
        + entry("web", "tokens", 'match = { kind = "web" }\n')
        + entry("others", "other_tokens")
    )
    path = worker_config(tmp_path / "purge.toml", schema_url, "purge", targets)

    done = await check(path)

    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "ok      tokens_30d (1 table)",
        "ok      tokens_1d (1 table)",
        f"        advice: {schema}.tokens is also swept by tokens_30d with no filter: each of "
        "its rows goes as soon as either target's rule holds",
        "ok      api (1 table)",
        "ok      web (1 table)",
        "ok      others (1 table)",
    ]
