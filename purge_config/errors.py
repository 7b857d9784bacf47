"""The one error configuration raises, the one way a message quotes another error, and the one
way it suggests a name."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A configuration file or value that cannot be used; the message is one line for a person."""


def first_line(err: BaseException) -> str:
    """The first line of an error's message, or its class name when it has none: a server's
    DETAIL line (which may quote a row's values, a session token say) never reaches a one-line
    message."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def did_you_mean(name: str, names: Iterable[str]) -> str:
    """` (did you mean 'x'?)` for the one of `names` nearest a misspelt `name`, or '' when none
    is near: for a message that refuses `name`."""
    near = difflib.get_close_matches(name, list(names), n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""
