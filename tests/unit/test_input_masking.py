"""A pass's input typed by hand is quoted in its refusal (`BadPurgeInput`, written to the
history and the worker's log) with every secret a connection string in it could hold masked."""

from __future__ import annotations

import pytest

from activities.errors import BadPurgeInput
from activities.input_checks import parse_input

#: Values put where a database name goes, each holding the secret SEC-RET (in pieces where the
#: string is split): a keyword string with a quoted password, a URL's parameter or user info
#: holding a space, and libpq's other secrets.
SECRETS_TYPED = {
    "quoted-keyword": "host=h password='SEC RET'",
    "parameter-with-a-space": "postgresql://h/db?password=SEC RET",
    "user-info-with-a-space": "postgresql://u:SEC RET@h/db",
    "user-info-with-a-quote": "postgresql://u:SEC'RET@h/db",
    "oauth-secret": "host=h oauth_client_secret=SEC-RET",
    "scram-key": "host=h scram_client_key=SEC-RET",
    "ssl-password": "host=h sslpassword='SEC\\' RET'",
    "upper-case-parameter": "postgresql://h/db?PASSWORD=SEC&RET=1",
    "raw-at-in-the-user": "postgresql://u@x:SEC-RET@h/db",
    "double-quote-in-a-keyword": 'host=h password=SEC"RET',
    "single-quote-in-a-keyword": "host=h password=SEC'RET",
    "double-quoted-keyword": 'host=h password="SEC RET"',
    "no-host-after-the-password": "postgresql://app:SEC-RET/db",
}


@pytest.mark.parametrize("value", SECRETS_TYPED.values(), ids=SECRETS_TYPED.keys())
def test_a_refused_value_is_quoted_with_no_piece_of_a_secret(value: str) -> None:
    with pytest.raises(BadPurgeInput) as refused:
        parse_input({"targets": ["x_auth"], "databases": {"x_auth": value}})
    message = str(refused.value)
    assert "input 'databases' must map target names to database names, got <" in message
    assert "SEC" not in message
    assert "RET" not in message


def test_a_refused_key_that_may_hold_a_secret_is_not_quoted() -> None:
    with pytest.raises(BadPurgeInput) as refused:
        parse_input({"targets": ["x_auth"], "postgresql://app:SEC RET@db/app": 1})
    message = str(refused.value)
    assert "has unknown keys <35 characters not shown: may hold a password>" in message
    assert "SEC" not in message


def test_a_refused_value_of_no_connection_string_is_quoted_as_sent() -> None:
    with pytest.raises(BadPurgeInput) as refused:
        parse_input({"targets": ["x_auth"], "databases": {"x_auth": 7}})
    assert "got {'x_auth': 7}" in str(refused.value)
