"""The subscriptions' pure logic: ops relative to a filter, filter normalisation, feed
cursors, bounded subscriber buffers, the subscriber index, live list coalescing and the
fan-out's dropping of repeats and other generations."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import strawberry
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.testclient import TestClient

from gateway.reads.filters import QueryError, parse_where
from gateway.reads.reads import Reads
from gateway.subscriptions.fanout import Fanout
from gateway.subscriptions.feed import FeedEvent
from gateway.subscriptions.feed_cursor import FeedCursor, decode_feed_cursor, encode_feed_cursor
from gateway.subscriptions.live_lists import LiveList
from gateway.subscriptions.subscribers import (
    Overflow,
    Subscriber,
    SubscriberIndex,
    filter_key,
    relative_op,
)
from gateway.subscriptions.websocket import GraphQLWebSocket
from schema.catalog import graphql_fields
from schema.demo import CATALOG
from schema.settings import Settings
from schema.storage import ChangeEvent

CUSTOMER = CATALOG.view("Customer")
FIELDS = graphql_fields(CUSTOMER)
GOLD = parse_where(CUSTOMER, FIELDS, {"tier": {"eq": "gold"}})


def _row(tier: str, name: str = "Ada") -> dict:
    return {"customer_id": "C1", "name": name, "tier": tier, "country": "DE"}


def _event(before: dict | None, row: dict | None, version: int = 1, key: str = "C1",
           generation: int = 0) -> ChangeEvent:
    op = "delete" if row is None else ("update" if before else "insert")
    return ChangeEvent("Customer", key, op, row, before, version, generation, 0)


@pytest.mark.parametrize(("before", "row", "expected"), [
    (None, _row("gold"), "INSERT"),
    (_row("silver"), _row("gold"), "INSERT"),  # starts matching
    (_row("gold"), _row("gold", "Bo"), "UPDATE"),
    (_row("gold"), _row("silver"), "DELETE"),  # stops matching
    (_row("gold"), None, "DELETE"),
    (_row("silver"), _row("silver", "Bo"), None),  # never seen through the filter
    (_row("silver"), None, None),
    (None, None, None),
])
def test_ops_are_relative_to_the_filter(before, row, expected):
    assert relative_op(_event(before, row), GOLD, FIELDS) == expected


def test_without_a_filter_the_op_is_the_feeds():
    assert relative_op(_event(_row("gold"), _row("silver")), [], FIELDS) == "UPDATE"
    assert relative_op(_event(None, _row("gold")), [], FIELDS) == "INSERT"
    assert relative_op(_event(_row("gold"), None), [], FIELDS) == "DELETE"


def test_the_same_filter_in_any_order_has_one_key():
    a = parse_where(CUSTOMER, FIELDS, {"tier": {"in": ["gold", "silver"]},
                                       "country": {"eq": "DE"}})
    b = parse_where(CUSTOMER, FIELDS, {"country": {"eq": "DE"},
                                       "tier": {"in": ["silver", "gold"]}})
    assert filter_key(a) == filter_key(b)
    assert filter_key(a) != filter_key(GOLD)
    assert filter_key(a, "country", False, 10) != filter_key(a, "country", True, 10)


def test_feed_cursors_round_trip_and_name_their_view():
    cursor = FeedCursor("Order", 2, 41)
    text = encode_feed_cursor(cursor)
    assert decode_feed_cursor(text, "Order") == cursor
    for bad, view in (("garbage", "Order"), (text[:-3], "Order"), (text, "Customer")):
        with pytest.raises(QueryError) as error:
            decode_feed_cursor(bad, view)
        assert error.value.extensions["code"] == "BAD_CURSOR"


def test_a_full_buffer_overflows_once_and_drops_what_waited():
    async def scenario() -> None:
        overflowed: list[Subscriber] = []
        sub = Subscriber(3, overflowed.append)
        removed: list[bool] = []
        sub.unregister = lambda: removed.append(True)
        for i in range(3):
            sub.put(i)
        assert await sub.get() == 0
        sub.put(3)
        sub.put(4)  # the fourth waiting message
        sub.put(5)
        assert overflowed == [sub] and removed == [True] and not sub.queue
        with pytest.raises(Overflow, match="gateway_subscription_buffer"):
            await sub.get()
    asyncio.run(scenario())


def test_a_failure_comes_after_the_messages_before_it():
    async def scenario() -> None:
        sub = Subscriber(10, lambda _: None)
        sub.put("a")
        sub.fail(QueryError("rebuilt", "GENERATION_CHANGED"))
        sub.put("b")  # after the failure: dropped
        assert await sub.get() == "a"
        with pytest.raises(QueryError):
            await sub.get()
    asyncio.run(scenario())


def test_the_index_finds_key_and_filter_subscribers_and_forgets_them():
    index = SubscriberIndex({"Customer": FIELDS})
    by_key, gold_a, gold_b, silver = (Subscriber(10, lambda _: None) for _ in range(4))
    index.add_key("Customer", "C1", by_key)
    index.add_filter("Customer", GOLD, gold_a)
    index.add_filter("Customer", list(GOLD), gold_b)
    index.add_filter("Customer", parse_where(CUSTOMER, FIELDS, {"tier": {"eq": "silver"}}),
                     silver)
    assert len(index.views["Customer"].filters) == 2  # one group per distinct filter
    demoted = _event(_row("gold"), _row("silver"))
    assert {(s, op) for s, op in index.targets(demoted)} == {
        (by_key, "UPDATE"), (gold_a, "DELETE"), (gold_b, "DELETE"), (silver, "INSERT")}
    other_key = _event(None, _row("bronze"), key="C2")
    assert list(index.targets(other_key)) == []
    for sub in (by_key, gold_a, gold_b, silver):
        sub.unregister()
    assert index.subscriber_count() == 0
    assert not index.views["Customer"].filters and not index.views["Customer"].by_key


def test_a_live_list_is_evaluated_once_per_burst_and_unchanged_pages_are_not_resent():
    async def scenario() -> None:
        pages = iter(["p1", "p1", "p2"])
        calls: list[int] = []

        async def evaluate() -> tuple[str, str]:
            calls.append(1)
            page = next(pages)
            return page, page

        live = LiveList(GOLD, evaluate, 0.01, lambda: None, lambda _: None)
        a, b = Subscriber(10, lambda _: None), Subscriber(10, lambda _: None)
        await live.add(a)
        await live.add(b)
        assert len(calls) == 1 and list(a.queue) == list(b.queue) == ["p1"]
        for _ in range(50):  # a burst
            live.changed()
        await asyncio.wait_for(live._task, 5)
        assert len(calls) == 2 and list(a.queue) == ["p1"]  # same page: not sent again
        live.changed()
        await asyncio.wait_for(live._task, 5)
        assert list(a.queue) == list(b.queue) == ["p1", "p2"]
    asyncio.run(scenario())


def test_the_fanout_drops_repeats_older_versions_and_other_generations():
    settings = Settings()
    fanout = Fanout(CATALOG, settings, Reads(CATALOG, settings))
    fanout.serving = dict.fromkeys(CATALOG.views, 0)
    sub = Subscriber(100, lambda _: None)
    fanout.index.add_key("Customer", "C1", sub)
    events = [_event(None, _row("gold"), 5), _event(None, _row("gold"), 5),
              _event(_row("gold"), _row("silver"), 4), _event(None, _row("gold"), 6),
              _event(None, _row("bronze"), 1, generation=-1)]
    batch = [FeedEvent("Customer", offset, e) for offset, e in enumerate(events)]
    asyncio.run(fanout.dispatch(batch))
    assert [(op, item.event.version) for op, item in sub.queue] == [("INSERT", 5),
                                                                      ("INSERT", 6)]
    assert fanout.stats.repeats == 2


def test_repeats_are_dropped_exactly_with_memory_of_the_newest_version_only():
    from gateway.subscriptions.repeats import RepeatFilter

    repeats = RepeatFilter()
    # Batch 7 reached the feed in part (k1, k2), the engine died, and its replay sends all
    # of batch 7 again (k1, k2, k3) before batch 8.
    first = [repeats.repeat("Order", 0, 7, k) for k in ("k1", "k2")]
    replay = [repeats.repeat("Order", 0, 7, k) for k in ("k1", "k2", "k3")]
    assert first == [False, False] and replay == [True, True, False]
    assert repeats.repeat("Order", 0, 8, "k1") is False  # a newer version of a key seen
    assert repeats.repeat("Order", 0, 7, "k9") is True  # older than the newest: a repeat
    assert repeats.repeat("Customer", 0, 3, "k1") is False  # each view on its own
    assert repeats.repeat("Order", 1, 0, "k1") is False  # a rebuild's generation: fresh
    assert repeats.repeat("Order", 0, 9, "k1") is True  # the old generation is behind
    # Only the newest version's keys are kept, however many were seen before.
    for version in range(10, 1_000):
        for key in range(50):
            repeats.repeat("Order", 1, version, f"k{key}")
    assert {v: len(n.keys) for v, n in repeats._newest.items()} == {"Order": 50,
                                                                      "Customer": 1}


def test_the_fanout_notes_a_batch_delivering_many_messages_and_not_a_small_one():
    from gateway.subscriptions.fanout import FANOUT_NOTED

    settings = Settings()
    fanout = Fanout(CATALOG, settings, Reads(CATALOG, settings))
    fanout.serving = dict.fromkeys(CATALOG.views, 0)
    fanout.feed.received_ms = 1_000.0
    subs = [Subscriber(10, lambda _: None) for _ in range(FANOUT_NOTED)]
    fanout.index.add_key("Customer", "C1", subs[0])
    asyncio.run(fanout.dispatch([FeedEvent("Customer", 0, _event(None, _row("gold"), 1))]))
    assert fanout.stats.last_fanout is None  # one message: not a fan-out
    for sub in subs[1:]:
        fanout.index.add_key("Customer", "C1", sub)

    async def dispatched_and_written() -> None:
        await fanout.dispatch([FeedEvent("Customer", 1, _event(None, _row("silver"), 2))])
        assert "written_ms" not in fanout.stats.last_fanout  # the writes leave after it
        # The loop runs its callbacks in the order they were queued: once one queued now has
        # run, so has the note the dispatch queued behind its writes.
        loop = asyncio.get_running_loop()
        turn = loop.create_future()
        loop.call_soon(turn.set_result, None)
        await turn
    asyncio.run(dispatched_and_written())
    noted = fanout.stats.last_fanout
    assert noted is not None and noted["delivered"] == FANOUT_NOTED
    assert noted["received_ms"] == 1_000.0
    assert noted["dispatch_started_ms"] > noted["received_ms"] and noted["dispatch_ms"] >= 0
    assert noted["written_ms"] >= noted["dispatch_started_ms"] + noted["dispatch_ms"] - 1
    assert fanout.report()["lastFanout"] is noted


def _tiny_app() -> Starlette:
    @strawberry.type
    class Query:
        ok: bool = True

    @strawberry.type
    class Subscription:
        @strawberry.subscription
        async def echo(self, text: str) -> AsyncIterator[str]:
            yield text

        @strawberry.subscription
        async def token(self, info: strawberry.Info) -> AsyncIterator[str]:
            yield info.context.connection_params["token"]

    schema = strawberry.Schema(query=Query, subscription=Subscription)
    return Starlette(routes=[WebSocketRoute("/graphql", GraphQLWebSocket(schema, Settings()))])


def test_malformed_messages_get_each_protocols_answer():
    client = TestClient(_tiny_app())
    with client.websocket_connect("/graphql", subprotocols=["graphql-transport-ws"]) as ws:
        ws.send_json({"type": "connection_init"})
        assert ws.receive_json()["type"] == "connection_ack"
        ws.send_json([1, 2])  # JSON, but not a message
        assert ws.receive()["code"] == 4400
    with client.websocket_connect("/graphql", subprotocols=["graphql-ws"]) as ws:
        ws.send_json({"type": "connection_init"})
        assert ws.receive_json()["type"] == "connection_ack"
        assert ws.receive_json()["type"] == "ka"
        for bad in ({"type": "nonsense", "id": "7"}, {"type": "start", "id": "8"}, [1]):
            ws.send_json(bad)
            error = ws.receive_json()
            assert error["type"] == "error" and "message" in error["payload"], error
        ws.send_json({"type": "start", "id": "9",
                      "payload": {"query": 'subscription { echo(text: "still here") }'}})
        assert ws.receive_json()["payload"] == {"data": {"echo": "still here"}}


def test_the_connection_init_payload_reaches_resolvers():
    with TestClient(_tiny_app()).websocket_connect(
            "/graphql", subprotocols=["graphql-transport-ws"]) as ws:
        ws.send_json({"type": "connection_init", "payload": {"token": "secret"}})
        assert ws.receive_json()["type"] == "connection_ack"
        ws.send_json({"id": "1", "type": "subscribe",
                      "payload": {"query": "subscription { token }"}})
        assert ws.receive_json()["payload"] == {"data": {"token": "secret"}}


@pytest.mark.timeout(30)  # the failure this guards against is a hang
def test_the_fanout_stops_when_a_generation_read_turns_its_cancellation_into_an_error(
        monkeypatch):
    """A client library may catch the cancellation of a call in flight and raise an error of
    its own, which the generation watch logs and goes on from: stop() must end all the
    same (a gateway's shutdown once waited for it forever)."""
    import gateway.subscriptions.fanout as fanout_module

    monkeypatch.setattr(fanout_module, "GENERATION_CHECK_S", 0)
    settings = Settings()
    fanout = Fanout(CATALOG, settings, Reads(CATALOG, settings))

    async def scenario() -> None:
        reading = asyncio.Event()

        async def refresh(_view: str) -> None:
            reading.set()
            try:
                await asyncio.Event().wait()  # a read that never answers
            except asyncio.CancelledError:
                raise ConnectionError("connection closed by a cancelled command") from None

        fanout._refresh = refresh  # type: ignore[method-assign]
        fanout._watch = asyncio.get_running_loop().create_task(fanout._watch_generations())
        await asyncio.wait_for(reading.wait(), 5)
        await asyncio.wait_for(fanout.stop(), 5)
        assert fanout._watch.done()
    asyncio.run(scenario())
