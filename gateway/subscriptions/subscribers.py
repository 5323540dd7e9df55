"""Who receives a change: subscribers with bounded buffers, and the in-memory index from
(view, key) and from filters to them. Pure logic (no I/O), so it is unit-tested alone.

Subscribers with the same filter share one group: a change is matched once per distinct
filter, not once per subscriber. The op a filtered subscriber sees is relative to its
filter: a row that starts matching is an INSERT for it, one that stops matching a DELETE.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from gateway.reads.filters import Condition, matches
from gateway.subscriptions.condition_index import ConditionIndex
from gateway.subscriptions.operation_starts import settle_current
from schema.catalog import FieldInfo
from schema.storage import ChangeEvent


class Overflow(Exception):
    """The client read too slowly: its buffer filled up."""


def relative_op(event: ChangeEvent, conditions: Sequence[Condition],
                fields: Mapping[str, FieldInfo]) -> str | None:
    """INSERT, UPDATE or DELETE as seen through a filter; None: the filter never saw it."""
    was = event.before is not None and matches(event.before, conditions, fields)
    now = event.row is not None and matches(event.row, conditions, fields)
    if was and now:
        return "UPDATE"
    if now:
        return "INSERT"
    return "DELETE" if was else None


def touches(event: ChangeEvent, conditions: Sequence[Condition],
            fields: Mapping[str, FieldInfo]) -> bool:
    """Whether the change may alter a list with these conditions."""
    return relative_op(event, conditions, fields) is not None


def filter_key(conditions: Sequence[Condition], *extra: Any) -> str:
    """The same filter (in any order, `in` values in any order) gives the same key.
    (A str: orjson's bytes keep their 4 KiB output buffer, and every subscriber's
    unregistering closure holds its key.)"""
    def value(c: Condition) -> Any:
        return sorted(map(str, c.value)) if c.op == "in" else str(c.value)
    normal = sorted([c.field, c.op, value(c)] for c in conditions)
    return orjson.dumps([normal, *extra], default=str).decode()


def unregistered() -> None:
    """The `unregister` of a subscriber registered nowhere (any more)."""


class Sink(Protocol):
    """Where a subscriber hands its items once nothing waits on it
    (gateway.subscriptions.live_operations)."""

    def push(self, item: Any) -> None: ...

    def fail(self, error: BaseException) -> None: ...


class Subscriber:
    """One subscription's outbox: at most `limit` messages wait for the client; one more
    and it overflows (the gateway closes the client's websocket), so a slow client never
    holds more than that and never slows anyone else down.

    Read in one of two ways. A task may wait on it (`get`). Or, once `attach`ed, it hands
    each item to its sink as it comes, and no task waits at all: the websocket handler's
    live operations (gateway.subscriptions.live_operations) are served so, the outbox then
    being their connection's. Tens of thousands are held at once, most of them idle: the
    queue exists only while messages wait, and a waiting `get` holds one future (an
    asyncio.Event and a deque each cost more than the rest of the subscriber)."""

    __slots__ = ("failure", "limit", "on_overflow", "queue", "sink", "unregister", "_waiter")

    # `unregister` is set by whoever registers the subscriber, and refers to it: it resets
    # itself when called, so a subscriber gone is freed at once, not by the cyclic
    # garbage collector (whose full passes over tens of thousands of tabs take a second).

    def __init__(self, limit: int, on_overflow: Callable[[Subscriber], None]) -> None:
        self.limit = limit
        self.on_overflow = on_overflow
        self.queue: deque[Any] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.failure: BaseException | None = None
        self.sink: Sink | None = None
        self.unregister: Callable[[], None] = unregistered

    def put(self, item: Any) -> None:
        if self.failure is not None:
            return
        if self.sink is not None:
            self.sink.push(item)
            return
        if self.queue is None:
            self.queue = deque()
        elif len(self.queue) >= self.limit:
            self.queue = None
            self.overflow()
            return
        self.queue.append(item)
        self._wake()

    def overflow(self) -> None:
        """The client reads too slowly: end this subscription, and tell `on_overflow`."""
        if self.failure is None:
            self.fail(Overflow(f"more than {self.limit} messages waited for this client "
                               "(gateway_subscription_buffer)"))
            self.on_overflow(self)

    def fail(self, error: BaseException) -> None:
        """End the subscription with `error` once the messages before it are read."""
        if self.failure is None:
            self.failure = error
            self.unregister()
            if self.sink is not None:
                self.sink.fail(error)
        self._wake()

    def attach(self, sink: Sink) -> None:
        """From now on, hand every item to `sink` as it comes: first those waiting, in
        order, then the failure that ended the subscription meanwhile, if any."""
        waiting, self.queue = self.queue, None
        self.sink = sink
        for item in waiting or ():
            sink.push(item)
        if self.failure is not None:
            sink.fail(self.failure)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> Any:
        while not self.queue:
            if self.failure is not None:
                raise self.failure
            settle_current()  # waiting for live changes: this subscription has started
            self.queue = None  # an empty deque still holds a block of 64 slots
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self.queue.popleft()
        if not self.queue:
            self.queue = None
        return item


class LiveQuery(Protocol):
    """A shared evaluation (gateway.subscriptions.live_lists) the index notifies of changes."""

    conditions: Sequence[Condition]

    def changed(self) -> None: ...

    def generation_changed(self) -> None: ...


@dataclass
class FilterGroup:
    conditions: list[Condition]
    subscribers: set[Subscriber] = field(default_factory=set)


class ViewIndex:
    """One view's subscribers: by key, and filter groups and live lists by filter key (found
    by the changes that may concern them: gateway.subscriptions.condition_index)."""

    def __init__(self, fields: Mapping[str, FieldInfo]) -> None:
        self.by_key: dict[str, set[Subscriber]] = {}
        self.filters: ConditionIndex[FilterGroup] = ConditionIndex(fields)
        self.lists: ConditionIndex[LiveQuery] = ConditionIndex(fields)

    def __len__(self) -> int:
        return sum(map(len, self.by_key.values())) + sum(
            len(g.subscribers) for g in self.filters.values())


class SubscriberIndex:
    def __init__(self, fields: Mapping[str, Mapping[str, FieldInfo]]) -> None:
        self.fields = fields
        self.views: dict[str, ViewIndex] = {name: ViewIndex(f) for name, f in fields.items()}

    def add_key(self, view: str, key: str, sub: Subscriber) -> None:
        subs = self.views[view].by_key.setdefault(key, set())
        subs.add(sub)

        def remove() -> None:
            sub.unregister = unregistered  # (it refers to this closure: a cycle otherwise)
            subs.discard(sub)
            if not subs and self.views[view].by_key.get(key) is subs:
                del self.views[view].by_key[key]
        sub.unregister = remove

    def add_filter(self, view: str, conditions: list[Condition],
                   sub: Subscriber) -> list[Condition]:
        """Register `sub`; returns its group's conditions (equal to `conditions`), one
        list however many subscribers share the filter."""
        groups = self.views[view].filters
        fkey = filter_key(conditions)
        group = groups.get(fkey)
        if group is None:
            group = groups[fkey] = FilterGroup(conditions)
        group.subscribers.add(sub)

        def remove() -> None:
            sub.unregister = unregistered
            group.subscribers.discard(sub)
            if not group.subscribers and groups.get(fkey) is group:
                del groups[fkey]
        sub.unregister = remove
        return group.conditions

    def targets(self, event: ChangeEvent) -> Iterator[tuple[Subscriber, str]]:
        """(subscriber, op) for every subscriber of a key or filter this change concerns."""
        index = self.views[event.view]
        for sub in list(index.by_key.get(event.key, ())):
            yield sub, event.op.upper()
        fields = self.fields[event.view]
        for group in index.filters.candidates(event):
            op = relative_op(event, group.conditions, fields)
            if op is not None:
                for sub in list(group.subscribers):
                    yield sub, op

    def live_queries(self, event: ChangeEvent) -> Iterator[LiveQuery]:
        """Shared live lists this change may alter."""
        fields = self.fields[event.view]
        for live in self.views[event.view].lists.candidates(event):
            if touches(event, live.conditions, fields):
                yield live

    def subscriber_count(self) -> int:
        return sum(len(v) for v in self.views.values())
