"""`pg-purge discover`: a database read (never written) into a commented config that parses,
starts a worker, and sweeps what discover said would go.

Frameworks that are not Python are read from their published DDL (tests/support/
framework_ddl.py); the Python ones from the schemas their own migrations make, filled through
their own APIs (tests/support/framework_apps.py, in the slow suite: Django's migrate takes
seconds).
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import worker
from activities.schema import reference_ddl
from purge_config.file import load_config
from purge_ops import discover as purge_discover
from purge_ops import discover_render
from purge_ops.discover import (
    Discovery,
    Finding,
    _star,
    discover,
    expiry_like,
    whose_expiry,
)
from purge_ops.runner import run_worker
from tests.conftest import Harness
from tests.support import framework_apps, framework_ddl
from tests.support.passes import run_pass_beside
from tests.support.procs import clean_env, use_env
from tests.support.servers import RunningTemporal

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def database(pg_url: str) -> Iterator[str]:
    """A database of the test's own (discover reads every schema of one)."""
    name = f"discover_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield make_conninfo(pg_url, dbname=name)
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def run_sql(url: str, script: str, *params: Any) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(script, params or None)


@contextmanager
def login_role(database: str) -> Iterator[tuple[str, str]]:
    """A login role of its own that may read nothing yet, and its connection string; dropped
    after, with whatever it was granted."""
    role = f"discover_{uuid.uuid4().hex[:8]}"
    run_sql(database, f'CREATE ROLE "{role}" LOGIN')
    try:
        yield role, make_conninfo(database, user=role)
    finally:
        run_sql(database, f'DROP OWNED BY "{role}"; DROP ROLE "{role}"')


def fill_published(url: str) -> None:
    """Rows as each framework writes them: UTC into its timestamp columns, epoch seconds into
    Laravel's integers. Old ones are hours or days past each framework's own age."""
    run_sql(url, framework_ddl.ALL)
    run_sql(
        url,
        """
        INSERT INTO good_jobs (finished_at, created_at, updated_at)
        SELECT f, now(), now() FROM unnest(ARRAY[
          timezone('UTC', now()) - interval '20 days', timezone('UTC', now()) - interval '20 days',
          timezone('UTC', now()) - interval '20 days', timezone('UTC', now()) - interval '1 day',
          NULL]) AS f;
        INSERT INTO good_job_batches (finished_at, created_at, updated_at)
        VALUES (timezone('UTC', now()) - interval '20 days', now(), now()), (NULL, now(), now());
        INSERT INTO good_job_executions (active_job_id, finished_at, created_at, updated_at)
        VALUES (gen_random_uuid(), timezone('UTC', now()) - interval '20 days', now(), now());
        INSERT INTO solid_queue_jobs (queue_name, class_name, finished_at, created_at, updated_at)
        SELECT 'default', 'Job', f, now(), now() FROM unnest(ARRAY[
          timezone('UTC', now()) - interval '2 days', timezone('UTC', now()) - interval '2 days',
          timezone('UTC', now()) - interval '2 days', NULL, NULL]) AS f;
        INSERT INTO solid_queue_failed_executions (job_id, created_at)
        SELECT id, now() FROM solid_queue_jobs WHERE finished_at IS NULL LIMIT 1;
        INSERT INTO solid_queue_semaphores (key, expires_at, created_at, updated_at)
        VALUES ('k', timezone('UTC', now()) - interval '1 hour', now(), now());
        INSERT INTO oban_jobs (state, worker, completed_at, cancelled_at, discarded_at) VALUES
          ('completed', 'W', timezone('UTC', now()) - interval '1 hour', NULL, NULL),
          ('completed', 'W', timezone('UTC', now()) - interval '1 hour', NULL, NULL),
          ('completed', 'W', timezone('UTC', now()) + interval '1 hour', NULL, NULL),
          ('cancelled', 'W', NULL, timezone('UTC', now()) - interval '1 hour', NULL),
          ('discarded', 'W', NULL, NULL, timezone('UTC', now()) - interval '1 hour'),
          ('retryable', 'W', NULL, NULL, timezone('UTC', now()) - interval '1 hour'),
          ('available', 'W', NULL, NULL, NULL);
        INSERT INTO sessions (id, payload, last_activity)
        SELECT 's' || i, '', extract(epoch FROM now())::integer
               - CASE WHEN i <= 3 THEN 3 * 3600 ELSE 60 END
        FROM generate_series(1, 5) AS i;
        INSERT INTO failed_jobs (uuid, connection, queue, payload, exception, failed_at)
        SELECT 'f' || i, 'db', 'default', '', '',
               timezone('UTC', now()) - CASE WHEN i <= 2 THEN interval '2 days' ELSE '0s' END
        FROM generate_series(1, 3) AS i;
        INSERT INTO job_batches (id, name, total_jobs, pending_jobs, failed_jobs, failed_job_ids,
                                 created_at, finished_at)
        VALUES ('b1', 'b', 1, 0, 0, '[]', 0, extract(epoch FROM now())::integer - 2 * 86400),
               ('b2', 'b', 1, 1, 0, '[]', 0, NULL);
        INSERT INTO cache VALUES ('a', '', extract(epoch FROM now())::integer - 60),
                                 ('b', '', extract(epoch FROM now())::integer - 60),
                                 ('c', '', extract(epoch FROM now())::integer + 3600);
        """,
    )


#: What each recognised table of the published schemas should show: (column, max_age, rows,
#: rows that would go now, the index that serves, or None).
PUBLISHED = {
    "good_jobs": ("finished_at", "14d", 5, 3, None),
    "good_job_batches": ("finished_at", "14d", 2, 1, None),
    "solid_queue_jobs": ("finished_at", "1d", 5, 3, "index_solid_queue_jobs_on_finished_at"),
    "sessions": ("last_activity", "2h", 5, 3, "sessions_last_activity_index"),
    "failed_jobs": ("failed_at", "1d", 3, 2, None),
    "job_batches": ("finished_at", "1d", 2, 1, None),
    "cache": ("expiration", "0s", 3, 2, None),
    "cache_locks": ("expiration", "0s", 0, 0, None),
}


def unwrapped(text: str) -> str:
    """The printed config's comments as one line each (they wrap at 100 columns)."""
    return re.sub(r"\n#\s+", " ", text)


def by_table(found: Discovery) -> dict[str, list[Finding]]:
    tables: dict[str, list[Finding]] = {}
    for finding in found.singles:
        tables.setdefault(finding.table, []).append(finding)
    return tables


async def test_published_schemas_are_recognised_with_their_frameworks_meaning(
    database: str,
) -> None:
    """GoodJob, Solid Queue, Oban and Laravel tables from their documented DDL: each entry has
    the framework's own age and column, its rows and the rows that would go now, whether an
    index serves, and the cleanup it replaces; tables the framework keeps itself are left."""
    fill_published(database)
    found = await discover(database)
    tables = by_table(found)

    for table, (column, max_age, rows, expired, index) in PUBLISHED.items():
        [finding] = tables[table]
        assert (finding.column, finding.max_age, finding.rows, finding.expired) == (
            column,
            max_age,
            rows,
            expired,
        ), table
        assert finding.source == "framework", table
        assert finding.is_target, table
        assert finding.index is not None
        assert finding.index.serves == index, table
    assert tables["sessions"][0].unit == "s"
    assert tables["cache_locks"][0].unit == "s"  # empty: the documented unit
    # GoodJob's finished_at index is partial: said so, and the one that would serve is given.
    good_jobs = tables["good_jobs"][0].index
    assert good_jobs is not None
    assert "partial" in good_jobs.note
    assert good_jobs.create == 'CREATE INDEX CONCURRENTLY ON "public"."good_jobs" ("finished_at")'

    oban = {f.preset.name: f for f in tables["oban_jobs"] if f.preset}
    assert {name: (f.column, f.expired) for name, f in oban.items()} == {
        "oban_jobs_completed": ("completed_at", 2),
        "oban_jobs_cancelled": ("cancelled_at", 1),
        "oban_jobs_discarded": ("discarded_at", 1),
    }
    assert oban["oban_jobs_completed"].index is not None
    assert oban["oban_jobs_completed"].index.create == (
        'CREATE INDEX CONCURRENTLY ON "public"."oban_jobs" ("state", "completed_at")'
    )

    left = {f.table: f.preset.treatment for f in found.singles if f.preset and not f.is_target}
    assert left == {
        "good_job_executions": "not_expressible",
        "solid_queue_blocked_executions": "leave",
        "solid_queue_semaphores": "leave",
    }
    text = unwrapped(discover_render.as_toml(found, database))
    assert "GoodJob.cleanup_preserved_jobs" in text
    assert "`php artisan queue:prune-failed`" in text
    assert "Oban.Plugins.Pruner" in text


async def test_the_printed_config_starts_a_worker_that_sweeps_what_discover_counted(
    database: str,
    harness: Harness,
    temporal_server: RunningTemporal,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """The printed text, saved as a file, is read by the package's own config reader; a
    worker built from it (`run_worker`, as `pg-purge run` does) sweeps a pass of its targets,
    and each removes exactly the rows discover said would go now. Its header names the steps
    from it to a scheduled worker, the ledger's tables first (else no count is exact)."""
    fill_published(database)
    found = await discover(database)
    path = tmp_path / "purge.toml"
    text = discover_render.as_toml(found, database)
    path.write_text(text, encoding="utf-8")
    header = " ".join(line[2:] for line in text.splitlines()[1:4])
    assert (
        "then `pg-purge schema --apply --config FILE` (the sweep's ledger), `pg-purge check "
        "--config FILE` and `pg-purge run --config FILE --schedule`."
    ) in header, header

    config = harness.adopt(load_config(path, env={}))
    expected = {
        found.names[f"{f.qualified}:{f.column}"]: f.expired for f in found.singles if f.is_target
    }
    # Every table the published schemas give a target (PUBLISHED, and Oban's three states),
    # with the rows that would go now: none missing, so the sweep below has rows to remove.
    assert expected == {table: shown[3] for table, shown in PUBLISHED.items()} | {
        "oban_jobs_completed": 2,
        "oban_jobs_cancelled": 1,
        "oban_jobs_discarded": 1,
    }
    assert sorted(config.target_names) == sorted(expected)
    assert config.database_url == database

    use_env(monkeypatch, clean_env())
    result = await run_pass_beside(
        lambda stop: run_worker(config, stop=stop, temporal_address=temporal_server.address),
        harness.client,
        config.task_queue,
        config.pass_input(),
    )
    assert result["failed"] == []
    assert {s["name"]: s["removed"] for s in result["swept"]} == expected
    after = by_table(await discover(database))
    assert all(f.expired == 0 for fs in after.values() for f in fs if f.is_target)
    assert after["solid_queue_semaphores"][0].rows == 1  # left to Solid Queue


async def test_a_presets_table_in_two_schemas_is_two_targets_of_two_names(
    database: str, tmp_path: Path
) -> None:
    """procrastinate's jobs in two schemas: two live entries of the preset, each with a name of
    its own, so the printed file is a config the reader takes (two entries of one name are
    refused); each reads the events beside its own jobs."""
    for schema in ("app_a", "app_b"):
        run_sql(
            database,
            f"CREATE SCHEMA {schema};"
            f" CREATE TABLE {schema}.procrastinate_jobs (id bigserial PRIMARY KEY, status text);"
            f" CREATE TABLE {schema}.procrastinate_events (id bigserial PRIMARY KEY,"
            f" job_id bigint REFERENCES {schema}.procrastinate_jobs ON DELETE CASCADE,"
            " at timestamptz)",
        )
    found = await discover(database)
    path = tmp_path / "purge.toml"
    path.write_text(discover_render.as_toml(found, database), encoding="utf-8")

    config = load_config(path, env={})
    jobs = [t for t in config.targets if t.tables[0].table == "procrastinate_jobs"]
    assert sorted(str(t.tables[0].schema) for t in jobs) == ["app_a", "app_b"]
    assert len({t.name for t in jobs}) == 2
    assert sorted(str(t.age_from) for t in jobs) == [
        "app_a.procrastinate_events",
        "app_b.procrastinate_events",
    ]


async def test_short_lived_tables_dated_by_their_making_are_named_in_a_comment(
    database: str,
) -> None:
    """A table whose name says its rows are short-lived (reset tokens, login attempts, an audit
    log) and whose rows say only when they were made: named in a comment with that column, no
    entry (its age is the owner's policy); so is one whose expiry-like column no entry sweeps
    as it is (an `expires_in` duration). A table of another name with a created_at (users),
    a made-at column that holds no instant, and a short-lived table with an expiry column (an
    entry already) are not named there."""
    run_sql(
        database,
        """
        CREATE TABLE password_reset_tokens (token text PRIMARY KEY, created_at timestamptz);
        CREATE TABLE "LoginAttempts" (id int, "createdAt" timestamp);
        CREATE TABLE audit_log (id int, inserted_at timestamptz, body text);
        CREATE TABLE users (id int, created_at timestamptz);
        CREATE TABLE api_tokens (id int, created bigint);
        CREATE TABLE refresh_tokens (id int, created_at timestamptz, expires_at timestamptz);
        CREATE TABLE oauth_tokens (id int, expires_in int, created_at timestamptz);
        INSERT INTO oauth_tokens VALUES (1, 3600, now());
        CREATE TABLE "reset-tokens" (id int, created_at timestamptz);
        """,
    )

    found = await discover(database)
    text = discover_render.as_toml(found, database)

    assert found.made_only == (
        "public.LoginAttempts (createdAt)",
        "public.audit_log (inserted_at)",
        "public.oauth_tokens (created_at)",  # its expires_in is a duration: no entry sweeps it
        "public.password_reset_tokens (created_at)",
    )  # not "reset-tokens": no config can name it
    assert "#   public.password_reset_tokens (created_at)" in text.splitlines()
    assert {f.table for f in found.singles if f.is_target} == {"refresh_tokens"}
    config = tomllib.loads(text)
    assert [t["table"] for t in config["targets"]] == ["public.refresh_tokens"]


async def test_other_expiry_columns_families_and_their_indexes(database: str) -> None:
    """Tables no framework explains: an expiry-like column of each type found with its counts;
    one that no target reads as it is (a date, a duration) said why; tables of one shape in
    many schemas, or many of one shape in a schema, become one pattern entry each."""
    run_sql(
        database,
        """
        CREATE SCHEMA app;
        CREATE TABLE app.tokens (id int, expires_at timestamptz);
        CREATE INDEX tokens_expiry ON app.tokens (expires_at);
        INSERT INTO app.tokens VALUES (1, now() - interval '1 hour'), (2, now() + interval '1h');
        CREATE TABLE app.api_keys (id int, valid_until_ms bigint);
        INSERT INTO app.api_keys
          VALUES (1, (extract(epoch FROM now()) * 1000)::bigint - 1000),
                 (2, (extract(epoch FROM now()) * 1000)::bigint + 3600000);
        CREATE TABLE app.coupons (id int, expire_date date);
        INSERT INTO app.coupons VALUES (1, current_date - 3);
        CREATE TABLE app.grants (id int, expires_in integer);
        INSERT INTO app.grants VALUES (1, 3600);
        CREATE TABLE app.notes (id int, created_at timestamptz);
        CREATE TABLE app.events_2026_01 (id int, expires_at timestamp);
        CREATE TABLE app.events_2026_02 (id int, expires_at timestamp);
        CREATE TABLE app.events_2026_03 (id int, expires_at timestamp);
        """,
    )
    for i in range(1, 5):
        run_sql(
            database,
            f"CREATE SCHEMA tenant_{i:04};"
            f" CREATE TABLE tenant_{i:04}.sessions (id int, expires_at timestamptz);"
            f" INSERT INTO tenant_{i:04}.sessions VALUES (1, now() - interval '1 hour');",
        )
    run_sql(database, "CREATE INDEX ON tenant_0001.sessions (expires_at)")
    # Not of the family: no expiry column. The pattern would still match it.
    run_sql(database, "CREATE SCHEMA tenant_0099; CREATE TABLE tenant_0099.sessions (id int)")

    found = await discover(database)
    tables = by_table(found)
    [tokens] = tables["tokens"]
    assert (tokens.rows, tokens.expired, tokens.max_age) == (2, 1, "0s")
    assert tokens.index is not None
    assert tokens.index.serves == "tokens_expiry"
    [keys] = tables["api_keys"]
    assert (keys.unit, keys.expired, keys.problem) == ("ms", 1, "")
    assert keys.index is not None
    assert keys.index.create == ('CREATE INDEX CONCURRENTLY ON "app"."api_keys" ("valid_until_ms")')
    [coupons] = tables["coupons"]
    assert "date column" in coupons.problem
    assert not coupons.is_target
    [grants] = tables["grants"]
    assert "no epoch instant" in grants.problem
    assert "notes" not in tables  # created_at: an age only the application knows

    families = {f.pattern: f for f in found.families}
    assert set(families) == {"tenant_*.sessions", "app.events_*"}
    tenants = families["tenant_*.sessions"]
    assert len(tenants.members) == 4
    assert tenants.strays == ("tenant_0099.sessions",)
    assert sum(m.expired or 0 for m in tenants.members) == 4
    assert [m.index.serves for m in tenants.members if m.index] == [
        "sessions_expires_at_idx",
        None,
        None,
        None,
    ]

    text = discover_render.as_toml(found, database)
    raw = tomllib.loads(text)
    entries = {e["table"]: e for e in raw["targets"]}
    assert entries["tenant_*.sessions"]["name"] == "sessions"
    assert entries["app.api_keys"] == {
        "kind": "expiring",
        "name": "api_keys",
        "table": "app.api_keys",
        "column": "valid_until_ms",
        "max_age": "0s",
    }
    assert "app.coupons" not in entries
    assert "app.grants" not in entries
    assert "tenant_0099.sessions, without expires_at" in unwrapped(text)


async def test_tables_with_two_expiry_columns_are_two_entries_of_two_names(
    database: str, tmp_path: Path
) -> None:
    """The tables of a pattern with two expiry-like columns are two families of one pattern:
    two entries, each named with its column, so the printed file is a config the reader takes
    (two entries of one name are refused). A table alone with two is two entries too."""
    for i in range(1, 5):
        run_sql(
            database,
            f"CREATE SCHEMA tenant_{i:04};"
            f" CREATE TABLE tenant_{i:04}.carts"
            " (id int, expires_at timestamptz, valid_until timestamptz);"
            f" INSERT INTO tenant_{i:04}.carts"
            " VALUES (1, now() - interval '1 hour', now() + interval '1 hour')",
        )
    run_sql(
        database, "CREATE TABLE vouchers (id int, expires_at timestamptz, valid_until timestamp)"
    )
    found = await discover(database)
    assert sorted((f.pattern, f.first.column) for f in found.families) == [
        ("tenant_*.carts", "expires_at"),
        ("tenant_*.carts", "valid_until"),
    ]

    text = discover_render.as_toml(found, database)
    path = tmp_path / "purge.toml"
    path.write_text(text, encoding="utf-8")
    config = load_config(path, env={})
    names = {(str(t.tables[0]), t.column): t.name for t in config.targets}
    assert names == {
        ("tenant_*.carts", "expires_at"): "carts_expires_at",
        ("tenant_*.carts", "valid_until"): "carts_valid_until",
        ("public.vouchers", "expires_at"): "vouchers",
        ("public.vouchers", "valid_until"): "vouchers_valid_until",
    }
    data = json.loads(discover_render.as_json(found))
    assert sorted(f["target"]["name"] for f in data["families"]) == [
        "carts_expires_at",
        "carts_valid_until",
    ]


async def test_a_role_with_catalog_rights_only_reads_it_and_nothing_is_written(
    database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a role that may read no table, discover still finds them (from the catalog) and
    gives the planner's estimates; given SELECT, it counts. It writes nothing either way: it
    runs in a READ ONLY transaction, whose every statement the server refuses to let write."""
    # Discover's own transaction, as the server sees it once discover has read all it reads:
    # read only, and never given a transaction id (which any write, even to a temporary table,
    # takes).
    seen: list[tuple[object, object]] = []
    read = purge_discover._read

    async def watched(conn: psycopg.AsyncConnection[Any], *args: Any) -> Discovery:
        found = await read(conn, *args)
        cur = await conn.execute(
            "SELECT current_setting('transaction_read_only'), pg_current_xact_id_if_assigned()"
        )
        row = await cur.fetchone()
        assert row is not None
        seen.append((row[0], row[1]))
        return found

    monkeypatch.setattr(purge_discover, "_read", watched)
    run_sql(
        database,
        "CREATE TABLE tokens (id int, expires_at timestamptz);"
        " INSERT INTO tokens VALUES (1, now() - interval '1 hour'), (2, now() + interval '1h');",
    )
    with login_role(database) as (role, as_role):
        [blind] = (await discover(as_role)).singles
        assert (blind.table, blind.estimated, blind.expired) == ("tokens", True, None)
        assert "may not SELECT" in discover_render.as_toml(await discover(as_role), as_role)

        run_sql(database, f'GRANT SELECT ON tokens TO "{role}"')
        [seeing] = (await discover(as_role)).singles
        assert (seeing.rows, seeing.expired, seeing.estimated) == (2, 1, False)

        # SELECT on a table in a schema it has no USAGE on: found, the refusal said, the rest read.
        run_sql(
            database,
            "CREATE SCHEMA hidden; CREATE TABLE hidden.codes (id int, expires_at timestamptz);"
            f' GRANT SELECT ON hidden.codes TO "{role}"',
        )
        found = {f.qualified: f for f in (await discover(as_role)).singles}
        assert found["hidden.codes"].estimated
        assert "permission denied for schema hidden" in found["hidden.codes"].unread
        assert found["public.tokens"].rows == 2

    assert seen == [("on", None)] * 4  # every discover above


def test_bad_input_is_one_line_with_the_password_masked(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An unreachable database and a URL libpq refuses each print one line (exit 1 and 2)
    that never shows the password; with no database named at all, it says where to name one."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PURGE_DATABASE_URL", raising=False)
    monkeypatch.delenv("PURGE_CONFIG", raising=False)
    status = worker.main(["discover", "postgresql://app:s3cret@127.0.0.1:1/app?connect_timeout=2"])
    err = capsys.readouterr().err
    assert status == 1
    assert err.startswith("pg-purge: cannot connect to postgresql://app:***@127.0.0.1:1/app")
    assert len(err.strip().splitlines()) == 1
    assert "s3cret" not in err

    assert worker.main(["discover", "postgresql://app:s3cret@db:port/app"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "s3cret" not in err
    assert "not a PostgreSQL connection string" in err

    # Options libpq only judges as it connects: refused there, as a database out of reach is.
    assert worker.main(["discover", "postgresql://app:s3cret@127.0.0.1:1/app?sslmode=bogus"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pg-purge: cannot connect to postgresql://app:***@127.0.0.1:1/app")
    assert "sslmode" in err
    assert "s3cret" not in err

    # No URL, no config: the URL is named first, as a new user has none yet.
    assert worker.main(["discover"]) == 2
    assert "no database; give its URL" in capsys.readouterr().err
    assert worker.main(["discover", "--config", "missing.toml"]) == 2
    assert "missing.toml: no such file" in capsys.readouterr().err


def test_json_gives_the_same_findings_for_tools(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`discover --json`: every finding with its figures, index and the entry it would be."""
    fill_published(database)
    assert worker.main(["discover", database, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    findings = {(f["table"], f["column"]): f for f in data["findings"]}
    sessions = findings[("public.sessions", "last_activity")]
    assert (sessions["rows"], sessions["would_go_now"], sessions["unit"]) == (5, 3, "s")
    assert sessions["index"]["serves"] == "sessions_last_activity_index"
    assert sessions["framework"]["name"] == "Laravel sessions"
    assert sessions["target"] == {
        "kind": "expiring",
        "name": "sessions",
        "table": "public.sessions",
        "column": "last_activity",
        "max_age": "2h",
        "unit": "s",
    }
    blocked = findings[("public.solid_queue_blocked_executions", "expires_at")]
    assert blocked["target"] is None
    assert blocked["framework"]["treatment"] == "leave"


@pytest.mark.slow
async def test_python_frameworks_own_migrations_and_cleanup_meaning(
    database: str,
    harness: Harness,
    temporal_server: RunningTemporal,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Django sessions and django-celery-results made by `migrate`, Celery's SQLAlchemy
    backend by its models, procrastinate by `apply_schema`, each filled through its own API:
    each is recognised with its framework's age and printed as its preset's one line
    (procrastinate's with the age it suggests); the printed config's worker removes the old
    rows and only those."""
    made = subprocess.run(
        [sys.executable, "-m", "tests.support.framework_apps", database],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert json.loads(made.stdout.splitlines()[-1])["django_session"] == (
        framework_apps.OLD + framework_apps.LIVE
    )
    found = await discover(database)
    tables = by_table(found)
    expected = {
        "django_session": ("expire_date", "0s"),
        "django_celery_results_taskresult": ("date_done", "1d"),
        "django_celery_results_groupresult": ("date_done", "1d"),
        "celery_taskmeta": ("date_done", "1d"),
        "celery_tasksetmeta": ("date_done", "1d"),
    }
    for table, (column, max_age) in expected.items():
        [finding] = tables[table]
        assert (finding.column, finding.max_age) == (column, max_age), table
        assert finding.expired == framework_apps.OLD, table
        assert finding.index is not None
        assert finding.index.serves, table
    [jobs] = tables["procrastinate_jobs"]
    assert jobs.preset is not None
    assert jobs.preset.treatment == "preset"
    assert jobs.rows == framework_apps.OLD + framework_apps.LIVE
    text = discover_render.as_toml(found, database)
    assert "remove_old_jobs" in text
    assert "clearsessions" in text
    presets = {
        "django_session": "django_sessions",
        "django_celery_results_taskresult": "celery_results",
        "django_celery_results_groupresult": "celery_group_results",
        "celery_taskmeta": "celery_taskmeta",
        "celery_tasksetmeta": "celery_tasksetmeta",
        "procrastinate_jobs": "procrastinate",
    }
    assert sorted(tomllib.loads(text)["targets"], key=lambda t: str(t["kind"])) == [
        {"kind": kind} | ({"max_age": "3d"} if kind == "procrastinate" else {})
        for kind in sorted(presets.values())
    ]

    path = tmp_path / "purge.toml"
    path.write_text(text, encoding="utf-8")
    config = dataclasses.replace(load_config(path, env={}), task_queue=harness.task_queue)
    use_env(monkeypatch, clean_env())
    result = await run_pass_beside(
        lambda stop: run_worker(config, stop=stop, temporal_address=temporal_server.address),
        harness.client,
        config.task_queue,
        config.pass_input(),
    )
    assert result["failed"] == []
    assert {s["name"]: s["removed"] for s in result["swept"]} == dict.fromkeys(
        presets.values(), framework_apps.OLD
    )
    with psycopg.connect(database) as conn:
        for table in presets:
            count = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
            assert count == (framework_apps.LIVE,), table


class TestNames:
    """The pure rules behind the findings: which names look like an expiry, which pattern
    covers a family."""

    @pytest.mark.parametrize(
        "name",
        ["expires_at", "expire_date", "expiry", "expiration", "expires_at_ms", "valid_until",
         "until_ms", "token_expires", "purge_after", "expiresAt", "validUntil",
         "tokenExpiresAt", "EXPIRES_AT"],
    )  # fmt: skip
    def test_an_expiry_word_or_an_until_is_expiry_like(self, name: str) -> None:
        assert expiry_like(name)

    @pytest.mark.parametrize(
        "name",
        ["created_at", "updated_at", "expired", "last_seen", "untiled", "experience",
         "createdAt", "Expired"],
    )  # fmt: skip
    def test_when_a_row_was_made_or_touched_is_not(self, name: str) -> None:
        assert not expiry_like(name)

    def test_what_a_name_ties_the_expiry_to(self) -> None:
        assert whose_expiry("users", "password_expires_at") == "password"
        assert whose_expiry("User", "passwordExpiresAt") == "password"
        assert whose_expiry("remember_tokens", "token_expires_at") == ""
        assert whose_expiry("RememberToken", "tokenExpiresAt") == ""
        assert whose_expiry("grants", "valid_until") == ""
        assert whose_expiry("users", "locked_until") == "locked"

    def test_a_star_takes_every_numbered_part_and_never_stands_alone(self) -> None:
        assert _star([f"tenant_{i:04}" for i in range(1, 43)]) == "tenant_*"
        assert _star(["events_2026_01", "events_2026_02", "events_2027_01"]) == "events_*"
        assert _star(["shop_a_carts", "shop_b_carts", "shop_c_carts"]) == "shop_*_carts"
        assert _star(["alpha", "beta", "gamma"]) is None


async def test_rows_that_may_be_records_are_entries_kept_as_comments_saying_why(
    database: str, tmp_path: Path
) -> None:
    """An expiry-like column on a table whose rows may be records, or may hold what a sweep
    would misread, is an entry printed commented out with its caution: a column that names
    what else expires (a user's password, an order's payment); a table other tables reference;
    rows that hold 0 for never. Uncommented, each is an entry the config reader takes. A
    table whose rows do expire, beside them, stays live."""
    run_sql(
        database,
        """
        CREATE TABLE users (id int PRIMARY KEY, password_expires_at timestamptz,
                            locked_until timestamptz);
        INSERT INTO users VALUES (1, now() - interval '1 day', now() - interval '1 day');
        CREATE TABLE orders (id int, payment_expires_at timestamptz);
        INSERT INTO orders VALUES (1, now() - interval '1 day');
        CREATE TABLE subscriptions (id int PRIMARY KEY, expires_at timestamptz);
        INSERT INTO subscriptions VALUES (1, now() - interval '1 day');
        CREATE TABLE invoices (id int, subscription_id int REFERENCES subscriptions);
        CREATE TABLE api_keys (id int PRIMARY KEY, key_expires_at timestamptz);
        CREATE TABLE api_requests (id int, key_id int REFERENCES api_keys ON DELETE CASCADE);
        CREATE TABLE remember_tokens (id int, token_expires_ms bigint);
        INSERT INTO remember_tokens VALUES
          (1, 0), (2, (extract(epoch FROM now()) * 1000)::bigint - 1000),
          (3, (extract(epoch FROM now()) * 1000)::bigint + 3600000);
        CREATE TABLE password_resets (id int, reset_expires_at timestamptz);
        INSERT INTO password_resets VALUES (1, now() - interval '1 hour');
        """,
    )
    found = await discover(database)
    by_name = {f.qualified: f for f in found.singles}
    cautions = {name: f.caution for name, f in by_name.items() if f.caution}
    assert set(cautions) == {
        "public.users",
        "public.orders",
        "public.subscriptions",
        "public.api_keys",
        "public.remember_tokens",
    }
    assert 'name (password_expires_at) ties the expiry to "password"' in cautions["public.users"]
    assert 'ties the expiry to "payment"' in cautions["public.orders"]
    assert "public.invoices (ON DELETE NO ACTION" in cautions["public.subscriptions"]
    assert "public.api_requests (ON DELETE CASCADE" in cautions["public.api_keys"]
    assert "1 of its rows reads as an instant before 1973" in cautions["public.remember_tokens"]
    resets = by_name["public.password_resets"]
    assert (resets.is_live, resets.caution) == (True, "")

    text = discover_render.as_toml(found, database)
    live = {e["table"] for e in tomllib.loads(text)["targets"]}
    assert live == {"public.password_resets"}
    # Uncommented, every kept entry is one the reader takes, each under a name of its own.
    path = tmp_path / "purge.toml"
    path.write_text(re.sub(r"(?m)^# (\[\[targets\]\]$|\w+ = )", r"\1", text), encoding="utf-8")
    config = load_config(path, env={})
    assert sorted(str(t.tables[0]) for t in config.targets) == sorted(
        ["public.password_resets", *(f.qualified for f in found.singles if f.caution)]
    )
    data = json.loads(discover_render.as_json(found))
    kept = {f["table"]: f for f in data["findings"] if f["caution"]}
    assert all(f["target"] is None and f["commented_target"] for f in kept.values())
    assert kept["public.remember_tokens"]["rows_before_1973"] == 1


async def test_a_pattern_entry_is_printed_only_where_it_would_sweep_its_own_tables(
    database: str,
) -> None:
    """Tables of one shape become a pattern entry only where the pattern matches no other
    table with the column: one holding epoch seconds beside tables in milliseconds, one whose
    column is of another type, or one of another name that the pattern would sweep by the
    family's rule (and whose own entry, taken out, would not keep it out). Each is then an
    entry of its own, in its own unit."""
    ms = "(extract(epoch FROM now()) * 1000)::bigint"
    for i in range(1, 6):
        value = f"{ms} - 1000" if i < 5 else f"{ms} / 1000 - 1"
        run_sql(
            database,
            f"CREATE SCHEMA tenant_{i:02}; CREATE TABLE tenant_{i:02}.tokens (expires_ms bigint);"
            f" INSERT INTO tenant_{i:02}.tokens VALUES ({value})",
        )
        # The column of another type in the fifth (epoch ms where four hold timestamptz): the
        # pattern would sweep it by the family's rule too, as epoch ms.
        kind = "timestamptz" if i < 5 else "bigint"
        run_sql(database, f"CREATE TABLE tenant_{i:02}.sessions (expires_at {kind})")
    run_sql(
        database,
        "CREATE SCHEMA app;"
        + "".join(
            f" CREATE TABLE app.events_2026_0{m} (expires_at timestamptz);" for m in (1, 2, 3)
        )
        + " CREATE TABLE app.events_important (expires_at timestamptz);",
    )
    found = await discover(database)
    assert found.families == ()
    units = {f.qualified: f.unit for f in found.singles if f.table == "tokens"}
    assert units == {**{f"tenant_0{i}.tokens": "ms" for i in range(1, 5)}, "tenant_05.tokens": "s"}
    events = [f.qualified for f in found.singles if f.is_live and f.table.startswith("events_")]
    assert len(events) == 4

    # Without the odd ones, each is one pattern entry.
    run_sql(database, "DROP TABLE tenant_05.tokens, tenant_05.sessions, app.events_important")
    patterns = {f.pattern for f in (await discover(database)).families}
    assert patterns == {"tenant_*.tokens", "tenant_*.sessions", "app.events_*"}


async def test_a_partitioned_tables_index_advice_is_one_it_can_build(database: str) -> None:
    """A partitioned table's index cannot be built CONCURRENTLY: the advice is the statement
    PostgreSQL takes, with what it costs and how to avoid it; an index on each partition
    serves the sweep as one on the table does."""
    run_sql(
        database,
        """
        CREATE TABLE grants (expires_at timestamptz) PARTITION BY RANGE (expires_at);
        CREATE TABLE grants_a PARTITION OF grants FOR VALUES FROM ('2020-01-01') TO ('2030-01-01');
        CREATE TABLE grants_b PARTITION OF grants FOR VALUES FROM ('2030-01-01') TO ('2040-01-01');
        CREATE INDEX ON grants_a (expires_at);
        """,
    )
    [grants] = (await discover(database)).singles
    assert grants.index is not None
    assert grants.index.create == 'CREATE INDEX ON "public"."grants" ("expires_at")'
    assert "cannot be built CONCURRENTLY" in grants.index.how
    # The advice is a statement the server takes; then the sweep is served.
    run_sql(database, grants.index.create)
    [again] = (await discover(database)).singles
    assert again.index is not None
    assert again.index.serves is not None
    # Dropped with the partitions' indexes it took in; then one built on each partition alone.
    run_sql(
        database,
        "DROP INDEX grants_expires_at_idx;"
        " CREATE INDEX ON grants_a (expires_at); CREATE INDEX ON grants_b (expires_at)",
    )
    [each] = (await discover(database)).singles
    assert each.index is not None
    assert each.index.serves == "an index on each of its 2 partitions"


async def test_an_integer_column_whose_values_could_not_be_read_is_kept_as_a_comment(
    database: str,
) -> None:
    """A role that may not read an integer expiry column cannot tell its unit, or whether it
    holds instants at all (an `expires_in` of 3600 is a duration): its entry is a comment that
    says so, never a live entry in a guessed unit."""
    run_sql(
        database,
        "CREATE TABLE oauth_codes (code text, expires_in integer);"
        " INSERT INTO oauth_codes VALUES ('a', 3600); ANALYZE oauth_codes",
    )
    with login_role(database) as (role, as_role):
        [blind] = (await discover(as_role)).singles
        assert not blind.is_live
        assert "its values could not be read (this role may not SELECT" in blind.caution
        assert "its values were not read" in blind.unit_note
        run_sql(database, f'GRANT SELECT ON oauth_codes TO "{role}"')
        [seeing] = (await discover(as_role)).singles
        assert "no epoch instant" in seeing.problem


async def test_this_packages_own_tables_are_entries_of_their_built_in_kinds(
    database: str, tmp_path: Path
) -> None:
    """The tables `pg-purge schema --kinds` makes are entries of the kinds that sweep them,
    each by its own rule (a full token bucket is no column's instant), named as the kinds name
    them; in another schema with their tables named. The ledger's tables are no entry."""
    ddl = reference_ddl()
    run_sql(database, ddl)
    run_sql(database, "CREATE SCHEMA shop; SET search_path = shop; " + ddl)
    found = await discover(database)
    path = tmp_path / "purge.toml"
    text = discover_render.as_toml(found, database)
    path.write_text(text, encoding="utf-8")
    entries = tomllib.loads(text)["targets"]
    assert sorted(e["kind"] for e in entries) == sorted(["idempotency", "rate_limit", "auth"] * 2)
    assert {"kind": "rate_limit"} in entries
    assert {
        "kind": "auth",
        "name": "x_auth_shop",
        "failures_table": "shop.x_auth_failures",
        "lockouts_table": "shop.x_auth_lockouts",
    } in entries
    assert "public.x_auth_lockouts.until_ms: left to pg-purge's auth kind" in unwrapped(text)
    config = load_config(path, env={})
    assert sorted(config.target_names) == sorted(
        [
            "x_idempotency",
            "x_idempotency_shop",
            "x_rate_limit",
            "x_rate_limit_shop",
            "x_auth",
            "x_auth_shop",
        ]
    )
    assert not any("purge_" in e.get("table", "") for e in entries)


def test_a_config_with_a_bad_entry_still_names_the_database_to_discover(
    database: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """`discover --config` of a config being written, one entry not right yet: discover still
    reads its database_url and discovers, saying in one line on stderr what is wrong; a bad
    database_url itself still stops it."""
    run_sql(database, "CREATE TABLE otp_codes (code text, expires_at timestamptz)")
    monkeypatch.delenv("PURGE_DATABASE_URL", raising=False)
    config = tmp_path / "purge.toml"
    config.write_text(
        f'database_url = "{database}"\n[[targets]]\nkind = "nosuch"\n', encoding="utf-8"
    )

    assert worker.main(["discover", "--config", str(config)]) == 0
    out, err = capsys.readouterr()
    assert "otp_codes" in out
    [line] = err.strip().splitlines()
    assert line.startswith(f"pg-purge: discover: {config}: [[targets]] #1: kind:")
    assert line.endswith("(reading only its database_url)")

    config.write_text('database_url = "nope://x"\n[[targets]]\nkind = "nosuch"\n', encoding="utf-8")
    assert worker.main(["discover", "--config", str(config)]) == 2
    assert "database_url: not a PostgreSQL connection string" in capsys.readouterr().err


async def test_a_referenced_inheritance_parent_is_printed_with_why_no_entry_sweeps_it(
    database: str,
) -> None:
    """An inheritance parent that a foreign key also references has a caution (the reference)
    and a problem (the sweep refuses it): the printed config says the problem, as for any
    table no entry sweeps, and no commented entry that uncommented would be refused."""
    run_sql(
        database,
        "CREATE TABLE logs (id int PRIMARY KEY, expires_at timestamptz);"
        " CREATE TABLE logs_keep (note text) INHERITS (logs);"
        " CREATE TABLE log_refs (log_id int REFERENCES logs (id));",
    )

    found = await discover(database)
    [parent] = by_table(found)["logs"]
    assert parent.caution
    assert parent.problem
    text = unwrapped(discover_render.as_toml(found, database))

    assert "not swept as it is. Why: it has inheritance children (logs_keep)" in text
    assert '# table = "logs"' not in text
    findings = json.loads(discover_render.as_json(found))["findings"]
    [shown] = [f for f in findings if f["table"].rpartition(".")[2] == "logs"]
    assert shown["commented_target"] is None


async def test_an_inheritance_parent_is_kept_as_a_comment_its_children_are_entries(
    database: str,
) -> None:
    """A DELETE of an inheritance parent removes its children's rows too, and the sweep
    refuses such a table: discover says why and prints its children as entries of their own."""
    run_sql(
        database,
        "CREATE TABLE logs (id int, expires_at timestamptz);"
        " CREATE TABLE logs_keep (note text) INHERITS (logs);"
        " INSERT INTO logs_keep VALUES (1, now() - interval '1 day', 'kept');",
    )

    tables = by_table(await discover(database))

    [parent] = tables["logs"]
    assert parent.problem == (
        "it has inheritance children (logs_keep), whose rows a DELETE of it removes too: a sweep "
        "refuses it; name the children instead"
    )
    assert not parent.is_target
    [child] = tables["logs_keep"]
    assert child.is_target
