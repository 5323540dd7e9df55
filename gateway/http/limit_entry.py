"""An ASGI middleware in front of everything else on `/graphql` (the lean entry and the
router): the per-client rate limit of HTTP requests and the per-client limit of open
websockets, so both HTTP paths and both websocket protocols are held by one check.

Over the rate, the answer is 429 with Retry-After (whole seconds) and a GraphQL error
(`extensions.code` RATE_LIMITED). A websocket past its client's limit is refused at the
handshake: HTTP 429 with a JSON reason where the server can send one (uvicorn can), else
closed with 4029 before it is accepted.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from gateway.access.client_identity import CLIENT_SCOPE_KEY, client_key
from gateway.access.client_limits import ClientCounts
from gateway.access.rate_limit import LIMITED, RateLimiter
from gateway.http.http import JSON, media_for, negotiate

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class LimitEntry:
    def __init__(self, app: ASGIApp, limiter: RateLimiter | None, websockets: int,
                 address_header: str | None, path: str = "/graphql") -> None:
        self.app = app
        self.limiter = limiter
        self.websockets = ClientCounts(websockets)
        self.address_header = address_header
        self.path = path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.limiter is not None \
                and scope["path"] == self.path:
            wait_s = await self.limiter.check(client_key(scope, self.address_header))
            if wait_s is not None:
                await _too_many(scope, send, wait_s)
                return
        elif scope["type"] == "websocket" and scope["path"] == self.path:
            await self._websocket(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = scope[CLIENT_SCOPE_KEY] = client_key(scope, self.address_header)
        if not self.websockets.acquire(client):
            LIMITED.labels("websocket").inc()
            await _refuse_websocket(scope, receive, send, self.websockets.limit)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.websockets.release(client)


def _error_body(message: str, code: str, **extensions: Any) -> bytes:
    return orjson.dumps({"errors": [{"message": message,
                                     "extensions": {"code": code, **extensions}}]})


async def _too_many(scope: Scope, send: Send, wait_s: int) -> None:
    accept = next((v.decode("latin-1") for n, v in scope["headers"] if n == b"accept"), None)
    body = _error_body(f"too many requests from this client; retry in {wait_s} s "
                       "(gateway_rate_limit_per_s)", "RATE_LIMITED", retryAfter=wait_s)
    await send({"type": "http.response.start", "status": 429, "headers": [
        (b"content-type", media_for(negotiate(accept) or JSON, 429).encode()),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(wait_s).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _refuse_websocket(scope: Scope, receive: Receive, send: Send, limit: int) -> None:
    message = await receive()  # websocket.connect: the handshake to answer
    if message["type"] != "websocket.connect":
        return
    reason = (f"this client already has {limit} open websockets "
              "(gateway_max_websockets_per_client)")
    if "websocket.http.response" in scope.get("extensions", {}):
        body = _error_body(reason, "LIMIT_WEBSOCKETS")
        await send({"type": "websocket.http.response.start", "status": 429, "headers": [
            (b"content-type", JSON.encode()), (b"content-length", str(len(body)).encode())]})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 4029, "reason": reason})
