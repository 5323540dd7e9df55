"""Publish one change event per changed row to the view's change-feed topic.

At least once: a replayed batch publishes again with the same version, and consumers
drop (view, key, version) they have seen. Published only after Redis holds the rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from confluent_kafka import KafkaException, Producer

from schema.storage import ChangeEvent, keyed_bytes


class ChangeFeed:
    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.failures: list[str] = []  # deliveries failed since the last wait
        failures = self.failures

        def delivered(err, _msg) -> None:
            # Not a method: the producer would then hold the feed, and the two would go
            # only with a full collection (engine.collector), not when the feed does.
            if err is not None:
                failures.append(str(err))

        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 2,
                # A throughput batch sends tens of thousands of JSON events: compressed in
                # librdkafka's own threads (no interpreter), the broker takes fewer bytes
                # (the batch's feed step 78-107 -> 71 ms in two pairs, 2026-11-29).
                "compression.type": "lz4",
                # A delivery report only for a message that failed: a Python callback for
                # each of a large batch's tens of thousands of events cost more CPU than
                # producing them; flush() still waits for every delivery.
                "delivery.report.only.error": True,
                # The producer's callback, not one given to each produce() call: with the
                # callback and keywords in every call, 14,000 events took 14-28 ms to
                # queue, against 11-13 ms.
                "on_delivery": delivered,
            }
        )

    def close(self) -> None:
        close_producer(self.producer)

    def publish(self, events: Sequence[ChangeEvent], timeout_s: float = 60) -> int:
        return self.send(events)(timeout_s)

    def send(self, events: Sequence[ChangeEvent]) -> Callable[[float], int]:
        """Queue `events` for delivery; the function returned waits until the broker has
        them all (or fails: KafkaException). Several feeds' deliveries then overlap."""
        produce, topic = self.producer.produce, self.topic
        count = 0
        for text, value in keyed_bytes(events):
            key = text.encode()
            while True:
                try:
                    produce(topic, value, key)
                    break
                except BufferError:
                    self.producer.poll(0.1)  # local queue full: let deliveries drain
            count += 1

        def wait(timeout_s: float = 60) -> int:
            remaining = self.producer.flush(timeout_s)
            failures = self.failures.copy()
            self.failures.clear()  # the list the producer's callback appends to
            if remaining or failures:
                # Failing the batch makes Spark retry it; a replay republishes.
                raise KafkaException(
                    f"change feed {self.topic}: {remaining} undelivered, errors: {failures[:3]}"
                )
            return count
        return wait


def close_producer(producer: Producer) -> None:
    """Stop `producer`'s threads and connections, dropping what it has not delivered (a
    batch waits for its deliveries: one that did not failed, and its replay sends again).
    Closing a closed producer does nothing."""
    try:
        producer.purge()
    except RuntimeError:  # closed already
        return
    producer.close()
