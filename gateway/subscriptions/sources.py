"""What a subscription field's resolver returns: a live source, its first messages and then
one message (or none) per item its subscriber receives from the fan-out.

Served two ways. The graphql-transport-ws handler runs `opening()` in the operation's
start task, then `attach`es the subscriber and turns each item into a message with
`message()` as the fan-out hands it over, with no task of the subscription's own
(gateway.subscriptions.live_operations). graphql-core's own subscribe (the legacy
graphql-ws protocol) iterates the source like any async iterable.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from gateway.subscriptions.subscribers import Subscriber


class LiveSource:
    __slots__ = ("subscriber",)

    def __init__(self, subscriber: Subscriber) -> None:
        self.subscriber = subscriber

    def opening(self) -> AsyncIterator[Any]:
        """The messages before the live ones (a current value, a replay); none here."""
        return _nothing()

    def message(self, item: Any) -> Any | Awaitable[Any]:
        """The message an item of the subscriber's becomes (None: nothing to send); an
        awaitable when it must read first. Items are given in order, each after the
        previous one's message is settled."""
        return item

    def close(self) -> None:
        self.subscriber.unregister()

    async def __aiter__(self) -> AsyncIterator[Any]:
        try:
            async for message in self.opening():
                yield message
            while True:
                message = self.message(await self.subscriber.get())
                if inspect.isawaitable(message):
                    message = await message
                if message is not None:
                    yield message
        finally:
            self.close()


async def _nothing() -> AsyncIterator[Any]:
    return
    yield
