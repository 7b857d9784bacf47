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


#: Connection strings whose password is SEC@RET (or whose pieces are SEC and RET), each a way a
#: hand-written URI puts it where a display of the string once showed a piece of it.
MISPLACED_PASSWORDS = {
    # libpq reads `db.example.com?password=SEC` as the user name, `RET` as the host.
    "at-in-parameters-no-path": "postgresql://db.example.com?password=SEC@RET",
    # ... and `db.example.com` as the user, `5432?password=SEC` as the password.
    "at-in-parameters-after-a-port": "postgresql://db.example.com:5432?password=SEC@RET",
    "at-in-parameters-refused-for-another": "postgresql://h/app?password=SEC@RET&sslmod=require",
    "at-in-parameters-bad-port": "postgresql://h:54x2/app?password=SEC@RET",
    "ampersand-in-a-password-parameter": "postgresql://h/app?password=SEC&RET",
    # A password's `/` ends libpq's host part: host `app`, port `2024`, database `SEC@db...`.
    "slash-in-password-after-digits": "postgresql://app:2024/SEC@db.example.com/app",
    "slash-first-in-password": "postgresql://app:/SEC@h/db",
    "at-in-a-password-parameter": "postgresql://u@h?password=SEC@RET",
    # No `@host`: libpq reads the password as a port, in any host of a list.
    "no-host-after-the-password": "postgresql://app:SECRET/db",
    "a-bracket-in-the-port": "postgresql://app:SEC]RET/db",
    "first-of-two-hosts": "postgresql://app:SECRET,h2:5432/db",
    "a-comma-in-the-password": "postgresql://app:SEC,RET/db",
    "a-question-mark-in-the-password": "postgresql://app:SEC?RET/db",
    "a-slash-in-the-password": "postgresql://app:SEC/RET",
    "an-unclosed-bracket": "postgresql://[app:SECRET/db",
    # libpq decodes a parameter's name: `pass%77ord` is `password`, misread as above.
    "an-encoded-parameter-name": "postgresql://db?pass%77ord=SEC@RET",
    # No user info, a password whose first piece is digits: its rest after the "port".
    "digits-then-a-question-mark": "postgresql://app:2024?SEC-RET",
    "digits-then-a-parameter": "postgresql://app:2024?SEC=RET",
    "digits-in-a-host-list": "postgresql://app:5432,h2:5433?SEC-RET",
    # A parameter typed into another's value, or into the database's name.
    "a-question-mark-for-an-ampersand": "postgresql://app@db/app?sslmode=require?password=SEC-RET",
    "a-semicolon-for-an-ampersand": "postgresql://app@db/app?sslmode=require;password=SEC-RET",
    "a-second-equals-sign": "postgresql://app@db/app?application_name=x=SEC-RET",
    "an-ampersand-for-a-question-mark": "postgresql://app@db/app&password=SEC-RET",
    "a-space-for-a-question-mark": "postgresql://app@db/app password=SEC-RET",
}


@pytest.mark.parametrize("dsn", MISPLACED_PASSWORDS.values(), ids=MISPLACED_PASSWORDS.keys())
def test_no_display_of_a_uri_shows_a_piece_of_its_password(dsn: str) -> None:
    """Neither `redact` nor the config's refusal shows a piece of the password, whether libpq
    reads the string or not: where it cannot tell where a password ends, it shows less."""
    from purge_config import parse_config
    from purge_config.errors import ConfigError

    shown = [redact(dsn)]
    try:
        parse_config({"database_url": dsn}, env={})
    except ConfigError as err:
        shown.append(str(err))
    for text in shown:
        assert "SEC" not in text, text
        assert "RET" not in text, text


@pytest.mark.parametrize(
    ("dsn", "fix"),
    [
        ("postgresql://db.example.com?password=p@ss", "write an '@' in a parameter as %40"),
        ("postgresql://db:5432?sslmode=require@h", "write an '@' in a parameter as %40"),
        ("postgresql://app:2024/pw@db/app", "in a password, write '/' as %2F"),
        ("postgresql://app@db/app&password=p", "parameters follow a '?'"),
    ],
    ids=["at-in-parameters", "at-after-a-port", "slash-in-password", "parameter-in-database"],
)
def test_a_uri_libpq_would_read_otherwise_than_meant_is_refused_naming_the_fix(
    dsn: str, fix: str
) -> None:
    """libpq reads `db?password=p@ss` as the user `db?password=p` at host `ss`, and
    `app:2024/pw@db/app` as host `app`, port 2024, database `pw@db/app`: never what was meant,
    and what connection errors then quote. Refused at start, the refusal naming the fix; the
    encoded forms read as meant, and a `?` alone in a password is still the password's."""
    from purge_config import parse_config
    from purge_config.errors import ConfigError

    with pytest.raises(BadDsn):
        parse_dsn(dsn)
    with pytest.raises(ConfigError) as refused:
        parse_config({"database_url": dsn}, env={})
    assert fix in str(refused.value)
    assert parse_dsn("postgresql://db.example.com?password=p%40ss") == {
        "host": "db.example.com",
        "password": "p@ss",
    }
    assert parse_dsn("postgresql://app:2024%2Fpw@db/app") == {
        "user": "app",
        "password": "2024/pw",
        "host": "db",
        "dbname": "app",
    }
    assert parse_dsn("postgresql://app:pw?x@db/app")["password"] == "pw?x"
    # A `?` before any `/` ends libpq's host part: an `@` in the parameters opens no path.
    socket = {"host": "/run/postgresql", "user": "me@srv"}
    assert parse_dsn("postgresql://?host=/run/postgresql&user=me@srv") == socket
    # A `?` and `=` of a password's own, where no libpq keyword follows the `?`.
    assert parse_dsn("postgresql://u:Xy?z=9@db:5432/app")["password"] == "Xy?z=9"
    assert redact("postgresql://u:Xy?z=9@db:5432/app") == "postgresql://u:***@db:5432/app"
