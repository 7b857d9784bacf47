"""Reading what a worker of another release sent: a sweep's result, a pattern's page and a
child's report, as the workflow code meets them mid-deploy; and a child's input.

Temporal's converter decodes a dataclass strictly: a value that does not fit its field (a status
this release does not know, a null where it reads a number, a field whose type a later release
changed) raises, and in workflow code that fails the workflow task on every retry, so the pass
stands still until a worker of the sender's release takes it, or its timeout ends it with no
report. `read` decodes leniently instead: unknown keys are dropped (as the converter drops them),
a field of fixed strings (`SweepStatus`) keeps any string, as written, and a field whose value
does not fit takes its default. Only a field with no default that is missing or does not fit
still raises.

Results only: an input (a child's) is read by `read_input`, strictly, and honours `format` as
`activities.input_checks` does for a pass's input and a target's step: an input a later
release marks as its own is left to a worker of that release.

No side effects: the workflows import this module.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

from temporalio.converter import value_to_type

from activities.errors import NewerPurgeFormat
from activities.input_checks import FORMAT

T = TypeVar("T")


def read(kind: type[T], raw: object) -> T:
    """`raw` (decoded JSON) as a `kind`, a dataclass, read leniently (see the module)."""
    return typing.cast(T, _value(kind, raw))


def read_input(kind: type[T], raw: object) -> T:
    """An input, strictly, as Temporal's converter reads it (what an input says is what the
    work does: no value of it is ever replaced by a default), after its `format`: one above
    this release's is refused with `NewerPurgeFormat` (in workflow code, a workflow task
    failure Temporal retries until a worker of the later release takes it), since a key it
    added may change what the rest means."""
    if isinstance(raw, dict):
        sent = raw.get("format", FORMAT)
        if isinstance(sent, int) and not isinstance(sent, bool) and sent > FORMAT:
            raise NewerPurgeFormat(
                f"{kind.__name__} of format {sent}, from a later release (this worker reads "
                f"format {FORMAT}): left to a worker of that release"
            )
    return typing.cast(T, value_to_type(kind, raw))


def _value(hint: Any, value: object) -> object:
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return _dataclass(hint, value)
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal and all(isinstance(arg, str) for arg in args):
        # A later release's value is kept as written: counted and shown under its own name.
        if not isinstance(value, str):
            raise TypeError(f"expected one of {args}, got {type(value).__name__}")
        return value
    if origin is typing.Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _value(arg, value)
            except (TypeError, ValueError):
                pass
        raise TypeError(f"{value!r} fits none of {hint}")
    if origin is list and isinstance(value, list):
        (item,) = args
        return [_value(item, v) for v in value]
    if origin is dict and isinstance(value, dict):
        key, item = args
        return {_value(key, k): _value(item, v) for k, v in value.items()}
    return value_to_type(hint, value)


def _dataclass(kind: type[Any], value: object) -> object:
    if not isinstance(value, dict):
        raise TypeError(f"{kind.__name__}: expected an object, got {type(value).__name__}")
    hints = get_type_hints(kind)
    given: dict[str, Any] = {}
    for f in dataclasses.fields(kind):
        if not f.init or f.name not in value:
            continue  # a missing field with no default fails in the constructor below
        try:
            given[f.name] = _value(hints[f.name], value[f.name])
        except (TypeError, ValueError) as err:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise TypeError(f"{kind.__name__}.{f.name}: {err}") from None
            # A later release's value this one cannot read: its default, as if never sent.
    try:
        return kind(**given)
    except TypeError as err:
        raise TypeError(f"{kind.__name__}: {err}") from None
