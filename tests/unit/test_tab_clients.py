"""The browsers group's tabs (viewgate.bench.tab_clients): the held tabs' graphql-transport-ws
client on the `websockets` library's sans-I/O protocol, which cuts uncompressed text frames
itself, driven against the library's own server side with the gateway's permessage-deflate
(in memory, the bytes cut every way); held and churning tabs against a stand-in server over
TCP."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import orjson
import pytest
from websockets.asyncio.server import serve
from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.server import ServerProtocol

from viewgate.bench.tab_clients import (
    INIT,
    PROTOCOL,
    Tab,
    TabFailed,
    churn_tabs,
    classify,
    hold_tabs,
)
from viewgate.websocket_protocol import Deflate


def _next(op: str, data: dict[str, Any]) -> bytes:
    # As the gateway frames it (gateway.subscriptions.live_operations._frame).
    return b'{"id":"%s","type":"next","payload":%s}' % (op.encode(), orjson.dumps(
        {"data": data}))


def test_a_message_is_classified_and_errors_fail_the_tab() -> None:
    assert classify(_next("v", {"customer": {"row": {"name": "x"}}})) == ("next", "v")
    # Another shape of `next` is parsed: the same answer.
    assert classify(b'{"type":"next","id":"c","payload":{"data":{}}}') == ("next", "c")
    assert classify(b'{"type":"connection_ack"}') == ("connection_ack", None)
    assert classify(b'{"type":"pong"}') == ("pong", None)
    assert classify(b'{"id":"l","type":"complete"}') == ("complete", "l")
    with pytest.raises(TabFailed, match="boom"):
        classify(b'{"id":"v","type":"next","payload":{"data":null,'
                 b'"errors":[{"message":"boom"}]}}')
    with pytest.raises(TabFailed, match="bad query"):
        classify(b'{"id":"v","type":"error","payload":[{"message":"bad query"}]}')
    # A `next` in the gateway's shape is taken by its start: not parsed (the cost of a
    # message is the load generator's), so not checked as JSON; anything else is.
    assert classify(b'{"id":"v","type":"next","payload":') == ("next", "v")
    with pytest.raises(orjson.JSONDecodeError):
        classify(b'{"id":"v","type":"nex')


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def abort(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.closed = True


class _Recorder(Tab):
    def __init__(self, compression: str | None) -> None:
        self.ends: list[str | None] = []
        super().__init__("ws://127.0.0.1:1/graphql", compression,
                         lambda _tab, failure: self.ends.append(failure))
        self.messages: list[tuple[str, bytes]] = []
        self.acks = 0

    def on_ack(self) -> None:
        self.acks += 1

    def on_next(self, op: str, data: bytes) -> None:
        self.messages.append((op, data))


def _pair(compression: str | None) -> tuple[_Recorder, _Transport, ServerProtocol]:
    """A tab connected to the library's server side, handshake done."""
    tab, transport = _Recorder(compression), _Transport()
    server = ServerProtocol(extensions=[Deflate()], subprotocols=[PROTOCOL])  # type: ignore[list-item]
    tab.connection_made(transport)
    server.receive_data(b"".join(transport.written))
    transport.written.clear()
    [request] = server.events_received()
    assert isinstance(request, Request)
    assert ("permessage-deflate" in request.headers.get("Sec-WebSocket-Extensions", "")) \
        == (compression == "deflate")
    server.send_response(server.accept(request))
    tab.data_received(b"".join(server.data_to_send()))
    server.receive_data(b"".join(transport.written))  # the tab's connection_init
    transport.written.clear()
    [init] = server.events_received()
    assert init.data == INIT
    return tab, transport, server


@pytest.mark.parametrize("compression", ["deflate", None])
@pytest.mark.parametrize("cut", [0, 1, 3, 7, 50])
def test_the_tab_reads_every_frame_however_the_bytes_are_cut(compression, cut) -> None:
    tab, transport, server = _pair(compression)
    value = _next("v", {"customer": {"row": {"name": "fan-1"}}})  # small: uncompressed
    page = _next("l", {"orders": {"edges": [{"node": {"orderId": f"o{i:04d}"}}
                                            for i in range(40)]}})  # over 256: compressed
    long = _next("c", {"customerChanges": {"row": {"name": "x" * 70_000}}})  # 64-bit size
    server.send_text(b'{"type":"connection_ack"}')
    server.send_text(value)
    server.send_text(page)
    server.send_ping(b"keep-alive")
    server.send_text(page[:100], fin=False)  # a fragmented message, a ping inside it
    server.send_ping(b"inside")
    server.send_continuation(page[100:], fin=True)
    server.send_text(long)
    server.send_text(value)
    data = b"".join(server.data_to_send())
    pieces = [data] if cut == 0 else [data[i:i + cut] for i in range(0, len(data), cut)]
    for piece in pieces:
        tab.data_received(piece)
    assert tab.acks == 1
    assert tab.messages == [("v", value), ("l", page), ("l", page), ("c", long), ("v", value)]
    # The websocket pings were answered (by the library), in order.
    server.receive_data(b"".join(transport.written))
    pongs = [e for e in server.events_received() if isinstance(e, Frame)]
    assert [(f.opcode, f.data) for f in pongs] == [(Opcode.PONG, b"keep-alive"),
                                                    (Opcode.PONG, b"inside")]
    assert tab.ends == [] and not transport.closed


def test_an_error_a_bad_frame_or_the_servers_close_fail_the_tab() -> None:
    async def main() -> None:  # a close starts a timer on the running loop
        tab, transport, server = _pair("deflate")
        server.send_text(b'{"type":"connection_ack"}')
        server.send_text(b'{"id":"v","type":"next","payload":{"data":null,'
                         b'"errors":[{"message":"no such customer"}]}}')
        tab.data_received(b"".join(server.data_to_send()))
        assert transport.closed
        tab.connection_lost(None)
        assert tab.ends == ["subscription v: {'data': None, 'errors': "
                            "[{'message': 'no such customer'}]}"]

        tab, transport, server = _pair(None)
        tab.data_received(b"\x81\x03\xff\xfe\xfd")  # text that is not UTF-8
        assert transport.closed
        tab.connection_lost(None)
        assert tab.ends and "UnicodeDecodeError" in tab.ends[0]

        tab, transport, server = _pair(None)
        server.send_text(b'{"type":"connection_ack"}')
        server.send_close(1011, "going away")
        tab.data_received(b"".join(server.data_to_send()))
        server.receive_data(b"".join(transport.written))
        assert [e.opcode for e in server.events_received()] == [Opcode.CLOSE]  # answered
        tab.connection_lost(None)
        assert tab.ends and tab.ends[0].startswith("closed by the server") \
            and "going away" in tab.ends[0]
    asyncio.run(main())


def test_a_tab_closed_as_asked_is_no_failure() -> None:
    async def main() -> None:  # a close starts a timer on the running loop
        tab, transport, server = _pair("deflate")
        server.send_text(b'{"type":"connection_ack"}')
        tab.data_received(b"".join(server.data_to_send()))
        tab.close()
        server.receive_data(b"".join(transport.written))
        assert [e.opcode for e in server.events_received()] == [Opcode.CLOSE]
        tab.data_received(b"".join(server.data_to_send()))  # the server's answer
        tab.connection_lost(None)
        assert tab.ends == [None]
    asyncio.run(main())


class _StandIn:
    """A graphql-transport-ws server (the library's asyncio server, the gateway's
    permessage-deflate) in a thread: answers connection_init and pings, gives the live
    value and list their first messages (a `next` with errors for the list of a customer
    named "bad"), and sends every tab a live value and a change on `fanout`."""

    def __init__(self) -> None:
        self.port = 0
        self.tabs: set[Any] = set()
        self.closed: list[int | None] = []
        self.pongs = 0
        self.closes = threading.Condition()
        self.loop = asyncio.new_event_loop()
        self.up = threading.Event()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self.main(),),
                                       daemon=True)
        self.done: asyncio.Future[None] | None = None
        self.thread.start()
        assert self.up.wait(10)

    async def main(self) -> None:
        self.done = self.loop.create_future()
        async with serve(self.handler, "127.0.0.1", 0, subprotocols=[PROTOCOL],  # type: ignore[list-item]
                         extensions=[Deflate()], compression=None) as server:
            self.port = next(iter(server.sockets)).getsockname()[1]
            self.up.set()
            await self.done

    async def handler(self, ws: Any) -> None:
        try:
            async for raw in ws:
                message = orjson.loads(raw)
                kind, op = message["type"], message.get("id")
                if kind == "connection_init":
                    await ws.send('{"type":"connection_ack"}')
                elif kind == "ping":
                    await ws.send('{"type":"pong"}')
                    with self.closes:
                        self.pongs += 1
                        self.closes.notify_all()
                elif kind == "subscribe" and op == "v":
                    self.tabs.add(ws)
                    await ws.send(_next("v", {"customer": {"row": {"name": "first"}}}).decode())
                elif kind == "subscribe" and op == "l":
                    if message["payload"]["variables"]["id"] == "bad":
                        await ws.send('{"id":"l","type":"next","payload":{"data":null,'
                                      '"errors":[{"message":"bad"}]}}')
                    else:
                        await ws.send(_next("l", {"orders": {"edges": []}}).decode())
        finally:
            self.tabs.discard(ws)
            with self.closes:
                self.closed.append(ws.close_code)
                self.closes.notify_all()

    def fanout(self, marker: str) -> None:
        async def send() -> None:
            for ws in list(self.tabs):
                await ws.send(_next("v", {"customer": {"row": {"name": marker}}}).decode())
                await ws.send(_next("c", {"customerChanges": {"row": {"name": marker}}})
                              .decode())
        asyncio.run_coroutine_threadsafe(send(), self.loop).result(10)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.done.set_result, None)  # type: ignore[union-attr]
        self.thread.join(10)


def test_held_tabs_note_each_marker_and_count_failed_tabs() -> None:
    server = _StandIn()
    ready, stop = threading.Event(), threading.Event()
    reached = [threading.Event(), threading.Event()]
    out: dict[str, Any] = {}
    url = f"ws://127.0.0.1:{server.port}/graphql"
    worker = threading.Thread(target=lambda: out.update(hold_tabs(
        url, 12, "hot", ["a", "b", "bad"], ready, stop, ["m-1", "m-2"], reached, "deflate",
        0.05, 1000.0)))
    worker.start()
    try:
        assert ready.wait(30)
        server.fanout("m-1")
        assert reached[0].wait(30)
        assert not reached[1].is_set()
        server.fanout("m-2")
        assert reached[1].wait(30)
        with server.closes:  # the tabs' pings (every 0.05 s) answered, three a tab
            assert server.closes.wait_for(lambda: server.pongs >= 24, 30)
    finally:
        stop.set()
        worker.join(30)
        server.stop()
    assert out["tabs"] == 12 and out["failures"] == 4  # every third tab watches "bad"
    assert out["failed"][0] == "subscription l: {'data': None, 'errors': [{'message': 'bad'}]}"
    assert out["firsts"] == {"v": 12, "c": 8, "l": 8}
    for marker in ("m-1", "m-2"):
        assert len(out["arrivals"][marker]["v"]) == len(out["arrivals"][marker]["c"]) == 8
    assert out["pongs"] >= 8
    assert all(us is not None and us >= 0 for us in out["copy_cpu_us"].values())


def test_churned_tabs_subscribe_stay_and_close() -> None:
    server = _StandIn()
    try:
        out = churn_tabs(f"ws://127.0.0.1:{server.port}/graphql", 100, 0.1, "hot", ["a", "b"],
                         0.01, "deflate")
        with server.closes:
            assert server.closes.wait_for(lambda: len(server.closed) == 10, 10)
    finally:
        server.stop()
    assert out["started"] == out["completed"] == 10 and out["failures"] == 0
    assert len(out["first_ms"]) == len(out["open_ms"]) == 10
    assert out["served"][0] <= out["served"][1] and all(ms > 0 for ms in out["open_ms"])
    assert server.closed == [1000] * 10  # each closed its websocket as a browser tab does
