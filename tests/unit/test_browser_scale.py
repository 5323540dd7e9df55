"""What each of tens of thousands of idle subscriptions holds in the gateway: a Subscriber
without an Event or an empty deque, keys and share keys without orjson's output buffers,
one copy of a document's text however many tabs send it; and the browsers bench group's
registration."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import tracemalloc
from collections.abc import AsyncIterator

import orjson
import pytest
import strawberry

from gateway.reads.filters import Condition
from gateway.subscriptions.subscribers import Overflow, Subscriber, filter_key
from gateway.subscriptions.websocket import GraphQLWebSocket
from viewgate.bench.runner import select_groups


def _allocated_per(make, count: int = 2000) -> float:
    """Bytes still allocated per object made by `make()` (kept alive meanwhile)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [make() for _ in range(count)]
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(kept) == count
    return (after - before) / count


def test_an_idle_subscriber_holds_no_queue_and_no_event() -> None:
    async def main() -> float:
        def idle() -> Subscriber:
            sub = Subscriber(10, lambda _: None)
            sub.put("first")  # had a message, which was read
            assert sub.queue is not None
            return sub
        subs = [idle() for _ in range(10)]
        for sub in subs:
            assert await sub.get() == "first"
            assert sub.queue is None  # an empty deque would keep its 64-slot block
        return _allocated_per(lambda: Subscriber(10, lambda _: None))
    per = asyncio.run(main())
    # An asyncio.Event (with its waiters' deque) and a deque alone cost over 1 KiB.
    assert per < 300, per


async def _until_waiting(sub: Subscriber, reader: asyncio.Future, timeout_s: float = 5) -> None:
    """Let the event loop run `reader` until it waits on `sub`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while sub._waiter is None:
        assert loop.time() < deadline, "the reader never started waiting"
        await asyncio.wait({reader}, timeout=0)  # one turn of the loop


def test_subscriber_wakes_its_reader_and_keeps_order() -> None:
    async def main() -> None:
        sub = Subscriber(3, lambda _: None)
        reader = asyncio.ensure_future(sub.get())
        await _until_waiting(sub, reader)
        assert not reader.done()
        sub.put("a")
        sub.put("b")
        assert await reader == "a"
        assert await sub.get() == "b"
        assert sub.queue is None
    asyncio.run(main())


def test_subscriber_overflow_and_failure_after_its_messages() -> None:
    overflowed: list[Subscriber] = []

    async def main() -> None:
        sub = Subscriber(2, overflowed.append)
        sub.put(1)
        sub.put(2)
        sub.put(3)  # one more than the buffer
        assert overflowed == [sub]
        with pytest.raises(Overflow):
            await sub.get()
        failing = Subscriber(5, overflowed.append)
        failing.put("last")
        failing.fail(RuntimeError("rebuilt"))
        assert await failing.get() == "last"
        with pytest.raises(RuntimeError, match="rebuilt"):
            await failing.get()
        waiting = Subscriber(5, overflowed.append)
        reader = asyncio.ensure_future(waiting.get())
        await _until_waiting(waiting, reader)
        waiting.fail(RuntimeError("gone"))
        with pytest.raises(RuntimeError, match="gone"):
            await reader
    asyncio.run(main())


def test_keys_are_compact_strings() -> None:
    a = [Condition("tier", "eq", "gold"), Condition("country", "in", ["DE", "FR"])]
    b = [Condition("country", "in", ["FR", "DE"]), Condition("tier", "eq", "gold")]
    assert filter_key(a) == filter_key(b)
    assert isinstance(filter_key(a), str)
    # orjson's bytes keep a 4 KiB buffer; every subscriber's unregistering closure holds
    # its key, so the key must not be one.
    per = _allocated_per(lambda: filter_key(a), 500)
    assert per < 512, per
    assert _allocated_per(lambda: orjson.dumps({"id": "C00001"}), 500) > 2048  # why


def test_tabs_sending_one_document_share_its_text() -> None:
    decode = GraphQLWebSocket.decode_json.__get__(object.__new__(GraphQLWebSocket))
    query = "subscription V($id: String!) { customer(customerId: $id) { op version } }"
    raw = orjson.dumps({"id": "1", "type": "subscribe",
                        "payload": {"query": query, "variables": {"id": "C1"}}})
    first, second = decode(raw), decode(raw)
    assert first["payload"]["query"] == query
    assert first["payload"]["query"] is second["payload"]["query"]
    assert decode(b"not json") is not None and decode(b"[1]") == [1]


def test_the_browsers_group_runs_when_named() -> None:
    assert [g.name for g in select_groups(["browsers"])] == ["browsers"]
    assert "browsers" not in [g.name for g in select_groups(None)]
    keys = {f.key for f in select_groups(["browsers"])[0].figures}
    assert {"ws_connections_open", "ws_subscriptions_open", "ws_fanout_10k_connections_s",
            "ws_rss_kb_per_subscription", "ws_churn_per_s", "ws_idle_cpu_share",
            "ws_generator_cpu"} <= keys


class _ClosingSocket:
    """A websocket whose send fails as uvicorn's sans-I/O implementation does once the
    closing handshake has begun."""

    async def send_json(self, message: object) -> None:
        raise RuntimeError("Unexpected ASGI message 'websocket.send', after sending "
                           "'websocket.close'.")


def test_a_send_racing_a_closing_tab_is_a_disconnect_not_an_error(caplog) -> None:
    from datetime import timedelta

    from strawberry.http.exceptions import WebSocketDisconnected

    from gateway.subscriptions.websocket import TransportWSHandler

    handler = TransportWSHandler(None, _ClosingSocket(), None, None, None,
                                 timedelta(seconds=1))

    async def main() -> None:
        with pytest.raises(WebSocketDisconnected):
            await handler.send_message({"id": "1", "type": "next", "payload": {}})
        await handler.handle_task_exception(WebSocketDisconnected())  # not logged
        await handler.handle_task_exception(ValueError("a bug"))  # logged
    with caplog.at_level("ERROR", logger="strawberry.ws.task"):
        asyncio.run(main())
    assert [r.exc_info[1].__class__ for r in caplog.records] == [ValueError]


# --- subscriptions served without a task each (gateway.subscriptions.live_operations) ---


def test_an_attached_subscriber_hands_items_over_in_order_then_its_failure() -> None:
    got: list = []

    class Sink:
        def push(self, item: object) -> None:
            got.append(item)

        def fail(self, error: BaseException) -> None:
            got.append(error)

    sub = Subscriber(5, lambda _: None)
    sub.put("waiting 1")
    sub.put("waiting 2")
    sub.attach(Sink())
    assert sub.queue is None  # nothing kept once attached
    sub.put("live")
    error = RuntimeError("rebuilt")
    sub.fail(error)
    sub.put("after the end")
    assert got == ["waiting 1", "waiting 2", "live", error]
    failed_before = Subscriber(5, lambda _: None)
    failed_before.put("last")
    failed_before.fail(error)
    got.clear()
    failed_before.attach(Sink())
    assert got == ["last", error]


def test_unregistered_subscribers_are_freed_without_the_cycle_collector() -> None:
    """Closed tabs must not wait for a full collection (a second at 10,000 tabs): once
    unregistered, nothing but its holder refers to a subscriber (no cycle through the
    closure that unregisters it)."""
    import sys

    from gateway.subscriptions.live_lists import LiveList
    from gateway.subscriptions.subscribers import SubscriberIndex

    async def main() -> list[tuple[int, int]]:
        index = SubscriberIndex({"Customer": {}})
        live = LiveList([], _page, 0.0, lambda: None, lambda _: None)
        counts = []
        for register in (lambda s: index.add_key("Customer", "C1", s),
                         lambda s: index.add_filter("Customer", [], s), live.add):
            sub = Subscriber(5, lambda _: None)
            alone = sys.getrefcount(sub)
            if asyncio.iscoroutine(outcome := register(sub)):
                await outcome
            registered = sys.getrefcount(sub)
            sub.unregister()
            counts.append((registered > alone, sys.getrefcount(sub) == alone))
        return counts

    assert asyncio.run(main()) == [(True, True)] * 3


async def _page() -> tuple[object, object]:
    return "page", "page"


@strawberry.type
class Tick:
    name: str


def _ticks_schema(start):
    """A Query with `ping` and a Subscription `ticks(key)` whose source `start(key)` makes."""

    @strawberry.type
    class Query:
        @strawberry.field
        def ping(self) -> str:
            return "pong"

    @strawberry.type
    class Subscription:
        @strawberry.subscription
        async def ticks(self, key: str) -> AsyncIterator[Tick]:  # type: ignore[misc]
            return start(key)
    return {"query": Query, "subscription": Subscription}


def _failing_source():
    from gateway.subscriptions.sources import LiveSource

    class Failing(LiveSource):
        def message(self, item: object) -> object:
            raise ValueError("a bug in this source")
    return Failing


def _replaying_source():
    """A source whose opening replays five times its subscriber's buffer."""
    from gateway.subscriptions.shared_results import shared
    from gateway.subscriptions.sources import LiveSource

    class Replaying(LiveSource):
        async def opening(self):
            for i in range(5 * self.subscriber.limit):
                yield shared(Tick(name=f"replayed {i}"))
    return Replaying


def _live_app():
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute

    from gateway.subscriptions.shared_results import SharedResultsExecutor, shared
    from gateway.subscriptions.sources import LiveSource
    from schema.settings import Settings

    subscribers: list[Subscriber] = []
    Failing = _failing_source()
    Replaying = _replaying_source()

    def ticks(key: str) -> LiveSource:
        sub = Subscriber(10, lambda _: None)
        subscribers.append(sub)
        sub.unregister = lambda: subscribers.remove(sub)
        return {"boom": Failing, "replay": Replaying}.get(key, LiveSource)(sub)

    schema = strawberry.Schema(**_ticks_schema(ticks),
                               execution_context_class=SharedResultsExecutor)
    view = GraphQLWebSocket(schema, Settings())
    app = Starlette(routes=[WebSocketRoute("/graphql", view)])

    def tick(name: str) -> None:
        message = shared(Tick(name=name))
        for sub in list(subscribers):
            sub.put(message)
    return app, view, subscribers, tick


TICKS = "subscription($k: String!) { ticks(key: $k) { name } }"


@contextlib.contextmanager
def _tab(app, subscriptions: tuple[tuple[str, str], ...] = ()):
    """A graphql-transport-ws connection to `app`, acknowledged, with `subscriptions`
    ((id, key), ...) started: a ping sent after them is answered once they have."""
    from starlette.testclient import TestClient

    with TestClient(app).websocket_connect("/graphql",
                                           subprotocols=["graphql-transport-ws"]) as ws:
        ws.send_json({"type": "connection_init"})
        assert ws.receive_json()["type"] == "connection_ack"
        for op, key in subscriptions:
            ws.send_json({"id": op, "type": "subscribe",
                          "payload": {"query": TICKS, "variables": {"k": key}}})
        if subscriptions:
            ws.send_json({"type": "ping"})
            assert ws.receive_json() == {"type": "pong"}
        yield ws


def test_live_operations_share_a_plan_and_end_with_complete_or_the_connection() -> None:
    app, view, subscribers, tick = _live_app()
    with _tab(app, (("a", "1"), ("b", "2"))) as ws:
        assert len(subscribers) == 2
        assert len(view.plans) == 1  # other root arguments, one execution
        ws.portal.call(_in_loop, tick, "first")
        got = [ws.receive_json(), ws.receive_json()]
        assert sorted(m["id"] for m in got) == ["a", "b"]
        assert all(m == {"id": m["id"], "type": "next", "payload": {"data": {
            "ticks": {"name": "first"}}}} for m in got)
        ws.send_json({"id": "a", "type": "complete"})
        ws.send_json({"type": "ping"})
        assert ws.receive_json() == {"type": "pong"}
        assert len(subscribers) == 1
        ws.portal.call(_in_loop, tick, "second")
        assert ws.receive_json()["id"] == "b"
    assert subscribers == [] and len(view.plans) == 0


async def _in_loop(fn, *args) -> None:
    fn(*args)


# --- the websocket protocol the gateway runs (viewgate.websocket_protocol) ------------------


def test_small_messages_go_uncompressed_and_large_ones_compressed() -> None:
    import zlib

    from websockets.frames import Frame, Opcode

    from viewgate.websocket_protocol import COMPRESS_MIN_BYTES, Deflate

    params, extension = Deflate().process_request_params(
        [("client_max_window_bits", None)], [])
    assert ("server_no_context_takeover", None) in params
    assert ("client_no_context_takeover", None) in params
    small = Frame(Opcode.TEXT, b'{"type":"pong"}')
    assert extension.encode(small) is small  # no RSV1: sent as it is
    large_data = orjson.dumps({"rows": [{"order": i, "status": "placed"} for i in range(40)]})
    assert len(large_data) >= COMPRESS_MIN_BYTES
    large = extension.encode(Frame(Opcode.TEXT, large_data))
    assert large.rsv1 and len(large.data) < len(large_data)
    # No context taken over: each message decompresses on its own.
    assert zlib.decompressobj(wbits=-12).decompress(bytes(large.data) + b"\x00\x00\xff\xff") \
        == large_data
    assert not hasattr(extension, "encoder")  # no compressor kept between messages


def test_the_inbox_hands_messages_over_in_order_and_keeps_nothing_idle() -> None:
    from viewgate.websocket_protocol import Inbox

    async def main() -> list:
        inbox = Inbox()
        reader = asyncio.ensure_future(inbox.get())
        deadline = asyncio.get_running_loop().time() + 5
        while inbox._waiter is None:  # the reader waits (a turn of the loop at most)
            assert asyncio.get_running_loop().time() < deadline, "the reader never waited"
            await asyncio.wait({reader}, timeout=0)
        inbox.put_nowait(1)
        inbox.put_nowait(2)
        got = [await reader, await inbox.get()]
        assert inbox.empty() and inbox._items is None and inbox._waiter is None
        return got
    assert asyncio.run(main()) == [1, 2]


def test_websockets_on_graphql_skip_starlettes_layers() -> None:
    from gateway.http.websocket_entry import WebSocketEntry

    calls: list[str] = []

    def app(name: str):
        async def run(scope, receive, send) -> None:
            calls.append(name)
        return run

    entry = WebSocketEntry(app("starlette"), websocket_app=app("graphql websockets"))

    async def main() -> None:
        for scope in ({"type": "websocket", "path": "/graphql"},
                      {"type": "websocket", "path": "/elsewhere"},
                      {"type": "http", "path": "/graphql"}):
            await entry(scope, None, None)
    asyncio.run(main())
    assert calls == ["graphql websockets", "starlette", "starlette"]


def test_a_query_over_the_websocket_runs_as_strawberry_runs_it() -> None:
    app, view, subscribers, _ = _live_app()
    with _tab(app) as ws:
        ws.send_json({"id": "q", "type": "subscribe", "payload": {"query": "{ ping }"}})
        assert ws.receive_json() == {"id": "q", "type": "next",
                                     "payload": {"data": {"ping": "pong"}}}
        assert ws.receive_json() == {"id": "q", "type": "complete"}
        ws.send_json({"id": "bad", "type": "subscribe",
                      "payload": {"query": "subscription { ticks(key: 1) { nope } }"}})
        error = ws.receive_json()
        assert (error["id"], error["type"]) == ("bad", "error"), error
    assert subscribers == [] and len(view.plans) == 0


def test_a_source_that_fails_ends_its_subscription_not_the_others() -> None:
    app, view, subscribers, tick = _live_app()
    with _tab(app, (("boom", "boom"), ("fine", "1"))) as ws:
        ws.portal.call(_in_loop, tick, "first")
        got = [ws.receive_json() for _ in range(3)]
        ended = [m for m in got if m["id"] == "boom"]
        assert [m["type"] for m in ended] == ["next", "complete"]
        assert "a bug in this source" in ended[0]["payload"]["errors"][0]["message"]
        assert [m["payload"] for m in got if m["id"] == "fine"] == [
            {"data": {"ticks": {"name": "first"}}}]
        assert len(subscribers) == 1


@pytest.mark.timeout(30)  # without the wait, the overflowed client would wait forever
def test_an_opening_longer_than_the_buffer_goes_at_the_clients_pace() -> None:
    """A resumed subscription may replay more changes than its buffer holds: it waits for
    the client to read them, rather than closing a client that reads promptly."""
    app, view, subscribers, tick = _live_app()
    with _tab(app) as ws:
        ws.send_json({"id": "r", "type": "subscribe",
                      "payload": {"query": TICKS, "variables": {"k": "replay"}}})
        names = [ws.receive_json()["payload"]["data"]["ticks"]["name"] for _ in range(50)]
        assert names == [f"replayed {i}" for i in range(50)]
        ws.portal.call(_in_loop, tick, "live")
        assert ws.receive_json() == {"id": "r", "type": "next",
                                     "payload": {"data": {"ticks": {"name": "live"}}}}
    assert subscribers == []


# --- frames written without a task (the server's SEND_NOW) ---------------------------------


def _offering_send_now(app, written: list[str], accept: list[bool]):
    """`app` behind a server that offers SEND_NOW: it records each text it is given and
    takes it (True) while `accept[0]` is true; otherwise answers False (take `send`)."""
    from gateway.subscriptions.live_operations import SEND_NOW

    def send_now(text: str) -> bool:
        if accept[0]:
            written.append(text)
            return True
        return False

    async def offering(scope, receive, send) -> None:
        if scope["type"] == "websocket":
            scope.setdefault("extensions", {})[SEND_NOW] = send_now
        await app(scope, receive, send)
    return offering


def test_live_frames_and_pongs_are_written_at_once_when_the_server_offers_it() -> None:
    app, view, subscribers, tick = _live_app()
    written: list[str] = []
    accept = [False]
    with _tab(_offering_send_now(app, written, accept), (("a", "1"), ("b", "2"))) as ws:
        accept[0] = True
        waiting: list[object] = []

        def tick_and_look(name: str) -> None:
            tick(name)  # every push of this change happens here, in one turn
            waiting.extend((s.sink.handler._outbox, s.sink.handler._writer)
                           for s in subscribers)
        ws.portal.call(_in_loop, tick_and_look, "now")
        # Written in the push itself, in order: no outbox, no writer task.
        assert [orjson.loads(t)["id"] for t in written] == ["a", "b"]
        assert waiting == [(None, None), (None, None)]
        assert orjson.loads(written[0])["payload"] == {"data": {"ticks": {"name": "now"}}}
        accept[0] = False  # the connection is not writable now: the outbox and its writer
        ws.portal.call(_in_loop, tick, "later")
        got = [ws.receive_json(), ws.receive_json()]
        assert [m["id"] for m in got] == ["a", "b"]
        assert all(m["payload"]["data"]["ticks"]["name"] == "later" for m in got)
        assert len(written) == 2
        accept[0] = True
        ws.send_json({"type": "ping"})
        deadline = 50_000
        while len(written) < 3 and deadline:  # the pong, written by the handler's task
            ws.portal.call(asyncio.sleep, 0)
            deadline -= 1
        assert orjson.loads(written[2]) == {"type": "pong"}
        accept[0] = False


def test_the_protocol_writes_a_frame_now_only_while_the_connection_is_open() -> None:
    from fake_transport import Transport
    from uvicorn.config import Config
    from uvicorn.server import ServerState
    from websockets.client import ClientProtocol
    from websockets.frames import Opcode
    from websockets.uri import parse_uri

    from gateway.subscriptions.live_operations import SEND_NOW
    from viewgate.websocket_protocol import GatewayWebSocketProtocol

    async def main() -> None:
        accepted = asyncio.Event()

        async def app(scope, receive, send) -> None:
            assert (await receive())["type"] == "websocket.connect"
            await send({"type": "websocket.accept"})
            accepted.set()
            while (await receive())["type"] != "websocket.disconnect":
                pass

        config = Config(app=app, ws_per_message_deflate=False, lifespan="off")
        config.load()
        protocol = GatewayWebSocketProtocol(config, ServerState(), {})
        transport = Transport()
        protocol.connection_made(transport)  # type: ignore[arg-type]
        client = ClientProtocol(parse_uri("ws://127.0.0.1:8000/graphql"))
        client.send_request(client.connect())
        protocol.data_received(b"".join(client.data_to_send()))
        send_now = protocol.scope["extensions"][SEND_NOW]
        assert send_now("too early") is False  # the handshake is not answered yet
        await asyncio.wait_for(accepted.wait(), 5)
        client.receive_data(transport.take())  # the handshake's answer
        client.events_received()
        transport.written.clear()
        assert send_now('{"type":"pong"}') is True
        # Written at the end of this turn of the loop (coalesced).
        await asyncio.wait_for(transport.written.wait(), 5)
        client.receive_data(transport.take())
        frames = client.events_received()
        assert [(f.opcode, bytes(f.data)) for f in frames] == [(Opcode.TEXT, b'{"type":"pong"}')]
        protocol.connection_lost(None)
        assert SEND_NOW not in protocol.scope["extensions"]  # no cycle left through it
        assert send_now("too late") is False
        assert transport.take() == b""
    asyncio.run(main())


def test_the_idle_window_waits_for_a_quiet_change_feed(monkeypatch) -> None:
    from viewgate.bench import browsers

    class Feed:
        """A gateway whose feed reader sees three more events, then none."""

        def __init__(self) -> None:
            self.asked = 0

        def stats(self) -> dict:
            self.asked += 1
            return {"positions": {"Customer": min(self.asked, 4), "Order": 10}}

    monkeypatch.setattr(browsers, "QUIET_S", 0.05)
    monkeypatch.setattr(browsers.time, "sleep", lambda s: None)
    feed = Feed()
    browsers._wait_quiet(feed)  # type: ignore[arg-type]
    assert feed.asked >= 5  # asked past the last new event
    assert browsers._feed_events(feed) == 14  # type: ignore[arg-type]


def test_the_churn_offers_more_than_its_goal() -> None:
    from viewgate.bench import browsers

    churn = next(f for f in browsers.FIGURES if f.key == "ws_churn_per_s")
    assert browsers.CHURN_RATE > browsers.CHURN_GOAL == churn.at_least


def test_the_first_copy_is_split_at_the_gateways_note_of_its_fanout() -> None:
    from viewgate.bench.browsers import _gateway_split

    noted = {"received_ms": 10_100.0, "dispatch_started_ms": 10_150.0, "dispatch_ms": 300.0,
             "delivered": 20_000}
    split = _gateway_split(noted, 10_000.0, 10_500.0, 11_000.0)
    assert split == {"feed_to_reader": 0.1, "reader_to_dispatch": 0.05, "dispatch": 0.3,
                     "dispatch_to_first_copy": 0.05, "messages": 20_000}
    # Once the gateway noted when its frames were written: the writes, then the tabs.
    written = _gateway_split({**noted, "written_ms": 10_600.0}, 10_000.0, 10_500.0, 11_000.0)
    assert written == {**split, "dispatch_to_written": 0.15, "written_to_last_copy": 0.4}
    assert _gateway_split(None, 10_000.0, 10_500.0, 11_000.0) is None
    assert _gateway_split(noted, None, 10_500.0, 11_000.0) is None


def test_the_schedule_says_how_long_a_process_ran_and_waited_for_a_cpu() -> None:
    import os

    from viewgate.bench.browsers import _schedule_over, _scheduled

    before = _scheduled(os.getpid())
    sum(range(2_000_000))  # some CPU of this process's own
    after = _scheduled(os.getpid())
    assert after[0] > before[0] and after[1] >= before[1] >= 0
    schedule = _schedule_over({"bench": [os.getpid()]}, {"bench": [before]}, 2.0)
    assert set(schedule) == {"bench"} and set(schedule["bench"]) == {"ran", "waited"}
    assert schedule["bench"]["ran"] >= round((after[0] - before[0]) / 2.0, 3)


def test_closed_websockets_leave_nothing_to_the_cycle_collector() -> None:
    """Tabs opened through uvicorn as the gateway serves them (its HTTP and websocket
    protocols, viewgate.serving), subscribed and closed, are freed by reference counting:
    the gateway's collector rarely runs a full pass (gateway.app.GC_THRESHOLDS), and every
    cycle a closed tab leaves stays until one does (uvicorn's HTTP protocol that upgraded
    the connection did: its transport, socket and flow control with it)."""
    import uvicorn
    from websockets.asyncio.client import connect

    from gateway.subscriptions.sources import LiveSource
    from gateway.subscriptions.subscribers import SubscriberIndex
    from schema.settings import Settings
    from viewgate.serving import uvicorn_options
    from viewgate.stack.process import eventually

    index = SubscriberIndex({"Customer": {}})

    def ticks(key: str) -> LiveSource:
        sub = Subscriber(10, lambda _: None)
        index.add_key("Customer", key, sub)
        return LiveSource(sub)

    from strawberry.extensions import ParserCache, ValidationCache

    from gateway.subscriptions.shared_results import SharedResultsExecutor
    schema = strawberry.Schema(**_ticks_schema(ticks),  # as the gateway's
                               extensions=[ParserCache, ValidationCache],
                               execution_context_class=SharedResultsExecutor)
    view = GraphQLWebSocket(schema, Settings())
    options = uvicorn_options(Settings())

    async def until(done, what: str) -> None:
        async def holds() -> bool | None:
            return True if done() else None
        await eventually(holds, timeout_s=10, what=what, interval_s=0.01)

    async def tab(port: int, key: str) -> None:
        async with connect(f"ws://127.0.0.1:{port}/graphql", compression="deflate",
                           subprotocols=["graphql-transport-ws"]) as ws:  # type: ignore[list-item]
            await ws.send('{"type":"connection_init"}')
            assert orjson.loads(await ws.recv())["type"] == "connection_ack"
            for op in ("a", "b", "c"):
                await ws.send(orjson.dumps({"id": op, "type": "subscribe", "payload": {
                    "query": TICKS, "variables": {"k": key}}}).decode())
            await ws.send('{"type":"ping"}')  # answered once the subscriptions started
            assert orjson.loads(await ws.recv())["type"] == "pong"

    def ours(kind: type) -> bool:
        module = kind.__module__.split(".")[0]
        return module in ("uvicorn", "httptools", "viewgate", "gateway", "strawberry") \
            or "Transport" in kind.__name__ or kind.__name__ == "ServerProtocol"

    async def main() -> list[str]:
        config = uvicorn.Config(view, port=0, http=options["http"], ws=options["ws"],
                                lifespan="off", log_level="warning")
        server = uvicorn.Server(config)
        serving = asyncio.create_task(server.serve())
        await until(lambda: server.started, "uvicorn started")
        port = server.servers[0].sockets[0].getsockname()[1]
        await tab(port, "warm-up")  # what a first connection builds once (caches)
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            await asyncio.gather(*(tab(port, f"C{i}") for i in range(20)))
            await until(lambda: view.open_connections == 0 and not server.server_state.connections
                        and not index.views["Customer"].by_key, "the tabs closed")
            gc.collect()
            left = sorted({type(o).__qualname__ for o in gc.garbage if ours(type(o))})
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
            server.should_exit = True
            await serving
        return left

    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:  # as the gateway runs
        assert runner.run(main()) == []


def test_a_lost_websocket_protocol_is_freed_without_the_cycle_collector() -> None:
    """The `websockets` protocol of a tab gone (and the one uvicorn builds and the gateway
    replaces) is freed by reference counting: its parser generator refers back to it."""
    import weakref

    from fake_transport import Transport
    from uvicorn.config import Config
    from uvicorn.server import ServerState
    from websockets.server import ServerProtocol

    from viewgate.websocket_protocol import GatewayWebSocketProtocol

    built: list[weakref.ref] = []
    original = ServerProtocol.__init__

    def recording(self, *args, **kwargs) -> None:
        original(self, *args, **kwargs)
        built.append(weakref.ref(self))

    async def app(scope, receive, send) -> None:  # pragma: no cover - never connected
        await receive()

    async def main() -> list[bool]:
        config = Config(app=app, interface="asgi3", ws_per_message_deflate=True,
                        lifespan="off")
        config.load()
        protocol = GatewayWebSocketProtocol(config, ServerState(), {})
        protocol.connection_made(Transport())  # type: ignore[arg-type]
        protocol.connection_lost(None)
        del protocol
        return [ref() is None for ref in built]

    gc.collect()
    gc.disable()
    ServerProtocol.__init__ = recording  # type: ignore[method-assign]
    try:
        freed = asyncio.run(main())
    finally:
        ServerProtocol.__init__ = original  # type: ignore[method-assign]
        gc.enable()
    assert freed == [True, True]
