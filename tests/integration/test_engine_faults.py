"""The engine (`viewgate engine`, a process of its own) while the services under it fail:
its Kafka broker restarts, then its Redis goes away and comes back empty. It reconnects by
itself (a query that failed is restarted from its checkpoint) and nothing is lost or
counted twice."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from engine_process import EngineProcess, delta_rows, delta_stats_exact, in_time_events
from shop_views import (
    expected_customers,
    isolated,
    produce,
    view_mismatches,
)

from schema.storage import meta_key
from viewgate.stack.kafka import KafkaBroker
from viewgate.stack.process import free_port, wait_until
from viewgate.stack.redis_server import RedisServer

pytestmark = pytest.mark.integration

PREFIX = "faults"


@pytest.fixture
def broker(base_settings, tmp_path) -> Iterator[KafkaBroker]:
    """A broker of this test's own, so restarting it disturbs no other test."""
    broker = KafkaBroker(tmp_path / "kafka", free_port(), base_settings.jar_dir / "kafka")
    broker.start(timeout_s=base_settings.startup_timeout_s)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def own_redis(tmp_path) -> Iterator[RedisServer]:
    """A Redis of this test's own (without persistence: a restart empties it)."""
    server = RedisServer(tmp_path / "redis", free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_engine_rides_out_a_kafka_restart_and_a_redis_outage(broker, own_redis, settings,
                                                             tmp_path):
    settings = isolated(settings, tmp_path / "data", redis_db=0).model_copy(
        update={"kafka_bootstrap": broker.bootstrap, "redis_url": own_redis.url})
    client = redis.Redis.from_url(settings.redis_url)
    engine = EngineProcess(settings, tmp_path, PREFIX)
    customers, orders = in_time_events(PREFIX, 1500)
    thirds = [orders[: len(orders) // 3], orders[len(orders) // 3: 2 * len(orders) // 3],
              orders[2 * len(orders) // 3:]]
    try:
        # Customers first, so every order's enrichment finds its customer (stream-static
        # join on the Customer view's Delta table).
        produce(broker.bootstrap, customers)
        engine.start()
        want_customers = len(expected_customers(customers))
        wait_until(lambda: delta_rows(settings, "Customer") == want_customers,
                   timeout_s=240, what="the customers to be in Delta")
        produce(broker.bootstrap, thirds[0])
        wait_until(lambda: view_mismatches(client, customers, thirds[0]) == [],
                   timeout_s=240, what="every view to match the first orders")

        broker.stop()
        wait_until(lambda: "could not be established" in engine.log_tail(), timeout_s=120,
                   what="the engine to notice that Kafka is gone")
        broker.start(timeout_s=settings.startup_timeout_s)
        produce(broker.bootstrap, thirds[1])
        wait_until(lambda: view_mismatches(client, customers, thirds[0] + thirds[1]) == [],
                   timeout_s=300, what="every view to match after the broker came back")

        own_redis.stop()
        produce(broker.bootstrap, thirds[2])
        wait_until(lambda: "restarting in" in engine.log_tail(), timeout_s=180,
                   what="a view's query to fail on the missing Redis and be restarted")
        own_redis.start()
        # Redis came back empty: the engine writes what it commits from now on (the gateway
        # re-warms the rest from Delta), and Delta holds every order exactly once.
        wait_until(lambda: delta_stats_exact(settings, orders), timeout_s=300,
                   what="CustomerStats in Delta to count every placed order once")
        assert client.hget(meta_key("CustomerStats"), "version") is not None
        assert engine.process.poll() is None, f"the engine exited:\n{engine.log_tail()}"
    finally:
        engine.stop()
        client.close()
