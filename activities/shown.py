"""How a refusal quotes a value sent by hand: as sent, but never a piece of a secret
(`purge_config.values.masked`, which the config's refusals use too).

A pass's input is typed by hand (`temporal workflow start --input`, a schedule's action), and a
refusal of it is written to the history and the worker's log: a connection string pasted into
the wrong field must not be repeated there.
"""

from __future__ import annotations

from purge_config.values import quoted


def shown(value: object) -> str:
    """`value` as a refusal quotes it (`purge_config.values.quoted`), at most 60 characters."""
    text = quoted(value)
    return text if len(text) <= 60 else text[:57] + "..."
