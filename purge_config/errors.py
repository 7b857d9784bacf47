"""The one error configuration raises, the one way a message quotes another error, and the one
way it suggests a name."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable


class ConfigError(ValueError):
    """A configuration file or value that cannot be used; the message is one line for a person."""


def first_line(err: BaseException) -> str:
    """The first line of an error's message, or its class name when it has none: a server's
    DETAIL line (which may quote a row's values, a session token say) never reaches a one-line
    message."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


#: What a server error's DETAIL becomes in what this package sends on (a failure Temporal keeps
#: in a history, a log line): PostgreSQL quotes a row's values there (`Key (token)=(...) already
#: exists`, `Failing row contains (...)`), and a key may be a session token.
DETAIL_LEFT_OUT = "DETAIL:  (left out: it may quote a row's values; the server's log has it)"
_DETAIL_LINE = re.compile(r"^DETAIL:.*$", re.MULTILINE)


def server_details(err: BaseException | None) -> list[str]:
    """The DETAIL of every server error in `err`'s chain (its causes, and the errors it was
    raised while handling), as psycopg read them."""
    found: list[str] = []
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        detail = getattr(getattr(err, "diag", None), "message_detail", None)
        if isinstance(detail, str) and detail:
            found.append(detail)
        err = err.__cause__ or err.__context__
    return found


def without_row_values(text: str, details: Iterable[str] = ()) -> str:
    """`text` (an error's message, a traceback) with each server DETAIL left out: each of
    `details` (`server_details`: exact, even one whose values span lines), then any other
    line that starts with `DETAIL:`."""
    for detail in details:
        text = text.replace(f"DETAIL:  {detail}", DETAIL_LEFT_OUT)
    return _DETAIL_LINE.sub(DETAIL_LEFT_OUT, text)


def did_you_mean(name: str, names: Iterable[str]) -> str:
    """` (did you mean 'x'?)` for the one of `names` nearest a misspelt `name`, or '' when none
    is near: for a message that refuses `name`."""
    near = difflib.get_close_matches(name, list(names), n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""
