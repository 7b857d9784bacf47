"""A pass's input typed by hand is quoted in its refusal (`BadPurgeInput`, written to the
history and the worker's log) with every secret a connection string in it could hold masked."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from activities.clock import check_now_ms
from activities.errors import BadPurgeInput
from activities.input_checks import parse_input, parse_step

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


def refused_unseen(refuse: Callable[[], object], said: str) -> None:
    """`refuse()` raises BadPurgeInput saying `said`, then a masked value: no piece of SEC-RET."""
    with pytest.raises(BadPurgeInput) as refused:
        refuse()
    message = str(refused.value)
    assert f"{said}, got <" in message
    assert "SEC" not in message
    assert "RET" not in message


@pytest.mark.parametrize("value", SECRETS_TYPED.values(), ids=SECRETS_TYPED.keys())
def test_a_refused_value_is_quoted_with_no_piece_of_a_secret(value: str) -> None:
    refused_unseen(
        lambda: parse_input({"targets": ["x_auth"], "databases": {"x_auth": value}}),
        "input 'databases' must map target names to database names",
    )


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


@pytest.mark.parametrize("value", SECRETS_TYPED.values(), ids=SECRETS_TYPED.keys())
def test_a_refused_instant_is_quoted_with_no_piece_of_a_secret(value: str) -> None:
    """`now_ms` is checked apart from the other fields (`clock.check_now_ms`: a step's, and a
    pattern's expansion's): a connection string pasted there is masked as anywhere else."""
    said = "now_ms must be an integer of epoch milliseconds"
    refused_unseen(lambda: parse_step({"name": "x_auth", "now_ms": value}), said)
    refused_unseen(lambda: check_now_ms(value), said)


def test_a_refused_instant_of_no_connection_string_is_quoted_as_sent() -> None:
    with pytest.raises(BadPurgeInput) as refused:
        parse_step({"name": "x_auth", "now_ms": "1700000000000"})
    assert "got '1700000000000'" in str(refused.value)
