"""What a websocket operation (graphql-transport-ws `subscribe`, legacy `start`) passes
before it runs: its persisted query is resolved into its payload (gateway.access.persisted), and
it takes one of its client's subscriptions (`gateway_max_subscriptions_per_client`, across
the client's connections to this process, gateway.access.client_limits), given back when the
operation ends however it ends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from graphql import GraphQLError

from gateway.access.client_identity import CLIENT_SCOPE_KEY
from gateway.access.client_limits import ClientCounts
from gateway.access.persisted import PersistedQueries, PersistedQueryError
from gateway.access.rate_limit import LIMITED


class Running(Protocol):
    """What runs an operation: an asyncio.Task, or a
    gateway.subscriptions.live_operations.LiveOperation."""

    def done(self) -> bool: ...

    def add_done_callback(self, callback: Callable[[Any], object]) -> None: ...


def _client(context: Any) -> str | None:
    websocket = getattr(context, "websocket", None)
    return getattr(websocket, "scope", {}).get(CLIENT_SCOPE_KEY)


class Admission:
    def __init__(self, max_subscriptions: int, persisted: PersistedQueries | None) -> None:
        self.subscriptions = ClientCounts(max_subscriptions)
        self.persisted = persisted

    async def admit(self, context: Any, payload: Any) -> GraphQLError | None:
        """None when the operation may start, holding one of its client's subscriptions
        (`started` must follow), else the error to answer it with, holding nothing. A
        malformed payload is let through for the protocol to refuse."""
        if self.persisted is not None and isinstance(payload, dict):
            try:
                resolved = await self.persisted.resolve(payload)
            except PersistedQueryError as error:
                return error.as_graphql_error()
            if resolved is not payload:
                payload["query"] = resolved["query"]  # the handlers read it from there
        client = _client(context) if self.subscriptions.limit else None  # 0: no limit
        if client is not None and not self.subscriptions.acquire(client):
            LIMITED.labels("subscription").inc()
            return GraphQLError(
                f"this client already has {self.subscriptions.limit} subscriptions open "
                "(gateway_max_subscriptions_per_client)",
                extensions={"code": "LIMIT_SUBSCRIPTIONS"})
        return None

    def started(self, context: Any, task: Running | None) -> None:
        """The admitted operation runs as `task` (an asyncio.Task, or a live operation that
        says when it ends the same way; None: the handler refused it after all): its
        client's subscription is given back when it ends."""
        client = _client(context) if self.subscriptions.limit else None
        if client is None:
            return
        if task is None or task.done():
            self.subscriptions.release(client)
        else:
            task.add_done_callback(lambda _: self.subscriptions.release(client))
