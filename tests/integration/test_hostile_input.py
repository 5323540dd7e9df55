"""Hostile input against a real gateway process (uvicorn, as `viewgate gateway` runs it)
while a well-behaved client keeps querying and holds a live subscription on each
websocket protocol: every attack is refused with a clear error (HTTP status and GraphQL
error, or the protocol's error message or close code), the process stays up with bounded
memory, and the bystander's answers stay correct throughout.

Not repeated here: the per-limit errors (test_gateway_http.py), malformed protocol
messages of either protocol and a subscriber that stops reading (test_subscriptions.py),
fuzzed engine events (test_engine_fuzz.py)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import httpx
import orjson
import pytest
from shop_views import catalog_on, expected_customers, isolated, produce, run_once, shop_events
from websockets.asyncio.client import connect
from ws_clients import GatewayServer, LegacyWS, TransportWS, small_socket

from schema.catalog import Catalog
from schema.settings import Settings
from viewgate.stack.process import wait_until

pytestmark = pytest.mark.integration

PREFIX = "hostile"
MB = 1024 * 1024
TIMEOUT_S = 120.0  # a deadline for answers, not a speed assertion
LIVE = 'subscription {{ customer(customerId: "{key}") {{ op row {{ name }} }} }}'
CHANGES = "subscription { customerChanges { op key } }"


class Shop(NamedTuple):
    settings: Settings
    catalog: Catalog
    customers: dict[str, dict]  # the latest row per customer


@pytest.fixture(scope="module")
def shop(spark, settings, tmp_path_factory) -> Shop:
    # Redis database 16: no other test uses it (test_auth has 11). Customers only: the
    # attacks read them.
    settings = isolated(settings, tmp_path_factory.mktemp("hostile"), redis_db=16).model_copy(
        update={"changefeed_prefix": f"{PREFIX}.changes."})
    customers = shop_events(PREFIX, seed=41, count=300)[0]
    shop = Shop(settings, catalog_on(PREFIX), expected_customers(customers))
    produce(settings.kafka_bootstrap, customers)
    run_once(spark, settings, shop.catalog)
    return shop


@pytest.fixture(scope="module")
def gateway(shop: Shop, tmp_path_factory, request) -> GatewayServer:
    # Per-client limits off: the attacks here meet the limits behind them (per connection,
    # per request); test_fairness.py floods a gateway on the default per-client limits.
    server = GatewayServer(shop.settings, tmp_path_factory.mktemp("hostile-logs"), PREFIX,
                           VIEWGATE_GATEWAY_MAX_WEBSOCKETS_PER_CLIENT="0",
                           VIEWGATE_GATEWAY_MAX_SUBSCRIPTIONS_PER_CLIENT="0",
                           VIEWGATE_GATEWAY_WS_MESSAGES_PER_S="0")
    request.addfinalizer(server.stop)
    return server.start()


def rss_mb(server: GatewayServer) -> float:
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


# --- The well-behaved client -----------------------------------------------------------


@dataclass
class Bystander:
    """Point lookups and a list over HTTP, back to back, and a live subscription of one
    customer on each websocket protocol; every answer checked against the shop."""

    server: GatewayServer
    customers: dict[str, dict]
    answers: int = 0
    failures: list[str] = field(default_factory=list)
    live: dict[str, list[dict]] = field(default_factory=lambda: {"transport": [],
                                                                 "legacy": []})
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def live_key(self) -> str:
        return sorted(self.customers)[0]

    def start(self) -> Bystander:
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self.thread.start()
        wait_until(lambda: self.answers > 10 and all(self.live.values()) or self.failures,
                   timeout_s=TIMEOUT_S, what="the bystander's first answers")
        self.check()
        return self

    async def _main(self) -> None:
        clients = [await TransportWS.open(self.server.url), await LegacyWS.open(self.server.url)]
        tasks = [asyncio.create_task(self._watch(c, name))
                 for c, name in zip(clients, self.live, strict=True)]
        try:
            await self._query()
        finally:
            for task in tasks:
                task.cancel()
            for client in clients:
                await client.close()

    async def _watch(self, client, name: str) -> None:
        op = await client.subscribe(LIVE.format(key=self.live_key))
        while True:
            try:
                self.live[name].append((await client.next(op, timeout_s=3600))["customer"])
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # noqa: BLE001 - recorded, the test fails on it
                self.failures.append(f"{name} subscription: {exc!r}")
                return

    async def _query(self) -> None:
        # Not the live key: the last test changes it (its subscriptions check that).
        keys = sorted(self.customers)[1:]
        url = f"http://127.0.0.1:{self.server.port}/graphql"
        point = "query P($id: String!) { customer(customerId: $id) { customerId name tier } }"
        listed = "{ customers(first: 10) { totalCount edges { node { customerId name } } } }"
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
            i = 0
            while not self.stop.is_set():
                key = keys[i % len(keys)]
                try:
                    got = await client.post(url, json={"query": point, "variables": {"id": key}})
                    row = self.customers[key]
                    assert got.status_code == 200, got.text
                    assert got.json()["data"]["customer"] == {
                        "customerId": key, "name": row["name"], "tier": row["tier"]}, got.text
                    got = await client.post(url, json={"query": listed})
                    assert got.status_code == 200, got.text
                    page = got.json()["data"]["customers"]
                    assert page["totalCount"] == len(self.customers), got.text
                    for edge in page["edges"]:
                        node = edge["node"]
                        assert node["customerId"] == self.live_key or \
                            node["name"] == self.customers[node["customerId"]]["name"], node
                except Exception as exc:  # noqa: BLE001 - recorded, the test fails on it
                    self.failures.append(f"query of {key}: {exc!r}")
                    return  # check() fails on it; no point asking on
                else:
                    self.answers += 1
                i += 1

    def check(self, more: int = 20) -> None:
        """The gateway is up and the bystander got `more` correct answers since now."""
        target = self.answers + more
        wait_until(lambda: self.answers >= target or bool(self.failures), timeout_s=TIMEOUT_S,
                   what=f"{more} more answers to the bystander", alive=self.server.process.alive,
                   log=self.server.process.log_path)
        assert not self.failures, self.failures[:5]
        assert self.server.process.alive()


@pytest.fixture(scope="module")
def bystander(shop, gateway) -> Iterator[Bystander]:
    client = Bystander(gateway, shop.customers).start()
    try:
        yield client
    finally:
        client.stop.set()
        client.thread.join(30)


# --- Raw HTTP ----------------------------------------------------------------------------


def raw_http(port: int, head: bytes, body: Iterable[bytes] = ()) -> tuple[int, bytes, int]:
    """Send a request's head, then its body chunk by chunk from a thread (the server may
    refuse and close before it is all sent); read the answer until the server closes or
    it is complete. Returns (status, body, bytes of the request body sent); status 0 when
    the server closed without an answer."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
    sent = 0

    def send() -> None:
        nonlocal sent
        try:
            sock.sendall(head)
            for chunk in body:
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass  # closed by the server: what a refusal looks like

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    data = b""
    try:
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
            status, answer = _parsed(data)
            if answer is not None:
                break
        sender.join(TIMEOUT_S)
    finally:
        sock.close()
    status, answer = _parsed(data)
    return status, answer or b"", sent


def _parsed(data: bytes) -> tuple[int, bytes | None]:
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        return 0, None
    lines = head.decode("latin-1").split("\r\n")
    length = next((int(v) for n, _, v in (line.partition(":") for line in lines[1:])
                   if n.strip().lower() == "content-length"), None)
    status = int(lines[0].split()[1])
    return status, rest[:length] if length is not None and len(rest) >= length else None


def post_head(port: int, length: int | None, extra: str = "") -> bytes:
    framing = f"Content-Length: {length}" if length is not None else \
        "Transfer-Encoding: chunked"
    return (f"POST /graphql HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\n{framing}\r\n{extra}\r\n").encode()


def post(server: GatewayServer, body: bytes, **headers: str) -> httpx.Response:
    return httpx.post(f"http://127.0.0.1:{server.port}/graphql", content=body,
                      headers={"content-type": "application/json", **headers},
                      timeout=TIMEOUT_S)


def error_of(response: httpx.Response) -> dict:
    errors = response.json()["errors"]
    assert errors and errors[0]["message"], response.text
    return errors[0]


# --- HTTP attacks ------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "status"), [
    (b'{"query": "{ views { name } }"', 400),  # cut short: not JSON
    (b"\xff\xfe\x00garbage", 400),
    (b'{"query": "{ views { name } }", "variables": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400),
    # JSON, but not a well-formed GraphQL-over-HTTP request: 422 (the spec's draft).
    (b"[1, 2, 3]", 422),
    (b'"{ views { name } }"', 422),
    (b'{"query": 42}', 422),
    (b'{"query": "{ views { name } }", "variables": "not json"}', 422),
    (b'{"query": "{ views { name } }", "operationName": ["A"]}', 422),
])
def test_malformed_bodies_get_400_or_422(gateway, bystander, body, status):
    response = post(gateway, body)
    assert response.status_code == status, response.text
    assert error_of(response)["extensions"]["code"] == "BAD_REQUEST"
    bystander.check()


@pytest.mark.parametrize(("document", "status"), [
    ("{ customer(customerId: ", 400),  # does not parse
    ("query {", 400),
    ("}}}} {{{{", 400),
    ("subscription { customerChanges { op } }" + " \u0000 ", 400),
    ("{ customer(customerId: " + "[" * 2000 + "]" * 2000 + ") { name } }", 400),  # nesting
    ("{ noSuchField }", 422),  # does not validate
])
def test_malformed_documents_get_graphql_errors(gateway, bystander, document, status):
    response = post(gateway, orjson.dumps({"query": document}),
                    accept="application/graphql-response+json")
    assert response.status_code == status, response.text
    assert "data" not in response.json()
    error_of(response)
    bystander.check()


def test_a_document_over_the_size_limit_gets_413(gateway, bystander):
    limit = Settings().gateway_max_document_bytes
    response = post(gateway, orjson.dumps({"query": "{ views { name } }" + " " * limit}))
    assert response.status_code == 413
    assert "gateway_max_document_bytes" in error_of(response)["message"]
    bystander.check()


def test_a_50mb_body_is_refused_by_its_length_without_being_read(gateway, bystander):
    before = rss_mb(gateway)
    chunk = b" " * MB
    status, answer, sent = raw_http(gateway.port, post_head(gateway.port, 50 * MB),
                                    (chunk for _ in range(50)))
    assert status == 413, answer
    assert "gateway_max_body_bytes" in json.loads(answer)["errors"][0]["message"]
    assert sent < 50 * MB  # the server closed the connection instead of draining it
    assert rss_mb(gateway) - before < 20, "the gateway's memory grew with the body"
    bystander.check()


def test_a_chunked_body_without_length_is_cut_off_at_the_limit(gateway, bystander):
    before = rss_mb(gateway)
    piece = b"x" * 65536
    chunks = (b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(800))  # 50 MB
    status, answer, sent = raw_http(gateway.port, post_head(gateway.port, None), chunks)
    assert status == 413, answer
    assert "gateway_max_body_bytes" in json.loads(answer)["errors"][0]["message"]
    assert sent < 50 * MB
    assert rss_mb(gateway) - before < 20, "the gateway's memory grew with the body"
    bystander.check()


def test_huge_headers_are_refused(gateway, bystander):
    status, _, _ = raw_http(gateway.port, post_head(gateway.port, 2, f"X-Big: {'a' * 4 * MB}\r\n"),
                            [b"{}"])
    # Refused, or the connection closed unanswered. uvicorn (httptools) passes a 4 MB header
    # on: the app then refuses the body `{}` (no query: 422); a 431 is not sent yet.
    assert status in (0, 400, 422, 431), status
    bystander.check()


def test_huge_variables_and_long_lists(gateway, bystander):
    query = "query Q($ids: [String!]) { customers(where: {customerId: {in: $ids}}) " \
            "{ totalCount } }"
    # Megabytes of variables: over the body limit.
    big = {"query": query, "variables": {"ids": ["C" * 100] * 50_000}}
    response = post(gateway, orjson.dumps(big))
    assert response.status_code == 413, response.text
    # A long list that fits in the body: over the `in` limit, said so.
    long = {"query": query, "variables": {"ids": [f"C{i:06d}" for i in range(15_000)]}}
    response = post(gateway, orjson.dumps(long))
    assert response.status_code == 200, response.text
    assert "values" in error_of(response)["message"]
    # A variables object with a great many keys: unknown variables are ignored.
    many = {"query": "{ views { name } }", "variables": {f"v{i}": i for i in range(10_000)}}
    response = post(gateway, orjson.dumps(many))
    assert response.status_code == 200 and "errors" not in response.json(), response.text
    bystander.check()


def _bomb(levels: int, spreads: int) -> str:
    """A billion laughs: F0 spreads F1 `spreads` times, F1 spreads F2, ... each leaf
    fragment selecting every field of a customer."""
    fragments = "".join(
        f"fragment F{i} on Customer {{ {' '.join(f'...F{i + 1}' for _ in range(spreads))} }} "
        for i in range(levels))
    return (f'{{ customer(customerId: "C00001") {{ ...F0 }} }} {fragments}'
            f"fragment F{levels} on Customer {{ customerId name tier country }}")


@pytest.mark.parametrize(("document", "code"), [
    # Deep nesting through relationships.
    ('{ customer(customerId: "C00001") { ' + "orders { edges { node { customer { " * 10
     + "name" + " } } } }" * 10 + " } }", "LIMIT_DEPTH"),
    # An alias bomb.
    ("{ " + " ".join(f'a{i}: customer(customerId: "C00001") {{ name }}' for i in range(200))
     + " }", "LIMIT_ALIASES"),
    # Aliases multiplied by fragments.
    ("{ ...A ...A ...A } fragment A on Query { "
     + " ".join(f'a{i}: customer(customerId: "C00001") {{ name }}' for i in range(25)) + " }",
     "LIMIT_ALIASES"),
    # Fragment-spread bombs: 50^5 and 300^2 fields once expanded.
    (_bomb(5, 50), "LIMIT_FIELDS"),
    (_bomb(2, 300), "LIMIT_FIELDS"),
    # More tokens than the limit: thousands of operations in one document.
    (" ".join(f"query Q{i} {{ views {{ name }} }}" for i in range(800)), "LIMIT_TOKENS"),
])
def test_expensive_documents_are_refused_naming_the_limit(gateway, bystander, document, code):
    response = post(gateway, orjson.dumps({"query": document}),
                    accept="application/graphql-response+json")
    assert response.status_code == 422, response.text
    assert error_of(response)["extensions"]["code"] == code, response.text
    bystander.check()


def test_circular_fragments_and_many_operations(gateway, bystander):
    cycle = ('{ customer(customerId: "C00001") { ...A } } '
             "fragment A on Customer { name ...B } fragment B on Customer { tier ...A }")
    response = post(gateway, orjson.dumps({"query": cycle}))
    assert response.status_code == 422
    assert "within itself" in error_of(response)["message"]
    many = " ".join(f"query Q{i} {{ views {{ name }} }}" for i in range(300))
    response = post(gateway, orjson.dumps({"query": many}))
    assert response.status_code == 422, response.text  # which one to run? (Strawberry
    assert error_of(response)["extensions"]["code"] == "OPERATION_NAME_REQUIRED"  # ran Q0)
    response = post(gateway, orjson.dumps({"query": many, "operationName": "Q299"}))
    assert response.json()["data"]["views"], response.text
    bystander.check()


def test_a_client_that_never_reads_its_answers_holds_bounded_memory(gateway, bystander):
    """Thousands of pipelined requests for big pages, none of the answers read: uvicorn
    stops reading the client while its answers wait, so memory stays bounded."""
    before = rss_mb(gateway)
    # 20 KB requests (the document padded), 5,000 of them: 100 MB, more than the kernel's
    # socket buffers on both sides hold.
    query = orjson.dumps({"query": "{ customers(first: 200) { edges { node "
                                   "{ customerId name tier country } } } }" + " " * 20_000})
    request = post_head(gateway.port, len(query)) + query
    sock = small_socket(gateway.port)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sock.setblocking(True)
    sock.settimeout(5)
    sent = 0
    try:
        for _ in range(5_000):
            try:
                sock.sendall(request)
            except (TimeoutError, OSError):
                break  # the server stopped reading us: what we expect
            sent += 1
        bystander.check(50)
        assert sent < 5_000, "the server read every request of a client that never reads"
        assert rss_mb(gateway) - before < 60, "answers nobody reads piled up in memory"
    finally:
        sock.close()
    bystander.check()


# --- Websocket attacks -------------------------------------------------------------------


async def _closed_with(ws, frames: list[str | bytes]) -> tuple[int | None, str]:
    for frame in frames:
        await ws.send(frame)
    await asyncio.wait_for(ws.wait_closed(), TIMEOUT_S)
    return ws.close_code, ws.close_reason


@pytest.mark.parametrize(("protocol", "frame", "code"), [
    ("transport", b"\x00\x01binary", 4400),
    ("transport", "[1, 2]", 4400),
    ("transport", "x" * (MB // 2), 1009),
    ("transport", json.dumps({"type": "connection_init", "payload": "a" * MB}), 1009),
    ("legacy", b"\x00\x01binary", 1002),
    ("legacy", "y" * (MB // 2), 1009),
])
def test_bad_frames_close_the_connection(gateway, bystander, protocol, frame, code):
    client = {"transport": TransportWS, "legacy": LegacyWS}[protocol]

    async def scenario() -> tuple[int | None, str]:
        return await _closed_with((await client.open(gateway.url)).ws, [frame])
    assert asyncio.run(scenario())[0] == code
    bystander.check()


def test_legacy_protocol_answers_bad_json_with_an_error(gateway, bystander):
    async def scenario() -> None:
        client = await LegacyWS.open(gateway.url)
        for frame, problem in (("not json", "not valid JSON"), ("[1, 2]", "invalid message"),
                               ('{"type": "start", "id": "1"}', "malformed start")):
            await client.ws.send(frame)
            message = await client.receive()
            assert message["type"] == "error" and problem in message["payload"]["message"], \
                message
        op = await client.subscribe(LIVE.format(key=bystander.live_key))
        assert (await client.next(op))["customer"]["op"] == "CURRENT"  # still serving
        await client.close()
    asyncio.run(scenario())
    bystander.check()


@pytest.mark.parametrize("protocol", ["graphql-transport-ws", "graphql-ws"])
def test_subscribing_before_connection_init_is_unauthorized(gateway, bystander, protocol):
    start = {"graphql-transport-ws": "subscribe", "graphql-ws": "start"}[protocol]

    async def scenario() -> tuple[int | None, str]:
        ws = await connect(gateway.url, subprotocols=[protocol])
        return await _closed_with(ws, [json.dumps({"id": "1", "type": start,
                                                   "payload": {"query": CHANGES}})])
    assert asyncio.run(scenario())[0] == 4401
    bystander.check()


def test_duplicate_subscription_ids(gateway, bystander):
    query = LIVE.format(key=bystander.live_key)

    async def scenario() -> None:
        # graphql-transport-ws: a second subscribe with a live id closes with 4409.
        client = await TransportWS.open(gateway.url)
        await client.send({"id": "same", "type": "subscribe", "payload": {"query": query}})
        assert (await client.next("same"))["customer"]["op"] == "CURRENT"
        code, reason = await _closed_with(client.ws, [json.dumps(
            {"id": "same", "type": "subscribe", "payload": {"query": query}})])
        assert code == 4409 and "same" in reason
        # graphql-ws: the second start replaces the first, as subscriptions-transport-ws does.
        legacy = await LegacyWS.open(gateway.url)
        before = gateway.stats()["subscribers"]
        for _ in range(3):
            await legacy.send({"id": "same", "type": "start", "payload": {"query": query}})
            message = await legacy.receive()
            if message["type"] == "complete":  # the replaced one's end
                message = await legacy.receive()
            assert message["type"] == "data", message
            assert message["payload"]["data"]["customer"]["op"] == "CURRENT"
        assert gateway.stats()["subscribers"] == before + 1
        await legacy.close()
    asyncio.run(scenario())
    bystander.check()


@pytest.mark.parametrize(("client", "start"), [(TransportWS, "subscribe"),
                                               (LegacyWS, "start")])
def test_a_subscribe_flood_is_capped_per_connection_and_released(gateway, bystander, client,
                                                                 start):
    limit = Settings().gateway_max_subscriptions_per_connection
    base = gateway.stats()["subscribers"]

    async def scenario() -> None:
        flooder = await client.open(gateway.url)
        for i in range(limit + 200):
            await flooder.send({"id": str(i), "type": start, "payload": {"query": CHANGES}})
        errors = await flooder.take(200)
        assert all(e["type"] == "error" and "limit" in json.dumps(e["payload"])
                   for e in errors), errors[:3]
        await asyncio.to_thread(wait_until, lambda: gateway.stats()["subscribers"]
                                == base + limit, timeout_s=TIMEOUT_S, what="the flood held")
        await flooder.close()
    asyncio.run(scenario())
    wait_until(lambda: gateway.stats()["subscribers"] == base, timeout_s=TIMEOUT_S,
               what="the flood's subscriptions released")
    bystander.check()


def test_the_bystander_still_gets_live_changes_and_memory_stayed_bounded(spark, shop, gateway,
                                                                        bystander):
    """Last: after every attack above, a change still reaches the bystander's live
    subscriptions on both protocols."""
    key = bystander.live_key
    row = dict(shop.customers[key], name="Still Served")
    topic = shop.catalog.sources["customers"].topic
    produce(shop.settings.kafka_bootstrap, [(topic, key, json.dumps(row).encode())])
    run_once(spark, shop.settings, shop.catalog)
    shop.customers[key] = row
    wait_until(lambda: all(any(m["row"] and m["row"]["name"] == "Still Served" for m in got)
                           for got in bystander.live.values()) or bystander.failures,
               timeout_s=TIMEOUT_S, what="the change on both protocols")
    bystander.check()
    assert rss_mb(gateway) < 1024, "the gateway's memory grew without bound"


def test_past_the_connection_limit_new_requests_get_503(shop, bystander, tmp_path):
    """uvicorn's limit_concurrency, from gateway_max_connections (viewgate.serving): idle
    connections held open by one client cannot make the process take unbounded more."""
    settings = shop.settings.model_copy(update={"gateway_max_connections": 20})
    server = GatewayServer(settings, tmp_path, PREFIX).start()
    held: list[socket.socket] = []
    try:
        url = f"http://127.0.0.1:{server.port}/graphql"
        body = {"query": "{ views { name } }"}
        assert httpx.post(url, json=body, timeout=TIMEOUT_S).status_code == 200
        held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(25)]
        wait_until(lambda: httpx.post(url, json=body, timeout=TIMEOUT_S).status_code == 503,
                   timeout_s=TIMEOUT_S, what="503 past 20 connections")
        for sock in held:
            sock.close()
        wait_until(lambda: httpx.post(url, json=body, timeout=TIMEOUT_S).status_code == 200,
                   timeout_s=TIMEOUT_S, what="answers again once the connections closed")
        assert server.process.alive()
    finally:
        for sock in held:
            sock.close()
        server.stop()
    bystander.check()
