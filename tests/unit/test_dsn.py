"""purge_config/dsn.py without a server: connection strings read as the libpq that psycopg
bundles reads them, and shown with the password masked."""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import Conninfo

from purge_config.dsn import KEYWORDS, BadDsn, parse_dsn, redact


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


@pytest.mark.parametrize(
    "key", ["sslpassword", "oauth_client_secret", "scram_client_key", "scram_server_key"]
)
def test_every_secret_libpq_reads_is_masked_as_the_password_is(key: str) -> None:
    """`sslpassword` unlocks the client's SSL key; libpq 18 reads an OAuth client secret and
    SCRAM keys: each masked in both forms."""
    assert conninfo_to_dict(redact(f"host=db {key}=s3cret password=pw")) == {
        "host": "db",
        key: "***",
        "password": "***",
    }
    shown = redact(f"postgresql://u@db/app?sslmode=require&{key}=s3cret")
    assert "s3cret" not in shown
    assert shown.endswith(f"?sslmode=require&{key}=***")


def test_a_password_with_an_unencoded_at_is_refused_without_a_piece_of_it() -> None:
    """libpq ends the user info at the first `@`: `p@ss` makes a host `ss@db.example`, whose
    name a connection error then quotes (a piece of the password, in a log line). Refused at
    start instead, naming the fix; the encoded form, and an `@` after the host, still read."""
    from purge_config import parse_config
    from purge_config.errors import ConfigError

    with pytest.raises(BadDsn) as refused:
        parse_dsn("postgresql://bob:p@ss@db.example/app")
    assert str(refused.value) == "an '@' in its user or password: write it %40"
    with pytest.raises(ConfigError) as config:
        parse_config({"database_url": "postgresql://bob:p@ss@db.example/app"}, env={})
    assert "ss@" not in str(config.value)
    assert "write it %40" in str(config.value)
    assert parse_dsn("postgresql://bob:p%40ss@db.example/app")["password"] == "p@ss"
    assert parse_dsn("postgresql://bob@db.example/app@x")["dbname"] == "app@x"


def test_a_question_mark_before_the_at_is_the_password_s_as_libpq_reads_it() -> None:
    """libpq ends the user info at the first `@` before a `/`, a `?` before it included: a
    second `@` after it is still the password's; one in the parameters is not."""
    with pytest.raises(BadDsn):
        parse_dsn("postgresql://bob:p?x@y@db/app")
    assert parse_dsn("postgresql://u@db?application_name=x@y")["application_name"] == "x@y"
