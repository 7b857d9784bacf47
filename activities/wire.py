"""Reading what a worker of another release sent: a sweep's result and a child's report, as the
workflow code meets them mid-deploy; and a child's input.

Temporal's converter decodes a dataclass strictly: a value that does not fit its field raises,
and in workflow code that fails the workflow task on every retry, so the pass stands still until
a worker of the sender's release takes it, or its timeout ends it with no report. Two changes a
later release may make to what it reports would do that to this one: a status it adds, and a
measurement it may leave unknown. `read` takes both: a field of fixed strings (`SweepStatus`)
keeps any string, as written (counted and shown under its own name), and a null where this
release reads a measurement (a `float` field) is that field's default. Unknown keys are dropped,
as the converter drops them. Anything else that does not fit still raises: a count, a flag or a
list that decides what the pass reports (`failed_total`, `failures`) is never replaced by a
default.

A child's input is read by `read_chunk`: as strictly, but for the report it carries from its
run before (`ChunkInput.carried`, read by `read`: its statuses may be a later release's), and
after its `format`, as `activities.input_checks` reads a pass's input and a target's step: an
input a later release marks as its own is left to a worker of that release. A pattern's page
is read by the converter itself: its fields decide which tables are swept.

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
from activities.results import PurgeSweep
from activities.spread_steps import ChunkInput, ChunkReport

T = TypeVar("T")


def read(kind: type[T], raw: object) -> T:
    """`raw` (decoded JSON) as a `kind`, a dataclass, read leniently (see the module)."""
    return typing.cast(T, _value(kind, raw))


def read_chunk(raw: object) -> ChunkInput:
    """A child's input, as strictly as Temporal's converter reads it (what an input says is what
    the child does: no value of it is ever replaced by a default), but for the report it
    carries from its run before, read by `read` (its statuses may be a later release's); and
    after its `format`: one above this release's is refused with `NewerPurgeFormat` (in
    workflow code, a workflow task failure Temporal retries until a worker of the later release
    takes it), since a key it added may change what the rest means."""
    if isinstance(raw, dict):
        sent = raw.get("format", FORMAT)
        if isinstance(sent, int) and not isinstance(sent, bool) and sent > FORMAT:
            raise NewerPurgeFormat(
                f"ChunkInput of format {sent}, from a later release (this worker reads format "
                f"{FORMAT}): left to a worker of that release"
            )
        if raw.get("carried") is not None:
            chunk: ChunkInput = value_to_type(ChunkInput, {**raw, "carried": None})
            return dataclasses.replace(chunk, carried=read(ChunkReport, raw["carried"]))
    return typing.cast(ChunkInput, value_to_type(ChunkInput, raw))


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
    if origin is list:
        if not isinstance(value, list):
            raise TypeError(f"expected a list, got {type(value).__name__}")
        (item,) = args
        return [_value(item, v) for v in value]
    if origin is dict:
        if not isinstance(value, dict):
            raise TypeError(f"expected an object, got {type(value).__name__}")
        key, item = args
        return {_value(key, k): _value(item, v) for k, v in value.items()}
    return value_to_type(hint, value)


def _dataclass(kind: type[Any], value: object) -> object:
    if not isinstance(value, dict):
        raise TypeError(f"{kind.__name__}: expected an object, got {type(value).__name__}")
    hints = _hints(kind)
    given: dict[str, Any] = {}
    for f in dataclasses.fields(kind):
        if not f.init or f.name not in value:
            continue  # a missing field with no default fails in the constructor below
        sent = value[f.name]
        if sent is None and hints[f.name] is float and _has_default(f):
            continue  # a measurement a later release left unknown: the default, as unsent
        try:
            given[f.name] = _value(hints[f.name], sent)
        except (TypeError, ValueError) as err:
            raise TypeError(f"{kind.__name__}.{f.name}: {err}") from None
    try:
        return kind(**given)
    except TypeError as err:
        raise TypeError(f"{kind.__name__}: {err}") from None


#: Each dataclass's field types, by `_hints`.
_HINTS: dict[type[Any], dict[str, Any]] = {}


def _hints(kind: type[Any]) -> dict[str, Any]:
    """A dataclass's field types, resolved once a process: `get_type_hints` evaluates every
    annotation's text again at each call, and a pass of small tables reads a result for each
    (8% of the busy samples of a py-spy profile of bench case 11, bench/README.md). Its dict is
    shared: read, never changed. (Two threads may both resolve it first: the same answer.)"""
    hints = _HINTS.get(kind)
    if hints is None:
        hints = _HINTS[kind] = get_type_hints(kind)
        for hint in hints.values():
            for inner in _dataclasses_in(hint):
                _hints(inner)
    return hints


def _dataclasses_in(hint: Any) -> list[type[Any]]:
    """The dataclasses a field's type names, itself or inside a list, a dict or a union."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return [hint]
    return [kind for arg in get_args(hint) for kind in _dataclasses_in(arg)]


def _has_default(f: dataclasses.Field[Any]) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


# The results the workflows read, and every dataclass inside them, resolved as this module is
# imported: the workflows pass it through, so that is among the worker's own modules, not in a
# sandbox, and a read never depends on which modules a workflow's sandbox has imported.
_hints(PurgeSweep)
_hints(ChunkReport)
