"""The checks every input passes before a pass or a sweep acts on it, whoever sent it (the CLI,
a schedule, `temporal workflow start`, a caller of the activity itself).

A bad input fails with `BadPurgeInput`, non-retryable, naming the key and the value; the workflow
takes `Any` and checks it here, so input that does not decode fails the workflow with that line
instead of failing its task forever. No side effects: the workflow imports this module.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from activities.clock import check_now_ms
from activities.errors import BadPurgeInput, NewerPurgeFormat
from activities.inputs import PurgeInput, PurgeStep
from activities.shown import shown
from purge_config.fleet import DATABASE_NAME, MAX_BUDGET_MS, MAX_TARGETS_PER_PASS
from purge_config.names import QUEUE_NAME, STEP_NAME
from purge_config.values import masked

#: The keys a workflow input may have.
INPUT_KEYS = (
    "targets",
    "dry_run",
    "max_concurrent",
    "max_per_database",
    "budget_ms",
    "databases",
    "database_ranges",
    "patterns",
    "child_size",
    "run_size",
    "queues",
    "worker_wait_ms",
    "format",
)
#: The keys a step may have.
STEP_KEYS = ("name", "now_ms", "dry_run", "budget_ms", "format")
#: The format of the inputs and steps this release reads. A later release that adds a key an
#: older worker must not ignore sends `format` above this beside it: a worker of this release
#: then leaves that input or step to a worker of the later release (`NewerPurgeFormat`, which
#: Temporal retries) instead of refusing it as a bad input, which would fail the pass mid-deploy.
#: No sender of this release writes `format`: a release before it would refuse the key.
FORMAT = 1


def parse_input(raw: object) -> PurgeInput:
    """The workflow's input, checked."""
    if isinstance(raw, PurgeInput):
        raw = {f.name: getattr(raw, f.name) for f in fields(raw)}
        raw = {k: v for k, v in raw.items() if v is not None}
    if not isinstance(raw, dict):
        raise BadPurgeInput(
            f'input must be an object like {{"targets": ["x_idempotency"]}}, got {shown(raw)}'
        )
    _known_keys(raw, "input", INPUT_KEYS)
    if "targets" not in raw:
        raise BadPurgeInput("input has no 'targets' list")
    targets = raw["targets"]
    if not isinstance(targets, list):
        raise BadPurgeInput(f"input 'targets' must be a list of names, got {shown(targets)}")
    if len(targets) > MAX_TARGETS_PER_PASS:
        raise BadPurgeInput(
            f"input 'targets' has {len(targets)} names, at most {MAX_TARGETS_PER_PASS} "
            'allowed; name tables by a pattern (table = "tenant_*.sessions") instead'
        )
    for name in targets:
        if not isinstance(name, str) or not STEP_NAME.fullmatch(name):
            raise BadPurgeInput(
                f"input 'targets' holds {shown(name)}, not a target name "
                f"(letters, digits, _ . : @ -, at most 228)"
            )
    patterns = raw.get("patterns", [])
    # Each a string before any is hashed: a list or an object among them would fail the
    # workflow's task (a TypeError), again and again, instead of the workflow.
    if (
        not isinstance(patterns, list)
        or not all(isinstance(name, str) for name in patterns)
        or not set(patterns) <= set(targets)
    ):
        raise BadPurgeInput(f"input 'patterns' must list names of 'targets', got {shown(patterns)}")
    return PurgeInput(
        targets=list(targets),
        dry_run=_dry_run(raw, "input"),
        max_concurrent=_count(raw, "max_concurrent", 1, 1000),
        max_per_database=_count(raw, "max_per_database", 1, 1000),
        budget_ms=_count(raw, "budget_ms", 1, MAX_BUDGET_MS),
        databases=_databases(raw, len(targets)),
        patterns=list(dict.fromkeys(patterns)),
        child_size=_count(raw, "child_size", 1, 2000),
        run_size=_count(raw, "run_size", 1, 1000),
        queues=_queues(raw),
        worker_wait_ms=_count(raw, "worker_wait_ms", 1000, MAX_BUDGET_MS),
    )


def parse_step(raw: object) -> PurgeStep:
    """The activity's input, checked: from this workflow, or a caller of the activity itself."""
    if isinstance(raw, PurgeStep):
        raw = {f.name: getattr(raw, f.name) for f in fields(raw)}
    if not isinstance(raw, dict):
        raise BadPurgeInput(
            f'step must be an object like {{"name": ..., "now_ms": ...}}, got {shown(raw)}'
        )
    _known_keys(raw, "step", STEP_KEYS)
    name = raw.get("name")
    if not isinstance(name, str) or not STEP_NAME.fullmatch(name):
        raise BadPurgeInput(f"step 'name' is not a target name, got {shown(name)}")
    return PurgeStep(
        name=name,
        now_ms=check_now_ms(raw.get("now_ms")),
        dry_run=_dry_run(raw, "step"),
        budget_ms=_count(raw, "budget_ms", 0, MAX_BUDGET_MS),
    )


def duplicate_names(names: Sequence[str]) -> list[str]:
    """The names that appear more than once, each once, in order of first appearance."""
    counts = Counter(names)
    return [name for name in counts if counts[name] > 1]


def _count(raw: dict[Any, Any], key: str, low: int, high: int) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadPurgeInput(
            f"input '{key}' must be a whole number from {low} to {high}, got {shown(value)}"
        )
    return value


def _databases(raw: dict[Any, Any], count: int) -> dict[str, str]:
    value = raw.get("databases", {})
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and DATABASE_NAME.fullmatch(v)
        for k, v in value.items()
    ):
        raise BadPurgeInput(
            f"input 'databases' must map target names to database names, got {shown(value)}"
        )
    found = dict(value)
    ranges = raw.get("database_ranges", [])
    bad = BadPurgeInput(
        "input 'database_ranges' must be a list of [database, start, stop] over the "
        f"positions of 'targets', got {shown(ranges)}"
    )
    if not isinstance(ranges, list):
        raise bad
    targets = raw["targets"]
    for entry in ranges:
        if not (
            isinstance(entry, list)
            and len(entry) == 3
            and isinstance(entry[0], str)
            and DATABASE_NAME.fullmatch(entry[0])
            and all(isinstance(n, int) and not isinstance(n, bool) for n in entry[1:])
            and 0 <= entry[1] < entry[2] <= count
        ):
            raise bad
        found.update(dict.fromkeys(targets[entry[1] : entry[2]], entry[0]))
    return found


def _queues(raw: dict[Any, Any]) -> dict[str, str]:
    value = raw.get("queues", {})
    if not isinstance(value, dict) or not all(
        isinstance(k, str)
        and DATABASE_NAME.fullmatch(k)
        and isinstance(v, str)
        and QUEUE_NAME.fullmatch(v)
        for k, v in value.items()
    ):
        raise BadPurgeInput(
            f"input 'queues' must map database names to task queue names, got {shown(value)}"
        )
    return dict(value)


def _known_keys(raw: dict[Any, Any], what: str, allowed: tuple[str, ...]) -> None:
    sent = raw.get("format", FORMAT)
    if isinstance(sent, bool) or not isinstance(sent, int) or sent < 1:
        raise BadPurgeInput(f"{what} 'format' must be a whole number from 1, got {shown(sent)}")
    unknown = sorted(str(key) for key in raw if key not in allowed)
    if sent > FORMAT:
        # Said to be a later release's (a typo sends no format): it may mean more by a key this
        # release knows, too, so it is not read here at all.
        new = f"; keys new to it: {masked(repr(unknown))}" if unknown else ""
        raise NewerPurgeFormat(
            f"{what} of format {sent}, from a later release (this worker reads format {FORMAT}"
            f"{new}): left to a worker of that release"
        )
    if unknown:
        keys = masked(repr(unknown))
        raise BadPurgeInput(f"{what} has unknown keys {keys}, allowed: {', '.join(allowed)}")


def _dry_run(raw: dict[Any, Any], what: str) -> bool:
    dry_run = raw.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise BadPurgeInput(f"{what} 'dry_run' must be true or false, got {shown(dry_run)}")
    return dry_run
