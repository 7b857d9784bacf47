"""How a refusal quotes a value sent by hand: as sent, but never a piece of a secret.

A pass's input is typed by hand (`temporal workflow start --input`, a schedule's action), and a
refusal of it is written to the history and the worker's log: a connection string pasted into
the wrong field must not be repeated there.
"""

from __future__ import annotations

import re

#: What a connection string, or a piece of one, holds where it may hold a secret: a URL's `://`
#: (its user info may hold a password, in forms no pattern could end rightly: raw `@`, quotes,
#: spaces, `/`), or a keyword of libpq's secrets (`dsn.SECRET_KEYS`; `sslpassword` and
#: `pgpassword` included).
_SECRET_HINT = re.compile(
    r"://|password|oauth_client_secret|scram_client_key|scram_server_key", re.I
)


def masked(text: str) -> str:
    """`text` as an error quotes a value sent by hand, but where it may hold a connection
    string's secret: then only its length, so that an error (and the history it is written to)
    never repeats a password, whatever the input held. A value of the right shape is never
    quoted: only the wrong ones, where the shape matters less than what they may hold."""
    if _SECRET_HINT.search(text) is None:
        return text
    return f"<{len(text)} characters not shown: may hold a password>"


def shown(value: object) -> str:
    """`value`'s repr as a refusal quotes it: `masked`, and at most 60 characters."""
    text = masked(repr(value))
    return text if len(text) <= 60 else text[:57] + "..."
