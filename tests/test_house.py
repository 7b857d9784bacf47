"""The rooms keep to themselves: configuration needs neither driver nor Temporal, a production
worker never loads the dev harness, and the connection-string reader agrees with libpq."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import Conninfo

from purge_config.dsn import KEYWORDS, BadDsn, parse_dsn, redact
from tests.support.procs import REPO


def _modules_loaded_by(statement: str) -> set[str]:
    """The top-level packages a fresh interpreter has loaded after `statement`."""
    done = subprocess.run(
        [sys.executable, "-c", f"{statement}\nimport sys\nprint(' '.join(sys.modules))"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return {name.split(".")[0] for name in done.stdout.split()}


def test_configuration_imports_neither_psycopg_nor_temporalio() -> None:
    loaded = _modules_loaded_by(
        "import purge_config, purge_config.file, purge_config.targets, purge_config.kinds"
    )

    assert "purge_config" in loaded
    assert not loaded & {"psycopg", "psycopg_pool", "temporalio"}


def test_the_engine_imports_no_temporalio() -> None:
    """The engine raises its own errors; only the activity, at its edge, speaks Temporal."""
    loaded = _modules_loaded_by(
        "import pkgutil, importlib, activities.engine\n"
        "for m in pkgutil.iter_modules(activities.engine.__path__, 'activities.engine.'):\n"
        "    importlib.import_module(m.name)"
    )

    assert {"activities", "psycopg"} <= loaded
    assert "temporalio" not in loaded


@pytest.mark.parametrize("package", ["activities", "activities.engine"])
def test_a_front_door_names_only_what_its_package_holds(package: str) -> None:
    front = importlib.import_module(package)

    assert all(getattr(front, name) is not None for name in front.__all__)


def test_the_activities_front_door_loads_nothing_until_asked() -> None:
    loaded = _modules_loaded_by("import activities")

    assert not loaded & {"psycopg", "temporalio"}


def test_a_production_worker_never_loads_the_dev_harness() -> None:
    loaded = _modules_loaded_by("import worker, purge_ops.runner, purge_ops.passes")

    assert "purge_ops" in loaded
    assert "purge_dev" not in loaded


def test_the_connection_keywords_are_those_of_the_libpq_psycopg_bundles() -> None:
    assert {o.keyword.decode() for o in Conninfo.get_defaults()} == KEYWORDS


DSNS = [
    "",
    "host=db dbname=app",
    "host = db   user=app password='p w\\'x' ",
    "host=db password=a\\ b",
    "postgresql://app:s3cr%40t@db:5433/app?sslmode=require&application_name=x",
    "postgresql://db1:5432,db2:5433/app",
    "postgresql://[::1]:5432/app",
    "postgres://app@/app?host=/var/run/postgresql",
    "postgresql://",
    "postgresql://db/app?ssl=true",
    # Refused by libpq, so by us:
    "host=db bogus=1",
    "just-words",
    "host='db",
    "postgresql://db/app?bogus=1",
    "postgresql://db/app?sslmode=require&&",
    "postgresql://[::1/app",
    "postgresql://db/app?x%zz=1",
    "host=db port=5x",
]


@pytest.mark.parametrize("dsn", DSNS)
def test_connection_strings_are_read_as_libpq_reads_them(dsn: str) -> None:
    try:
        expected: dict[str, str] | None = conninfo_to_dict(dsn)  # type: ignore[assignment]
    except Exception:
        expected = None
    try:
        got: dict[str, str] | None = parse_dsn(dsn)
    except BadDsn:
        got = None
    if expected is not None and not all(
        p.isdigit() for p in str(expected.get("port", "")).split(",") if p
    ):
        expected = None  # libpq parses a bad port and fails later; we refuse it at once
    assert got == expected


def test_a_redacted_keyword_string_reads_back_with_the_password_masked() -> None:
    shown = redact("host=db user=app password='p w\\'x' options='-c a=b'")

    assert conninfo_to_dict(shown) == {
        "host": "db",
        "user": "app",
        "password": "***",
        "options": "-c a=b",
    }
