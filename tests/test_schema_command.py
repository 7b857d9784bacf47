"""`pg-purge schema`: the ledger and the advice table alone (the built-in kinds' tables only when
asked), printed or applied to every database a config sweeps, with the role's right to create
checked in each database before anything is created anywhere."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from activities.schema import ADVICE_TABLE, LEDGER_TABLE, reference_ddl, table_ddl
from tests.support.procs import clean_env, run_main


@pytest.fixture
def empty(pg_admin: psycopg.Connection[Any]) -> Iterator[tuple[str, str, str]]:
    """Two empty schemas of the test's own (the default database and a named one point into
    one each) and a login role that may use both but create in neither."""
    first, second = (f"e_{uuid.uuid4().hex[:12]}" for _ in range(2))
    role = f"purge_{uuid.uuid4().hex[:10]}"
    pg_admin.execute(f'CREATE SCHEMA "{first}"; CREATE SCHEMA "{second}"')
    pg_admin.execute(f'CREATE ROLE "{role}" LOGIN')
    pg_admin.execute(f'GRANT USAGE ON SCHEMA "{first}", "{second}" TO "{role}"')
    yield first, second, role
    pg_admin.execute(f'DROP SCHEMA "{first}", "{second}" CASCADE')
    pg_admin.execute(f'DROP OWNED BY "{role}"; DROP ROLE "{role}"')


def _tables(admin: psycopg.Connection[Any], schema: str) -> set[str]:
    rows = admin.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)
    ).fetchall()
    return {row[0] for row in rows}


def _config(tmp_path: Path, default_url: str, other_url: str, table: str = "") -> Path:
    path = tmp_path / "purge.toml"
    named = f'table = "{table}"\n' if table else ""
    path.write_text(
        f"database_url = {json.dumps(default_url)}\n"
        f"[databases.other]\nurl = {json.dumps(other_url)}\n"
        '[[targets]]\nkind = "idempotency"\n' + named + "\n"
        '[[targets]]\nkind = "expiring"\nname = "sessions"\ntable = "sessions"\n'
        'column = "expires_at"\nmax_age = "0s"\ndatabase = "other"\n'
    )
    return path


def test_the_schema_file_is_one_paragraph_a_table() -> None:
    """Every table of schema.sql comes out of exactly one paragraph, so none is left unprinted."""
    parts = table_ddl()

    assert list(parts) == [
        "x_idempotency",
        "x_rate_limit",
        "x_auth_failures",
        "x_auth_lockouts",
        LEDGER_TABLE,
        ADVICE_TABLE,
    ]
    assert reference_ddl().count("CREATE TABLE") == sum(
        p.count("CREATE TABLE") for p in parts.values()
    )


def test_print_gives_the_ledger_and_the_advice_table_and_kinds_only_when_asked(
    tmp_path: Path, pg_url: str, pg_admin: psycopg.Connection[Any], empty: tuple[str, str, str]
) -> None:
    config = _config(tmp_path, pg_url, pg_url)

    plain = run_main("schema", "--config", str(config))
    kinds = run_main("schema", "--config", str(config), "--kinds")

    assert plain.returncode == 0, plain.stderr
    # What it prints is SQL that runs as it is, and creates just those tables.
    pg_admin.execute(f'SET search_path = "{empty[0]}"; {plain.stdout}')
    pg_admin.execute(f'SET search_path = "{empty[1]}"; {kinds.stdout}; RESET search_path')
    assert _tables(pg_admin, empty[0]) == {LEDGER_TABLE, ADVICE_TABLE}
    assert _tables(pg_admin, empty[1]) == {LEDGER_TABLE, ADVICE_TABLE, "x_idempotency"}


def test_a_kind_table_renamed_in_the_config_is_a_note_not_ddl(tmp_path: Path, pg_url: str) -> None:
    done = run_main("schema", "--config", str(_config(tmp_path, pg_url, pg_url, "keys")), "--kinds")

    assert done.returncode == 0, done.stderr
    assert "CREATE TABLE x_idempotency" not in done.stdout
    assert (
        "-- note: target x_idempotency sweeps keys: the reference DDL below is for x_idempotency"
        in done.stdout
    )


def test_apply_creates_what_is_missing_in_every_database_then_keeps_it(
    tmp_path: Path, pg_url: str, pg_admin: psycopg.Connection[Any], empty: tuple[str, str, str]
) -> None:
    first, second, _ = empty
    pg_admin.execute(f'CREATE TABLE "{second}".{LEDGER_TABLE} (kept int)')
    config = _config(
        tmp_path,
        make_conninfo(pg_url, options=f"-c search_path={first}"),
        make_conninfo(pg_url, options=f"-c search_path={second}"),
    )

    done = run_main("schema", "--config", str(config), "--apply")
    again = run_main("schema", "--config", str(config), "--apply")

    assert done.returncode == 0, done.stderr
    assert _tables(pg_admin, first) == {LEDGER_TABLE, ADVICE_TABLE}
    assert _tables(pg_admin, second) == {LEDGER_TABLE, ADVICE_TABLE}
    assert (
        f"the default database (database_url): created {LEDGER_TABLE}, {ADVICE_TABLE} in schema"
        f" {first}"
    ) in done.stdout
    assert f"other: created {ADVICE_TABLE} in schema {second}; kept {LEDGER_TABLE}" in done.stdout
    # An existing table is never touched, whatever its shape.
    assert pg_admin.execute(
        "SELECT count(*) FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0",
        (f'"{second}".{LEDGER_TABLE}',),
    ).fetchone() == (1,)
    assert again.returncode == 0, again.stderr
    assert "the default database (database_url): every table is there" in again.stdout
    assert "other: every table is there" in again.stdout


def test_apply_refuses_in_one_line_and_creates_nothing_anywhere_without_the_right(
    tmp_path: Path, pg_url: str, pg_admin: psycopg.Connection[Any], empty: tuple[str, str, str]
) -> None:
    """The default database's role may create, the named database's (checked second) may not:
    neither gets a table, and the line names the database, the role, the schema and the GRANT."""
    first, second, role = empty
    config = _config(
        tmp_path,
        make_conninfo(pg_url, options=f"-c search_path={first}"),
        make_conninfo(pg_url, user=role, options=f"-c search_path={second}"),
    )

    done = run_main("schema", "--config", str(config), "--apply", env=clean_env())

    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"pg-purge: schema: other: role {role} may not create tables in schema {second}"
        f" of database {pg_admin.info.dbname} (GRANT CREATE ON SCHEMA {second} TO {role}, or run"
        " as its owner); nothing was created"
    )
    assert _tables(pg_admin, first) == set()
    assert _tables(pg_admin, second) == set()
