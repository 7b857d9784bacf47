"""What a worker's config would drop from a schedule it finds (`purge_ops.schedule._dropped`):
the guard that keeps a regional worker from narrowing the scheduler's schedule. The whole path,
a worker started with `--schedule`, is `tests/test_regions.py`'s."""

from __future__ import annotations

from typing import Any

from temporalio.client import ScheduleActionStartWorkflow
from temporalio.converter import DataConverter

from purge_ops.schedule import _dropped, _said

CONVERTER = DataConverter.default.payload_converter


def held(arg: Any) -> ScheduleActionStartWorkflow:
    return ScheduleActionStartWorkflow("Purge", arg, id="purge-hourly", task_queue="purge")


def payload(arg: Any) -> ScheduleActionStartWorkflow:
    """As the server describes it: the input as a payload."""
    action = held(arg)
    action.args = [CONVERTER.to_payload(arg)]
    return action


CENTRAL = {
    "targets": ["a@eu", "b@eu", "c", "d@us"],
    "databases": {"a@eu": "eu", "b@eu": "eu", "c": "_default", "d@us": "us"},
}


def test_a_narrower_config_drops_the_databases_it_names_no_target_on() -> None:
    regional = {"targets": ["a@eu"], "databases": {"a@eu": "eu"}}
    assert _dropped(payload(CENTRAL), regional, CONVERTER) == {"_default": 1, "us": 1}


def test_fewer_targets_on_the_same_databases_drop_none() -> None:
    fewer = {"targets": ["a@eu", "c", "d@us"], "databases": {"a@eu": "eu", "d@us": "us"}}
    assert _dropped(held(CENTRAL), fewer, CONVERTER) == {}


def test_databases_given_by_ranges_count_alike() -> None:
    names = [f"t{i}" for i in range(600)]
    ranged = {"targets": names, "database_ranges": [["eu", 0, 400], ["us", 400, 600]]}
    only_eu = {"targets": names[:400], "database_ranges": [["eu", 0, 400]]}
    assert _dropped(held(ranged), only_eu, CONVERTER) == {"us": 200}


def test_an_input_this_release_does_not_read_is_not_guarded() -> None:
    """A hand edit, or a later release's input (its `format`): the config writes over it, as
    every release before the guard did."""
    later = {**CENTRAL, "format": 2, "new_key": 1}
    regional = {"targets": ["a@eu"], "databases": {"a@eu": "eu"}}
    assert _dropped(held(later), regional, CONVERTER) == {}
    assert _dropped(held({"targets": "a@eu"}), regional, CONVERTER) == {}
    two = held(CENTRAL)
    two.args = [CENTRAL, CENTRAL]
    assert _dropped(two, regional, CONVERTER) == {}
    # A payload no converter reads (an encoding of someone else's codec): the start goes on.
    foreign = payload(CENTRAL)
    foreign.args[0].metadata["encoding"] = b"binary/encrypted"
    assert _dropped(foreign, regional, CONVERTER) == {}


def test_what_is_dropped_is_said_by_database() -> None:
    assert _said({"eu": 2}) == "2 targets on database eu"
    assert _said({"_default": 1}) == "1 target on the default database"
    assert _said({"us": 1, "_default": 3, "eu": 1}) == (
        "5 targets on the default database and databases eu, us"
    )
