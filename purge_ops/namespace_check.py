"""Whether the namespace defines the search attributes a pass records
(`activities.search_attributes`): asked by whoever starts passes (`sweep`, the schedule), never
by the workflow, which only sees whether its pass was started with them."""

from __future__ import annotations

import logging

from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.common import TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from activities.search_attributes import KEYS, at_start

log = logging.getLogger(__name__)


async def namespace_defines(client: Client) -> bool:
    """Whether the client's namespace defines every key, each with its type. An answer the
    server refuses (a role without the operator API, as on some Temporal Cloud namespaces) is
    a no: passes then run as before, without the attributes."""
    return bool(await namespace_answer(client))


async def namespace_answer(client: Client) -> bool | None:
    """As `namespace_defines`, but None where the server refused to say (a role without the
    operator API, or a passing refusal): a schedule already there then keeps the choice it
    was made with, where a no would flip it at every start of workers of two roles."""
    try:
        defined = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=client.namespace)
        )
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise  # no such namespace: nothing else this command asks would be answered either
        log.warning("search attributes not used: listing them was refused: %s", err.message)
        return None
    custom = defined.custom_attributes
    return all(custom.get(key.name) == int(key.indexed_value_type) for key in KEYS)


async def start_attributes(client: Client) -> TypedSearchAttributes:
    """What a pass is started with: `at_start()` where the namespace defines the keys, else
    none (an undefined attribute at start would fail the start)."""
    if await namespace_defines(client):
        return at_start()
    return TypedSearchAttributes.empty
