"""Framework presets (purge_config.presets): each `kind` read as the `expiring` entry it stands
for, its keys overridable as any entry's, and what it refuses; and, in the slow suite, each
removing the same rows as the framework's own cleanup on a copy of the schema its migrations
made."""

from __future__ import annotations

import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from activities.builtin_kinds import build_registry
from activities.inputs import PurgeStep
from activities.results import PurgeSweep
from activities.sweep import PurgeActivities
from purge_config import ConfigError
from purge_config.file import load_config, parse_config
from purge_config.names import TableName
from purge_config.settings import SweepSettings
from purge_config.specs import TargetSpec, parse_target
from purge_ops.connect import open_pool
from tests.support import framework_apps
from tests.support.activity import activity_env
from tests.support.rows import HOUR, PAST_NOW

DAY_MS = 86_400_000


def spec(text: str) -> TargetSpec:
    return parse_target("purge.toml", 1, tomllib.loads(text), SweepSettings())


@pytest.mark.parametrize(
    ("kind", "table", "column", "max_age_ms"),
    [
        ("django_sessions", "django_session", "expire_date", 0),
        ("celery_results", "django_celery_results_taskresult", "date_done", DAY_MS),
        ("celery_group_results", "django_celery_results_groupresult", "date_done", DAY_MS),
        ("celery_taskmeta", "celery_taskmeta", "date_done", DAY_MS),
        ("celery_tasksetmeta", "celery_tasksetmeta", "date_done", DAY_MS),
    ],
)
def test_one_line_is_the_frameworks_expiring_entry(
    kind: str, table: str, column: str, max_age_ms: int
) -> None:
    got = spec(f'kind = "{kind}"')
    assert (got.kind, got.name, got.tables, got.column, got.max_age_ms) == (
        "expiring",
        kind,
        (TableName(table),),
        column,
        max_age_ms,
    )
    assert (got.row_filter, got.age_from, got.archives) == (None, None, (None,))


def test_procrastinate_ages_finished_jobs_by_their_newest_event() -> None:
    got = spec('kind = "procrastinate"\nmax_age = "3d"')
    assert (got.kind, got.name, got.tables, got.column, got.max_age_ms) == (
        "expiring",
        "procrastinate",
        (TableName("procrastinate_jobs"),),
        "at",
        3 * DAY_MS,
    )
    assert got.age_from == TableName("procrastinate_events")
    assert got.row_filter is not None
    assert got.row_filter.match == (("status", ("succeeded",)),)


def test_procrastinate_has_no_default_age() -> None:
    """remove_old_jobs' max_hours has no default either: the entry must say it."""
    with pytest.raises(ConfigError, match=r"#1: max_age: missing; procrastinate has no default"):
        spec('kind = "procrastinate"')


def test_procrastinate_widens_to_finished_states_only() -> None:
    got = spec(
        'kind = "procrastinate"\nmax_age = "1h"\n'
        'match = { status = ["succeeded", "failed", "cancelled", "aborted"] }'
    )
    assert got.row_filter is not None
    assert got.row_filter.match == (("status", ("succeeded", "failed", "cancelled", "aborted")),)
    for status in ("todo", "doing"):
        with pytest.raises(ConfigError, match=rf"match.status: only finished states .*'{status}'"):
            spec(f'kind = "procrastinate"\nmax_age = "1h"\nmatch = {{ status = "{status}" }}')
    with pytest.raises(ConfigError, match="match: must keep status"):
        spec('kind = "procrastinate"\nmax_age = "1h"\nmatch = { queue_name = "q" }')


def test_procrastinate_in_a_schema_reads_the_events_of_that_schema() -> None:
    got = spec('kind = "procrastinate"\nmax_age = "1d"\ntable = "jobs_app.procrastinate_jobs"')
    assert got.age_from == TableName("procrastinate_events", "jobs_app")
    pattern = spec('kind = "procrastinate"\nmax_age = "1d"\ntable = "t_*.procrastinate_jobs"')
    assert pattern.age_from == TableName("procrastinate_events", "t_*")
    matched = pattern.matched("procrastinate@t_1")
    assert matched is not None
    assert matched.age_from == TableName("procrastinate_events", "t_1")


def test_every_key_of_an_entry_overrides_the_presets() -> None:
    got = spec(
        'kind = "django_sessions"\nname = "sessions"\ntable = "web.django_session"\n'
        'max_age = "1h"\ndatabase = "web"\nmax_rows = 1000\nbatch_target = "20ms"\n'
        'match_not_null = ["session_data"]'
    )
    assert (got.name, got.tables, got.max_age_ms, got.database) == (
        "sessions",
        (TableName("django_session", "web"),),
        3_600_000,
        "web",
    )
    assert (got.guards.max_rows, got.settings.batch_target_ms) == (1000, 20)
    assert got.row_filter is not None
    assert got.row_filter.not_null == ("session_data",)


@pytest.mark.parametrize("key", ["column", "unit"])
def test_the_frameworks_column_is_not_a_key_and_the_refusal_says_why(key: str) -> None:
    with pytest.raises(ConfigError) as refused:
        spec(f'kind = "django_sessions"\n{key} = "ms"')
    assert str(refused.value).endswith(
        f"#1: {key}: a preset fixes its framework's column (django_session.expire_date) and "
        "its type; for another column, write an `expiring` entry"
    )


def test_a_config_of_presets_loads(tmp_path: Path) -> None:
    path = tmp_path / "purge.toml"
    path.write_text(
        'database_url = "postgresql://localhost/app"\n'
        '[[targets]]\nkind = "django_sessions"\n'
        '[[targets]]\nkind = "celery_results"\n'
        '[[targets]]\nkind = "procrastinate"\nmax_age = "3d"\n',
        encoding="utf-8",
    )
    config = load_config(path, env={})
    assert [(t.kind, t.name) for t in config.targets] == [
        ("expiring", "django_sessions"),
        ("expiring", "celery_results"),
        ("expiring", "procrastinate"),
    ]


#: django.contrib.sessions' table as its migration 0001_initial creates it (`sqlmigrate
#: sessions 0001` on PostgreSQL), index included.
DJANGO_SESSION_DDL = """
CREATE TABLE django_session (session_key varchar(40) NOT NULL PRIMARY KEY,
    session_data text NOT NULL, expire_date timestamp with time zone NOT NULL);
CREATE INDEX django_session_expire_date_a5c62663 ON django_session (expire_date);
"""


async def test_django_sessions_end_to_end_on_the_published_table(
    pg_url: str, copies: Callable[[str | None], str]
) -> None:
    """One line sweeps Django's table: the expired sessions go, the live stay, and the one
    expiring exactly now goes too, which clearsessions (`expire_date < now`) would keep."""
    url = make_conninfo(pg_url, dbname=copies(None))
    at = "to_timestamp(%s / 1000.0)"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(DJANGO_SESSION_DDL)
        for key, offset in (("old", -HOUR), ("older", -24 * HOUR), ("now", 0), ("live", HOUR)):
            conn.execute(
                f"INSERT INTO django_session VALUES (%s, '', {at})", (key, PAST_NOW + offset)
            )
        clearsessions_keeps = {
            row[0]
            for row in conn.execute(
                f"SELECT session_key FROM django_session WHERE NOT expire_date < {at}",
                (PAST_NOW,),
            )
        }
    config = parse_config(
        tomllib.loads('[[targets]]\nkind = "django_sessions"\n'),
        env={"PURGE_DATABASE_URL": url},
    )
    pool = await open_pool(url)
    try:
        result: PurgeSweep = await activity_env().run(
            PurgeActivities(build_registry(config, pool)).purge_target,
            PurgeStep(name="django_sessions", now_ms=PAST_NOW),
        )
    finally:
        await pool.close()
    with psycopg.connect(url) as conn:
        left = {row[0] for row in conn.execute("SELECT session_key FROM django_session")}
    assert (result.removed, left) == (3, {"live"})
    assert clearsessions_keeps - left == {"now"}  # the boundary row, and only it


REPO = Path(__file__).resolve().parent.parent

#: Each framework table and the preset that sweeps it.
TABLES = {
    "django_session": "django_sessions",
    "django_celery_results_taskresult": "celery_results",
    "django_celery_results_groupresult": "celery_group_results",
    "celery_taskmeta": "celery_taskmeta",
    "celery_tasksetmeta": "celery_tasksetmeta",
    "procrastinate_jobs": "procrastinate",
}
#: One line each; procrastinate's age is the cleanup's max_hours (framework_cleanups.MAX_HOURS).
PRESETS_TOML = "".join(f'[[targets]]\nkind = "{kind}"\n' for kind in TABLES.values()).replace(
    'kind = "procrastinate"\n', 'kind = "procrastinate"\nmax_age = "2d"\n{widen}'
)
WIDEN = 'match = { status = ["succeeded", "failed", "cancelled", "aborted"] }\n'


def python(*args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, check=True,
        timeout=180,
    )  # fmt: skip


@pytest.fixture
def copies(pg_url: str) -> Iterator[Callable[[str | None], str]]:
    """`copies(template)`: a database of the test's own (a copy of `template`), its URL."""
    made: list[str] = []

    def make(template: str | None) -> str:
        name = f"preset_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(pg_url, autocommit=True) as admin:
            copy = f' TEMPLATE "{template}"' if template else ""
            admin.execute(f'CREATE DATABASE "{name}"{copy}')
        made.append(name)
        return name

    yield make
    with psycopg.connect(pg_url, autocommit=True) as admin:
        for name in reversed(made):
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def rows(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of each framework table (procrastinate's events too), in key order."""
    with psycopg.connect(url) as conn:
        return {
            table: conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
            for table in (*TABLES, "procrastinate_events")
        }


async def sweep_presets(url: str, widen: bool) -> dict[str, int]:
    """A sweep of every preset's target on `url`, as a pass runs it: rows removed by target."""
    text = PRESETS_TOML.format(widen=WIDEN if widen else "")
    config = parse_config(tomllib.loads(text), env={"PURGE_DATABASE_URL": url})
    pool = await open_pool(url)
    try:
        activities = PurgeActivities(build_registry(config, pool))
        removed = {}
        now_ms = int(time.time() * 1000)
        for kind in TABLES.values():
            result: PurgeSweep = await activity_env().run(
                activities.purge_target, PurgeStep(name=kind, now_ms=now_ms)
            )
            removed[kind] = result.removed
        return removed
    finally:
        await pool.close()


@pytest.mark.slow
@pytest.mark.parametrize("widen", [False, True], ids=["succeeded", "finished"])
async def test_each_preset_removes_what_the_frameworks_cleanup_removes(
    pg_url: str, copies: Callable[[str | None], str], widen: bool
) -> None:
    """Schemas made by the frameworks' migrations and filled through their APIs
    (framework_apps, and procrastinate jobs failed, cancelled and waiting), copied twice: the
    frameworks' cleanups (clearsessions, backend_cleanup, remove_old_jobs) on one, the presets
    on the other; the same rows remain. No row sits at the cutoff (every old one is a day or
    more past it), where the two differ: they delete `< cutoff`, a sweep `<=`."""
    filled = copies(None)
    url = make_conninfo(pg_url, dbname=filled)
    python("tests.support.framework_apps", url)
    python("tests.support.framework_cleanups", "extra", url)
    before = rows(url)
    theirs, ours = (make_conninfo(pg_url, dbname=copies(filled)) for _ in range(2))

    python("tests.support.framework_cleanups", "clean", theirs, *(["widen"] if widen else []))
    removed = await sweep_presets(ours, widen)

    after = rows(theirs)
    assert rows(ours) == after
    gone = {table: len(before[table]) - len(after[table]) for table in TABLES}
    # procrastinate: the old succeeded jobs; widened, the old failed and cancelled one too (the
    # old job still waiting stays either way).
    jobs = framework_apps.OLD + (2 if widen else 0)
    assert gone == dict.fromkeys(TABLES, framework_apps.OLD) | {"procrastinate_jobs": jobs}
    assert removed == {kind: gone[table] for table, kind in TABLES.items()}
