"""The one error configuration raises, and the one way a message quotes another error."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration file or value that cannot be used; the message is one line for a person."""


def first_line(err: BaseException) -> str:
    """The first line of an error's message, or its class name when it has none: a server's
    DETAIL line (which may quote a row's values, a session token say) never reaches a one-line
    message."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
