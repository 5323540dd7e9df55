"""A websocket connection's subscriptions served without a task each (graphql-transport-ws).

Strawberry's protocol handler runs every operation as a task of its own for its whole
life: the task, its chain of async generators (the handler's result loop, the schema's
stream with its extension contexts, graphql-core's response stream, the resolver's), and
graphql-core's executor. For browser tabs (thousands of connections, a few subscriptions
each, idle most of the time) that chain is most of what the gateway holds.

Here an operation's task lives only while the subscription starts: parsing, validation
and the schema extensions' hooks (Strawberry's own, as for any operation), graphql-core's
executor and the source stream (the resolver's `LiveSource`, gateway.subscriptions.sources),
then the source's first messages. Then the task ends, and the operation lives on as a
small object: its subscriber hands each item straight to it (`push`), the source turns it
into a message, and the operation's `Plan` executes the selection set over the message and
encodes the `next` payload, once per message for every subscription sharing the plan
(same document, variables below the root field and scope: gateway.subscriptions.shared_results).
A frame is written at once when nothing waits before it and the connection is writable
(the server's `send_now`, viewgate.websocket_protocol); otherwise it goes to the
connection's outbox, written by a task that exists only while frames wait.

Operations other than subscriptions (a query sent over the websocket) run as Strawberry
runs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
from collections import deque
from collections.abc import Awaitable, Callable
from copy import copy
from typing import Any

import orjson
from graphql import ExecutionResult, GraphQLError
from graphql.execution import Executor, create_source_event_stream
from starlette.websockets import WebSocketDisconnect
from strawberry.exceptions import MissingQueryError
from strawberry.schema.exceptions import CannotGetOperationTypeError, InvalidOperationTypeError
from strawberry.schema.schema import _coerce_pre_execution_error
from strawberry.subscriptions.protocols.graphql_transport_ws.handlers import Operation
from strawberry.types.execution import PreExecutionError
from strawberry.types.graphql import OperationType

from gateway.subscriptions.compiled_payloads import compile_payload
from gateway.subscriptions.shared_results import RESULTS, share_key
from gateway.subscriptions.sources import LiveSource

# What a plan's context leaves out of the first subscription's (SubscriptionContext): what
# belongs to its connection.
CONNECTION_FIELDS = ("websocket", "connection_params", "message_context")

# The ASGI scope extension a server may offer a websocket: `send_now(text) -> bool` writes
# a text frame at once when the connection is writable, else answers False (take `send`).
# uvicorn as the gateway runs it offers it (viewgate.websocket_protocol).
SEND_NOW = "viewgate.websocket.send_now"

NOT_A_SUBSCRIPTION = object()  # open_subscription's answer for queries and mutations


async def open_subscription(schema: Any, context: Any, root_value: Any, query: str | None,
                            variables: dict[str, Any] | None,
                            operation_name: str | None) -> Any:
    """Start a subscription as Strawberry's `Schema.stream` does (its extensions' operation,
    parsing, validation and execution hooks around graphql-core's executor and
    `create_source_event_stream`), stopping once the source stream exists.

    Returns (executor, source); a list of errors refusing the operation (graphql-ws
    `error`); or NOT_A_SUBSCRIPTION (nothing ran: Strawberry runs it)."""
    execution_context = schema._create_execution_context(
        query=query, allowed_operation_types=tuple(OperationType),
        variable_values=variables, context_value=context, root_value=root_value,
        operation_name=operation_name)
    extensions = schema.get_extensions()
    for extension in extensions:
        extension.execution_context = execution_context
    runner = schema.create_extensions_runner(execution_context, extensions)
    async with runner.operation():
        try:
            refused = await schema._prepare_operation_async(execution_context, runner)
        except (MissingQueryError, CannotGetOperationTypeError,
                InvalidOperationTypeError) as error:
            refused = PreExecutionError(data=None, errors=[_coerce_pre_execution_error(error)])
        except GraphQLError as error:  # the parser cache raises what does not parse
            refused = PreExecutionError(data=None, errors=[error])
        if refused is not None:
            return _refused(schema, refused.errors, execution_context)
        if execution_context.operation_type is not OperationType.SUBSCRIPTION:
            return NOT_A_SUBSCRIPTION
        async with runner.executing():
            early = execution_context.result  # set by an `on_execute` hook: a limit
            if early is not None and early.errors:
                return _refused(schema, early.errors, execution_context)
            executor = schema.execution_context_class.build(
                schema._schema, execution_context.graphql_document, root_value, context,
                variables, operation_name, middleware=schema._get_middleware_manager(extensions),
                **schema._get_custom_context_kwargs(None))
            if isinstance(executor, list):  # variables that do not fit
                return _refused(schema, executor, execution_context)
            source = create_source_event_stream(executor)
            if inspect.isawaitable(source):
                source = await source
            if isinstance(source, ExecutionResult):  # the resolver refused
                return _refused(schema, source.errors or [], execution_context)
            return executor, source


def _refused(schema: Any, errors: list[GraphQLError], execution_context: Any) -> list:
    schema.process_errors(errors, execution_context)
    return errors


class Plan:
    """The execution of a subscription's selection set over a message, shared by the
    subscriptions with the same share key (gateway.subscriptions.shared_results): each
    message is executed and its `next` payload encoded once for all of them, kept on the
    message. Its executor is the first subscription's, with a context of its own that holds
    what results may depend on (the role and its row rules), not the connection."""

    __slots__ = ("compiled", "executor", "key", "schema", "users")

    def __init__(self, schema: Any, executor: Executor, key: tuple | None) -> None:
        self.schema = schema
        self.executor = copy(executor)
        context = executor.context_value
        if dataclasses.is_dataclass(context) and not isinstance(context, type):
            names = {f.name for f in dataclasses.fields(context)}
            self.executor.context_value = dataclasses.replace(context, **{
                name: None for name in CONNECTION_FIELDS if name in names})
        self.key = key
        self.users = 0
        # Plain selections skip the executor (gateway.subscriptions.compiled_payloads).
        self.compiled = compile_payload(self.executor)

    def payload(self, message: Any) -> str | Awaitable[str]:
        """The JSON text of the `next` payload of `message`; an awaitable when some
        resolver under it is asynchronous."""
        results = getattr(message, RESULTS, None) if self.key is not None else None
        slot = (PAYLOAD, self.key)
        if results is not None:
            kept = results.get(slot)
            if kept is not None:
                return kept
        payload: Any = self.compiled(message) if self.compiled is not None else None
        if payload is None:
            result = self.executor.build_per_event_executor(message).execute_operation(False)
            if inspect.isawaitable(result):
                payload = asyncio.ensure_future(self._encode_later(result))
            else:
                payload = self._encode(result)
        if results is not None:
            results[slot] = payload
        return payload

    async def _encode_later(self, result: Awaitable[ExecutionResult]) -> str:
        try:
            return self._encode(await result)
        except Exception as error:  # noqa: BLE001 - not a field's error: the message says it
            return error_payload(self.schema, error)

    def _encode(self, result: ExecutionResult) -> str:
        payload: dict[str, Any] = {"data": result.data}
        if result.errors:
            self.schema.process_errors(result.errors)
            payload["errors"] = [error.formatted for error in result.errors]
        return orjson.dumps(payload).decode()


PAYLOAD = "payload"  # a plan's encoded payloads on a shared message: (PAYLOAD, key)


def error_payload(schema: Any, error: BaseException) -> str:
    """The `next` payload of an error that ends a subscription (logged when it is not a
    GraphQL error, as Strawberry logs what a stream raised)."""
    graphql_error = error if isinstance(error, GraphQLError) else GraphQLError(
        str(error), original_error=error)
    schema.process_errors([graphql_error])
    return orjson.dumps({"data": None, "errors": [graphql_error.formatted]}).decode()


class Plans:
    """This process's plans, by share key; a plan is dropped with its last subscription."""

    def __init__(self) -> None:
        self._plans: dict[tuple, Plan] = {}

    def take(self, schema: Any, executor: Executor) -> Plan:
        key = share_key(executor)
        plan = self._plans.get(key) if key is not None else None
        if plan is None:
            plan = Plan(schema, executor, key)
            if key is not None:
                self._plans[key] = plan
        plan.users += 1
        return plan

    def give_back(self, plan: Plan) -> None:
        plan.users -= 1
        if plan.users == 0 and plan.key is not None and self._plans.get(plan.key) is plan:
            del self._plans[plan.key]

    def __len__(self) -> int:
        return len(self._plans)


def _frame(op: str, kind: str, payload: str) -> str:
    return f'{{"id":{orjson.dumps(op).decode()},"type":"{kind}","payload":{payload}}}'


class LiveOperation(Operation):
    """A graphql-transport-ws operation (Strawberry's `Operation`): run by its task while
    it starts, then, for a subscription, by the items its subscriber pushes. Like an
    asyncio.Task, it says when it is `done` and calls back those waiting for its end."""

    __slots__ = ("ended", "plan", "source", "waiting")

    def __init__(self, handler: Any, id: str, query: str, variables: dict | None,
                 operation_name: str | None) -> None:
        super().__init__(handler, id, query, variables, operation_name)
        self.plan: Plan | None = None
        self.source: LiveSource | None = None
        # Items that came while the message of an earlier one was being read.
        self.waiting: deque[Any] | None = None
        self.ended: list[Callable[[Any], None]] | bool | None = None

    # --- the end, as asyncio.Task tells it ----------------------------------------------

    def done(self) -> bool:
        return self.ended is True

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        if self.ended is True:
            callback(self)
        elif isinstance(self.ended, list):
            self.ended.append(callback)
        else:
            self.ended = [callback]

    def end(self) -> None:
        """Give back what it holds (once): its subscription, its plan, then the callbacks."""
        if self.ended is True:
            return
        callbacks, self.ended = self.ended, True
        source, self.source = self.source, None
        if source is not None:
            source.close()
        if self.plan is not None:
            self.handler.view.plans.give_back(self.plan)
            self.plan = None
        for callback in callbacks if isinstance(callbacks, list) else ():
            callback(self)

    # --- live -----------------------------------------------------------------------------

    def send(self, message: Any) -> None:
        """Queue the `next` frame of `message` on the connection."""
        assert self.plan is not None
        payload = self.plan.payload(message)
        if isinstance(payload, str):
            self.handler.enqueue(_frame(self.id, "next", payload), self)
        else:
            self.handler.enqueue(asyncio.ensure_future(self._frame_later(payload)), self)

    async def _frame_later(self, payload: Awaitable[str]) -> str:
        return _frame(self.id, "next", await payload)

    def push(self, item: Any) -> None:
        """An item of its subscriber's (gateway.subscriptions.subscribers.Sink)."""
        if self.waiting is not None:
            self.waiting.append(item)
            return
        source = self.source
        if source is None:
            return
        try:
            message = source.message(item)
            if message is None:
                return
            if inspect.isawaitable(message):  # it reads first; later items wait for it
                self.waiting = deque()
                self.handler.enqueue(asyncio.ensure_future(self._message_later(message)),
                                     self)
            else:
                self.send(message)
        except Exception as error:  # noqa: BLE001 - ends this subscription, not the fan-out
            self.fail(error)

    async def _message_later(self, message: Awaitable[Any]) -> str | None:
        frame = None
        try:
            got = await message
            if got is not None and self.plan is not None:
                payload = self.plan.payload(got)
                frame = _frame(self.id, "next", payload if isinstance(payload, str)
                               else await payload)
        except Exception as error:  # noqa: BLE001 - the subscription ends with it
            self.fail(error)
        finally:
            waiting, self.waiting = self.waiting, None
            for item in waiting or ():
                self.push(item)
        return frame

    def fail(self, error: BaseException) -> None:
        """End with `error`: a `next` carrying it, then `complete` (as Strawberry ends a
        stream that raised)."""
        if self.completed:
            return
        self.handler.enqueue(_frame(self.id, "next", error_payload(self.handler.schema, error)),
                             self)
        self.complete()

    def complete(self) -> None:
        """End from the server's side: `complete` after what is queued."""
        if self.completed:
            return
        self.completed = True
        if self.handler.operations.get(self.id) is self:
            del self.handler.operations[self.id]
        self.handler.enqueue(f'{{"id":{orjson.dumps(self.id).decode()},"type":"complete"}}',
                             self)
        self.end()


class LiveOperations:
    """The graphql-transport-ws handler's side (a mixin of
    gateway.subscriptions.websocket.TransportWSHandler): operations as LiveOperation, the
    connection's outbox and its writer."""

    _outbox: deque[Any] | None = None
    _writer: asyncio.Task | None = None
    _send_now: Callable[[str], bool] | bool | None = None  # SEND_NOW; False: not offered
    _too_slow: bool = False
    _room: asyncio.Future[None] | None = None  # an opening waiting for the writer
    _room_below = 0  # ... until fewer frames than this wait

    def new_operation(self, message: Any) -> LiveOperation:
        """Strawberry's `handle_subscribe` after its checks, with a LiveOperation."""
        payload = message["payload"]
        operation = LiveOperation(self, message["id"], payload["query"],
                                  payload.get("variables"), payload.get("operationName"))
        operation.task = asyncio.create_task(self.run_operation(operation))
        operation.task.add_done_callback(self._task_done)  # type: ignore[attr-defined]
        self.operations[message["id"]] = operation  # type: ignore[attr-defined]
        return operation

    async def run_operation(self, operation: LiveOperation) -> None:  # type: ignore[override]
        handed_over = False
        try:
            opened = await open_subscription(
                self.schema, self.context, self.root_value,  # type: ignore[attr-defined]
                operation.query, operation.variables, operation.operation_name)
            if opened is NOT_A_SUBSCRIPTION:
                await super().run_operation(operation)  # type: ignore[misc]
                return
            if isinstance(opened, list):
                await operation.send_initial_errors(opened)
                return
            executor, source = opened
            operation.plan = self.view.plans.take(self.schema, executor)  # type: ignore[attr-defined]
            if not isinstance(source, LiveSource):  # any other async iterable: served here
                await self._serve(operation, source)
                return
            operation.source = source
            try:
                async for message in source.opening():
                    operation.send(message)
                    self.starts.settle(operation.id)  # type: ignore[attr-defined]
                    await self.room_for(source.subscriber.limit // 2)
            except Exception as error:  # noqa: BLE001 - ends the subscription, as Strawberry
                operation.fail(error)
                return
            if operation.completed or operation.ended is True:
                return
            operation.task = None
            operation.variables = None
            # graphql-core's executor refers to itself (its async helpers are its own bound
            # methods); the plan has a copy: break the cycle, refcounting frees the rest.
            executor.async_helpers = None
            source.subscriber.attach(operation)
            handed_over = True
        except asyncio.CancelledError:
            raise
        except Exception as error:
            await self.handle_task_exception(error)  # type: ignore[attr-defined]
            with contextlib.suppress(Exception):
                await operation.send_operation_message({"id": operation.id, "type": "complete"})
            self.operations.pop(operation.id, None)  # type: ignore[attr-defined]
            raise
        finally:
            if not handed_over:
                operation.end()

    async def _serve(self, operation: LiveOperation, source: Any) -> None:
        """A source that is not a LiveSource, by this task, as Strawberry serves them."""
        events = aiter(source)
        try:
            async for event in events:
                operation.send(event)
                self.starts.settle(operation.id)  # type: ignore[attr-defined]
        except Exception as error:  # noqa: BLE001 - ends the subscription, as Strawberry
            operation.fail(error)
        else:
            operation.complete()
        finally:
            if hasattr(events, "aclose"):
                await events.aclose()

    async def cleanup_operation(self, operation_id: str) -> None:
        operation = self.operations.pop(operation_id, None)  # type: ignore[attr-defined]
        if operation is None:
            return
        if operation.task is not None:
            operation.task.cancel()  # starting: its task ends it
        else:
            operation.end()

    # --- the outbox -------------------------------------------------------------------

    def enqueue(self, frame: str | Awaitable[str | None], operation: LiveOperation) -> None:
        """Queue a frame (text, or an awaitable of it) to be written after those before.
        Past the buffer (`gateway_subscription_buffer` a subscription), the client reads
        too slowly: it is closed (gateway.subscriptions.subscriptions)."""
        if self._too_slow:
            return
        outbox = self._outbox
        if not outbox and isinstance(frame, str) and self.send_now(frame):
            return  # written: nothing waited before it
        if outbox is None:
            outbox = self._outbox = deque()
        elif operation.source is not None and len(outbox) >= operation.source.subscriber.limit \
                * max(1, len(self.operations)):  # type: ignore[attr-defined]
            self._too_slow = True
            self._outbox = None
            operation.source.subscriber.overflow()
            return
        outbox.append(frame)
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._write())

    def send_now(self, text: str) -> bool:
        """Write `text` at once when nothing waits before it and the server offers it
        (SEND_NOW: the connection is writable): no writer task for the frame. False: it
        must wait its turn (the outbox and its writer)."""
        send_now = self.sender_now()
        return send_now is not None and send_now(text)

    def sender_now(self) -> Callable[[str], bool] | None:
        """The server's SEND_NOW when a frame may be written at once (nothing waits in the
        outbox), else None. It is looked up once; whether the connection is still open
        is its own to check."""
        if self._outbox or self._writer is not None:
            return None
        send_now = self._send_now
        if send_now is None:
            send_now = self._send_now = self.scope_extensions().get(SEND_NOW) or False
        return send_now or None

    def scope_extensions(self) -> dict[str, Any]:
        """The ASGI extensions the server offers this connection (its scope's)."""
        ws = getattr(self.websocket, "ws", None)  # type: ignore[attr-defined]
        scope = getattr(ws, "scope", None) or {}
        return scope.get("extensions") or {}

    async def room_for(self, mark: int) -> None:
        """Wait until fewer than `mark` frames wait to be written. An opening (a replay
        may hold more changes than the buffer) goes at the pace its client reads: only
        live messages, which nobody can hold back, count against the buffer."""
        mark = max(1, mark)
        while self._outbox is not None and len(self._outbox) >= mark:
            if self._room is None:
                self._room = asyncio.get_running_loop().create_future()
            self._room_below = mark
            await asyncio.shield(self._room)

    def _make_room(self) -> None:
        room, self._room = self._room, None
        if room is not None and not room.done():
            room.set_result(None)

    async def _write(self) -> None:
        send = self.websocket.ws.send_text  # type: ignore[attr-defined]
        try:
            while self._outbox:
                frame = self._outbox.popleft()
                if self._room is not None and len(self._outbox) < self._room_below:
                    self._make_room()
                if not isinstance(frame, str):
                    frame = await frame
                    if frame is None:
                        continue
                await send(frame)
        except (WebSocketDisconnect, RuntimeError, OSError):
            self._outbox = None  # the client is gone: the connection's end cleans up
        finally:
            self._writer = None
            if not self._outbox:
                self._outbox = None
            self._make_room()
