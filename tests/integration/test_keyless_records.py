"""Records produced without a Kafka key (many producers set none) are valid: an upsert view
keeps each one by its value's key field, not all of a batch's keyless records as one. The
graph's batch function runs here as Spark's foreachBatch would call it, over real Kafka
records, on the driver's read and on the tasks' (engine.task_read)."""

from __future__ import annotations

import json

import pytest
import redis
from confluent_kafka import Producer
from shop_views import catalog_on, isolated, redis_rows

from engine.graph import GraphBatch, graph_sources
from engine.runner import prepare

pytestmark = pytest.mark.integration


def _order(order_id: str, amount: float) -> bytes:
    return json.dumps({"order_id": order_id, "customer_id": "C1", "product_id": "P1",
                       "amount": amount, "status": "placed",
                       "ts": "2024-01-01T00:00:00Z"}).encode()


@pytest.mark.parametrize("task_read", [False, True], ids=["driver-read", "task-read"])
def test_orders_without_a_kafka_key_are_each_kept(spark, settings, tmp_path, task_read):
    settings = isolated(settings, tmp_path, redis_db=27).model_copy(
        update={"engine_task_read": task_read})
    client = redis.Redis.from_url(settings.redis_url)
    client.flushdb()
    prefix = f"keyless{'tasks' if task_read else ''}"
    catalog = catalog_on(prefix)
    orders, customers = f"{prefix}.orders", f"{prefix}.customers"
    generations, schemas = prepare(spark, settings, catalog)
    # One partition, so that "later" is defined (keyless records of one order in two
    # partitions have no order between them).
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap,
                         "enable.idempotence": True})
    producer.produce(customers, key="C1", value=json.dumps(
        {"customer_id": "C1", "name": "Ada", "tier": "gold", "country": "NL"}).encode())
    for key, value in [(None, _order("K1", 1.0)), (None, _order("K2", 2.0)),
                       (None, _order("K1", 3.0)),  # K1 again: the later one wins
                       ("K3", _order("K3", 4.0)),
                       (None, _order("K3", 5.0))]:  # keyed before, keyless now: one order
        producer.produce(orders, key=key, value=value, partition=0)
    assert producer.flush(60) == 0
    step = GraphBatch(spark, settings, catalog, generations, schemas,
                      str(tmp_path / "checkpoint"), dead_letters=False)
    assert (step.task_read is not None) == task_read
    raw = (spark.read.format("kafka")
           .option("kafka.bootstrap.servers", settings.kafka_bootstrap)
           .option("subscribe", ",".join(s.topic for s in graph_sources(catalog)))
           .option("startingOffsets", "earliest").load())
    step(raw, 0)  # the records as the graph query's batch holds them

    rows = redis_rows(client, "OrderRecord")
    assert {k: r["amount"] for k, r in rows.items()} == {"K1": 3.0, "K2": 2.0, "K3": 5.0}
    stats = redis_rows(client, "CustomerStats")
    assert stats["C1"]["order_count"] == 3
    client.close()
