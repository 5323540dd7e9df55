"""One execution per change for the subscribers that asked the same thing.

A change message (and a live list's page) is one Python object however many subscribers
it goes to (gateway.subscriptions.subscriptions builds it once). For each event
graphql-core executes every subscription's selection set over that object, so 10,000
subscribers of one key cost 10,000 identical executions. Subscribers with the same
document, variables and scope (`share_scope` of the connection's context: whatever else a
result depends on, such as the role) get the same result, so the first execution is kept
on the message and the others take it.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import orjson
from graphql import OperationType
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext

RESULTS = "_viewgate_results"  # attribute of a shared message: share key -> result


def shared(message: Any) -> Any:
    """Mark `message` as sent to many subscribers: their executions over it are shared."""
    object.__setattr__(message, RESULTS, {})
    return message


def share_key(executor: Any) -> tuple | None:
    """What makes two subscriptions' results over one message equal; None: no sharing
    (a document parsed without its source text)."""
    operation = executor.operation
    if operation.loc is None:
        return None
    # A str: orjson's bytes keep their 4 KiB output buffer, held here per subscription.
    variables = orjson.dumps(executor.variable_values.coerced, default=repr,
                             option=orjson.OPT_SORT_KEYS).decode()
    scope = getattr(executor.context_value, "share_scope", None)
    name = operation.name.value if operation.name else None
    return id(executor.schema), operation.loc.source.body, name, variables, scope


class SharedResultsExecutor(StrawberryGraphQLCoreExecutionContext):
    """graphql-core's executor, sharing per-event results of equal subscriptions."""

    _share_key: tuple | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Once per subscription, when it starts (not in the middle of a fan-out); its
        # events' executors are copies and keep it.
        if self.operation.operation is OperationType.SUBSCRIPTION:
            self._share_key = share_key(self)

    def execute_operation(self, serially: bool | None = None) -> Any:
        results = getattr(self.root_value, RESULTS, None)
        if results is None or self._share_key is None:
            return super().execute_operation(serially)
        kept = results.get(self._share_key)
        # The key holds the schema's id: the kept one must be this very schema.
        if kept is not None and kept[0] is self.schema:
            return kept[1]
        result = super().execute_operation(serially)
        if inspect.isawaitable(result):  # async resolvers: the others await the same one
            result = asyncio.ensure_future(result)
        results[self._share_key] = (self.schema, result)
        return result
