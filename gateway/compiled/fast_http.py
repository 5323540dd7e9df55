"""A lean ASGI entry in front of the router for `/graphql` requests whose document has a
compiled plan (gateway.compiled.fastpath): the hot path skips Starlette's routing, Request and
Response objects and sends the plan's bytes itself.

It answers only when the request is plainly valid (POST with a JSON object body or GET
with a `query` parameter, an acceptable media type, no `minVersion`, a caller of the admin
role: gateway.access.access) and the plan ran; for anything else (a bad token too) it hands the
request, with the body it already read, to the router, so every status code, media type
and error stays the general path's (gateway.http.http).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

import orjson

from gateway.access.auth import ROLE_HEADER
from gateway.http.http import (
    BadRequest,
    GraphQLHTTP,
    is_json_body,
    media_for,
    negotiate,
    parse_params,
)
from gateway.ops.metrics import observe_request

ROLE_HEADER_BYTES = ROLE_HEADER.encode()

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class FastEntry:
    """ASGI middleware: compiled `/graphql` answers, everything else to `app`."""

    def __init__(self, app: ASGIApp, graphql: GraphQLHTTP, path: str = "/graphql") -> None:
        self.app = app
        self.graphql = graphql
        self.path = path
        self.max_body = graphql.settings.gateway_max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        fast = self.graphql.fast
        if scope["type"] != "http" or scope["path"] != self.path or fast is None \
                or not fast.plans:
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        if method == "POST":
            await self._post(scope, receive, send)
        elif method == "GET":
            await self._get(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _post(self, scope: Scope, receive: Receive, send: Send) -> None:
        accept = content_type = authorization = role = None
        for name, value in scope["headers"]:
            # The first of each, as Starlette's Headers.get reads them.
            if name == b"accept" and accept is None:
                accept = value.decode("latin-1")
            elif name == b"content-type" and content_type is None:
                content_type = value.decode("latin-1")
            elif name == b"authorization" and authorization is None:
                authorization = value.decode("latin-1")
            elif name == ROLE_HEADER_BYTES and role is None:
                role = value.decode("latin-1")
        body, more, messages = await _read_body(receive, self.max_body)
        answered = False
        if not more and is_json_body(content_type):
            try:
                params = orjson.loads(body)
            except orjson.JSONDecodeError:
                params = None
            if isinstance(params, dict):
                answered = await self._answer(params, accept, send, authorization, role)
        if not answered:
            await self.app(scope, _replay(messages, receive), send)

    async def _get(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {n: v.decode("latin-1") for n, v in reversed(scope["headers"])}  # first wins
        accept = headers.get(b"accept")
        if accept is not None and "text/html" in accept:
            await self.app(scope, receive, send)  # GraphiQL or a browser: the general path
            return
        params = dict(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True))
        if not await self._answer(params, accept, send, headers.get(b"authorization"),
                                  headers.get(ROLE_HEADER_BYTES), in_url=True):
            await self.app(scope, receive, send)

    async def _answer(self, params: dict[str, Any], accept: str | None, send: Send,
                      authorization: str | None, role: str | None,
                      in_url: bool = False) -> bool:
        """Send the compiled answer; False (nothing sent) when the general path must."""
        started = time.perf_counter()
        media = negotiate(accept)
        if media is None:
            return False
        persisted = self.graphql.persisted
        if persisted is not None:  # a persisted query known in memory, else the general path
            params = persisted.cached(params)
            if params is None:
                return False
        try:
            req = parse_params(params, self.graphql.settings.gateway_max_document_bytes,
                               in_url)
        except BadRequest:
            return False
        answer = await self.graphql.fast_answer(req, authorization, role)
        if answer is None:
            return False
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-length", str(len(answer)).encode()),
            (b"content-type", media_for(media, 200).encode())]})
        await send({"type": "http.response.body", "body": answer})
        observe_request(req.operation_name, "compiled", time.perf_counter() - started)
        return True


async def _read_body(receive: Receive, limit: int) -> tuple[bytes, bool, list[Message]]:
    """The body (up to about `limit` bytes), whether more is left unread, and the messages
    read, to replay to the router."""
    messages: list[Message] = []
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return b"", True, messages
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), False, messages
        if size > limit:
            return b"", True, messages


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()
    return replayed
