"""The one error configuration raises."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration file or value that cannot be used; the message is one line for a person."""
