"""Publish one change event per changed row to the view's change-feed topic.

At least once: a replayed batch publishes again with the same version, and consumers
drop (view, key, version) they have seen. Published only after Redis holds the rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from confluent_kafka import KafkaException, Producer

from schema.storage import ChangeEvent


class ChangeFeed:
    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 2,
                # A delivery report only for a message that failed: a Python callback for
                # each of a large batch's tens of thousands of events cost more CPU than
                # producing them; flush() still waits for every delivery.
                "delivery.report.only.error": True,
            }
        )

    def publish(self, events: Iterable[ChangeEvent], timeout_s: float = 60) -> int:
        return self.send(events)(timeout_s)

    def send(self, events: Iterable[ChangeEvent]) -> Callable[[float], int]:
        """Queue `events` for delivery; the function returned waits until the broker has
        them all (or fails: KafkaException). Several feeds' deliveries then overlap."""
        errors: list[str] = []

        def delivered(err, _msg) -> None:
            if err is not None:
                errors.append(str(err))

        count = 0
        for event in events:
            while True:
                try:
                    self.producer.produce(
                        self.topic,
                        key=event.key.encode(),
                        value=event.to_bytes(),
                        on_delivery=delivered,
                    )
                    break
                except BufferError:
                    self.producer.poll(0.1)  # local queue full: let deliveries drain
            count += 1

        def wait(timeout_s: float = 60) -> int:
            remaining = self.producer.flush(timeout_s)
            if remaining or errors:
                # Failing the batch makes Spark retry it; a replay republishes.
                raise KafkaException(
                    f"change feed {self.topic}: {remaining} undelivered, errors: {errors[:3]}"
                )
            return count
        return wait
