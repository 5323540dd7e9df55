"""Answers from Delta (delta-rs) when Redis is empty, flushed or stopped, and Redis
re-warmed from Delta. Uses a Redis server of its own, so the session's stays intact."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from graphql_client import data, gql
from starlette.testclient import TestClient

from gateway.app import create_app
from schema.storage import complete_field, meta_key, row_key
from viewgate.stack.process import free_port, wait_until
from viewgate.stack.redis_server import RedisServer

pytestmark = pytest.mark.integration

LIST = ('{ orders(where: {status: {eq: "paid"}}, orderBy: {field: AMOUNT}, first: 500) '
        '{ totalCount edges { node { orderId amount customer { customerId name } } } } }')



@pytest.fixture(scope="module")
def own_redis(tmp_path_factory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("own-redis"), free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def client(gateway_shop, own_redis) -> Iterator[TestClient]:
    settings = gateway_shop.settings.model_copy(update={
        "redis_url": own_redis.url, "gateway_redis_timeout_s": 0.5,
        "gateway_redis_retry_ms": 100})
    with TestClient(create_app(settings, gateway_shop.catalog)) as test_client:
        yield test_client


def _expected_list(shop) -> list[str]:
    paid = [(o["amount"], k) for k, o in shop.orders.items() if o["status"] == "paid"]
    return [k for _, k in sorted(paid)]


def _check_list(body: dict, shop) -> None:
    orders = body["data"]["orders"]
    assert [e["node"]["orderId"] for e in orders["edges"]] == _expected_list(shop)
    assert orders["totalCount"] == len(_expected_list(shop))
    for edge in orders["edges"]:
        customer_id = shop.orders[edge["node"]["orderId"]]["customer_id"]
        assert edge["node"]["customer"] == {
            "customerId": customer_id, "name": shop.customers[customer_id]["name"]}


def test_empty_redis_answers_from_delta_then_is_rewarmed(client, gateway_shop, own_redis):
    direct = redis.Redis.from_url(own_redis.url)
    key, want = sorted(gateway_shop.customers.items())[1]
    body = gql(client, f'{{ customer(customerId: "{key}") {{ name tier }} }}')
    assert body["data"]["customer"] == {"name": want["name"], "tier": want["tier"]}
    assert body["extensions"]["freshness"]["Customer"]["source"] == "delta"
    wait_until(lambda: direct.exists(row_key("Customer", 0, key)), timeout_s=30,
               what="the row re-warmed")

    body = gql(client, LIST)
    _check_list(body, gateway_shop)
    seen = body["extensions"]["freshness"]["Order"]
    assert seen["source"] == "delta" and seen["version"] == gateway_shop.order_versions[-1]
    # The list found the indexes incomplete and started a full re-warm; then Redis serves.
    wait_until(lambda: direct.hexists(meta_key("Order"), complete_field(0)), timeout_s=30,
               what="a full re-warm")
    body = gql(client, LIST)
    _check_list(body, gateway_shop)
    assert body["extensions"]["freshness"]["Order"] == {
        **body["extensions"]["freshness"]["Order"], "source": "redis",
        "version": gateway_shop.order_versions[-1]}
    direct.close()


def test_flushed_redis_still_answers_correctly(client, gateway_shop, own_redis):
    direct = redis.Redis.from_url(own_redis.url)
    key, want = sorted(gateway_shop.orders.items())[5]
    lookup = f'{{ order(orderId: "{key}") {{ status amount }} }}'
    for query in (LIST, lookup):  # learned: compiled plans answer from here on
        data(client, query)
        assert client.app.state.fast.plans[(query, None)] is not None
    direct.flushdb()
    _check_list(gql(client, LIST), gateway_shop)
    got = data(client, lookup)["order"]
    assert got == {"status": want["status"], "amount": pytest.approx(want["amount"])}
    direct.close()


def test_stopped_redis_still_answers_from_delta(client, gateway_shop, own_redis):
    own_redis.stop()
    body = gql(client, LIST)
    _check_list(body, gateway_shop)
    assert body["extensions"]["freshness"]["Order"]["source"] == "delta"
    key, want = sorted(gateway_shop.customers.items())[2]
    body = gql(client, f'{{ customer(customerId: "{key}") {{ name stats {{ orderCount }} '
                       'orders(first: 500) { orderId } } }')
    assert body["data"]["customer"]["name"] == want["name"]
    assert {o["orderId"] for o in body["data"]["customer"]["orders"]} == {
        k for k, o in gateway_shop.orders.items() if o["customer_id"] == key}
    body = gql(client, "{ orders(first: 1) { totalCount } }",
               extensions={"minVersion": {"Order": gateway_shop.order_versions[-1]}})
    assert body["extensions"]["freshness"]["Order"]["version"] >= gateway_shop.order_versions[-1]
