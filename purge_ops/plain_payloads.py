"""A workflow runner for workers whose payloads are plain: Temporal's sandbox as it is, but the
serialization context of each payload is not asked of the sandbox where nothing would read it.

`temporalio` 1.35 asks a running workflow, several times for every payload sequence of every
activation and completion (a pass over each for the codec, the external store and the store's
references, both ways), which serialization context its codec and external store should see: a
sandboxed workflow answers by executing a line of source inside its sandbox each time. Only a
payload codec or an external store reads that context; a converter with neither passes every
payload through unchanged there, whatever the context. In bench case 11 (a pass of small
tables) those answers took 12% of the worker's busy samples (bench/README.md, "Case 11 at
`bb7ea30`").

The workflow's activations still run in the sandbox, under its restrictions
(tests/test_plain_payloads.py). A worker whose converter has a codec or an external store (a
team's encryption, say) keeps the SDK's runner: `plain_runner` returns None for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import temporalio.workflow
from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.converter import (
    DataConverter,
    SerializationContext,
    StorageDriverStoreContext,
)
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner


def plain_runner(converter: DataConverter) -> PlainPayloadsRunner | None:
    """The runner for a worker whose client converts with `converter`: None (the SDK's own)
    where a payload codec or an external store would read each payload's context."""
    if converter.payload_codec is not None or converter.external_storage is not None:
        return None
    return PlainPayloadsRunner()


@dataclass(frozen=True)
class PlainPayloadsRunner(SandboxedWorkflowRunner):
    """The SDK's sandboxed runner, its instances answering no serialization context. A
    subclass, not a wrapper: what adjusts a sandboxed runner by `isinstance` and
    `dataclasses.replace` (the SDK's debug mode relaxing `breakpoint`, its OpenTelemetry plugin
    passing its modules through) adjusts this one too, and it stays this class."""

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _PlainPayloadsInstance(super().create_instance(det))


class _PlainPayloadsInstance(WorkflowInstance):
    """A workflow instance of the sandbox's, but for the two contexts, answered outside it."""

    def __init__(self, inner: WorkflowInstance) -> None:
        self.inner = inner

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        return self.inner.activate(act)

    def get_serialization_context(self, command_info: Any) -> SerializationContext | None:
        # None: the worker's converter as it is, which with neither codec nor external store
        # passes every payload through unchanged, whatever context it were given.
        return None

    def get_external_store_context(self, command_info: Any) -> StorageDriverStoreContext:
        # No external store to give it to (plain_runner).
        return StorageDriverStoreContext()

    def get_info(self) -> temporalio.workflow.Info:
        return self.inner.get_info()

    def get_thread_id(self) -> int | None:
        return self.inner.get_thread_id()
