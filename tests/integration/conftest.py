"""The demo shop as the real engine writes it, for the gateway tests: run once per session
over fixed demo events into Redis (its own database) and Delta, then served by the app."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis
from shop_views import catalog_on, expected_customers, isolated, produce, run_once, shop_events
from starlette.testclient import TestClient

from schema.catalog import Catalog
from schema.settings import Settings
from schema.storage import ViewMeta, meta_key


@dataclass
class Shop:
    settings: Settings
    catalog: Catalog
    customers: dict[str, dict]  # the latest row per customer
    orders: dict[str, dict]  # the latest row per order (deleted ones left out), as produced
    topics: dict[str, str]  # source name -> topic
    order_versions: list[int]  # the Order view's version after each engine run with orders
    changed_order: tuple[str, dict]  # an order whose status the last run changed (old row)


@pytest.fixture(scope="session")
def gateway_shop(spark, settings: Settings, tmp_path_factory) -> Shop:
    settings = isolated(settings, tmp_path_factory.mktemp("gateway-shop"), redis_db=2)
    catalog = catalog_on("gateway-test")
    topics = {s.name: s.topic for s in catalog.sources.values()}
    customers, orders = shop_events("gateway-test", seed=11, count=900)
    # Customers first, so every order finds its customer (stream-static join).
    produce(settings.kafka_bootstrap, customers)
    run_once(spark, settings, catalog)
    produce(settings.kafka_bootstrap, orders)
    run_once(spark, settings, catalog)
    versions = [order_version(settings)]
    # A second version of the Order view, for time travel: one order changes status.
    latest = expected_customers(orders)
    key, old = next((k, r) for k, r in sorted(latest.items()) if r["status"] == "placed")
    new = dict(old, status="refunded")
    produce(settings.kafka_bootstrap, [(topics["orders"], key, json.dumps(new).encode())])
    run_once(spark, settings, catalog)
    versions.append(order_version(settings))
    latest[key] = new
    return Shop(settings, catalog, expected_customers(customers), latest, topics, versions,
                (key, old))


def order_version(settings: Settings) -> int:
    client = redis.Redis.from_url(settings.redis_url)
    try:
        return ViewMeta.from_fields(client.hgetall(meta_key("Order"))).version
    finally:
        client.close()


@pytest.fixture(scope="session")
def gateway_client(gateway_shop: Shop) -> Iterator[TestClient]:
    from gateway.app import create_app

    with TestClient(create_app(gateway_shop.settings, gateway_shop.catalog)) as client:
        yield client
