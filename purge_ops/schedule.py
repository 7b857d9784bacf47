"""The Temporal Schedule that fires a pass: declared from the config, created or updated in place.

Policies are chosen for a retention sweep, not left at the SDK's defaults:
- overlap SKIP: one live pass; a slow pass makes the next one wait for the hour after, not pile up;
- catch-up window of about one period: after an outage at most one missed pass runs late (the
  default of a year would replay every missed hour);
- a small jitter, so many deployments sharing a cluster (or a database) do not all fire at :23:00;
- an execution timeout on each pass (`pass_timeout`): a pass that cannot go on (a
  workflow task no worker of the running release can run) ends by itself, where overlap SKIP
  would otherwise skip every firing behind it.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleDescription,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
)
from temporalio.common import TypedSearchAttributes
from temporalio.converter import PayloadConverter
from temporalio.service import RPCError, RPCStatusCode

from activities.input_checks import FORMAT, parse_input
from activities.inputs import PurgeInput
from activities.search_attributes import at_start
from purge_config import PurgeConfig, ScheduleConfig
from purge_config.fleet import DEFAULT_DATABASE_KEY
from purge_ops.namespace_check import namespace_answer
from purge_ops.passes import not_this_pass
from workflows.spread import CHUNK_GRACE

WORKFLOW_TYPE = "Purge"
#: The action memo key holding the fingerprint of the config the schedule was made from. In the
#: action, not the schedule's note: an operator's pause note must neither be lost nor read as a
#: change, and each scheduled pass then carries the fingerprint of the config that started it.
MEMO_KEY = "purge_config"
#: How long a scheduled pass may run past its budget and its `[pass] worker_wait` (an activity
#: sent as the budget ends may wait that long before it fails as `NoPurgeWorker`, which the pass
#: reports) before Temporal ends it: the bound of its children on a database's queue (the
#: deadline and CHUNK_GRACE, `workflows.spread`) and ten minutes to report. Its sweeps stop at
#: the budget, so a pass still running then is one that cannot go on: a workflow task that no
#: worker of the release running can run (after a rollback, a later release's `format`; a
#: nondeterminism error). Overlap SKIP would skip every firing behind it until an operator
#: terminated it; timed out, it lets the next one run.
PASS_GRACE = CHUNK_GRACE + timedelta(minutes=10)


def pass_timeout(config: PurgeConfig, request: dict[str, Any]) -> timedelta:
    """The execution timeout of each pass a schedule starts with `request` (the config's
    `scheduled_input`): its budget, the config's worker_wait and PASS_GRACE (95 minutes for the
    default hourly schedule)."""
    return timedelta(milliseconds=request["budget_ms"] + config.limits.worker_wait_ms) + PASS_GRACE


@dataclass(frozen=True)
class ScheduleOutcome:
    """What `ensure_schedule` did, and the schedule as the server now describes it."""

    action: str
    """`created`, `updated`, `unchanged`, `left as it is` (a regional worker's config, naming no
    target on a database the schedule's passes sweep, or beside another config's schedules; or
    a worker's, where a later release wrote the schedule's input with a higher `format`), `left
    behind`, or `not listed` (the namespace's schedules could not be listed)."""
    summary: str
    """What will run, when: the config's schedule and the server's next fire times."""
    warns: bool = False
    """Whether a worker writing it as it starts says it as a warning: not this worker's to
    write, left firing, not checked, or an update that drops databases or moves the queue (two
    configs writing one schedule in turn, say)."""


def desired(config: PurgeConfig, spec: ScheduleConfig, searchable: bool = False) -> Schedule:
    """The schedule `spec` of the config; with `searchable`, its passes start with the search
    attributes they record (`activities.search_attributes`)."""
    request = config.scheduled_input(spec)
    schedule = Schedule(
        action=ScheduleActionStartWorkflow(
            WORKFLOW_TYPE,
            request,
            # Temporal appends the fire time: purge-hourly-2026-11-29T11:23:00Z.
            id=spec.id,
            task_queue=config.task_queue,
            execution_timeout=pass_timeout(config, request),
            memo={MEMO_KEY: fingerprint(config, spec, searchable)},
            typed_search_attributes=at_start() if searchable else TypedSearchAttributes.empty,
        ),
        spec=ScheduleSpec(
            cron_expressions=[spec.cron],
            time_zone_name=spec.time_zone,
            jitter=timedelta(milliseconds=spec.jitter_ms),
        ),
        policy=SchedulePolicy(
            overlap=ScheduleOverlapPolicy.SKIP,
            catchup_window=timedelta(milliseconds=spec.catchup_window_ms),
        ),
    )
    return schedule


def fingerprint(config: PurgeConfig, spec: ScheduleConfig, searchable: bool = False) -> str:
    """A digest of everything the schedule is made from: equal configs, equal schedules. (The
    passes' execution timeout follows from the input's budget and worker_wait; a schedule made
    before it, with this digest and no timeout, is told apart by `matches`.)"""
    material: dict[str, object] = {
        "cron": spec.cron,
        "time_zone": spec.time_zone,
        "jitter_ms": spec.jitter_ms,
        "catchup_window_ms": spec.catchup_window_ms,
        "task_queue": config.task_queue,
        "targets": list(spec.targets) or config.target_names,
        "input": config.scheduled_input(spec),
        "workflow": WORKFLOW_TYPE,
        "overlap": "skip",
    }
    if searchable:
        # Only when set: a schedule made before the attributes existed stays `unchanged`
        # until they are defined, then is updated to start its passes with them.
        material["searchable"] = True
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]


def matches(current: Schedule, want: Schedule, converter: PayloadConverter) -> bool:
    """Whether the server's schedule already is the one wanted (a hand edit counts as a change)."""
    action, wanted = current.action, want.action
    if not isinstance(action, ScheduleActionStartWorkflow):
        return False
    assert isinstance(wanted, ScheduleActionStartWorkflow)
    memo = action.memo or {}
    held = memo.get(MEMO_KEY)
    if isinstance(held, Payload):
        held = converter.from_payload(held)
    return (
        held == (wanted.memo or {}).get(MEMO_KEY)
        and action.workflow == wanted.workflow
        and action.task_queue == wanted.task_queue
        and action.id == wanted.id
        and action.execution_timeout == wanted.execution_timeout
        and current.policy.overlap == want.policy.overlap
        and current.policy.catchup_window == want.policy.catchup_window
        and (current.spec.jitter or timedelta(0)) == (want.spec.jitter or timedelta(0))
        and current.spec.time_zone_name == want.spec.time_zone_name
        and not current.spec.intervals
        and _same_input(action, wanted, converter)
    )


def _same_input(
    held: ScheduleActionStartWorkflow,
    wanted: ScheduleActionStartWorkflow,
    converter: PayloadConverter,
) -> bool:
    """Whether the schedule's passes start with the input wanted, as JSON reads it back: an
    input edited by hand, or written by another release under the same fingerprint, is not."""
    if len(wanted.args) != 1:
        return False
    value = _held_value(held, converter)
    return value is not _UNREAD and bool(value == json.loads(json.dumps(wanted.args[0])))


async def ensure_schedules(
    client: Client, config: PurgeConfig, only_ensured: bool = False, by_worker: bool = False
) -> list[ScheduleOutcome]:
    """Create or update every schedule of the config (`[schedule]`, or each `[schedules.NAME]`);
    with `only_ensured`, only those that say `ensure = true` (a `run` without `--schedule`).

    `by_worker` (a worker writing it as it starts): where the config is a regional worker's
    (every target on a database queue of its own) and the schedule's passes sweep a database
    it names no target on, the schedule is left as it is (`left as it is`): writing it would
    drop every other database's targets from every pass. `pg-purge schedule`, typed by an
    operator, and a worker of a config with targets of its own write it and say which
    databases it drops. A worker leaves a schedule whose input a later release wrote (its
    `format` above this release's) as it is too, whatever its config: mid-deploy, an old worker
    restarted late would otherwise turn every pass back to the old release's input."""
    searchable = await namespace_answer(client)
    specs = [s for s in config.schedules if s.ensure or not only_ensured]
    regional = _regional(config, by_worker)
    # A regional config's queue's other schedules are the scheduler's config's: never its to
    # call left behind, and, where its worker writes, read only for what they sweep.
    others: dict[str, set[str] | None] | None = {}
    extra: list[ScheduleOutcome] = []
    if config.own_queue is not None or regional:
        try:
            others = await _others_on_the_queue(client, config)
        except RPCError as err:
            if regional:
                others = None  # each schedule it would create says why it did not
            else:
                # Only said: what the config names is written all the same.
                extra.append(
                    ScheduleOutcome(
                        "not listed",
                        warns=True,
                        summary=f"schedules on task queue {config.task_queue!r}: the "
                        f"namespace's schedules could not be listed ({err.message}), so none "
                        "the config no longer names is said",
                    )
                )
    outcomes = [
        await _ensure(client, config, spec, searchable, by_worker, others if regional else {})
        for spec in specs
    ]
    if config.own_queue is None:
        return outcomes + extra
    return outcomes + [_left_behind(config, other) for other in others or {}] + extra


async def _others_on_the_queue(client: Client, config: PurgeConfig) -> dict[str, set[str] | None]:
    """The schedules this package made for the config's task queue that the config does not
    name (one renamed or removed from it, or another config's of the same queue), each with
    the targets its passes sweep (None where its input does not read as a pass's)."""
    wanted = {spec.id for spec in config.schedules}
    found: dict[str, set[str] | None] = {}
    async for listed in await client.list_schedules():
        action = listed.schedule.action if listed.schedule else None
        if listed.id in wanted or getattr(action, "workflow", None) != WORKFLOW_TYPE:
            continue
        try:
            described = await client.get_schedule_handle(listed.id).describe()
        except RPCError:
            continue  # deleted between the list and the read
        made = described.schedule.action
        if (
            isinstance(made, ScheduleActionStartWorkflow)
            and made.task_queue == config.task_queue
            and MEMO_KEY in (made.memo or {})
        ):
            held = _held_input(made, client.data_converter.payload_converter)
            found[listed.id] = set(held.targets) if held is not None else None
    return found


def _left_behind(config: PurgeConfig, schedule_id: str) -> ScheduleOutcome:
    """A schedule the config no longer names (renamed or removed): still firing, so said, never
    deleted behind a user's back."""
    return ScheduleOutcome(
        "left behind",
        warns=True,
        summary=f"schedule {schedule_id}: not in the config but still firing on task queue "
        f"{config.task_queue!r}; delete it with "
        f"`temporal schedule delete --schedule-id {schedule_id}`",
    )


async def _ensure(
    client: Client,
    config: PurgeConfig,
    spec: ScheduleConfig,
    searchable: bool | None,
    by_worker: bool,
    others: dict[str, set[str] | None] | None,
) -> ScheduleOutcome:
    """Create the schedule, or update it in place when it differs (unless a worker leaves it as it
    is: `_kept_from`); safe to run from many workers at once (the loser of a create race
    updates, which is idempotent). `searchable` None: the namespace would not say whether it
    defines the attributes; a schedule made without them, an existing one as it was made.
    `others`, given to a regional worker's start: the other schedules firing passes on the
    queue, with their targets (None: they could not be listed); it creates none beside one that
    sweeps its targets."""
    want = desired(config, spec, bool(searchable))
    schedule_id = spec.id
    sweeping = _sweeping_these(others, config.scheduled_input(spec)["targets"], config.task_queue)
    if sweeping and not await _exists(client, schedule_id):
        return ScheduleOutcome(
            "left as it is",
            warns=True,
            summary=f"schedule {schedule_id}: not created: {sweeping}, and every target of "
            "this config has a database queue of its own (a regional worker's config): a "
            "worker creates no schedule whose passes would sweep its targets beside another. "
            "Write the schedules with `pg-purge schedule` from the config that names every "
            "database of the passes (or, where the other is this config's under an old id, "
            "delete that one)",
        )
    was_on = config.task_queue
    dropped: dict[str, int] = {}  # what an update takes from the schedule's passes, said
    try:
        handle = await client.create_schedule(schedule_id, want)
        action = "created"
    except ScheduleAlreadyRunningError:
        handle = client.get_schedule_handle(schedule_id)
        current = await handle.describe()
        try:
            held = _ours(current.schedule.action, schedule_id)
        except ScheduleConflict as err:
            raise err from None  # said alone, not as what the create's refusal led to
        was_on = held.task_queue
        if searchable is None:
            want = desired(config, spec, bool(held.typed_search_attributes.search_attributes))
        converter = client.data_converter.payload_converter
        if matches(current.schedule, want, converter):
            action = "unchanged"
        else:
            wanted = want.action
            assert isinstance(wanted, ScheduleActionStartWorkflow)  # as desired() made it
            # Judged on the schedule as described, then again on the description the update is
            # made from: another writer (a later release's worker) coming between the two is
            # seen. The SDK sends its update with no conflict token, so one that writes between
            # that description and the update still is not: this narrows the race, no more.
            left, dropped = _kept_from(held, wanted, config, schedule_id, by_worker, converter)
            if left is not None:
                return left

            def update(given: ScheduleUpdateInput) -> ScheduleUpdate | None:
                nonlocal left, dropped
                now = given.description.schedule
                fresh = _ours(now.action, schedule_id)
                left, dropped = _kept_from(fresh, wanted, config, schedule_id, by_worker, converter)
                if left is not None:
                    return None  # no update
                # Replace what the config owns; keep what an operator owns: the state (a
                # pause, its note, a limit on remaining actions), and the times the spec skips
                # or is bounded by (a freeze window), which no config says.
                want.state = now.state
                want.spec.skip = now.spec.skip
                want.spec.start_at, want.spec.end_at = now.spec.start_at, now.spec.end_at
                return ScheduleUpdate(schedule=want)

            await handle.update(update)
            if left is not None:
                return left
            action = "updated"
    described = await handle.describe()
    summary = summarize(config, spec, described)
    if action == "updated" and was_on != config.task_queue:
        # A config whose task_queue changed, or another config's schedule of this id: the
        # second would now fight this one at every start, so it is said.
        summary += (
            f"\nmoved from task queue {was_on!r}: if another config's schedule has this "
            "id, give one of them another `id` under [schedule]"
        )
    if action == "updated" and dropped:
        summary += f"\ndrops {_said(dropped)}: its passes no longer sweep them"
    moved = action == "updated" and was_on != config.task_queue
    return ScheduleOutcome(action=action, summary=summary, warns=bool(dropped) or moved)


async def behind(client: Client, config: PurgeConfig, specs: Sequence[ScheduleConfig]) -> list[str]:
    """For each of `specs` (the config's schedules a worker did not write as it started) whose
    schedule starts this package's passes on the config's task queue but not the passes the
    config would (`passes.not_this_pass`: targets it lacks, or sent to another config's
    queues): one line saying so. Mid-deploy, workers of a new config started before
    `pg-purge schedule` writes it (or without it ever running) find the old config's input;
    its passes send their targets to the old config's queues, and once the old workers are
    gone each of those targets waits `worker_wait` and fails `NoPurgeWorker`. A regional
    worker's config (every target on a queue of its own) says nothing: it names only its own
    databases, and the scheduler's passes are not its to judge (nor to write). A schedule this
    worker cannot read (absent, not allowed, not this package's, an input that is not a pass's
    of this release: a later release's, one written by hand) is not said: it stops no start."""
    lines: list[str] = []
    if config.own_queue is None:
        return lines
    converter = client.data_converter.payload_converter
    for spec in specs:
        try:
            described = await client.get_schedule_handle(spec.id).describe()
        except RPCError:
            continue
        try:
            action = _ours(described.schedule.action, spec.id)
        except ScheduleConflict:
            continue
        value = _held_value(action, converter)
        if action.task_queue != config.task_queue or _as_pass(value) is None:
            continue
        why = not_this_pass(value, config.scheduled_input(spec))
        if why:
            lines.append(
                f"schedule {spec.id} starts passes that are not this config's: {why}. They "
                "sweep by the config that wrote it, and a target routed to its queues fails "
                "NoPurgeWorker once no worker of that config runs: `pg-purge schedule` (or a "
                "worker started with --schedule) writes this config's; where another config "
                "owns that schedule, give this one another `id` under [schedule]"
            )
    return lines


def _ours(action: object, schedule_id: str) -> ScheduleActionStartWorkflow:
    """A schedule's action where it starts this package's passes; else ScheduleConflict: it is
    someone else's schedule under this id, and replacing it would stop their workflow."""
    if isinstance(action, ScheduleActionStartWorkflow) and action.workflow == WORKFLOW_TYPE:
        return action
    what = getattr(action, "workflow", None) or "no workflow"
    raise ScheduleConflict(
        f"schedule {schedule_id} exists and starts {what}, not {WORKFLOW_TYPE}: left as "
        f"it is; give this config's schedule another id (`id` under [schedule])"
    )


def _kept_from(
    held: ScheduleActionStartWorkflow,
    wanted: ScheduleActionStartWorkflow,
    config: PurgeConfig,
    schedule_id: str,
    by_worker: bool,
    converter: PayloadConverter,
) -> tuple[ScheduleOutcome | None, dict[str, int]]:
    """Whether a worker leaves the schedule whose passes start as `held` as it is, and why (None:
    it writes `wanted`), with the databases writing it drops: a later release's input, or,
    from a regional worker's config, an input naming a database it names no target on."""
    if by_worker and (later := _later_format(held, converter)) is not None:
        return ScheduleOutcome(
            "left as it is",
            warns=True,
            summary=f"schedule {schedule_id}: its passes start with an input of format "
            f"{later}, a later release's (this one writes format {FORMAT}): a worker "
            "of this release writes no schedule over it, which would turn the passes back "
            "to this release's mid-deploy. Write it with `pg-purge schedule` from this "
            "config if that is meant",
        ), {}
    dropped = _dropped(held, wanted.args[0], converter)  # the input desired() built
    if dropped and _regional(config, by_worker):
        return ScheduleOutcome(
            "left as it is",
            warns=True,
            summary=f"schedule {schedule_id}: its passes sweep {_said(dropped)}, "
            "which this config names no target on, and every target of this config has "
            "a database queue of its own (a regional worker's config): a worker writes "
            "no schedule that would drop them. Write it with `pg-purge schedule` from "
            "the config that names every database of the pass (from this one, if it "
            "drops them on purpose), or give this config's schedule another `id` under "
            "[schedule]",
        ), dropped
    return None, dropped


def _sweeping_these(
    others: dict[str, set[str] | None] | None, targets: list[str], queue: str
) -> str:
    """What keeps a regional worker from creating its schedule, said; empty where nothing does:
    another schedule of the queue whose passes sweep any of `targets` (or whose input does not
    read as a pass's), or no listing to tell."""
    if others is None:
        return "the namespace's schedules could not be listed to tell whether another sweeps them"
    ids = sorted(i for i, swept in others.items() if swept is None or swept & set(targets))
    if not ids:
        return ""
    return f"{', '.join(ids)} start passes on task queue {queue!r} that sweep its targets"


async def _exists(client: Client, schedule_id: str) -> bool:
    try:
        await client.get_schedule_handle(schedule_id).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True


def _dropped(
    held: ScheduleActionStartWorkflow, want: object, converter: PayloadConverter
) -> dict[str, int]:
    """The databases whose targets the schedule's passes sweep and `want`'s would not, each with
    how many targets it loses; empty when the held input does not read as a pass's of this
    release (a hand edit, another encoding, a later release's: replacing it is the config's to
    do)."""
    had = _held_input(held, converter)
    if had is None:
        return {}
    keeps = _databases(parse_input(want))
    return {db: count for db, count in _databases(had).items() if db not in keeps}


def _held_input(
    held: ScheduleActionStartWorkflow, converter: PayloadConverter
) -> PurgeInput | None:
    """The input a schedule's passes start with, None where it does not read as a pass's of this
    release (a hand edit, another encoding, a later release's `format`): reading it must not
    stop a worker's start."""
    return _as_pass(_held_value(held, converter))


def _as_pass(value: object) -> PurgeInput | None:
    """`value` (`_held_value`'s) read as a pass's input of this release; else None."""
    if value is _UNREAD:
        return None
    try:
        return parse_input(value)
    except Exception:
        return None


#: What `_held_value` returns for an input that does not decode.
_UNREAD = object()


def _held_value(held: ScheduleActionStartWorkflow, converter: PayloadConverter) -> object:
    """The one argument a schedule's passes start with, decoded (as JSON reads it); `_UNREAD`
    where there is not one, or it does not decode."""
    if len(held.args) != 1:
        return _UNREAD
    raw = held.args[0]
    try:
        return converter.from_payload(raw) if isinstance(raw, Payload) else raw
    except Exception:
        return _UNREAD


def _later_format(held: ScheduleActionStartWorkflow, converter: PayloadConverter) -> int | None:
    """The `format` of the schedule's input where it is a later release's (above this release's
    FORMAT); None for any other, or one that does not read as an object."""
    value = _held_value(held, converter)
    sent = value.get("format") if isinstance(value, dict) else None
    if isinstance(sent, int) and not isinstance(sent, bool) and sent > FORMAT:
        return sent
    return None


def _databases(order: PurgeInput) -> Counter[str]:
    """How many of a pass input's targets each database has (`_default`: `database_url`'s)."""
    return Counter(order.databases.get(name) or DEFAULT_DATABASE_KEY for name in order.targets)


def _regional(config: PurgeConfig, by_worker: bool) -> bool:
    """Whether the guard holds: a worker writing the schedule as it starts, whose every target
    has a database queue of its own (`own_queue` None: a regional worker's config, which names
    only its own databases). A config with targets of its own is the scheduler's kind, and may
    drop a database on purpose (one retired) at a deploy, as any other change."""
    return by_worker and config.own_queue is None


def _said(dropped: dict[str, int]) -> str:
    """`2 targets on database eu`, `5 targets on the default database and databases eu, us`."""
    total = sum(dropped.values())
    named = sorted(db for db in dropped if db != DEFAULT_DATABASE_KEY)
    places = ["the default database"] if DEFAULT_DATABASE_KEY in dropped else []
    if named:
        places.append(f"database{'s' if len(named) > 1 else ''} {', '.join(named)}")
    return f"{total} target{'s' if total != 1 else ''} on {' and '.join(places)}"


class ScheduleConflict(Exception):
    """A schedule of the config's id that is not this package's to change; one line."""


def summarize(config: PurgeConfig, spec: ScheduleConfig, described: ScheduleDescription) -> str:
    """One paragraph a person reads to know what will run, when."""
    paused = described.schedule.state.paused
    state = " (PAUSED)" if paused else ""
    if paused:
        # The server's next action times of a paused schedule are the ones it had when it was
        # paused (past ones among them): none of them will start a pass.
        runs = (
            "none while paused (`temporal schedule toggle --schedule-id "
            f"{spec.id} --unpause` resumes it)"
        )
    else:
        runs = ", ".join(
            t.strftime("%Y-%m-%d %H:%M:%S %Z") for t in described.info.next_action_times[:3]
        )
    return (
        f"schedule {spec.id}{state}: cron {spec.cron!r} in {spec.time_zone}, "
        f"starts {WORKFLOW_TYPE} on task queue {config.task_queue!r} "
        f"with targets {list(spec.targets) or config.target_names}; overlap SKIP, "
        f"catch-up window {timedelta(milliseconds=spec.catchup_window_ms)}, "
        f"jitter {timedelta(milliseconds=spec.jitter_ms)}, "
        f"{_timeout_said(described)}\nnext runs: {runs or 'none'}"
    )


def _timeout_said(described: ScheduleDescription) -> str:
    """The execution timeout of the passes the server's schedule starts, as said."""
    timeout = getattr(described.schedule.action, "execution_timeout", None)
    return f"a pass runs at most {timeout}" if timeout else "no limit on how long a pass runs"
