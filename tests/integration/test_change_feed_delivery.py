"""The change feed's producer (engine.sinks.changefeed) against a real broker: what it
queues arrives, in order, and a delivery the broker refuses fails the batch's wait."""

from __future__ import annotations

import secrets
import time

import pytest
from confluent_kafka import Consumer, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from engine.sinks.changefeed import ChangeFeed
from schema.storage import ChangeEvent

pytestmark = pytest.mark.integration


def _create_topic(bootstrap: str, topic: str, **config: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until the topic is
    created = admin.create_topics(
        [NewTopic(topic, num_partitions=1, replication_factor=1, config=config)])
    created[topic].result(timeout=30)


def _event(i: int, text: str = "") -> ChangeEvent:
    return ChangeEvent("Order", f"o-{i}", "insert", {"order_id": f"o-{i}", "note": text}, None,
                       3, 1, 1_000)


def _read(bootstrap: str, topic: str, count: int) -> list[tuple[bytes, bytes]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{topic}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    got: list[tuple[bytes, bytes]] = []
    try:
        deadline = time.monotonic() + 60
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                got.append((message.key(), message.value()))
    finally:
        consumer.close()
    return got


def test_every_event_queued_arrives_in_order_with_its_key(settings, unique):
    topic = f"feed-{unique}"
    _create_topic(settings.kafka_bootstrap, topic)
    events = [_event(i) for i in range(2_000)]
    assert ChangeFeed(settings.kafka_bootstrap, topic).publish(events, timeout_s=60) == 2_000
    got = _read(settings.kafka_bootstrap, topic, len(events))
    assert got == [(e.key.encode(), e.to_bytes()) for e in events]


def test_a_delivery_the_broker_refuses_fails_the_wait_and_names_the_error(settings, unique):
    topic = f"feed-{unique}"
    _create_topic(settings.kafka_bootstrap, topic, **{"max.message.bytes": "2000"})
    feed = ChangeFeed(settings.kafka_bootstrap, topic)
    # Random text: the feed compresses its batches (lz4), and the limit is on their size.
    wait = feed.send([_event(1), _event(2, secrets.token_hex(5_000)), _event(3)])
    with pytest.raises(KafkaException, match="MSG_SIZE_TOO_LARGE|too large"):
        wait(30)
    # The failure went with the wait that reported it: the next batch starts clean.
    assert feed.publish([_event(4)], timeout_s=30) == 1
