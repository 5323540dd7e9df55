"""ASGI entry for the websockets on `/graphql`: straight to the GraphQL websocket app,
past Starlette's exception middleware, router and route.

A websocket holds the coroutine of every layer it went through for as long as it is open,
and each of its messages goes back out through them: Starlette's layers were six
coroutines (and a closure wrapping every send) per connection, for nothing a websocket uses
(its exception handlers answer HTTP errors; the route only matches the path). With ten
thousand browser tabs that was about 3 KiB and a share of every message's CPU each.
Everything else goes on to `app`. No coroutine of its own: it returns the one it hands to."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]


class WebSocketEntry:
    def __init__(self, app: ASGIApp, websocket_app: ASGIApp, path: str = "/graphql") -> None:
        self.app = app
        self.websocket_app = websocket_app
        self.path = path

    def __call__(self, scope: Scope, receive: Any, send: Any) -> Awaitable[None]:
        if scope["type"] == "websocket" and scope["path"] == self.path:
            return self.websocket_app(scope, receive, send)
        return self.app(scope, receive, send)
