"""uvicorn's sans-I/O websocket implementation (`websockets-sansio`) as the gateway runs it:
permessage-deflate without context takeover, and only for messages worth compressing;
keep-alive pings only for connections that were silent for a whole interval; the frames
written in one turn of the event loop sent in one system call; and lighter per connection
(tens of thousands are held at once, idle most of the time).

With context takeover (uvicorn's choice, 12-bit windows) each connection keeps a zlib
compressor and decompressor for its whole life: about 14 KiB of resident memory per
subscription at three subscriptions a tab, more than the rest of the connection and its
subscriptions together (docs/benchmarks.md, "Browser scale"). Without it, the gateway
compresses each message on its own and keeps nothing between messages, in both
directions: it asks browsers not to take their context over either
(`client_no_context_takeover`, which RFC 7692 lets a server require). A fresh compressor
costs about 5 microseconds a message and gains nothing on a small one (a live value's
change: 141 bytes to 125), so messages under `COMPRESS_MIN_BYTES` go uncompressed, as the
extension allows per message; a page of a live list (400 bytes to 144) is compressed.

uvicorn pings every connection every `ws_ping_interval` seconds to find the dead ones. A
browser running graphql-ws with its keep-alive sends a `ping` message of its own as often:
it is alive, and pinging it too doubles the messages idle tabs cost. A connection that
sent anything within the last interval and a half is not pinged (the half: a client pinging
as often as the server would otherwise always be a little late); the check comes again
when that has passed. A silent one is pinged, and closed if it does not answer within
`ws_ping_timeout`, as uvicorn does.

uvicorn writes each frame to the socket at once. When a change reaches a tab's live value
and its change stream, that was two writes, each a trip through the TCP stack: most of a
fan-out's CPU (measured with py-spy: 60% in the write). The connection's writes of one turn
of the loop now go out together, at its end.

Sending through ASGI is a chain of coroutines per frame (Strawberry's adapter, Starlette's
websocket, uvicorn's `send`), and the gateway ran a task per connection to drive it: for one
change to 10,000 tabs, 10,000 tasks created, stepped and ended. None of it waits on
anything while the connection is writable, so the protocol also offers the application a
plain function in the ASGI scope's extensions (`SEND_NOW`, an ASGI extension as the spec
allows): it writes a text frame at once and says so, or answers False when the frame must
take the ASGI `send` (the handshake not complete, the connection closing or closed, the
transport's buffer full: that path waits for room and reports the disconnect).

A browser tab's graphql-transport-ws keep-alive is a `ping` message every so often (20 s in
the browsers bench), and answering it through the application cost about 200 microseconds
of the gateway's CPU: the frame queued for the application, its task woken, Strawberry's
receive chain and handler, the pong sent back. Ten thousand idle tabs are 500 a second,
about a tenth of a core. So the protocol answers them itself once the application asks it
to (`KEEP_ALIVE_BUDGET` in the ASGI scope's extensions, gateway.subscriptions.message_rate):
the graphql-transport-ws handler does, once it has acknowledged the connection, and hands
over its connection's message budget. From then on a whole text frame under
`KEEP_ALIVE_MAX_BYTES` that is a `ping` is answered here with a `pong` (with the ping's
payload, as graphql-ws's own server answers), and a `pong` (the server sends no pings of
its own: nothing waits for one, Strawberry's handler drops it) is dropped here; each spends
one message of the budget, as through the handler. Anything else goes to the application,
as does any doubt: a frame that does not parse or has other fields, messages waiting for the
application before it (their order is kept), a connection not open for writing now, and the
message the budget refuses (the handler then closes the connection with 4029, and counts
it). Before the acknowledgement, and on the legacy `graphql-ws` protocol, nothing is
answered here. The pong may go out before answers to earlier messages the application is
still working on, as graphql-ws's server's does: the protocol asks for a pong "as soon as
possible", not in order. The client's frame still counts as a sign of life
(`received_at`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

import orjson
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import InvalidState
from websockets.extensions.permessage_deflate import (
    PerMessageDeflate,
    ServerPerMessageDeflateFactory,
)
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.server import ServerProtocol

from gateway.subscriptions.live_operations import SEND_NOW
from gateway.subscriptions.message_rate import KEEP_ALIVE_BUDGET

WINDOW_BITS = 12  # as uvicorn's
COMPRESS_SETTINGS = {"memLevel": 5}  # as uvicorn's
COMPRESS_MIN_BYTES = 256
KEEP_ALIVE_MAX_BYTES = 256  # a longer frame is not parsed here: the application reads it
PONG = b'{"type":"pong"}'
KEEP_ALIVE_FIELDS = frozenset(("type", "payload"))


class SmallUncompressed(PerMessageDeflate):
    """permessage-deflate that sends a message under COMPRESS_MIN_BYTES as it is."""

    def encode(self, frame: Frame) -> Frame:
        if frame.fin and frame.opcode in (Opcode.TEXT, Opcode.BINARY) \
                and len(frame.data) < COMPRESS_MIN_BYTES:
            return frame
        return super().encode(frame)


class Deflate(ServerPerMessageDeflateFactory):
    def __init__(self) -> None:
        super().__init__(server_no_context_takeover=True, client_no_context_takeover=True,
                         server_max_window_bits=WINDOW_BITS,
                         client_max_window_bits=WINDOW_BITS,
                         compress_settings=COMPRESS_SETTINGS)

    def process_request_params(self, *args: Any, **kwargs: Any) -> Any:
        params, agreed = super().process_request_params(*args, **kwargs)
        return params, SmallUncompressed(
            agreed.remote_no_context_takeover, agreed.local_no_context_takeover,
            agreed.remote_max_window_bits, agreed.local_max_window_bits,
            agreed.compress_settings)


class Inbox:
    """The received messages waiting for the application: what uvicorn uses of an
    asyncio.Queue (`put_nowait`, `get`, `empty`; one reader). An asyncio.Queue holds four
    deques for its whole life (about 2.5 KiB a connection); this holds one only while
    messages wait, and one future while its reader waits."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[Any] | None = None
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: Any) -> None:
        if self._items is None:
            self._items = deque()
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def empty(self) -> bool:
        return not self._items

    async def get(self) -> Any:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        assert self._items is not None
        item = self._items.popleft()
        if not self._items:
            self._items = None
        return item


class CoalescedWrites:
    """A connection's transport whose writes of one turn of the event loop are sent in one
    system call, at its end. What else uvicorn uses of the transport is passed through;
    closing sends what waits first."""

    __slots__ = ("_loop", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] | None = None

    def write(self, data: bytes) -> None:
        if self._pending is None:
            self._pending = [data]
            self._loop.call_soon(self._flush)
        else:
            self._pending.append(data)

    def _flush(self) -> None:
        pending, self._pending = self._pending, None
        if pending and not self._transport.is_closing():
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)


def _free(conn: ServerProtocol) -> None:
    """Let reference counting free a `websockets` protocol that reads no more: its parser
    is a generator of its own whose frame refers back to it, a cycle even once closed
    (uvicorn never feeds it the end of the stream). Thousands of closed tabs' protocols
    (each with its reader, extensions and buffers) otherwise waited for a full collection,
    which the gateway runs rarely (gateway.app.GC_THRESHOLDS)."""
    conn.parser.close()


class GatewayWebSocketProtocol(WebSocketsSansIOProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue = Inbox()  # type: ignore[assignment]
        if self.config.ws_per_message_deflate:
            _free(self.conn)  # uvicorn's, replaced by one with the gateway's deflate
            self.conn = ServerProtocol(extensions=[Deflate()], max_size=self.config.ws_max_size,
                                       logger=self.conn.logger)

    received_at = 0.0  # loop time of the last data from the client
    # The connection's message budget (KEEP_ALIVE_BUDGET): set, graphql-transport-ws pings
    # and pongs are answered here.
    keep_alive_take: Callable[[], bool] | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self.transport = CoalescedWrites(transport, self.loop)  # type: ignore[assignment]

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)  # None: the handshake was refused
        if scope is not None:
            scope["extensions"][SEND_NOW] = self.send_now
            scope["extensions"][KEEP_ALIVE_BUDGET] = self.answer_keep_alive

    def writable_now(self) -> bool:
        """Whether a frame may be written at once: the handshake answered, no close sent
        or received, the client there, the transport not asking writers to wait."""
        return self.handshake_complete and not self.close_sent and not self.disconnected \
            and self.initial_response is None and self.writable.is_set() \
            and not self.transport.is_closing() and self.conn.state is State.OPEN

    def send_now(self, text: str) -> bool:
        """Write a text frame now (with the other writes of this turn of the loop): True.
        False when it must go through the ASGI `send` instead: before the handshake's
        answer, once a close was sent or the client is gone, or while the transport asks
        writers to wait."""
        if not self.writable_now():
            return False
        try:
            self.conn.send_text(text.encode())
        except InvalidState:  # the client's close arrived: ASGI's send reports it
            return False
        self.transport.write(b"".join(self.conn.data_to_send()))
        return True

    def answer_keep_alive(self, take: Callable[[], bool]) -> None:
        """KEEP_ALIVE_BUDGET: from now on, answer this graphql-transport-ws connection's
        pings and drop its pongs here, each spending one message through `take()`."""
        self.keep_alive_take = take

    def handle_text(self, event: Frame) -> None:
        if self.keep_alive_take is not None and event.fin \
                and len(event.data) < KEEP_ALIVE_MAX_BYTES and self.keep_alive(event.data):
            return
        super().handle_text(event)

    def keep_alive(self, data: bytes) -> bool:
        """Answer a graphql-transport-ws `ping` with a `pong`, or drop a `pong`: True. False:
        the application reads the message (not one of these, or in doubt, or past the
        connection's budget)."""
        if not self.queue.empty() or not self.writable_now():
            return False  # after the messages waiting for the application; or by its `send`
        try:
            message = orjson.loads(data)
        except orjson.JSONDecodeError:  # not JSON, or not UTF-8
            return False
        if type(message) is not dict or not message.keys() <= KEEP_ALIVE_FIELDS:
            return False
        kind = message.get("type")
        payload = message.get("payload")
        if kind not in ("ping", "pong") or not (payload is None or type(payload) is dict):
            return False
        take = self.keep_alive_take
        if take is None or not take():
            return False  # past the budget: the application closes the connection (4029)
        if kind == "ping":
            self.conn.send_text(PONG if payload is None
                                else orjson.dumps({"type": "pong", "payload": payload}))
            self.transport.write(b"".join(self.conn.data_to_send()))
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        scope = getattr(self, "scope", None)
        if scope is not None:  # the scope would otherwise hold the protocol in a cycle
            scope["extensions"].pop(SEND_NOW, None)
            scope["extensions"].pop(KEEP_ALIVE_BUDGET, None)
        self.keep_alive_take = None  # ... and the application's budget hold the protocol
        super().connection_lost(exc)
        _free(self.conn)

    def data_received(self, data: bytes) -> None:
        self.received_at = self.loop.time()
        super().data_received(data)

    def send_keepalive_ping(self) -> None:
        assert self.ping_interval is not None
        alive = 1.5 * self.ping_interval - (self.loop.time() - self.received_at)
        if alive > 0 and not self.close_sent:
            self.ping_timer = self.loop.call_later(alive, self.send_keepalive_ping)
            return
        super().send_keepalive_ping()

    def start_keepalive(self) -> None:
        super().start_keepalive()  # the handshake is complete (uvicorn's `send`, on accept)
        # Its request and response (their headers) are not needed after it; the ASGI
        # scope keeps the request's headers for the application.
        self.request = self.response = None  # type: ignore[assignment]
