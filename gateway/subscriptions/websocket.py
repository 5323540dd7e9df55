"""GraphQL over websockets on /graphql: Strawberry's own handlers of both protocols,
`graphql-transport-ws` (graphql-ws, the current one) and the legacy `graphql-ws`
(subscriptions-transport-ws), with keep-alive. Each connection's context carries its
websocket (to close a slow client) and the `connection_init` payload, whose token picks
the connection's role: its schema and row rules (gateway.access.access); without one in the
payload, the handshake's `Authorization` header counts. A bad token closes a
`graphql-transport-ws` connection with 4403 and the reason; the legacy protocol answers
`connection_error` with it, then closes with 4403 and the reason too. A connection sending
messages faster than `gateway_ws_messages_per_s` (after its burst) is closed with 4029.
Once a graphql-transport-ws connection is acknowledged, the server may answer its pings
itself, spending the same budget (KEEP_ALIVE_BUDGET, gateway.subscriptions.message_rate)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import orjson
from graphql import GraphQLError
from strawberry.asgi import GraphQL
from strawberry.exceptions import ConnectionRejectionError
from strawberry.http.exceptions import WebSocketDisconnected
from strawberry.subscriptions import GRAPHQL_TRANSPORT_WS_PROTOCOL, GRAPHQL_WS_PROTOCOL
from strawberry.subscriptions.protocols.graphql_transport_ws.handlers import (
    BaseGraphQLTransportWSHandler,
)
from strawberry.subscriptions.protocols.graphql_ws.handlers import BaseGraphQLWSHandler
from strawberry.types.execution import PreExecutionError

from gateway.access.auth import Unauthenticated
from gateway.access.rate_limit import LIMITED
from gateway.ops.metrics import WEBSOCKETS
from gateway.subscriptions.live_operations import LiveOperations, Plans
from gateway.subscriptions.message_rate import KEEP_ALIVE_BUDGET, MessageBudget
from gateway.subscriptions.operation_starts import OperationStarts, enter, leave
from gateway.subscriptions.subscriptions import SubscriptionContext
from gateway.subscriptions.ws_admission import Admission
from schema.settings import Settings


async def parse_errors_as_results(source: AsyncGenerator[Any, None]) -> AsyncGenerator[Any, None]:
    """A stream whose document fails to parse yields that error as its first result.
    (Strawberry's parser-cache extension raises it out of the stream, which its protocol
    handlers answer with a bare `complete`: the client would never learn why.)"""
    started = False
    try:
        async for result in source:
            started = True
            yield result
    except GraphQLError as error:
        if started:
            raise
        yield PreExecutionError(data=None, errors=[error])
    finally:
        await source.aclose()


SHARED_TEXT_CHARS = 10_000  # longer documents are rare and not shared

# What a text frame that is not JSON decodes to (GraphQLWebSocket.decode_json): the legacy
# handler would otherwise drop it without a word; both handlers answer it below.
NOT_JSON = object()

KEEP_ALIVE = ("ping", "pong")  # graphql-transport-ws messages answered without a turn


class MessageRate:
    """Both handlers: a connection sending past its budget
    (gateway.subscriptions.message_rate) is closed with 4029, and what it sent after that is
    dropped unread. Each message but a ping or pong first lets every other connection take
    its turn, and a connection starts at most a few operations at once
    (gateway.subscriptions.operation_starts): one connection's backlog of subscribes or pings
    cannot hold the event loop from the others. (A pong is less work than the turn it would
    wait for, and the budget bounds how many come in a row; ten thousand idle tabs' pings
    each waited a turn of the loop.)"""

    _budget: MessageBudget | None = None
    _over: bool = False
    _starts: OperationStarts | None = None

    @property
    def starts(self) -> OperationStarts:
        if self._starts is None:
            self._starts = OperationStarts()
        return self._starts

    def sent_now(self, message: Any) -> bool:
        """Written at once, without the ASGI send's chain of coroutines (the
        graphql-transport-ws handler, gateway.subscriptions.live_operations)."""
        return False

    async def send_message(self, message: Any) -> None:
        if not self.sent_now(message):
            try:
                await super().send_message(message)  # type: ignore[misc]
            except RuntimeError as exc:
                # uvicorn's sans-I/O websocket refuses a send once the closing handshake
                # has begun (a tab closed while a message was on its way): the client is
                # gone, as for a disconnect, not a failure of ours.
                if "close" not in str(exc):
                    raise
                raise WebSocketDisconnected from None
        op = message.get("id") if isinstance(message, dict) else None
        if op is not None:  # an operation's first message settles its start
            self.starts.settle(op)

    async def handle_task_exception(self, error: Exception) -> None:
        if isinstance(error, WebSocketDisconnected):
            return  # the client left while its operation was sending: nothing to report
        await super().handle_task_exception(error)  # type: ignore[misc]

    async def start_operation(self, op: str, run: Callable[[], Awaitable[None]],
                              task_of: Callable[[], asyncio.Task | None]) -> None:
        """`run()` (the handler's own start of operation `op`) once the connection may
        start one more; `task_of()` is the operation's task after it."""
        start = await self.starts.begin(op)
        token = enter(start)
        try:
            await run()
        finally:
            leave(token)
            self.starts.settle_when_done(op, task_of())

    def take(self) -> bool:
        """Spend one message of the connection's budget: False once past it. (The server
        spends it too for the pings it answers itself: KEEP_ALIVE_BUDGET.)"""
        if self._over:
            return False
        if self._budget is None:
            self._budget = MessageBudget(*self.view.message_rate)  # type: ignore[attr-defined]
        return self._budget.take()

    async def over_budget(self, message: Any = None) -> bool:
        if not (isinstance(message, dict) and message.get("type") in KEEP_ALIVE):
            await asyncio.sleep(0)  # the other connections' turn first
        if self._over:
            return True
        if self.take():
            return False
        assert self._budget is not None
        self._over = True
        LIMITED.labels("websocket_message").inc()
        await self.websocket.close(  # type: ignore[attr-defined]
            code=4029, reason=close_reason(
                f"too many messages: over {self._budget.rate:g}/s after a burst of "
                f"{self._budget.burst} (gateway_ws_messages_per_s)"))
        return True


class TransportWSHandler(MessageRate, LiveOperations, BaseGraphQLTransportWSHandler):
    """Strawberry's handler; its subscriptions are served without a task each once
    started (gateway.subscriptions.live_operations)."""

    def sent_now(self, message: Any) -> bool:
        # A pong, an ack, an error: straight out when nothing waits before it (what
        # Strawberry's send_json would send: the view's encoding, a text frame).
        send_now = self.sender_now()
        return send_now is not None and send_now(self.view.encode_json(message))

    @staticmethod
    def _get_pre_execution_close_reason(error: GraphQLError) -> str | None:
        # A document that does not parse is one bad operation, not a broken connection:
        # answer it with an `error` message, as for a validation error, and keep the
        # client's other subscriptions (Strawberry would close the socket with 4400).
        return None

    async def handle_connection_init(self, message: Any) -> None:
        payload = message.get("payload") or {}
        if isinstance(payload, dict) and not self.connection_init_received \
                and not self.connection_timed_out:
            # Strawberry closes a rejected connection with the bare reason "Forbidden".
            reason = await self.view.rejection(payload, self.context)
            if reason is not None:
                self.connection_init_received = True
                if self.connection_init_timeout_task:
                    self.connection_init_timeout_task.cancel()
                await self.websocket.close(code=4403, reason=close_reason(reason))
                return
        await super().handle_connection_init(message)
        # Strawberry cancelled the init timeout and keeps its task (with its exception,
        # traceback and frames) for the connection's life, more than a subscription costs.
        # The loop holds the task until its cancellation is through.
        if self.connection_init_received:
            self.connection_init_timeout_task = None
        if self.connection_acknowledged and self.context.schema is not None:
            self.schema = self.context.schema  # the role's schema (on_ws_connect chose it)
        if self.connection_acknowledged:
            # Pings from now on answered by the server, if it offers to, on this budget.
            # (Before the acknowledgement they come here, in order with connection_init.)
            offer = self.scope_extensions().get(KEEP_ALIVE_BUDGET)
            if offer is not None:
                offer(self.take)

    async def handle_ping(self, message: Any) -> None:
        # The ping's payload back, as graphql-ws's own server and the gateway's protocol
        # (viewgate.websocket_protocol) answer; Strawberry's pong has none.
        payload = message.get("payload")
        await self.send_message({"type": "pong", "payload": payload}
                                if isinstance(payload, dict) else {"type": "pong"})

    async def handle_message(self, message: Any) -> None:
        if await self.over_budget(message):
            return
        if message is NOT_JSON:
            await self.handle_invalid_message("WebSocket message must be valid JSON")
            return
        if not isinstance(message, dict):  # valid JSON, but no message: malformed (4400)
            await self.handle_invalid_message("a message must be a JSON object")
            return
        await super().handle_message(message)

    async def handle_subscribe(self, message: Any) -> None:
        # Persisted queries and the client's subscription limit
        # (gateway.subscriptions.ws_admission).
        op = message["id"]
        if not self.connection_acknowledged or op in self.operations:
            await super().handle_subscribe(message)  # Strawberry closes the socket
            return
        await self.start_operation(op, lambda: self._subscribe(message), lambda: (
            operation.task if (operation := self.operations.get(op)) else None))

    async def _subscribe(self, message: Any) -> None:
        op = message["id"]
        error = await self.view.admission.admit(self.context, message.get("payload"))
        if error is not None:
            await self.send_message({"id": op, "type": "error", "payload": [error.formatted]})
            return
        operation = None
        try:
            if self.max_subscriptions_per_connection is not None \
                    and len(self.operations) >= self.max_subscriptions_per_connection:
                await super().handle_subscribe(message)  # Strawberry answers the limit
            else:
                operation = self.new_operation(message)
        finally:
            # Given back when the operation ends (not its start task: a subscription
            # lives on without it).
            self.view.admission.started(self.context, operation)


LEGACY_TYPES = ("connection_init", "connection_terminate", "start", "stop")


class LegacyWSHandler(MessageRate, BaseGraphQLWSHandler):
    async def handle_connection_init(self, message: Any) -> None:
        payload = message.get("payload")
        if (payload is None or isinstance(payload, dict)) and not self.connection_acknowledged:
            # Strawberry answers a rejection with `connection_error` and then closes with
            # 1011 ("internal error"); refused credentials are the client's to fix: 4403, as
            # graphql-transport-ws closes for them, with the reason.
            reason = await self.view.rejection(payload or {}, self.context)
            if reason is not None:
                await self.send_message({"type": "connection_error",
                                         "payload": {"message": reason}})
                await self.websocket.close(code=4403, reason=close_reason(reason))
                return
        await super().handle_connection_init(message)

    async def handle_message(self, message: Any) -> None:
        if await self.over_budget():
            return
        # subscriptions-transport-ws answers a message it cannot handle with `error`
        # (Strawberry ignores an unknown type and fails on a message without its fields).
        kind = message.get("type") if isinstance(message, dict) else None
        if kind in LEGACY_TYPES:
            try:
                await super().handle_message(message)
                if kind == "connection_init" and self.connection_acknowledged \
                        and self.context.schema is not None:
                    self.schema = self.context.schema  # the role's (on_ws_connect chose it)
                return
            except (KeyError, TypeError):
                problem = f"malformed {kind} message"
        elif message is NOT_JSON:
            problem = "the message is not valid JSON"
        else:
            problem = f"invalid message type {kind!r}"
        op = message.get("id") if isinstance(message, dict) else None
        await self.send_message({"type": "error", "id": op,  # type: ignore[typeddict-item]
                                 "payload": {"message": problem}})

    async def handle_start(self, message: Any) -> None:
        # Persisted queries and the client's subscription limit
        # (gateway.subscriptions.ws_admission).
        op = message["id"]
        if not self.connection_acknowledged:
            await super().handle_start(message)  # Strawberry closes the socket
            return
        if op in self.tasks:
            await self.cleanup_operation(op)  # a restarted id gives its subscription back
        await self.start_operation(op, lambda: self._start(message),
                                   lambda: self.tasks.get(op))

    async def _start(self, message: Any) -> None:
        op = message["id"]
        error = await self.view.admission.admit(self.context, message.get("payload"))
        if error is not None:
            await self.send_message({"type": "error", "id": op,  # type: ignore[typeddict-item]
                                     "payload": error.formatted})
            return
        try:
            await super().handle_start(message)
        finally:
            self.view.admission.started(self.context, self.tasks.get(op))


class GraphQLWebSocket(GraphQL):
    graphql_transport_ws_handler_class = TransportWSHandler
    graphql_ws_handler_class = LegacyWSHandler

    def __init__(self, schema: Any, settings: Settings, access: Any = None,
                 admission: Admission | None = None) -> None:
        self.access = access  # gateway.access.access.Access; None: every connection is admin
        self.admission = admission or Admission(0, None)
        self.message_rate = (settings.gateway_ws_messages_per_s,
                             settings.gateway_ws_messages_burst)
        self.open_connections = 0  # websockets this process holds now (/subscriptions)
        self.plans = Plans()  # executions shared by equal subscriptions (live_operations)
        super().__init__(
            schema,
            graphql_ide=None,
            keep_alive=True,  # graphql-ws "ka" messages; graphql-transport-ws has ping/pong
            keep_alive_interval=settings.gateway_keep_alive_s,
            subscription_protocols=(GRAPHQL_TRANSPORT_WS_PROTOCOL, GRAPHQL_WS_PROTOCOL),
            max_subscriptions_per_connection=settings.gateway_max_subscriptions_per_connection,
        )

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await super().__call__(scope, receive, send)
            return
        WEBSOCKETS.inc()
        self.open_connections += 1
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.open_connections -= 1
            WEBSOCKETS.dec()

    def decode_json(self, data: str | bytes) -> object:
        try:
            message = orjson.loads(data)
        except orjson.JSONDecodeError:
            return NOT_JSON
        # Every operation keeps its document's text while it runs, and thousands of tabs
        # send the same few documents: they share one copy.
        payload = message.get("payload") if isinstance(message, dict) else None
        if isinstance(payload, dict):
            query = payload.get("query")
            if isinstance(query, str) and len(query) <= SHARED_TEXT_CHARS:
                payload["query"] = sys.intern(query)
        return message

    def encode_json(self, data: object) -> str:
        # orjson, as for HTTP answers; text frames, which every client reads.
        return orjson.dumps(data).decode()

    async def get_context(self, request: Any, response: Any) -> SubscriptionContext:
        return SubscriptionContext(websocket=response)

    async def rejection(self, params: dict[str, Any], context: Any) -> str | None:
        """Why a `connection_init` payload's credentials (else the handshake's) are
        refused; None: accepted."""
        if self.access is None:
            return None
        try:
            await self.access.auth.from_connection_params(params, _headers(context))
        except Unauthenticated as exc:
            return str(exc)
        return None

    async def on_ws_connect(self, context: Any) -> Any:
        """Authenticate the `connection_init` payload: the connection's role picks its
        schema, row rules and what its subscriptions may share (`share_scope`)."""
        if self.access is not None:
            try:
                principal = await self.access.auth.from_connection_params(
                    context.connection_params, _headers(context))
            except Unauthenticated as exc:
                raise ConnectionRejectionError({"message": str(exc)}) from None
            context.scope = principal.scope
            context.share_scope = principal.share_scope
            context.schema = self.access.schema_for(principal)
        return await super().on_ws_connect(context)


def _headers(context: Any) -> Any:
    """The websocket handshake's headers (Starlette's, case-insensitive)."""
    return getattr(getattr(context, "websocket", None), "headers", None)


def close_reason(reason: str) -> str:
    """A websocket close reason fits in 123 bytes (RFC 6455)."""
    data = reason.encode()
    return reason if len(data) <= 123 else data[:120].decode(errors="ignore") + "..."
