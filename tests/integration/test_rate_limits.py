"""Per-client rate limits against the real gateway and Redis: 429 with Retry-After after
the burst and a request through again after it, on the general and the compiled path,
separate buckets per token and per address, failing open while Redis is down and limiting
again once it is back; and limits on
a client's open websockets and subscriptions, and on the messages one websocket may send
(a real uvicorn gateway, both protocols)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator

import jwt
import orjson
import pytest
from prometheus_client import REGISTRY
from pydantic import SecretStr
from starlette.testclient import TestClient
from websockets.exceptions import ConnectionClosed, InvalidStatus
from ws_clients import GatewayServer, LegacyWS, TransportWS

from gateway.app import create_app
from viewgate.stack.process import eventually, free_port, wait_until
from viewgate.stack.redis_server import RedisServer

pytestmark = pytest.mark.integration

LOOKUP = "query($id: String!) { customer(customerId: $id) { customerId name } }"
GENERAL = "{ views { name } }"  # a system field: never compiled
BURST = 3
SECRET = uuid.uuid4().hex  # signs the tokens of this module's clients (HS256)
LIMITS = {"gateway_rate_limit_per_s": 0.2, "gateway_rate_limit_burst": BURST,
          "gateway_client_address_header": "X-Forwarded-For",
          "auth_jwt_secret": SecretStr(SECRET)}


def _token() -> str:
    """A valid token of a client of its own."""
    return jwt.encode({"sub": uuid.uuid4().hex, "role": "admin"}, SECRET, algorithm="HS256")


def _client_headers(token: str | None = None) -> dict[str, str]:
    """A client of its own: a fresh address (through the trusted proxy header) or token."""
    if token is not None:
        return {"authorization": f"Bearer {token}",
                "x-forwarded-for": f"10.1.{uuid.uuid4().int % 250}.1"}
    return {"x-forwarded-for": f"192.0.2.{uuid.uuid4().int % 250}, {uuid.uuid4()}"}


@pytest.fixture(scope="module")
def limited(gateway_shop) -> Iterator[TestClient]:
    settings = gateway_shop.settings.model_copy(update=LIMITS)
    with TestClient(create_app(settings, gateway_shop.catalog)) as client:
        yield client


def _sample(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def _until_limited(client: TestClient, body: dict, headers: dict) -> list:
    """Requests until the first 429 (at most a few past the burst)."""
    answers = []
    for _ in range(BURST + 3):
        answers.append(client.post("/graphql", json=body, headers=headers))
        if answers[-1].status_code == 429:
            break
    return answers


def _assert_limited_then_recovers(client: TestClient, body: dict, headers: dict) -> None:
    answers = _until_limited(client, body, headers)
    assert [a.status_code for a in answers[:BURST]] == [200] * BURST
    refused = answers[-1]
    assert refused.status_code == 429, [a.status_code for a in answers]
    wait_s = int(refused.headers["retry-after"])
    assert 1 <= wait_s <= 5  # a token every 5 s at 0.2/s
    error = refused.json()["errors"][0]
    assert error["extensions"] == {"code": "RATE_LIMITED", "retryAfter": wait_s}
    assert "gateway_rate_limit_per_s" in error["message"]
    # A client that waits as told gets through (the bucket refilled meanwhile): by
    # Retry-After, give or take a second.
    refused_at = time.monotonic()
    served = []
    wait_until(lambda: served.append(client.post("/graphql", json=body, headers=headers))
               or served[-1].status_code == 200, timeout_s=wait_s + 1, interval_s=0.2,
               what="a request after Retry-After")
    assert time.monotonic() - refused_at >= wait_s - 1
    assert "errors" not in served[-1].json()


def test_the_general_path_answers_429_after_the_burst_and_serves_after_retry_after(limited):
    _assert_limited_then_recovers(limited, {"query": GENERAL}, _client_headers())


def test_compiled_queries_are_limited_too(limited, gateway_shop):
    key = sorted(gateway_shop.customers)[0]
    body = {"query": LOOKUP, "variables": {"id": key}}
    # Its first clean run (another client) compiles it; later requests take the plan.
    assert limited.post("/graphql", json=body, headers=_client_headers()).status_code == 200
    compiled = {"operation": "anonymous", "path": "compiled"}
    before = _sample("viewgate_gateway_requests_total", compiled)
    _assert_limited_then_recovers(limited, body, _client_headers())
    assert _sample("viewgate_gateway_requests_total", compiled) >= before + BURST


def test_each_token_and_each_address_has_its_own_bucket(limited):
    body = {"query": GENERAL}
    token = _token()
    assert _until_limited(limited, body, _client_headers(token))[-1].status_code == 429
    # The same token from another address: the same bucket, still refused.
    assert limited.post("/graphql", json=body,
                        headers=_client_headers(token)).status_code == 429
    # Another token, and a request without token from a fresh address: served.
    assert limited.post("/graphql", json=body,
                        headers=_client_headers(_token())).status_code == 200
    address = _client_headers()
    assert _until_limited(limited, body, address)[-1].status_code == 429
    assert limited.post("/graphql", json=body, headers=_client_headers()).status_code == 200
    # GET requests and other endpoints: GET counts, probes and /metrics never do.
    get = limited.get("/graphql", params={"query": GENERAL}, headers=address)
    assert get.status_code == 429 and get.headers["retry-after"]
    assert limited.get("/healthz", headers=address).status_code == 200


def test_the_limiter_fails_open_when_redis_is_down(gateway_shop, tmp_path):
    redis = RedisServer(tmp_path / "redis", free_port())
    redis.start()
    try:
        # Its own Redis, empty: answers come from the shop's Delta tables either way.
        settings = gateway_shop.settings.model_copy(update={
            **LIMITS, "gateway_rate_limit_burst": 1, "redis_url": redis.url})
        with TestClient(create_app(settings, gateway_shop.catalog)) as client:
            body = {"query": LOOKUP, "variables": {"id": sorted(gateway_shop.customers)[0]}}
            headers = _client_headers()
            assert client.post("/graphql", json=body, headers=headers).status_code == 200
            assert client.post("/graphql", json=body, headers=headers).status_code == 429
            redis.stop()
            before = _sample("viewgate_gateway_rate_limit_unavailable_total")
            for _ in range(3):
                answer = client.post("/graphql", json=body, headers=headers)
                assert answer.status_code == 200, answer.text
                assert answer.json()["data"]["customer"]["customerId"] == body["variables"]["id"]
            assert _sample("viewgate_gateway_rate_limit_unavailable_total") == before + 3
            # Redis back (empty, a fresh bucket): once the gateway asks it again, the limit
            # holds again.
            redis.start()
            statuses: list[int] = []

            def limited_again() -> bool:
                statuses.append(client.post("/graphql", json=body,
                                            headers=headers).status_code)
                return statuses[-1] == 429
            wait_until(limited_again, timeout_s=60, interval_s=0.2,
                       what="the rate limit to apply again after Redis came back")
            assert set(statuses) <= {200, 429}
    finally:
        redis.stop()


# Websockets: a real uvicorn gateway (the handshake's 429 is the server's).

MESSAGE_BURST = 40  # messages a connection may send at once (then 5 a second)

@pytest.fixture(scope="module")
def ws_gateway(gateway_shop, tmp_path_factory) -> Iterator[GatewayServer]:
    server = GatewayServer(gateway_shop.settings, tmp_path_factory.mktemp("limits-gateway"),
                           "gateway-test", VIEWGATE_GATEWAY_MAX_WEBSOCKETS_PER_CLIENT="2",
                           VIEWGATE_GATEWAY_MAX_SUBSCRIPTIONS_PER_CLIENT="3",
                           VIEWGATE_GATEWAY_WS_MESSAGES_PER_S="5",
                           VIEWGATE_GATEWAY_WS_MESSAGES_BURST=str(MESSAGE_BURST))
    try:
        yield server.start()
    finally:
        server.stop()


def test_a_client_past_its_open_websockets_is_refused_with_429(ws_gateway):
    async def scenario() -> None:
        first = await TransportWS.open(ws_gateway.url)
        second = await LegacyWS.open(ws_gateway.url)  # both protocols count
        with pytest.raises(InvalidStatus) as refused:
            await TransportWS.open(ws_gateway.url)
        response = refused.value.response
        assert response.status_code == 429
        error = orjson.loads(response.body)["errors"][0]
        assert error["extensions"]["code"] == "LIMIT_WEBSOCKETS"
        assert "gateway_max_websockets_per_client" in error["message"]
        await first.close()
        # Once the server has seen the close, the client may open one again.
        third = await _open_when_allowed(TransportWS, ws_gateway.url)
        await second.close()
        await third.close()
    asyncio.run(scenario())


async def _read_until_closed(ws) -> None:
    with contextlib.suppress(ConnectionClosed):
        while True:
            await ws.recv()
    await ws.wait_closed()


async def _open_when_allowed(kind: type, url: str):
    """A connection, once the server has let go of the client's earlier ones."""
    async def attempt():
        try:
            return await kind.open(url)
        except InvalidStatus:
            return None
    return await eventually(attempt, timeout_s=30, what="a websocket within the limit")


def test_subscriptions_are_limited_per_client_across_its_connections(ws_gateway,
                                                                      gateway_shop):
    keys = sorted(gateway_shop.customers)
    live = 'subscription {{ customer(customerId: "{}") {{ op }} }}'

    async def scenario() -> None:
        one = await _open_when_allowed(TransportWS, ws_gateway.url)
        two = await _open_when_allowed(LegacyWS, ws_gateway.url)
        ops = [await one.subscribe(live.format(keys[0])),
               await one.subscribe(live.format(keys[1]))]
        for op in ops:
            assert (await one.next(op))["customer"]["op"] == "CURRENT"
        legacy_op = await two.subscribe(live.format(keys[2]))
        assert (await two.next(legacy_op))["customer"]["op"] == "CURRENT"
        # The fourth, on either connection: each protocol's error, the connection stays.
        refused = await one.subscribe(live.format(keys[3]))
        error = await one.receive()
        assert (error["type"], error["id"]) == ("error", refused), error
        assert error["payload"][0]["extensions"]["code"] == "LIMIT_SUBSCRIPTIONS"
        assert "gateway_max_subscriptions_per_client" in error["payload"][0]["message"]
        legacy_refused = await two.subscribe(live.format(keys[3]))
        error = await two.receive()
        assert (error["type"], error["id"]) == ("error", legacy_refused), error
        assert error["payload"]["extensions"]["code"] == "LIMIT_SUBSCRIPTIONS"
        # Completing one gives it back.
        await one.send({"id": ops[0], "type": "complete"})
        async def subscribe_again():
            op = await two.subscribe(live.format(keys[3]))
            message = await two.receive()
            if message["type"] == "data":
                return op, message
            assert message["payload"]["extensions"]["code"] == "LIMIT_SUBSCRIPTIONS"
            return None
        op, message = await eventually(subscribe_again, timeout_s=30,
                                       what="the completed subscription released")
        assert message["id"] == op and message["payload"]["data"]["customer"]
        await one.close()
        await two.close()
    asyncio.run(scenario())


# Messages that change nothing: a graphql-transport-ws ping, a legacy stop of no operation.
IDLE_MESSAGE = {TransportWS: {"type": "ping"}, LegacyWS: {"type": "stop", "id": "none"}}


@pytest.mark.parametrize("kind", [TransportWS, LegacyWS])
def test_a_connection_flooding_messages_is_closed_and_others_keep_working(ws_gateway,
                                                                          gateway_shop, kind):
    key = sorted(gateway_shop.customers)[0]

    async def scenario() -> None:
        flood = await _open_when_allowed(kind, ws_gateway.url)
        sent = 0
        with contextlib.suppress(ConnectionClosed):
            for _ in range(10 * MESSAGE_BURST):
                await flood.send(IDLE_MESSAGE[kind])
                sent += 1
        # Read what the gateway answered (pongs to the burst's pings) up to its close, as a
        # client does: unread, they held the close frame back, and the closing handshake
        # waited out both sides' close timeouts (10 s each, 20 s in all: near the deadline
        # on a loaded machine).
        await asyncio.wait_for(_read_until_closed(flood.ws), 30)
        assert flood.ws.close_code == 4029, (flood.ws.close_code, flood.ws.close_reason)
        assert "gateway_ws_messages_per_s" in flood.ws.close_reason
        assert sent > MESSAGE_BURST  # the burst went through first
        # Another connection of the same client, within the rate, is served as before.
        calm = await _open_when_allowed(TransportWS, ws_gateway.url)
        op = await calm.subscribe(f'subscription {{ customer(customerId: "{key}") {{ op }} }}')
        assert (await calm.next(op))["customer"]["op"] == "CURRENT"
        await calm.close()
    asyncio.run(scenario())
