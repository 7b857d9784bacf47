"""Framework presets (purge_config.presets): each `kind` read as the `expiring` entry it stands
for, its keys overridable as any entry's, and what it refuses."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from purge_config import ConfigError
from purge_config.file import load_config
from purge_config.names import TableName
from purge_config.settings import SweepSettings
from purge_config.specs import TargetSpec, parse_target

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
def test_the_frameworks_column_is_not_a_key(key: str) -> None:
    with pytest.raises(ConfigError, match=rf"#1: {key}: unknown key"):
        spec(f'kind = "django_sessions"\n{key} = "ms"')


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
