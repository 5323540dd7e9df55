"""graphql-transport-ws keep-alive answered by the gateway's websocket protocol
(viewgate.websocket_protocol) without waking the application, on the connection's own
message budget (gateway.subscriptions.message_rate): driven through uvicorn's protocol as the
gateway runs it, in front of the gateway's GraphQL websocket application."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import strawberry
from fake_transport import Transport
from uvicorn.config import Config
from uvicorn.server import ServerState
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from gateway.subscriptions.message_rate import KEEP_ALIVE_BUDGET
from gateway.subscriptions.websocket import GraphQLWebSocket
from schema.settings import Settings
from viewgate.websocket_protocol import KEEP_ALIVE_MAX_BYTES, GatewayWebSocketProtocol

DEADLINE_S = 5.0  # how long a test waits for what it checks
TRANSPORT_WS = "graphql-transport-ws"
LEGACY_WS = "graphql-ws"


@strawberry.type
class Query:
    @strawberry.field
    def hello(self) -> str:
        return "world"


@strawberry.type
class Subscription:
    @strawberry.subscription
    async def nothing(self) -> AsyncIterator[str]:  # pragma: no cover - not subscribed
        yield "never"


class Tab:
    """One client of a GatewayWebSocketProtocol in front of the gateway's GraphQL websocket
    application; `received` is what reached the application (its ASGI `receive`)."""

    def __init__(self, subprotocol: str, settings: Settings) -> None:
        self.subprotocol = subprotocol
        self.view = GraphQLWebSocket(strawberry.Schema(query=Query, subscription=Subscription),
                                     settings)
        self.received: list[dict] = []
        self.transport = Transport()
        self.client = ClientProtocol(parse_uri("ws://127.0.0.1:8000/graphql"),
                                     subprotocols=[Subprotocol(subprotocol)])
        self.frames: list[Frame] = []
        self.got: list[dict] = []  # read from the transport, not yet taken
        self.arrived = asyncio.Event()  # the application read a message

    async def app(self, scope: dict, receive: Callable[[], Awaitable[dict]],
                  send: Callable[[dict], Awaitable[None]]) -> None:
        async def recording() -> dict:
            message = await receive()
            self.received.append(message)
            self.arrived.set()
            return message
        await self.view(scope, recording, send)

    async def open(self) -> None:
        config = Config(app=self.app, interface="asgi3", ws_per_message_deflate=False,
                        lifespan="off")
        config.load()
        self.protocol = GatewayWebSocketProtocol(config, ServerState(), {})
        self.protocol.connection_made(self.transport)  # type: ignore[arg-type]
        self.client.send_request(self.client.connect())
        self.protocol.data_received(b"".join(self.client.data_to_send()))
        await self.until(lambda: self.transport.data, "the handshake's answer")
        self.client.receive_data(self.transport.take())
        [response] = self.client.events_received()
        assert response.status_code == 101  # type: ignore[attr-defined]
        assert response.headers["Sec-WebSocket-Protocol"] == self.subprotocol  # type: ignore[attr-defined]

    async def send(self, *messages: dict | bytes) -> None:
        """The messages in one read of the server (one data_received)."""
        for message in messages:
            self.client.send_text(message if isinstance(message, bytes)
                                  else orjson.dumps(message))
        self.protocol.data_received(b"".join(self.client.data_to_send()))

    async def until(self, condition: Callable[[], Any], what: str) -> None:
        """Until `condition()` holds, checked whenever the protocol writes to the client or
        the application reads a message, within DEADLINE_S."""
        events = (self.transport.written, self.arrived)
        try:
            async with asyncio.timeout(DEADLINE_S):
                while True:
                    for event in events:
                        event.clear()
                    if condition():
                        return
                    waits = [asyncio.ensure_future(event.wait()) for event in events]
                    try:
                        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        for wait in waits:
                            wait.cancel()
        except TimeoutError:
            raise AssertionError(f"not within {DEADLINE_S} s: {what}") from None

    def _read(self) -> list[dict]:
        self.client.receive_data(self.transport.take())
        for frame in self.client.events_received():
            if frame.opcode is Opcode.TEXT:
                self.got.append(orjson.loads(frame.data))
            elif frame.opcode is Opcode.CLOSE:
                close = self.client.close_rcvd
                assert close is not None
                self.got.append({"close": close.code, "reason": close.reason})
        return self.got

    async def take(self, count: int = 1,
                   until: Callable[[list[dict]], bool] | None = None) -> list[dict]:
        """The messages written to the client since the last take (a close: its code), once
        there are `count` of them (or `until` holds of them)."""
        enough = until or (lambda got: len(got) >= count)
        await self.until(lambda: enough(self._read()), f"messages to the client: {count}")
        got, self.got = self.got, []
        return got

    def texts_received(self) -> list[dict]:
        """The text messages that reached the application."""
        return [orjson.loads(m["text"]) for m in self.received
                if m["type"] == "websocket.receive"]

    async def acknowledged(self) -> None:
        await self.open()
        await self.send({"type": "connection_init"})
        assert (await self.take())[0]["type"] == "connection_ack"

    async def close(self) -> None:
        """The client gone: the application ends."""
        self.protocol.connection_lost(None)
        await asyncio.wait_for(asyncio.gather(*self.protocol.tasks), DEADLINE_S)


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())


def test_an_acknowledged_connections_pings_are_answered_without_the_application() -> None:
    async def scenario() -> None:
        tab = Tab(TRANSPORT_WS, Settings(gateway_ws_messages_per_s=0.001))
        await tab.acknowledged()
        assert tab.protocol.keep_alive_take is not None  # the handler handed its budget over
        reached = len(tab.texts_received())
        before = tab.protocol.received_at
        await tab.send({"type": "ping"})
        assert await tab.take() == [{"type": "pong"}]
        assert tab.protocol.received_at > before  # a tab that pings is alive
        # The payload back, as graphql-ws's server answers; a pong dropped: none of the three
        # reached the application.
        await tab.send({"type": "ping", "payload": {"at": 1}}, {"type": "pong"},
                       {"type": "pong", "payload": {"at": 2}})
        assert await tab.take() == [{"type": "pong", "payload": {"at": 1}}]
        assert len(tab.texts_received()) == reached and tab.protocol.queue.empty()
        # The budget was spent for each (the handler's: connection_init, then four here).
        budget = tab.protocol.keep_alive_take.__self__._budget  # type: ignore[union-attr]
        assert round(budget.burst - budget.tokens) == 5
        await tab.close()
        assert KEEP_ALIVE_BUDGET not in tab.protocol.scope["extensions"]
        assert tab.protocol.keep_alive_take is None  # no cycle left through it
    run(scenario)


def test_anything_but_a_plain_ping_or_pong_goes_to_the_application() -> None:
    big = {"type": "ping", "payload": {"pad": "x" * KEEP_ALIVE_MAX_BYTES}}
    others: list[dict | bytes] = [
        {"id": "q", "type": "subscribe", "payload": {"query": "{ hello }"}},
        {"type": "ping", "id": "x"},  # another field: in doubt
        {"type": "ping", "payload": "text"},  # a payload that is no object
        big,  # too long to be parsed here
    ]

    async def scenario() -> None:
        tab = Tab(TRANSPORT_WS, Settings())
        await tab.acknowledged()
        for message in others:
            reached = len(tab.texts_received())
            await tab.send(message)
            await tab.until(lambda: len(tab.texts_received()) > reached,  # noqa: B023
                            "the message at the application")
            assert tab.texts_received()[reached:] == [message]
        got = await tab.take(5)
        # The operation's messages in their order; the pongs, Strawberry's answers (the
        # handler's), in theirs (the operation runs in a task of its own: the two interleave).
        assert [m for m in got if "id" in m] == [
            {"id": "q", "type": "next", "payload": {"data": {"hello": "world"}}},
            {"id": "q", "type": "complete"},
        ]
        assert [m for m in got if "id" not in m] == [
            {"type": "pong"}, {"type": "pong"}, {"type": "pong", "payload": big["payload"]},
        ]
        # Not JSON: the application answers it (4400), as before.
        await tab.send(b"not json")
        assert (await tab.take())[0]["close"] == 4400
        assert tab.received[-1] == {"type": "websocket.receive", "text": "not json"}
        await tab.close()
    run(scenario)


def test_pings_before_the_acknowledgement_go_to_the_application_in_order() -> None:
    async def scenario() -> None:
        tab = Tab(TRANSPORT_WS, Settings())
        await tab.open()
        await tab.send({"type": "ping"})  # before connection_init: Strawberry answers it
        assert await tab.take() == [{"type": "pong"}]
        assert tab.texts_received() == [{"type": "ping"}]
        # In the read with connection_init: after its acknowledgement, through the handler.
        await tab.send({"type": "connection_init"}, {"type": "ping"})
        assert await tab.take(2) == [{"type": "connection_ack"}, {"type": "pong"}]
        assert [m["type"] for m in tab.texts_received()] == ["ping", "connection_init", "ping"]
        await tab.close()
    run(scenario)


def test_a_ping_flood_is_closed_with_4029_by_the_application() -> None:
    async def scenario() -> None:
        burst = 5
        tab = Tab(TRANSPORT_WS, Settings(gateway_ws_messages_per_s=0.001,
                                         gateway_ws_messages_burst=burst))
        await tab.acknowledged()  # connection_init: one of the burst
        await tab.send(*[{"type": "ping"}] * (3 * burst))
        got = await tab.take(burst)
        # The rest of the burst answered here, the first refused ping (and those after it)
        # handed to the application, which closes with 4029 and says why.
        assert got[:-1] == [{"type": "pong"}] * (burst - 1)
        assert got[-1]["close"] == 4029
        assert "gateway_ws_messages_per_s" in got[-1]["reason"]
        # The application read connection_init and the refused ping, then closed.
        assert tab.texts_received() == [{"type": "connection_init"}, {"type": "ping"}]
        await tab.close()
    run(scenario)


def test_the_legacy_protocol_is_not_intercepted() -> None:
    async def scenario() -> None:
        tab = Tab(LEGACY_WS, Settings())
        await tab.open()
        await tab.send({"type": "connection_init"})
        assert (await tab.take())[0]["type"] == "connection_ack"
        assert tab.protocol.keep_alive_take is None
        # subscriptions-transport-ws has no `ping`: the legacy handler's answer, as before.
        await tab.send({"type": "ping"})
        got = await tab.take(until=lambda got: any(m["type"] == "error" for m in got))
        assert tab.texts_received()[-1] == {"type": "ping"}
        assert [m for m in got if m["type"] != "ka"] == [
            {"type": "error", "id": None,
             "payload": {"message": "invalid message type 'ping'"}}]
        await tab.close()
    run(scenario)
