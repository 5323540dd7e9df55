"""GraphQL websocket clients for the tests, on the `websockets` library: one per protocol
(graphql-transport-ws and the legacy graphql-ws), and the gateway as a real uvicorn
process on a free port."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from typing import Any

import httpx
import orjson
from websockets.asyncio.client import ClientConnection, connect

from viewgate.bench.servers import FACTORIES, settings_env, uvicorn_args
from viewgate.stack.process import ManagedProcess, free_port, wait_until

HERE = Path(__file__).resolve().parent
TIMEOUT_S = 60.0


class GatewayServer:
    """`uvicorn --factory gateway.app:create_app` with the test's settings in its
    environment; stopped by pid at teardown."""

    def __init__(self, settings: Any, log_dir: Path, prefix: str, **env: str) -> None:
        self.port = free_port()
        self.process = ManagedProcess(
            f"gateway-{self.port}",
            uvicorn_args(FACTORIES["gateway"], self.port, settings),
            log_dir / f"gateway-{self.port}.log",
            env={
                **settings_env(settings),
                "VIEWGATE_CATALOG": "shop_views:PREFIXED_CATALOG",
                "SHOP_TOPIC_PREFIX": prefix,
                "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
                "PYTHONFAULTHANDLER": "1",  # a crash of the process leaves its stack in the log
                **env,
            },
        )

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/graphql"

    def start(self) -> GatewayServer:
        self.process.start()
        wait_until(lambda: self._ready(), timeout_s=60, what="the gateway to serve",
                   alive=self.process.alive, log=self.process.log_path)
        return self

    def _ready(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/subscriptions").json()["feedReady"]
        except httpx.HTTPError:
            return False

    def stats(self) -> dict[str, Any]:
        return httpx.get(f"http://127.0.0.1:{self.port}/subscriptions").json()

    def query(self, query: str) -> dict[str, Any]:
        response = httpx.post(f"http://127.0.0.1:{self.port}/graphql", json={"query": query})
        response.raise_for_status()
        return response.json()

    def stop(self) -> None:
        self.process.stop()

    def state(self) -> str:
        """Whether the process runs, and the end of its log: for a test's failure message
        when a connection ends unexpectedly."""
        log = self.process.log_path.read_text(errors="replace")[-3000:]
        return f"gateway {'running' if self.process.alive() else 'DEAD'}; its log ends:\n{log}"


def small_socket(port: int, receive_buffer: int = 4096) -> socket.socket:
    """A connected socket with a tiny receive buffer: a client that stops reading pushes
    back on the server after a few kilobytes instead of the kernel's megabytes."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    return sock


class Client:
    """Common to both protocols: JSON messages, read with a deadline."""

    protocol = ""
    start_type = data_type = ""  # the protocol's names of the subscribe and data messages

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.ids = 0

    @classmethod
    async def open(cls, url: str, payload: dict | None = None, **kwargs: Any) -> Any:
        ws = await connect(url, subprotocols=[cls.protocol], **kwargs)  # type: ignore[list-item]
        client = cls(ws)
        await client.send({"type": "connection_init", "payload": payload or {}})
        ack = await client.receive()
        assert ack["type"] == "connection_ack", ack
        return client

    async def send(self, message: dict) -> None:
        await self.ws.send(orjson.dumps(message).decode())

    async def receive(self, timeout_s: float = TIMEOUT_S) -> dict:
        """The next message other than keep-alives."""
        while True:
            message = orjson.loads(await asyncio.wait_for(self.ws.recv(), timeout_s))
            if message["type"] not in ("ka", "ping", "pong"):
                return message

    async def take(self, count: int, timeout_s: float = TIMEOUT_S) -> list[dict]:
        """The next `count` messages (of any operation), keep-alives left out."""
        return [await self.receive(timeout_s) for _ in range(count)]

    async def close(self) -> None:
        await self.ws.close()

    async def subscribe(self, query: str, variables: dict | None = None) -> str:
        self.ids += 1
        op = str(self.ids)
        await self.send({"id": op, "type": self.start_type,
                         "payload": {"query": query, "variables": variables or {}}})
        return op

    async def next(self, op: str, timeout_s: float = TIMEOUT_S) -> dict:
        """The `data` of the next data message of `op`; fails on anything else."""
        message = await self.receive(timeout_s)
        assert message.get("id") == op and message["type"] == self.data_type, message
        assert "errors" not in message["payload"], message
        return message["payload"]["data"]


class TransportWS(Client):
    """graphql-transport-ws (the graphql-ws library's protocol)."""

    protocol = "graphql-transport-ws"
    start_type, data_type = "subscribe", "next"


class LegacyWS(Client):
    """graphql-ws (subscriptions-transport-ws, Apollo's legacy protocol)."""

    protocol = "graphql-ws"
    start_type, data_type = "start", "data"
