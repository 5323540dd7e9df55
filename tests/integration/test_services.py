"""The real pieces work together: Kafka, Spark Structured Streaming, Delta, Redis."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import redis
import redis.asyncio as aioredis
from confluent_kafka import Consumer, Producer
from deltalake import DeltaTable

from schema.delta_read import live_rows

pytestmark = pytest.mark.integration


def produce(bootstrap: str, topic: str, records: list[tuple[str, dict]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for key, value in records:
        producer.produce(topic, key=key, value=json.dumps(value))
    assert producer.flush(30) == 0, "messages were left undelivered"


def test_kafka_produce_consume_round_trip(settings, unique):
    topic = f"roundtrip-{unique}"
    sent = [(f"k{i}", {"n": i}) for i in range(20)]
    produce(settings.kafka_bootstrap, topic, sent)

    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": f"g-{unique}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    received: list[tuple[str, dict]] = []
    deadline = time.monotonic() + 60
    try:
        while len(received) < len(sent) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            received.append((message.key().decode(), json.loads(message.value())))
    finally:
        consumer.close()
    assert sorted(received) == sorted(sent)


def test_spark_streams_kafka_into_delta(spark, settings, unique, tmp_path):
    topic = f"orders-{unique}"
    events = [(f"o{i}", {"order_id": f"o{i}", "amount": i * 1.5}) for i in range(50)]
    produce(settings.kafka_bootstrap, topic, events)

    table = str(tmp_path / "delta")
    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", settings.kafka_bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("from_json(CAST(value AS STRING), 'order_id STRING, amount DOUBLE') AS v")
        .select("v.*")
    )
    query = (
        stream.writeStream.format("delta")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start(table)
    )
    assert query.awaitTermination(180), "the streaming query did not finish"
    assert query.exception() is None

    expected = {(v["order_id"], v["amount"]) for _, v in events}
    with_spark = {(r.order_id, r.amount) for r in spark.read.format("delta").load(table).collect()}
    assert with_spark == expected

    # delta-rs reads the same table without a JVM, as the gateway will.
    arrow = live_rows(DeltaTable(table))
    with_delta_rs = set(
        zip(arrow["order_id"].to_pylist(), arrow["amount"].to_pylist(), strict=True)
    )
    assert with_delta_rs == expected


def test_redis_async_round_trip(settings, unique):
    async def round_trip() -> tuple[bytes | None, list[bytes | None], int]:
        client = aioredis.Redis.from_url(settings.redis_url)
        try:
            await client.set(f"{unique}:a", b"1")
            async with client.pipeline(transaction=True) as pipe:
                pipe.set(f"{unique}:b", b"2").incr(f"{unique}:n").incr(f"{unique}:n")
                await pipe.execute()
            return (
                await client.get(f"{unique}:a"),
                await client.mget([f"{unique}:a", f"{unique}:b", f"{unique}:missing"]),
                int(await client.get(f"{unique}:n")),
            )
        finally:
            await client.aclose()

    single, many, counter = asyncio.run(round_trip())
    assert single == b"1"
    assert many == [b"1", b"2", None]
    assert counter == 2


def test_a_cluster_node_whose_bus_port_was_taken_starts_on_another(tmp_path, monkeypatch):
    import socket

    from viewgate.stack import redis_cluster
    from viewgate.stack.process import free_port
    from viewgate.stack.redis_server import RedisServer

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    ports = iter([busy])
    monkeypatch.setattr(redis_cluster, "free_port", lambda: next(ports, None) or free_port())
    node = RedisServer(tmp_path / "node", free_port(), cluster_bus_port=busy)
    servers = redis_cluster.RedisClusterServers.__new__(redis_cluster.RedisClusterServers)
    try:
        servers._start_node(node, timeout_s=30)
        assert node.cluster_bus_port != busy
        assert node.healthy()
        with redis.Redis(port=node.port) as client:
            assert client.config_get("cluster-port")["cluster-port"] == str(node.cluster_bus_port)
    finally:
        node.stop()
        taken.close()
