"""Reading a view's change feed back (gateway.subscriptions.feed_history) against a real
Kafka topic: where the changes after a version begin, and a replay of them. A short replay
(the last few versions) must not be slower than a long one."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from gateway.subscriptions.feed_history import FeedHistory
from schema.storage import ChangeEvent

pytestmark = pytest.mark.integration

VERSIONS = 120
EVENTS_PER_VERSION = 5


@pytest.fixture(scope="module")
def feed_topic(settings) -> str:
    """A one-partition feed topic holding VERSIONS versions of EVENTS_PER_VERSION events."""
    topic = f"history-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap,
                         "enable.idempotence": True, "linger.ms": 5})
    for version in range(1, VERSIONS + 1):
        for i in range(EVENTS_PER_VERSION):
            event = ChangeEvent("Order", f"O{i:03d}", "update", {"order_id": f"O{i:03d}"},
                                {"order_id": f"O{i:03d}"}, version, 0, 1_700_000_000_000)
            producer.produce(topic, event.to_bytes(), key=event.key)
    assert producer.flush(30) == 0
    return topic


async def _resume(history: FeedHistory, topic: str, after_version: int) -> tuple[float, list]:
    """Seconds to the first replayed chunk of the changes after `after_version`, and all of
    the replay's versions."""
    started = time.perf_counter()
    low, high = await history.bounds(topic)
    start, _ = await history.start_after_version("Order", topic, 0, after_version, low, high)
    first_s = None
    versions = []
    async for chunk in history.replay("Order", topic, start, high):
        if first_s is None:
            first_s = time.perf_counter() - started
        versions += [item.event.version for item in chunk]
    assert first_s is not None
    return first_s, versions


def test_a_short_replay_is_not_slower_than_a_long_one(settings, feed_topic):
    history = FeedHistory(settings.kafka_bootstrap)
    timings = {}
    for back in (80, 3, 1):
        after = VERSIONS - back
        first_s, versions = asyncio.run(_resume(history, feed_topic, after))
        # Exactly the changes after that version, in order.
        assert versions == [v for v in range(after + 1, VERSIONS + 1)
                            for _ in range(EVENTS_PER_VERSION)]
        timings[back] = first_s
    print(f"first replayed chunk after head-80: {timings[80]:.3f} s, head-3: "
          f"{timings[3]:.3f} s, head-1: {timings[1]:.3f} s")
    # Generous: before the fix every resume near the end took about 5 s (each bisection
    # step waited on the broker's 500 ms fetch wait), after it well under one.
    assert timings[3] < 3.0 and timings[1] < 3.0, timings



class _WatchedConsumer:
    """A real consumer that notes whether it was closed while a `consume` was running, and
    says when it starts reading past `total` messages (a read that must wait)."""

    def __init__(self, consumer, total: int, waiting: threading.Event,
                 closed: threading.Event) -> None:
        self.consumer = consumer
        self.total, self.returned = total, 0
        self.waiting, self.closed = waiting, closed
        self.reading = False
        self.closed_while_reading: bool | None = None

    def assign(self, partitions) -> None:
        self.consumer.assign(partitions)

    def consume(self, n: int, timeout: float):
        self.reading = True
        if self.returned >= self.total:
            self.waiting.set()
        try:
            messages = self.consumer.consume(n, timeout=timeout)
            self.returned += len(messages)
            return messages
        finally:
            self.reading = False

    def close(self) -> None:
        self.closed_while_reading = self.reading
        self.consumer.close()
        self.closed.set()


class _WatchedHistory(FeedHistory):
    def __init__(self, bootstrap: str, total: int) -> None:
        super().__init__(bootstrap)
        self.total = total
        self.waiting, self.closed = threading.Event(), threading.Event()
        self.watched: _WatchedConsumer | None = None

    def _consumer(self):
        self.watched = _WatchedConsumer(super()._consumer(), self.total, self.waiting,
                                        self.closed)
        return self.watched


def test_a_replay_ended_mid_read_closes_its_consumer_after_the_read(settings, feed_topic):
    """A subscription that completes while its replay waits on Kafka (here: a range past
    the topic's end, so the next read waits) ends cleanly, and the consumer is closed only
    once that read returned. Closed beside it, confluent-kafka crashed the gateway."""
    total = VERSIONS * EVENTS_PER_VERSION
    history = _WatchedHistory(settings.kafka_bootstrap, total)

    async def main() -> int:
        got: list = []

        async def replay() -> None:
            async for chunk in history.replay("Order", feed_topic, 0, total + 1_000):
                got.extend(chunk)

        task = asyncio.create_task(replay())
        assert await asyncio.to_thread(history.waiting.wait, 30), "no read past the end"
        task.cancel()  # while the worker thread is in `consume`, waiting for more
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await asyncio.to_thread(history.closed.wait, 30), "never closed"
        return len(got)

    assert asyncio.run(main()) == total
    assert history.watched is not None and history.watched.closed_while_reading is False
