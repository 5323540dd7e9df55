"""The Subscription root built from the catalog: per view a live value by key, the changes
of a filtered list (resumable), and a live list.

- `customer(customerId: "c1")`: the current row (op CURRENT), then each new version of it
  (UPDATE, INSERT) and its deletion (DELETE). An unknown key is an error.
- `customerChanges(where, after, afterVersion)`: INSERT / UPDATE / DELETE relative to the
  filter, each with the row, key, version and a cursor; `after: cursor` or
  `afterVersion: N` replays the feed from there, then goes live, without gap or repeat.
- `customers(where, orderBy, first)`: the list's page, sent again when a change alters it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import strawberry
from strawberry.dataloader import DataLoader

from gateway.access.row_rules import RowScope, allows, scoped, seen_change
from gateway.ops.long_scalar import Long
from gateway.ops.metrics import SLOW_CLIENTS
from gateway.reads.filters import Condition, QueryError
from gateway.reads.freshness import Freshness
from gateway.reads.redis_store import RedisUnavailable
from gateway.subscriptions.fanout import GENERATION_CHANGED, Fanout, rebuilt_error
from gateway.subscriptions.feed import FeedEvent
from gateway.subscriptions.feed_cursor import FeedCursor, decode_feed_cursor, encode_feed_cursor
from gateway.subscriptions.live_lists import LiveList
from gateway.subscriptions.shared_results import shared
from gateway.subscriptions.sources import LiveSource
from gateway.subscriptions.subscribers import Subscriber, filter_key, relative_op
from gateway.types.types import (
    RequestContext,
    ViewTypes,
    keyword,
    list_name,
    list_page,
    list_query,
    lookup_name,
    where_conditions,
    with_signature,
)
from schema.storage import key_of

SLOW_CLIENT_CLOSE_CODE = 4008
MESSAGE_CACHE = 4096  # recent change messages, shared by their subscribers
CURRENT_CACHE = 4096  # recent current values, shared by the subscriptions starting from them


@strawberry.enum(description="What happened to a row. CURRENT: its value when the "
                 "subscription started (or after the view was rebuilt).")
class ChangeOp(enum.Enum):
    CURRENT = "CURRENT"
    INSERT = "INSERT"
    UPDATE = "UPDATE"
    DELETE = "DELETE"


@dataclass
class SubscriptionContext:
    """Per websocket connection. `connection_params` is the `connection_init` payload
    (set by Strawberry's protocol handlers), for authentication."""

    websocket: Any
    connection_params: dict[str, Any] | None = None
    # What besides document and variables can make two subscribers' results differ
    # (gateway.subscriptions.shared_results shares executions only within one scope): set
    # from the connection_init token (gateway.subscriptions.websocket) to the role and the
    # claim values its row rules read; None: the admin role.
    share_scope: Any = None
    too_slow: bool = False  # a subscription overflowed: the websocket is being closed
    # Also from the token: the role's schema and its row rules (None: admin, no rules).
    schema: Any = None
    scope: RowScope | None = None
    # The request context of the message being executed (gateway.types.types.request_context).
    message_context: Any = None


def changefeed_name(vt: ViewTypes) -> str:
    return f"{lookup_name(vt.view)}Changes"


def change_type(vt: ViewTypes) -> type:
    name = vt.view.name
    return strawberry.type(type(f"{name}Change", (), {"__annotations__": {
        "op": ChangeOp, "key": str, "version": int | None, "cursor": str | None,
        "row": vt.object | None, "before": vt.object | None, "committed_at_ms": Long | None,
    }}), description=(
        f"A change of one {name} row. `row` is the new value (null once deleted), `before` "
        f"the previous one; `cursor` resumes after this message (`after: cursor`); "
        f"`committedAtMs` is when the engine committed it, in epoch milliseconds (UTC)."))


class Subscriptions:
    def __init__(self, types: dict[str, ViewTypes], fanout: Fanout, settings: Any) -> None:
        self.types = types
        self.fanout = fanout
        self.settings = settings
        self.reads = fanout.reads
        self.changes = {name: change_type(vt) for name, vt in types.items()}
        self._closing: set[asyncio.Task] = set()
        self._messages: OrderedDict[tuple, Any] = OrderedDict()
        self._currents: OrderedDict[tuple, tuple[Any, Any]] = OrderedDict()
        # Current values that subscriptions start from, read in batches: thousands of
        # clients subscribing at once cost a few MGETs, not one read each (which could time
        # Redis out and send them all to Delta). No cache: each batch reads anew.
        self._current_values = {
            name: DataLoader(self._current_loader(vt), cache=False)
            for name, vt in types.items()}

    def fields(self) -> dict[str, tuple[Any, Any]]:
        out: dict[str, tuple[Any, Any]] = {}
        for vt in self.types.values():
            change = self.changes[vt.view.name]
            out[lookup_name(vt.view)] = (change, self._live_value_field(vt))
            out[changefeed_name(vt)] = (change, self._changes_field(vt))
            out[list_name(vt.view)] = (vt.connection, self._live_list_field(vt))
        return out

    # --- shared ---------------------------------------------------------------------------

    def _subscriber(self, info: strawberry.Info) -> Subscriber:
        # (Not kept on the context: the context would refer to itself through it.)
        return Subscriber(self.settings.gateway_subscription_buffer,
                          functools.partial(self._overflowed, info.context))

    def _overflowed(self, context: Any, sub: Subscriber) -> None:
        """A subscription of the client's overflowed: close its websocket."""
        if not isinstance(context, SubscriptionContext) or context.too_slow:
            return  # closing already (another subscription of the same client)
        context.too_slow = True
        self.fanout.stats.overflows += 1
        SLOW_CLIENTS.inc()
        reason = f"too slow: over {sub.limit} messages waited (gateway_subscription_buffer)"
        task = asyncio.ensure_future(_close(context.websocket, reason))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _seen(self, vt: ViewTypes, op: str | None, item: FeedEvent,
              scope: RowScope | None) -> Any:
        """The message of a change as a subscriber with these row rules sees it, or None
        (a change of rows it may not see: gateway.access.row_rules.seen_change)."""
        op, show_row, show_before = seen_change(scope, item.event, op)
        return None if op is None else self._message(vt, op, item, show_row, show_before)

    def _message(self, vt: ViewTypes, op: str, item: FeedEvent, show_row: bool = True,
                 show_before: bool = True) -> Any:
        # Built once per change and op, however many subscribers it goes to.
        slot = (vt.view.name, item.event.generation, item.offset, op, show_row, show_before)
        message = self._messages.get(slot)
        if message is None:
            event = item.event
            message = self._messages[slot] = shared(self.changes[vt.view.name](
                op=ChangeOp(op), key=event.key, version=event.version,
                cursor=encode_feed_cursor(FeedCursor(vt.view.name, event.generation,
                                                     item.offset)),
                row=vt.to_object(event.row) if event.row is not None and show_row else None,
                before=vt.to_object(event.before) if event.before is not None and show_before
                else None,
                committed_at_ms=event.committed_at_ms))
            if len(self._messages) > MESSAGE_CACHE:
                self._messages.popitem(last=False)
        return message

    def _current_message(self, vt: ViewTypes, key: str, row: Any, version: int | None,
                         cursor: str) -> Any:
        """The CURRENT message of a live value; one object for the subscriptions that
        read an equal row at the same position (thousands of tabs opening on one key),
        so their executions are shared too."""
        slot = (vt.view.name, key, version, cursor)
        cached = self._currents.get(slot)
        if cached is not None and cached[0] == row:
            return cached[1]
        message = shared(self.changes[vt.view.name](
            op=ChangeOp.CURRENT, key=key, version=version, cursor=cursor,
            row=vt.to_object(row) if row is not None else None, before=None,
            committed_at_ms=None))
        self._currents[slot] = (row, message)
        if len(self._currents) > CURRENT_CACHE:
            self._currents.popitem(last=False)
        return message

    # --- live value by key ----------------------------------------------------------------

    def _live_value_field(self, vt: ViewTypes) -> Any:
        view = vt.view

        async def live_value(info: strawberry.Info, **kwargs: Any) -> AsyncIterator[Any]:
            key = key_of(kwargs, view.key)
            scope = getattr(info.context, "scope", None)
            sub = self._subscriber(info)
            self.fanout.index.add_key(view.name, key, sub)
            try:
                current = await self._current(vt, key)
            except BaseException:
                sub.unregister()
                raise
            if not allows(scope, view.name, current[0]):  # a row it may not see: none
                sub.unregister()
                raise QueryError(
                    f"{view.name} has no row with key {key}: subscribe to an existing key, or "
                    f"to {changefeed_name(vt)} to see rows appear", "NOT_FOUND",
                    view=view.name, key=key)
            return LiveValue(self, vt, key, sub, current, scope)

        params = [keyword(c, vt.fields[c].python_type) for c in view.key]
        return strawberry.subscription(
            resolver=with_signature(live_value, params), graphql_type=self.changes[view.name],
            description=(f"One {view.name} by its key: its current value (CURRENT), then every "
                         "new version (UPDATE, INSERT) and its deletion (DELETE)."))

    async def _current(self, vt: ViewTypes, key: str) -> tuple[Any, int | None, str]:
        """(row, version, cursor) now; the cursor resumes right after this read."""
        view = vt.view.name
        cursor = encode_feed_cursor(FeedCursor(view, self.fanout.serving.get(view, 0),
                                               self.fanout.position(view) - 1))
        row, version = await self._current_values[view].load(key)
        return row, version, cursor

    def _current_loader(self, vt: ViewTypes) -> Any:
        async def load(keys: list[str]) -> list[tuple[Any, int | None]]:
            fresh = Freshness()
            unique = list(dict.fromkeys(keys))
            rows = dict(zip(unique, await self.reads.rows(vt.view, unique, fresh),
                            strict=True))
            seen = fresh.latest.get(vt.view.name)
            version = seen.version if seen else None
            return [(rows[k], version) for k in keys]
        return load

    # --- changes of a filtered list -------------------------------------------------------

    def _changes_field(self, vt: ViewTypes) -> Any:
        view = vt.view

        async def changes(info: strawberry.Info, where: Any = None, after: str | None = None,
                          after_version: int | None = None) -> AsyncIterator[Any]:
            # The caller's row rules join its filter: leaving the visible set is a DELETE.
            scope = getattr(info.context, "scope", None)
            conditions = scoped(where_conditions(vt, where), scope, view.name)
            if after is not None and after_version is not None:
                raise QueryError("pass either after or afterVersion, not both", "BAD_REQUEST")
            sub = self._subscriber(info)
            conditions = self.fanout.index.add_filter(view.name, conditions, sub)
            position = self.fanout.position(view.name)
            generation = self.fanout.serving.get(view.name, 0)
            try:
                start = await self._resume_start(view.name, generation, position, after,
                                                 after_version)
            except BaseException:
                sub.unregister()
                raise
            return ChangeStream(self, vt, sub, conditions, generation, start, position,
                                after_version, scope)

        params = [keyword("where", vt.where | None, None), keyword("after", str | None, None),
                  keyword("after_version", int | None, None)]
        return strawberry.subscription(
            resolver=with_signature(changes, params), graphql_type=self.changes[view.name],
            description=(
                f"Changes of the {view.name} rows matching `where` (the list's filter), as "
                "seen through it: a row starting to match is an INSERT, one that stops "
                "matching a DELETE. `after: cursor` (a message's cursor) or `afterVersion: N` "
                "(a version a query reported) first replays what changed since, without gap "
                "or repeat."))

    async def _resume_start(self, view: str, generation: int, position: int,
                            after: str | None, after_version: int | None) -> int:
        """The feed offset from which this subscriber's changes start."""
        if after is None and after_version is None:
            return position
        topic = self.fanout.topics[view]
        if after is not None:
            cursor = decode_feed_cursor(after, view)
            if cursor.generation != generation:
                raise rebuilt_error(view, generation)
            low, _ = await self.fanout.history.bounds(topic)
            if cursor.offset + 1 < low:
                raise _expired(view)
            return cursor.offset + 1
        assert after_version is not None
        with contextlib.suppress(RedisUnavailable):  # then search the feed
            meta = await self.reads.redis.meta(view)
            if meta.generation == generation and meta.version is not None \
                    and meta.version <= after_version:
                return position  # nothing newer committed yet: the live feed has it all
        low, high = await self.fanout.history.bounds(topic)
        start, first = await self.fanout.history.start_after_version(
            view, topic, generation, after_version, low, high)
        # Records before `low` are gone; unless a retained event is at or below the
        # client's version, some of the changes it missed may be among them.
        if low > 0 and (first is None or first > after_version):
            raise _expired(view)
        return start

    # --- live list ------------------------------------------------------------------------

    def _live_list_field(self, vt: ViewTypes) -> Any:
        view = vt.view

        async def live_list(info: strawberry.Info, where: Any = None, order_by: Any = None,
                            first: int | None = None) -> AsyncIterator[Any]:
            conditions, order = list_query(vt, where, order_by)
            scope = getattr(info.context, "scope", None)
            conditions = scoped(conditions, scope, view.name)  # re-evaluated on their changes
            lists = self.fanout.index.views[view.name].lists
            key = filter_key(conditions, order.field, order.descending, first,
                             getattr(info.context, "share_scope", None))
            live = lists.get(key)
            if live is None:
                live = lists[key] = self._live_list(vt, key, conditions, {
                    "where": where, "order_by": order_by, "first": first}, scope)
            sub = self._subscriber(info)
            await live.add(sub)  # type: ignore[attr-defined]
            return LiveSource(sub)  # its pages as they come

        params = [keyword("where", vt.where | None, None),
                  keyword("order_by", vt.order_by | None, None),
                  keyword("first", int | None, None)]
        return strawberry.subscription(
            resolver=with_signature(live_list, params), graphql_type=vt.connection,
            description=(f"A page of the {list_name(view)} list (same arguments), sent again "
                         "whenever a change alters it. Subscribers with the same arguments "
                         "share one evaluation."))

    def _live_list(self, vt: ViewTypes, key: str, conditions: list[Condition],
                   kwargs: dict[str, Any], scope: RowScope | None) -> LiveList:
        lists = self.fanout.index.views[vt.view.name].lists

        async def evaluate() -> tuple[Any, Any]:
            context = RequestContext(self.reads, self.reads.catalog, scope=scope)
            page = shared(await list_page(vt, self.settings, context, kwargs))
            info = page.page_info
            # What a client can see of the page: its rows, cursors, counts and flags.
            snapshot = ([(e.cursor, [getattr(e.node, f) for f in vt.fields]) for e in page.edges],
                        page.total_count, info.has_next_page, info.has_previous_page)
            return page, snapshot

        def evaluated() -> None:
            self.fanout.stats.evaluations += 1

        def idle(live: LiveList) -> None:
            if lists.get(key) is live:
                del lists[key]

        return LiveList(conditions, evaluate, self.settings.gateway_subscription_coalesce_ms
                        / 1000, evaluated, idle)


async def _close(websocket: Any, reason: str) -> None:
    with contextlib.suppress(Exception):  # already closing or gone
        await websocket.close(code=SLOW_CLIENT_CLOSE_CODE, reason=reason)


def _expired(view: str) -> QueryError:
    return QueryError(
        f"the change feed of {view} no longer holds the changes after this position (they "
        "are older than its retention, changefeed_retention_ms): query the view again and "
        "subscribe with afterVersion set to the version the query reports",
        "CURSOR_EXPIRED", view=view)


class LiveValue(LiveSource):
    """One row by key: its value when the subscription started (CURRENT), then each new
    version of it, read again (CURRENT) when its view switches generation."""

    __slots__ = ("cursor", "key", "row", "scope", "subscriptions", "version", "vt")

    def __init__(self, subscriptions: Subscriptions, vt: ViewTypes, key: str,
                 sub: Subscriber, current: tuple[Any, int | None, str],
                 scope: RowScope | None) -> None:
        super().__init__(sub)
        self.subscriptions, self.vt, self.key, self.scope = subscriptions, vt, key, scope
        self.row, self.version, cursor = current
        self.cursor: str | None = cursor

    async def opening(self) -> AsyncIterator[Any]:
        cursor, self.cursor = self.cursor, None
        assert cursor is not None
        yield self.subscriptions._current_message(self.vt, self.key, self.row, self.version,
                                                  cursor)

    def message(self, item: Any) -> Any:
        if item is GENERATION_CHANGED:
            return self._read_again()
        op, feed_event = item
        event = feed_event.event
        # Already part of the value sent (the read may trail the feed a little).
        if (self.version is not None and event.version <= self.version) \
                or event.row == self.row:
            return None
        message = self.subscriptions._seen(self.vt, op, feed_event, self.scope)
        if message is not None:  # else a change among values it may not see
            self.row = event.row
        return message

    async def _read_again(self) -> Any:
        subscriptions, vt = self.subscriptions, self.vt
        row, version, cursor = await subscriptions._current(vt, self.key)
        if not allows(self.scope, vt.view.name, row):
            row = None
        self.row, self.version = row, version
        return subscriptions._current_message(vt, self.key, row, version, cursor)


class ChangeStream(LiveSource):
    """The changes of the rows matching a filter, relative to it; resumed ones first
    replay the feed from `start` up to `position`, where the live changes begin."""

    __slots__ = ("conditions", "floor", "generation", "position", "replayed", "scope",
                 "start", "subscriptions", "vt")

    def __init__(self, subscriptions: Subscriptions, vt: ViewTypes, sub: Subscriber,
                 conditions: list[Condition], generation: int, start: int, position: int,
                 floor: int | None, scope: RowScope | None) -> None:
        super().__init__(sub)
        self.subscriptions, self.vt, self.conditions, self.scope = (
            subscriptions, vt, conditions, scope)
        self.generation, self.start, self.position, self.floor = (
            generation, start, position, floor)
        self.replayed: dict[str, int] | None = None  # key -> version sent while replaying

    def _wanted(self, item: FeedEvent, replaying: bool) -> bool:
        event = item.event
        if item.offset < self.start or event.generation != self.generation \
                or (self.floor is not None and event.version <= self.floor) \
                or (self.replayed is not None
                    and self.replayed.get(event.key, -1) >= event.version):
            return False
        if replaying:
            if self.replayed is None:
                self.replayed = {}
            self.replayed[event.key] = event.version
        return True

    async def opening(self) -> AsyncIterator[Any]:
        if self.start >= self.position:
            return
        subscriptions, vt = self.subscriptions, self.vt
        view = vt.view.name
        async for chunk in subscriptions.fanout.history.replay(
                view, subscriptions.fanout.topics[view], self.start, self.position):
            for item in chunk:
                op = relative_op(item.event, self.conditions, vt.fields) \
                    if self._wanted(item, replaying=True) else None
                message = subscriptions._seen(vt, op, item, self.scope)
                if message is not None:
                    yield message

    def message(self, item: Any) -> Any:
        op, feed_event = item
        return self.subscriptions._seen(self.vt, op, feed_event, self.scope) \
            if self._wanted(feed_event, False) else None
