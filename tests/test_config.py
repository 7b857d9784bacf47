"""Every bad configuration is refused with one line naming the file, the key and the bad value,
before the worker connects to anything, so nothing is deleted; the good forms read as documented.

The unit cases go through `load_config` on real files; the end-to-end cases run the command line
(`worker.main`, in this process) the way a deployment does, against the real PostgreSQL server,
and check that no row went.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from purge_config.errors import ConfigError
from purge_config.file import PurgeConfig, config_path, load_config, parse_config
from purge_config.names import TableName
from purge_config.settings import Guards, PartitionPolicy, SweepSettings
from purge_config.values import MAX_AGE_LIMIT_MS
from purge_ops import runner
from tests.conftest import Harness
from tests.support import apptargets
from tests.support.passes import run_pass_beside
from tests.support.procs import Done, clean_env, run_main, use_env
from tests.support.rows import HOUR, auth_rows, bucket_rows, idempotency_rows, keys
from tests.support.servers import RunningTemporal

REPO = Path(__file__).resolve().parent.parent

#: A key left out of an entry built by `sessions()`.
MISSING: Any = object()
SECRET = "s3cret"


def toml_value(value: Any) -> str:
    """One TOML value; JSON's string escapes (\\n, \\u00e9) are TOML's too."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return repr(value)


def toml(**doc: Any) -> str:
    """A config file from Python values: a dict is a [table], a list of dicts [[tables]]."""
    tables = {
        key: value
        for key, value in doc.items()
        if isinstance(value, dict)
        or (isinstance(value, list) and value and all(isinstance(v, dict) for v in value))
    }
    lines = [f"{key} = {toml_value(value)}" for key, value in doc.items() if key not in tables]
    for key, value in tables.items():
        for entry in value if isinstance(value, list) else [value]:
            lines.append(f"[[{key}]]" if isinstance(value, list) else f"[{key}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in entry.items()]
    return "\n".join(lines) + "\n"


IDEMPOTENCY = {"kind": "idempotency"}


def sessions(**changes: Any) -> dict[str, Any]:
    """A valid `expiring` entry named sessions, with `changes` (MISSING drops a key)."""
    entry = {"kind": "expiring", "name": "sessions", "table": "sessions", "column": "expires_at"}
    entry.update(changes)
    return {key: value for key, value in entry.items() if value is not MISSING}


def second(entry: dict[str, Any]) -> str:
    """A file whose first target is valid and whose second is `entry`."""
    return toml(targets=[IDEMPOTENCY, entry])


def write(tmp_path: Path, text: str, name: str = "purge.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def refusal(path: Path, env: dict[str, str] | None = None) -> str:
    """The message `load_config` refuses `path` with."""
    with pytest.raises(ConfigError) as refused:
        load_config(path, env=env or {})
    return str(refused.value)


def assert_one_clear_line(message: str, path: Path, key: str, shown: str) -> None:
    assert message.startswith(f"{path}: "), message
    assert key in message, message
    assert shown in message, message
    assert "\n" not in message, message
    assert "\r" not in message, message


@dataclass(frozen=True)
class Bad:
    """A bad file, the key its refusal must name and how it must show the bad value."""

    text: str
    key: str
    shown: str


S2 = "[[targets]] #2 (sessions)"
T2 = "[[targets]] #2"

BAD_FILES: dict[str, Bad] = {
    # The file as a whole.
    "toml-unterminated-string": Bad('task_queue = "purge\n', "not valid TOML", "line 1"),
    "toml-key-twice": Bad('task_queue = "a"\ntask_queue = "b"\n', "not valid TOML", "line 2"),
    "toml-targets-not-a-table": Bad("[[targets]]\nkind\n", "not valid TOML", "line 2"),
    "top-unknown-key": Bad(toml(task_queu="purge"), "task_queu", "unknown key"),
    "top-unknown-key-with-newline": Bad('"task\\nqueue" = "purge"\n', "'task\\nqueue'", "unknown"),
    # Top-level values of the wrong type or shape.
    "database_url-int": Bad(toml(database_url=5), ": database_url", "got 5"),
    "database_url-empty": Bad(toml(database_url=""), ": database_url", "got ''"),
    "database_wait-int": Bad(toml(database_wait=30), ": database_wait", "got 30"),
    "database_wait-no-unit": Bad(toml(database_wait="30"), ": database_wait", "'30'"),
    "database_wait-zero": Bad(toml(database_wait="0s"), ": database_wait", "got '0s'"),
    "database_wait-over-an-hour": Bad(toml(database_wait="61m"), ": database_wait", "'61m'"),
    "task_queue-list": Bad(toml(task_queue=[]), ": task_queue", "got []"),
    "task_queue-empty": Bad(toml(task_queue=""), ": task_queue", "got ''"),
    "task_queue-space": Bad(toml(task_queue="purge now"), ": task_queue", "'purge now'"),
    "task_queue-too-long": Bad(toml(task_queue="q" * 201), ": task_queue", "'qqqq"),
    "targets-string": Bad(toml(targets="x"), ": targets", "got 'x'"),
    "targets-entry-int": Bad(toml(targets=[1]), "[[targets]] #1", "got 1"),
    "schedule-int": Bad(toml(schedule=3), ": schedule", "got 3"),
    "schedule-array": Bad(toml(schedule=[{"cron": "0 * * * *"}]), ": schedule", "[{'cron'"),
    "targets-one-table": Bad(toml(targets=IDEMPOTENCY), ": targets", "{'kind': 'idempotency'}"),
    "targets-entry-string": Bad(toml(targets=["auth"]), "[[targets]] #1", "got 'auth'"),
    # [schedule].
    "schedule-unknown-key": Bad(toml(schedule={"crn": "0 * * * *"}), "schedule.crn", "unknown"),
    "schedule-id-int": Bad(toml(schedule={"id": 5}), "schedule.id", "got 5"),
    "schedule-id-space": Bad(
        toml(schedule={"id": "purge hourly"}), "schedule.id", "'purge hourly'"
    ),
    "cron-empty": Bad(toml(schedule={"cron": ""}), "schedule.cron", "got ''"),
    "cron-list": Bad(toml(schedule={"cron": ["23 * * * *"]}), "schedule.cron", "['23 * * * *']"),
    "cron-four-fields": Bad(toml(schedule={"cron": "23 * * *"}), "schedule.cron", "'23 * * *'"),
    "cron-six-fields": Bad(
        toml(schedule={"cron": "0 23 * * * *"}), "schedule.cron", "'0 23 * * * *'"
    ),
    "cron-words": Bad(toml(schedule={"cron": "every hour"}), "schedule.cron", "'every hour'"),
    "cron-letters": Bad(toml(schedule={"cron": "x x x x x"}), "schedule.cron", "'x x x x x'"),
    "cron-minute-61": Bad(toml(schedule={"cron": "61 * * * *"}), "schedule.cron", "'61 * * * *'"),
    "cron-hour-24": Bad(toml(schedule={"cron": "0 24 * * *"}), "schedule.cron", "'0 24 * * *'"),
    "cron-day-0": Bad(toml(schedule={"cron": "0 0 0 * *"}), "schedule.cron", "'0 0 0 * *'"),
    "cron-month-13": Bad(toml(schedule={"cron": "0 0 * 13 *"}), "schedule.cron", "'0 0 * 13 *'"),
    "cron-weekday-8": Bad(toml(schedule={"cron": "0 0 * * 8"}), "schedule.cron", "'0 0 * * 8'"),
    "cron-quartz-L": Bad(toml(schedule={"cron": "0 0 L * *"}), "schedule.cron", "'0 0 L * *'"),
    "cron-step-0": Bad(toml(schedule={"cron": "*/0 * * * *"}), "schedule.cron", "'*/0 * * * *'"),
    "cron-backwards": Bad(toml(schedule={"cron": "30-10 * * * *"}), "schedule.cron", "'30-10"),
    "cron-empty-item": Bad(toml(schedule={"cron": "1,,2 * * * *"}), "schedule.cron", "'1,,2"),
    "cron-never-fires": Bad(toml(schedule={"cron": "0 0 31 2 *"}), "schedule.cron", "never fires"),
    "time_zone-unknown": Bad(toml(schedule={"time_zone": "Mars/Olympus"}), "time_zone", "'Mars/"),
    "time_zone-path": Bad(toml(schedule={"time_zone": "../etc/passwd"}), "time_zone", "'../etc"),
    "time_zone-padded": Bad(toml(schedule={"time_zone": " UTC"}), "schedule.time_zone", "' UTC'"),
    "time_zone-int": Bad(toml(schedule={"time_zone": 1}), "schedule.time_zone", "got 1"),
    # kind.
    "kind-missing": Bad(second({"name": "sessions"}), f"{T2}: kind", "missing"),
    "kind-unknown": Bad(second({"kind": "idempotence"}), f"{T2}: kind", "'idempotence'"),
    "kind-int": Bad(second({"kind": 5}), f"{T2}: kind", "got 5"),
    "kind-case": Bad(second({"kind": "Expiring"}), f"{T2}: kind", "'Expiring'"),
    # Keys a kind does not take.
    "target-unknown-key": Bad(
        second(sessions(colum="x")), f"{S2}: colum", "unknown key (did you mean 'column'?)"
    ),
    "top-unknown-key-far": Bad(toml(frobnicate=1), "frobnicate", "unknown key; allowed here"),
    "builtin-max_age": Bad(
        toml(targets=[{**IDEMPOTENCY, "max_age": "1d"}]), "#1: max_age", "unknown"
    ),
    "auth-table": Bad(second({"kind": "auth", "table": "x_auth"}), f"{T2}: table", "unknown key"),
    "python-name": Bad(
        second({"kind": "python", "name": "app", "factory": "tests.support.apptargets:targets"}),
        f"{T2} (app): name",
        "unknown key",
    ),
    # Every key of the wrong type.
    "name-int": Bad(second(sessions(name=1)), f"{T2}: name", "got 1"),
    "table-bool": Bad(second(sessions(table=True)), f"{S2}: table", "got True"),
    "column-float": Bad(second(sessions(column=2.5)), f"{S2}: column", "got 2.5"),
    "max_age-int": Bad(second(sessions(max_age=30)), f"{S2}: max_age", "got 30"),
    "factory-list": Bad(second({"kind": "python", "factory": []}), f"{T2}: factory", "got []"),
    "names-string": Bad(
        second({"kind": "python", "factory": "tests.support.apptargets:targets", "names": "a"}),
        f"{T2}: names",
        "got 'a'",
    ),
    "names-holds-int": Bad(
        second({"kind": "python", "factory": "tests.support.apptargets:targets", "names": [1]}),
        f"{T2}: names",
        "got [1]",
    ),
    "idempotency-table-int": Bad(toml(targets=[{**IDEMPOTENCY, "table": 1}]), "#1: table", "got 1"),
    "auth-lockouts-list": Bad(
        second({"kind": "auth", "lockouts_table": ["x"]}), f"{T2}: lockouts_table", "['x']"
    ),
    # Empty strings.
    "name-empty": Bad(second(sessions(name="")), f"{T2}: name", "got ''"),
    "table-empty": Bad(second(sessions(table="")), f"{S2}: table", "got ''"),
    "column-empty": Bad(second(sessions(column="")), f"{S2}: column", "got ''"),
    "max_age-empty": Bad(second(sessions(max_age="")), f"{S2}: max_age", "got ''"),
    "factory-empty": Bad(second({"kind": "python", "factory": ""}), f"{T2}: factory", "got ''"),
    "rate_limit-name-empty": Bad(second({"kind": "rate_limit", "name": ""}), f"{T2}: name", "''"),
    # `expiring` without what it needs.
    "expiring-no-name": Bad(second(sessions(name=MISSING)), f"{T2}: name", "missing"),
    "expiring-no-table": Bad(second(sessions(table=MISSING)), f"{S2}: table", "missing"),
    "expiring-no-column": Bad(second(sessions(column=MISSING)), f"{S2}: column", "missing"),
    "python-no-factory": Bad(second({"kind": "python"}), f"{T2}: factory", "missing"),
    # Target names.
    "name-space": Bad(second(sessions(name="my sessions")), f"{T2}: name", "'my sessions'"),
    "name-newline": Bad(second(sessions(name="a\nb")), f"{T2}: name", "'a\\nb'"),
    "name-too-long": Bad(second(sessions(name="n" * 101)), f"{T2}: name", "'nnnn"),
    # Duplicate names.
    "duplicate-builtin": Bad(
        toml(targets=[IDEMPOTENCY, IDEMPOTENCY]), f"{T2}: name", "'x_idempotency' is already"
    ),
    "duplicate-expiring-named-like-auth": Bad(
        toml(targets=[{"kind": "auth"}, sessions(name="x_auth")]),
        f"{T2}: name",
        "'x_auth'",
    ),
    "duplicate-renamed-builtin": Bad(
        second({"kind": "rate_limit", "name": "x_idempotency"}), f"{T2}: name", "#1"
    ),
    "duplicate-python-names": Bad(
        second(
            {
                "kind": "python",
                "factory": "tests.support.apptargets:targets",
                "names": ["tmp_uploads", "x_idempotency"],
            }
        ),
        f"{T2}: names",
        "'x_idempotency' is already a name of [[targets]] #1",
    ),
    "duplicate-after-python": Bad(
        toml(
            targets=[
                {"kind": "python", "factory": "tests.support.apptargets:targets", "names": ["s"]},
                sessions(name="s"),
            ]
        ),
        f"{T2}: name",
        "'s'",
    ),
    # Python factories.
    "factory-no-colon": Bad(
        second({"kind": "python", "factory": "nocolon"}), "factory", "'nocolon'"
    ),
    "factory-two-colons": Bad(second({"kind": "python", "factory": "a:b:c"}), "factory", "'a:b:c'"),
    "factory-empty-module": Bad(second({"kind": "python", "factory": ":f"}), "factory", "':f'"),
    "factory-not-importable": Bad(
        second({"kind": "python", "factory": "tests.support.no_such_module:targets"}),
        f"{T2}: factory",
        "'tests.support.no_such_module'",
    ),
    "factory-no-attribute": Bad(
        second({"kind": "python", "factory": "tests.support.apptargets:no_such_factory"}),
        f"{T2}: factory",
        "'no_such_factory'",
    ),
    "factory-not-callable": Bad(
        second({"kind": "python", "factory": "tests.support.apptargets:calls"}),
        f"{T2}: factory",
        "'tests.support.apptargets:calls' is not callable",
    ),
}

#: Not a SQL name for a table or a column: each is refused, never quoted into a statement.
BAD_IDENTIFIERS = {
    "double-quote": 'se"ssions',
    "semicolon": "sessions;drop",
    "space": "my sessions",
    "dash": "my-sessions",
    "leading-digit": "1sessions",
    "unicode": "séssions",
    "64-characters": "s" * 64,
    "trailing-space": "sessions ",
}
#: Refused as a table only in a dotted form.
BAD_TABLES = {
    "three-parts": "a.b.c",
    "empty-table-part": "app.",
    "empty-schema-part": ".sessions",
    "64-character-schema": "s" * 64 + ".sessions",
    "quoted-dotted": '"app.sessions"',
}

for label, ident in BAD_IDENTIFIERS.items():
    BAD_FILES[f"table-{label}"] = Bad(second(sessions(table=ident)), f"{S2}: table", repr(ident))
    BAD_FILES[f"column-{label}"] = Bad(second(sessions(column=ident)), f"{S2}: column", repr(ident))
for label, ident in BAD_TABLES.items():
    BAD_FILES[f"table-{label}"] = Bad(second(sessions(table=ident)), f"{S2}: table", repr(ident))
BAD_FILES["column-dotted"] = Bad(second(sessions(column="s.c")), f"{S2}: column", "'s.c'")
BAD_FILES["idempotency-table-dash"] = Bad(
    toml(targets=[{**IDEMPOTENCY, "table": "x-idem"}]), "[[targets]] #1: table", "'x-idem'"
)
BAD_FILES["auth-one-table-twice"] = Bad(
    second({"kind": "auth", "failures_table": "t", "lockouts_table": "t"}),
    f"{T2}: lockouts_table",
    "the same table as failures_table, got 't'",
)
BAD_FILES["auth-failures-three-parts"] = Bad(
    second({"kind": "auth", "failures_table": "a.b.c"}), f"{T2}: failures_table", "'a.b.c'"
)

# Whole partitions: `partitions` and `detached_schema`.
BAD_FILES["partitions-unknown"] = Bad(
    second(sessions(partitions="truncate")), f"{S2}: partitions", "'truncate'"
)
BAD_FILES["partitions-case"] = Bad(
    second(sessions(partitions="Drop")), f"{S2}: partitions", "'Drop'"
)
BAD_FILES["partitions-bool"] = Bad(second(sessions(partitions=True)), f"{S2}: partitions", "True")
BAD_FILES["partitions-detach-without-schema"] = Bad(
    second(sessions(partitions="detach")), f"{S2}: detached_schema", "missing"
)
BAD_FILES["detached_schema-with-drop"] = Bad(
    second(sessions(partitions="drop", detached_schema="archive")),
    f"{S2}: detached_schema",
    "only with partitions = 'detach'",
)
BAD_FILES["detached_schema-without-partitions"] = Bad(
    second(sessions(detached_schema="archive")), f"{S2}: detached_schema", "'archive'"
)
BAD_FILES["detached_schema-int"] = Bad(
    second(sessions(partitions="detach", detached_schema=5)), f"{S2}: detached_schema", "got 5"
)
BAD_FILES["python-partitions"] = Bad(
    second({"kind": "python", "factory": "tests.support.apptargets:targets", "partitions": "drop"}),
    f"{T2}: partitions",
    "unknown key",
)
for label, ident in {**BAD_IDENTIFIERS, "dotted": "app.archive", "empty": ""}.items():
    BAD_FILES[f"detached_schema-{label}"] = Bad(
        second(sessions(partitions="detach", detached_schema=ident)),
        f"{S2}: detached_schema",
        repr(ident),
    )

BAD_MAX_AGES = {
    "no-unit": "30",
    "no-number": "d",
    "unknown-unit": "1x",
    "unit-twice": "1h1h",
    "negative": "-5m",
    "fraction": "1.5h",
    "leading-space": " 1h",
    "inner-space": "1h 30m",
    "upper-case": "1H",
    "fullwidth-digit": "\uff11h",
    "over-a-century": "36526d",
    "over-a-century-in-weeks": "5219w",
    "twenty-one-digits": "1" * 21 + "ms",
    "five-thousand-digits": "1" * 5000 + "s",
}
for label, age in BAD_MAX_AGES.items():
    BAD_FILES[f"max_age-{label}"] = Bad(
        second(sessions(max_age=age)), f"{S2}: max_age", repr(age)[:40]
    )


@pytest.mark.parametrize("bad", BAD_FILES.values(), ids=BAD_FILES.keys())
def test_bad_file_is_refused_with_one_line_naming_file_key_and_value(
    tmp_path: Path, bad: Bad
) -> None:
    path = write(tmp_path, bad.text)

    assert_one_clear_line(refusal(path), path, bad.key, bad.shown)


def test_missing_file_says_how_to_give_one(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.toml"

    assert_one_clear_line(refusal(path), path, "no such file", "--config")


def test_directory_in_place_of_file_cannot_be_read(tmp_path: Path) -> None:
    path = tmp_path / "purge.toml"
    path.mkdir()

    assert_one_clear_line(refusal(path), path, "cannot read", "Is a directory")


def test_file_not_utf8_cannot_be_read(tmp_path: Path) -> None:
    path = tmp_path / "purge.toml"
    path.write_bytes(b'task_queue = "p\xffrge"\n')

    assert_one_clear_line(refusal(path), path, "cannot read", "0xff")


DSNS_WITH_A_PASSWORD = {
    "url-empty-query-items": (
        f"postgresql://app:{SECRET}@db/app?sslmode=bogus&&&",
        "postgresql://app:***@db/app",
    ),
    # Only parameters that read as libpq's own are shown: a typo's value may be a password's
    # rest (a password with no user info: app:2024?pw=x).
    "url-unknown-parameter": (
        f"postgresql://app:{SECRET}@db/app?bogus=1",
        "'postgresql://app:***@db/app?***'",
    ),
    "url-password-in-query": (
        f"postgresql://app@db/app?password={SECRET}&bogus=1",
        "postgresql://app@db/app?",
    ),
    "url-broken-ipv6-host": (
        f"postgresql://app:{SECRET}@[::1/app",
        "postgresql://app:***@[::1/app",
    ),
    # libpq takes a "#" or a "?" in the user info as the password's, where a URL parser ends the
    # host (and so found no password to mask).
    "url-hash-in-password": (
        f"postgresql://app:pw#{SECRET}@db:x/app",
        "'postgresql://app:***@db:x/app'",
    ),
    "url-question-mark-in-password": (
        f"postgresql://app:pw?{SECRET}@db:x/app",
        "'postgresql://app:***@db:x/app'",
    ),
    "url-unencoded-at-in-password": (
        f"postgresql://app:pw@{SECRET}@db:x/app",
        "'postgresql://app:***@db:x/app'",
    ),
    "keywords-unknown-option": (f"host=db password={SECRET} bogus=1", "<unparseable"),
    # A key=value string holding "://" somewhere once went through the URL redaction, which
    # found no user:password@ in it and showed the password.
    "keywords-with-a-url-value": (
        f"host=db password={SECRET} sslrootcert=file:///etc/ca.pem bogus=1",
        "<unparseable",
    ),
    "keywords-url-looking-password": (f"password={SECRET}://x host=db &&", "<unparseable"),
    "just-the-password": (SECRET, "<unparseable"),
}


@pytest.mark.parametrize(
    ("dsn", "shown"), DSNS_WITH_A_PASSWORD.values(), ids=DSNS_WITH_A_PASSWORD.keys()
)
def test_bad_database_url_is_refused_without_its_password(
    tmp_path: Path, dsn: str, shown: str
) -> None:
    path = write(tmp_path, toml(database_url=dsn))

    message = refusal(path)

    assert_one_clear_line(message, path, "database_url: not a PostgreSQL connection", shown)
    assert SECRET not in message


def test_bad_purge_database_url_is_refused_under_its_own_name_without_its_password(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, toml(database_url="postgresql://app@db/app"))

    message = refusal(path, env={"PURGE_DATABASE_URL": f"host=db password={SECRET} bogus=1"})

    assert_one_clear_line(message, path, "PURGE_DATABASE_URL: not a PostgreSQL", "<unparseable")
    assert SECRET not in message


URLS_OF_THE_WRONG_TYPE = {
    "database_url-array": (toml(database_url=[f"postgresql://app:{SECRET}@db/app"]), "an array"),
    "database_url-table": (
        f'[database_url]\ndsn = "postgresql://app:{SECRET}@db/app"\n',
        "a table",
    ),
    "databases-string": (f'databases = "postgresql://app:{SECRET}@db/app"\n', "a string"),
    "databases-entry-string": (
        f'[databases]\neu = "postgresql://app:{SECRET}@db/app"\n',
        "a string",
    ),
    "databases-url-array": (
        f'[databases.eu]\nurl = ["postgresql://app:{SECRET}@db/app"]\n',
        "an array",
    ),
}


@pytest.mark.parametrize(
    ("text", "shown"), URLS_OF_THE_WRONG_TYPE.values(), ids=URLS_OF_THE_WRONG_TYPE.keys()
)
def test_a_url_of_the_wrong_type_is_refused_by_its_type_not_its_value(
    tmp_path: Path, text: str, shown: str
) -> None:
    """A connection string given as an array or a table (or a `[databases]` entry given as a
    string) is refused naming the value's type: quoting it would show its password."""
    path = write(tmp_path, text)

    message = refusal(path)

    assert_one_clear_line(message, path, "database", f"got {shown}")
    assert SECRET not in message


def test_bad_database_url_in_file_is_refused_even_when_the_environment_overrides_it(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, toml(database_url=5))

    message = refusal(path, env={"PURGE_DATABASE_URL": "postgresql://app@db/app"})

    assert_one_clear_line(message, path, ": database_url", "got 5")


# The accepted forms.


def load(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> PurgeConfig:
    return load_config(write(tmp_path, text), env=env or {})


def test_defaults_are_filled_in(tmp_path: Path) -> None:
    config = load(tmp_path, toml(targets=[IDEMPOTENCY, {"kind": "rate_limit"}, {"kind": "auth"}]))

    assert config.database_url is None
    assert config.database_wait_ms == 30_000
    assert (config.task_queue, config.schedule.id) == ("purge", "purge-hourly")
    assert (config.schedule.cron, config.schedule.time_zone) == ("23 * * * *", "UTC")
    assert config.target_names == ["x_idempotency", "x_rate_limit", "x_auth"]
    assert [t.tables for t in config.targets] == [
        (TableName("x_idempotency"),),
        (TableName("x_rate_limit"),),
        (TableName("x_auth_failures"), TableName("x_auth_lockouts")),
    ]


def test_a_machine_without_zone_files_loads_utc_and_says_why_it_cannot_check_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slim container image has no time zone database (and no tzdata package): the default
    UTC, which every Temporal server knows, must not stop the worker; another zone is refused
    saying the machine cannot check it, not that it is no IANA zone."""
    from zoneinfo import ZoneInfoNotFoundError

    from purge_config import schedules

    def no_zone_files(key: str) -> None:
        raise ZoneInfoNotFoundError(f"No time zone found with key {key}")

    monkeypatch.setattr(schedules, "ZoneInfo", no_zone_files)
    monkeypatch.setattr(schedules, "available_timezones", set, raising=False)
    assert load(tmp_path, toml(targets=[IDEMPOTENCY])).schedule.time_zone == "UTC"
    utc = toml(targets=[IDEMPOTENCY], schedule={"time_zone": "Etc/UTC"})
    assert load(tmp_path, utc).schedule.time_zone == "Etc/UTC"
    with pytest.raises(ConfigError) as paris:
        load(tmp_path, toml(targets=[IDEMPOTENCY], schedule={"time_zone": "Europe/Paris"}))
    assert "'Europe/Paris' cannot be checked: this machine has no time zone database" in str(
        paris.value
    )


def test_empty_file_is_a_config_with_no_targets(tmp_path: Path) -> None:
    config = load(tmp_path, "")

    assert config.targets == ()
    assert config.target_names == []


def test_design_example_is_accepted_as_written(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        toml(
            database_url="postgresql://app@db/app",
            task_queue="purge",
            schedule={"id": "purge-hourly", "cron": "23 * * * *", "time_zone": "UTC"},
            targets=[
                IDEMPOTENCY,
                {"kind": "rate_limit"},
                {"kind": "auth"},
                sessions(column="expires_at", max_age="0s"),
            ],
        ),
    )

    assert config.database_url == "postgresql://app@db/app"
    assert config.target_names == ["x_idempotency", "x_rate_limit", "x_auth", "sessions"]


def test_schema_qualified_table_is_kept_exactly_with_its_case(tmp_path: Path) -> None:
    config = load(tmp_path, toml(targets=[sessions(table="App.UserSessions", column="Exp_At")]))

    [spec] = config.targets
    assert spec.tables == (TableName(table="UserSessions", schema="App"),)
    assert spec.column == "Exp_At"


def test_identifier_of_63_characters_is_accepted_and_64_refused(tmp_path: Path) -> None:
    """PostgreSQL's limit is 63 bytes; one more would be truncated into another name."""
    at_limit, over = "s" * 63, "s" * 64
    config = load(
        tmp_path, toml(targets=[sessions(table=f"{at_limit}.{at_limit}", column=at_limit)])
    )

    [spec] = config.targets
    assert spec.tables == (TableName(table=at_limit, schema=at_limit),)
    assert spec.column == at_limit
    for entry in (sessions(table=over), sessions(column=over), sessions(table=f"{over}.t")):
        message = refusal(write(tmp_path, toml(targets=[entry]), "over.toml"))
        assert f"'{over}" in message, message


@pytest.mark.parametrize(
    ("max_age", "ms"),
    [
        ("1h30m", 5_400_000),
        ("0s", 0),
        ("1w2d", 9 * 86_400_000),
        ("250ms", 250),
        ("1m1ms", 60_001),
        ("90s", 90_000),
        ("36525d", MAX_AGE_LIMIT_MS),
        ("007s", 7_000),
        ("0" * 5000 + "1h", 3_600_000),
    ],
)
def test_max_age_is_read_as_the_sum_of_its_parts(tmp_path: Path, max_age: str, ms: int) -> None:
    config = load(tmp_path, toml(targets=[sessions(max_age=max_age)]))

    assert config.targets[0].max_age_ms == ms


@pytest.mark.parametrize(
    ("database_wait", "ms"), [("1s", 1_000), ("2m30s", 150_000), ("1h", 3_600_000)]
)
def test_database_wait_is_read_as_a_duration(tmp_path: Path, database_wait: str, ms: int) -> None:
    config = load(tmp_path, toml(database_wait=database_wait))

    assert config.database_wait_ms == ms


def test_max_age_defaults_to_zero(tmp_path: Path) -> None:
    config = load(tmp_path, toml(targets=[sessions()]))

    assert config.targets[0].max_age_ms == 0


@pytest.mark.parametrize(
    "cron", ["*/15 * * * *", "0 9-17 * * mon-fri", "0 0 1 jan,Jul *", "5/20 0,12 1-31/2 * 7"]
)
def test_cron_that_temporal_accepts_is_accepted(tmp_path: Path, cron: str) -> None:
    config = load(tmp_path, toml(schedule={"cron": cron}))

    assert config.schedule.cron == cron


def test_schedule_values_are_kept(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        toml(task_queue="ops/purge", schedule={"id": "nightly", "time_zone": "Europe/Paris"}),
    )

    assert config.task_queue == "ops/purge"
    assert (config.schedule.id, config.schedule.time_zone) == ("nightly", "Europe/Paris")


def test_a_factory_module_beside_the_config_is_not_found_and_the_line_says_where_to_put_it(
    tmp_path: Path,
) -> None:
    """A module next to purge.toml is not on the worker's path: the refusal says how to put it
    there, not only that it is missing."""
    (tmp_path / "myapp_beside").mkdir()
    (tmp_path / "myapp_beside" / "__init__.py").write_text("")
    (tmp_path / "myapp_beside" / "purge.py").write_text("def targets():\n    return []\n")
    path = write(tmp_path, second({"kind": "python", "factory": "myapp_beside.purge:targets"}))

    message = refusal(path)

    assert_one_clear_line(message, path, f"{T2}: factory", "'myapp_beside.purge'")
    assert message.endswith(
        "ModuleNotFoundError: No module named 'myapp_beside' (the worker imports it, and what "
        "it imports, from its own Python environment: install it there, or put the directory "
        "that holds it on PYTHONPATH)"
    ), message


def test_python_factory_is_resolved_and_its_names_are_swept(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        toml(
            targets=[
                IDEMPOTENCY,
                {
                    "kind": "python",
                    "factory": "tests.support.apptargets:targets",
                    "names": ["tmp_uploads"],
                },
            ]
        ),
    )

    assert config.targets[1].factory is apptargets.targets
    assert config.target_names == ["x_idempotency", "tmp_uploads"]


def test_purge_database_url_overrides_the_file(tmp_path: Path) -> None:
    text = toml(database_url="postgresql://file@db/app")

    assert load(tmp_path, text).database_url == "postgresql://file@db/app"
    overridden = load(tmp_path, text, env={"PURGE_DATABASE_URL": "postgresql://env@db/app"})
    assert overridden.database_url == "postgresql://env@db/app"


def test_purge_database_url_alone_is_enough(tmp_path: Path) -> None:
    config = load(tmp_path, "", env={"PURGE_DATABASE_URL": "host=db dbname=app"})

    assert config.require_database_url() == "host=db dbname=app"


def test_no_database_url_anywhere_is_refused_when_one_is_needed(tmp_path: Path) -> None:
    path = write(tmp_path, "")

    with pytest.raises(ConfigError) as refused:
        load_config(path, env={}).require_database_url()

    assert_one_clear_line(str(refused.value), path, "database_url: missing", "PURGE_DATABASE_URL")


def test_config_path_prefers_the_option_then_purge_config_then_purge_toml() -> None:
    env = {"PURGE_CONFIG": "/etc/from-env.toml"}

    assert config_path("/etc/from-option.toml", env) == Path("/etc/from-option.toml")
    assert config_path(None, env) == Path("/etc/from-env.toml")
    assert config_path(None, {}) == Path("purge.toml")
    assert config_path(None, {"PURGE_CONFIG": ""}) == Path("purge.toml")


# End to end: `pg-purge run --config F` as a deployment runs it (`worker.main`, in this process:
# tests/test_cli.py runs `run` through the real entry point).

PREFIX = "pg-purge: config error: "


def run_worker_cli(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None) -> Done:
    return run_main("run", *args, cwd=cwd, env=env)


def refused_line(done: Done) -> str:
    """The one stderr line of a worker that refused its config; fails on anything else."""
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output, output
    lines = done.stderr.splitlines()
    assert len(lines) == 1, output
    assert lines[0].startswith(PREFIX), output
    return lines[0].removeprefix(PREFIX)


SECOND_TARGETS_E2E = {
    "column-with-semicolon": (sessions(column="expires_at;drop"), f"{S2}: column"),
    "unknown-kind": ({"kind": "idempotence"}, f"{T2}: kind"),
    "duplicate-name": (IDEMPOTENCY, f"{T2}: name"),
    "max_age-malformed": (sessions(max_age="1.5h"), f"{S2}: max_age"),
    "detach-without-schema": (sessions(partitions="detach"), f"{S2}: detached_schema"),
}


@pytest.mark.parametrize(
    ("entry", "key"), SECOND_TARGETS_E2E.values(), ids=SECOND_TARGETS_E2E.keys()
)
def test_worker_refuses_a_bad_second_target_and_deletes_nothing(
    tmp_path: Path, db: psycopg.Connection[Any], schema_url: str, entry: dict[str, Any], key: str
) -> None:
    """The first target is valid and its table holds expired rows: none of them may go."""
    idempotency_rows(db, {"old-1": 1_000, "old-2": HOUR, "old-3": 2 * HOUR})
    path = write(tmp_path, toml(database_url=schema_url, targets=[IDEMPOTENCY, entry]))

    line = refused_line(run_worker_cli("--config", str(path)))

    assert line.startswith(f"{path}: {key}"), line
    assert keys(db, "x_idempotency") == {"old-1", "old-2", "old-3"}


def test_worker_refuses_a_bad_purge_database_url_over_a_good_file(
    tmp_path: Path, db: psycopg.Connection[Any], schema_url: str
) -> None:
    idempotency_rows(db, {"old": 1_000})
    path = write(tmp_path, toml(database_url=schema_url, targets=[IDEMPOTENCY]))
    env = clean_env(PURGE_DATABASE_URL=f"postgresql://app:{SECRET}@db/app?sslmode=bogus&&&")

    line = refused_line(run_worker_cli("--config", str(path), env=env))

    assert line.startswith(f"{path}: PURGE_DATABASE_URL: not a PostgreSQL connection string"), line
    assert SECRET not in line
    assert keys(db, "x_idempotency") == {"old"}


def test_worker_without_any_config_file_says_how_to_give_one(tmp_path: Path) -> None:
    line = refused_line(run_worker_cli(cwd=tmp_path))

    assert line.startswith("purge.toml: no such file"), line
    assert all(way in line for way in ("--config", "PURGE_CONFIG", "./purge.toml")), line


def test_worker_reads_purge_config_when_no_option_is_given(tmp_path: Path) -> None:
    path = write(tmp_path, toml(task_queu="purge"), "from-env.toml")
    write(tmp_path, toml(targets="x"))  # ./purge.toml, which PURGE_CONFIG must win over

    line = refused_line(run_worker_cli(cwd=tmp_path, env=clean_env(PURGE_CONFIG=str(path))))

    assert line.startswith(f"{path}: task_queu: unknown key"), line


def test_worker_without_a_database_url_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, toml(targets=[IDEMPOTENCY]))

    line = refused_line(run_worker_cli("--config", str(path)))

    assert line.startswith(f"{path}: database_url: missing"), line


def test_sweep_settings_default_and_override_per_target(tmp_path: Path) -> None:
    """`[sweep]` sets every built-in target's bounds; a target's own keys override them."""
    path = tmp_path / "purge.toml"
    path.write_text(
        '[sweep]\ntime_budget = "5m"\nbatch_target = "25ms"\n'
        '[[targets]]\nkind = "idempotency"\n'
        '[[targets]]\nkind = "auth"\nlock_timeout = "500ms"\ntime_budget = "2m"\n',
        encoding="utf-8",
    )
    first, second = load_config(path, env={}).targets
    assert (first.settings.time_budget_ms, first.settings.batch_target_ms) == (300_000, 25)
    assert first.settings.lock_timeout_ms == SweepSettings().lock_timeout_ms
    assert (second.settings.time_budget_ms, second.settings.lock_timeout_ms) == (120_000, 500)
    assert second.settings.batch_target_ms == 25


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[sweep]\ntime_budget = "25m"\n', "sweep.time_budget: must be from 1s to 20m, got '25m'"),
        ('[sweep]\ntime_budget = "10ms"\n', "sweep.time_budget: must be from 1s to 20m"),
        ('[sweep]\nbatch_target = 15\n', "sweep.batch_target: must be a string like '30d'"),
        ('[sweep]\nbatch_size = "1000"\n', "sweep.batch_size: unknown key"),
        ('sweep = "fast"\n', "sweep: must be a table, got 'fast'"),
        (
            '[sweep]\nbatch_target = "2s"\nstatement_timeout = "5s"\n',
            "sweep.statement_timeout: must be at least 10 times batch_target (2s), got 5s",
        ),
        (
            '[[targets]]\nkind = "auth"\nlock_timeout = "2m"\n',
            "[[targets]] #1: lock_timeout: must be from 1ms to 1m, got '2m'",
        ),
        (
            '[[targets]]\nkind = "python"\nfactory = "tests.support.gate:targets"\n'
            'time_budget = "1m"\n',
            "[[targets]] #1: time_budget: unknown key",
        ),
    ],
    ids=["budget-too-long", "budget-too-short", "not-a-string", "unknown-key", "not-a-table",
         "timeout-below-target", "target-lock-timeout", "python-has-no-sweep-keys"],
)  # fmt: skip
def test_bad_sweep_settings_are_refused(tmp_path: Path, toml: str, message: str) -> None:
    path = tmp_path / "purge.toml"
    path.write_text(toml, encoding="utf-8")
    with pytest.raises(ConfigError) as refused:
        load_config(path, env={})
    assert str(refused.value).startswith(f"{path}: ")
    assert message in str(refused.value)


def test_guards_are_read_per_target(tmp_path: Path) -> None:
    path = tmp_path / "purge.toml"
    path.write_text(
        '[[targets]]\nkind = "idempotency"\nmax_rows = 100000\nmax_fraction = 0.25\n'
        'max_clock_jump = "6h"\n[[targets]]\nkind = "auth"\n',
        encoding="utf-8",
    )
    guarded, plain = load_config(path, env={}).targets
    assert guarded.guards == Guards(
        max_rows=100_000, max_fraction=0.25, max_clock_jump_ms=21_600_000
    )
    assert plain.guards == Guards()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("max_rows = 0", "max_rows: must be a whole number of at least 1, got 0"),
        ("max_rows = 1.5", "max_rows: must be a whole number of at least 1, got 1.5"),
        ("max_rows = true", "max_rows: must be a whole number of at least 1, got True"),
        ('max_rows = "10"', "max_rows: must be a whole number of at least 1, got '10'"),
        ("max_fraction = 0", "max_fraction: must be a share above 0 and at most 1"),
        ("max_fraction = 1.5", "max_fraction: must be a share above 0 and at most 1"),
        ("max_fraction = 25", "got 25"),
        ('max_clock_jump = "0s"', "max_clock_jump: at least 1s, got '0s'"),
        ("max_clock_jump = 3600", "max_clock_jump: must be a string like '30d', got 3600"),
    ],
)
def test_bad_guards_are_refused(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "purge.toml"
    path.write_text(f'[[targets]]\nkind = "idempotency"\n{line}\n', encoding="utf-8")
    with pytest.raises(ConfigError) as refused:
        load_config(path, env={})
    assert str(refused.value).startswith(f"{path}: [[targets]] #1: ")
    assert message in str(refused.value)


@pytest.mark.parametrize("kind", ["idempotency", "rate_limit", "auth"])
def test_every_builtin_kind_takes_partitions(tmp_path: Path, kind: str) -> None:
    config = load(tmp_path, toml(targets=[{"kind": kind, "partitions": "drop"}]))

    assert config.targets[0].partitions == PartitionPolicy("drop")


def test_partitions_default_to_delete_and_detach_keeps_its_schema(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        toml(
            targets=[
                sessions(),
                sessions(name="audit", partitions="detach", detached_schema="Archive_1"),
            ]
        ),
    )

    plain, archived = config.targets
    assert plain.partitions == PartitionPolicy("delete")
    assert archived.partitions == PartitionPolicy("detach", "Archive_1")


async def test_the_readme_config_example_is_accepted(
    harness: Harness,
    temporal_server: RunningTemporal,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The README's example file, run: pointed at the test's servers (its database_url and
    task_queue), its schema `app` being the test's, its fictional factory swapped for a real
    one, a worker built from it (`run_worker`, as `pg-purge run` does) sweeps a pass of the
    targets it names through Temporal, and each removes its expired rows and only those."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    start = readme.index("```toml\ndatabase_url") + len("```toml\n")
    raw = tomllib.loads(readme[start : readme.index("```", start)])
    assert raw["database_url"] == "postgresql://purge@db/app"
    raw["database_url"], raw["task_queue"] = harness.url, harness.task_queue
    for entry in raw["targets"]:
        if entry.get("table", "").startswith("app."):
            entry["table"] = entry["table"].replace("app.", f"{harness.schema}.", 1)
        if entry.get("factory") == "myapp.purge:targets":
            entry["factory"] = "tests.support.apptargets:targets"
    config = parse_config(raw, env={})
    assert config.target_names == [
        "x_idempotency", "x_rate_limit", "x_auth", "sessions", "tmp_uploads",
    ]  # fmt: skip
    assert config.metrics == "0.0.0.0:9464"

    # The tables it names, each with a row expired as of now and one live.
    idempotency_rows(harness.db, {"old": harness.now_ms - HOUR, "new": harness.now_ms + HOUR})
    bucket_rows(
        harness.db,
        {"full": (0.0, 4.0, 1.0, harness.now_ms - HOUR), "empty": (0.0, 4.0, 1e-9, harness.now_ms)},
    )
    auth_rows(
        harness.db,
        {"f-old": harness.now_ms - HOUR, "f-new": harness.now_ms + HOUR},
        {"l-old": harness.now_ms - HOUR},
    )
    harness.db.execute(
        "CREATE TABLE sessions (key text PRIMARY KEY, expires_at timestamptz NOT NULL)"
    )
    harness.db.execute(
        "INSERT INTO sessions VALUES ('s-old', now() - interval '1 hour'),"
        " ('s-new', now() + interval '1 hour')"
    )
    harness.db.execute(
        "CREATE TABLE tmp_uploads (key text PRIMARY KEY, expires_at_ms bigint NOT NULL)"
    )
    harness.db.execute(
        "INSERT INTO tmp_uploads VALUES ('u-old', %s), ('u-new', %s)",
        (harness.now_ms - HOUR, harness.now_ms + HOUR),
    )

    use_env(monkeypatch, clean_env())  # Temporal's client settings come from the test alone
    apptargets.start_app(
        harness.pool
    )  # the application's own store, as the README's start() makes it
    try:
        result = await run_pass_beside(
            lambda stop: runner.run_worker(
                config, stop=stop, temporal_address=temporal_server.address
            ),
            harness.client,
            config.task_queue,
            {"targets": config.target_names},
        )
    finally:
        apptargets.stop_app()

    assert {s["name"]: s["removed"] for s in result["swept"]} == {
        "x_idempotency": 1, "x_rate_limit": 1, "x_auth": 2, "sessions": 1, "tmp_uploads": 1,
    }  # fmt: skip
    assert result["failed"] == []
    assert keys(harness.db, "x_idempotency") == {"new"}
    assert keys(harness.db, "x_rate_limit") == {"empty"}
    assert keys(harness.db, "x_auth_failures") == {"f-new"}
    assert keys(harness.db, "x_auth_lockouts") == set()
    assert keys(harness.db, f'"{harness.schema}".sessions') == {"s-new"}
    assert keys(harness.db, "tmp_uploads") == {"u-new"}


def test_an_archive_refuses_partitions_that_would_leave_without_their_copy(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path,
        toml(targets=[sessions(archive_table="archive.sessions", partitions="drop")]),
    )

    assert_one_clear_line(
        refusal(path), path, "partitions", "'drop' takes partitions out without copying"
    )


@pytest.mark.parametrize("url", ["mysql://app:s3cret@db/app", "sqlite:///var/app.db"])
def test_another_database_s_url_is_named_by_its_scheme_without_the_rest(url: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config({"database_url": url, "targets": [{"kind": "idempotency"}]}, env={})

    scheme = url.split("://")[0]
    assert str(refused.value).endswith(
        f"database_url: not a PostgreSQL connection string (postgresql://...), got a "
        f"{scheme}:// URL"
    )
    assert "s3cret" not in str(refused.value)
