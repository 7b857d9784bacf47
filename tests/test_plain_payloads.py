"""The worker's workflow runner (purge_ops/plain_payloads.py): with plain payloads the sandbox
is asked no payload's serialization context, and the workflow still runs in the sandbox; with
a payload codec the SDK's own runner, so the codec sees each payload's context."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowFailureError
from temporalio.converter import (
    DataConverter,
    PayloadCodec,
)
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, _runner

from activities import builtin_kinds as kinds
from activities.registry import TargetRegistry
from purge_ops.plain_payloads import PlainPayloadsRunner, plain_runner
from purge_ops.runner import activity_worker, new_worker
from tests.conftest import Harness
from tests.support.passes import run_pass
from tests.support.reads_the_clock import ReadsTheClock
from tests.support.rows import HOUR, idempotency_rows, keys


def sandbox_asked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each payload context (serialization, external store) the SDK's sandbox is asked for,
    from now on."""
    asked: list[str] = []
    for name in ("get_serialization_context", "get_external_store_context"):
        ask = getattr(_runner._Instance, name)

        def counted(self: Any, command_info: Any, ask: Any = ask, name: str = name) -> Any:
            asked.append(name)
            return ask(self, command_info)

        monkeypatch.setattr(_runner._Instance, name, counted)
    return asked


@pytest.mark.parametrize("runner", ["the package's", "the SDK's, given"])
async def test_a_pass_asks_the_sandbox_no_payload_context_unless_given_the_sdk_s_runner(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, runner: str
) -> None:
    """A pass through the package's worker sweeps as ever, and the sandbox was asked no
    payload's context (it executes a line of source inside the sandbox each time); a
    `workflow_runner` given to `new_worker` replaces the package's, and is asked."""
    idempotency_rows(harness.db, {"old": harness.now_ms - HOUR, "new": harness.now_ms + HOUR})
    asked = sandbox_asked(monkeypatch)
    options = {} if runner == "the package's" else {"workflow_runner": SandboxedWorkflowRunner()}
    registry = TargetRegistry([kinds.idempotency(harness.pool)])
    async with new_worker(harness.client, registry, harness.task_queue, **options):
        result = await run_pass(harness.client, harness.task_queue, {"targets": ["x_idempotency"]})

    assert [(s["name"], s["removed"]) for s in result["swept"]] == [("x_idempotency", 1)]
    assert keys(harness.db, "x_idempotency") == {"new"}
    if runner == "the package's":
        assert asked == []
    else:
        assert set(asked) == {"get_serialization_context", "get_external_store_context"}


async def test_a_workflow_under_the_package_s_runner_is_still_sandboxed(
    client: Client, task_queue: str
) -> None:
    """The runner answers only the payload contexts: a workflow that reads the machine's
    clock still fails as the SDK's sandbox fails it."""
    runner = plain_runner(client.data_converter)
    assert isinstance(runner, PlainPayloadsRunner)
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[ReadsTheClock],
        workflow_runner=runner,
        workflow_failure_exception_types=[Exception],
    ):
        with pytest.raises(WorkflowFailureError) as failed:
            await client.execute_workflow(
                ReadsTheClock.run, id=f"clock-{uuid.uuid4()}", task_queue=task_queue
            )
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError)
    assert cause.type == "RestrictedWorkflowAccessError"
    assert "datetime.date.today" in cause.message


class Marking(PayloadCodec):
    """A codec that marks what it encodes, and refuses to decode what it did not."""

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [Payload(metadata={"encoding": b"binary/marked"}, data=p.SerializeToString())
                for p in payloads]  # fmt: skip

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        decoded = []
        for p in payloads:
            assert p.metadata["encoding"] == b"binary/marked", p.metadata
            original = Payload()
            original.ParseFromString(p.data)
            decoded.append(original)
        return decoded


async def test_a_worker_whose_client_has_a_codec_keeps_the_sdk_s_runner(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A team's codec (encryption, say) may read each payload's context: a worker on its
    client keeps the SDK's runner, which asks the sandbox for it, and a pass through it
    completes with its payloads encoded by the codec."""
    config = harness.client.config()
    config["data_converter"] = dataclasses.replace(DataConverter.default, payload_codec=Marking())
    client = Client(**config)
    idempotency_rows(harness.db, {"old": harness.now_ms - HOUR, "new": harness.now_ms + HOUR})
    registry = TargetRegistry([kinds.idempotency(harness.pool)])
    built = [
        new_worker(client, registry, harness.task_queue),
        activity_worker(client, registry, f"{harness.task_queue}:own"),
    ]
    assert [type(w.config()["workflow_runner"]) for w in built] == [SandboxedWorkflowRunner] * 2
    result_id = f"purge-codec-{uuid.uuid4()}"
    asked = sandbox_asked(monkeypatch)
    async with built[0]:
        result = await run_pass(
            client, harness.task_queue, {"targets": ["x_idempotency"]}, result_id
        )

    assert [(s["name"], s["removed"]) for s in result["swept"]] == [("x_idempotency", 1)]
    assert keys(harness.db, "x_idempotency") == {"new"}
    history = await client.get_workflow_handle(result_id).fetch_history()
    completed = [
        e.workflow_execution_completed_event_attributes
        for e in history.events
        if e.HasField("workflow_execution_completed_event_attributes")
    ]
    [payload] = completed[0].result.payloads
    assert payload.metadata["encoding"] == b"binary/marked"
    assert set(asked) == {"get_serialization_context", "get_external_store_context"}


def test_what_adjusts_a_sandboxed_runner_adjusts_the_package_s() -> None:
    """The SDK's debug mode and its OpenTelemetry plugin adjust a runner that is a
    SandboxedWorkflowRunner with `dataclasses.replace` (more pass-through modules, `breakpoint`
    allowed); any other runner they leave as it is. The package's is one, and stays its class."""
    runner = plain_runner(DataConverter.default)
    assert isinstance(runner, SandboxedWorkflowRunner)
    adjusted = dataclasses.replace(
        runner, restrictions=runner.restrictions.with_passthrough_modules("opentelemetry")
    )
    assert type(adjusted) is PlainPayloadsRunner
    assert "opentelemetry" in adjusted.restrictions.passthrough_modules
