"""The gateway process's one reader of every view's change feed.

A confluent-kafka consumer in a thread of its own, with a manual assignment of each view's
feed topic (one partition) and no consumer group: every gateway process sees every event
and serves its own subscribers, with no coordination. It starts at the end of each topic
(subscribers that resume read history with gateway.subscriptions.feed_history) and hands
events to the asyncio loop in batches, waiting for each batch to be dispatched, so a burst
of events never piles up in memory here.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, TopicPartition

from schema.storage import ChangeEvent

log = logging.getLogger("viewgate.gateway.feed")

BATCH_EVENTS = 256  # events per hand-over: bounded work per loop turn
MISSING_TOPIC_RETRY_S = 1.0


@dataclass(frozen=True)
class FeedEvent:
    view: str
    offset: int
    event: ChangeEvent


Dispatch = Callable[[list[FeedEvent]], Awaitable[None]]


def consumer_config(bootstrap: str) -> dict[str, object]:
    # A group id is only a name here: nothing subscribes and no offset is committed.
    return {"bootstrap.servers": bootstrap, "group.id": f"viewgate-gateway-{uuid.uuid4()}",
            "enable.auto.commit": False, "enable.auto.offset.store": False}


def parse(view: str, message) -> FeedEvent | None:
    try:
        return FeedEvent(view, message.offset(), ChangeEvent.from_bytes(message.value()))
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("skipping change event %s@%d: %s", message.topic(), message.offset(), exc)
        return None


class FeedConsumer:
    def __init__(self, bootstrap: str, topics: Mapping[str, str], dispatch: Dispatch) -> None:
        self.bootstrap = bootstrap
        self.topics = dict(topics)  # view -> topic
        self.views = {t: v for v, t in self.topics.items()}
        self.dispatch = dispatch
        # The offset each view's next dispatched event will have: a subscriber registered
        # now receives every event from there on (read and written on the loop only).
        self.positions: dict[str, int] = {}
        self.assigned: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ready: asyncio.Event | None = None
        self._listed = False  # topics listed once: later ones are read from their start
        # Wall-clock ms when the batch being dispatched came out of the consumer (set by
        # the reader thread before it hands the batch over and waits for its dispatch).
        self.received_ms = 0.0

    async def start(self, timeout_s: float = 30) -> None:
        """Start reading; returns once every existing feed topic is assigned at its end
        (or Kafka did not answer: then it keeps trying in the background)."""
        loop = asyncio.get_running_loop()
        self._ready = asyncio.Event()
        self._thread = threading.Thread(target=self._run, args=(loop,), name="viewgate-feed",
                                        daemon=True)
        self._thread.start()
        await asyncio.wait_for(self._ready.wait(), timeout_s)

    async def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

    @property
    def ready(self) -> bool:
        """Started, and every view's feed topic assigned."""
        return self._ready is not None and self._ready.is_set() \
            and len(self.assigned) == len(self.topics)

    def _assign_new(self, consumer: Consumer, loop: asyncio.AbstractEventLoop) -> None:
        """Assign the topics that exist now: at their end when the gateway starts, from
        the beginning when one appears later (all of it is new then)."""
        existing = consumer.list_topics(timeout=10).topics
        new = [t for v, t in self.topics.items() if v not in self.assigned and t in existing]
        partitions = []
        for topic in new:
            start = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1] \
                if not self._listed else 0
            partitions.append(TopicPartition(topic, 0, start))
        self._listed = True
        if partitions:
            consumer.incremental_assign(partitions)
            self.assigned.update(self.views[p.topic] for p in partitions)
            starts = {self.views[p.topic]: p.offset for p in partitions}
            loop.call_soon_threadsafe(self.positions.update, starts)

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        consumer = Consumer(consumer_config(self.bootstrap))
        try:
            self._assign_new(consumer, loop)
        except KafkaException as exc:  # Kafka down: queries still work; keep trying
            log.warning("cannot read the change feed yet: %s", exc)
        assert self._ready is not None
        loop.call_soon_threadsafe(self._ready.set)
        next_check = time.monotonic() + MISSING_TOPIC_RETRY_S
        try:
            while not self._stop.is_set():
                if len(self.assigned) < len(self.topics) and time.monotonic() >= next_check:
                    next_check = time.monotonic() + MISSING_TOPIC_RETRY_S
                    try:
                        self._assign_new(consumer, loop)
                    except KafkaException as exc:
                        log.warning("cannot read the change feed yet: %s", exc)
                messages = _next_messages(consumer)
                batch = [e for e in (self._event(m) for m in messages) if e is not None]
                if batch and not self._stop.is_set():
                    self.received_ms = time.time() * 1000
                    asyncio.run_coroutine_threadsafe(self._deliver(batch), loop).result()
        except Exception:  # the loop shutting down under us, or a bug: say so, stop
            if not self._stop.is_set():
                log.exception("the change-feed reader stopped")
        finally:
            consumer.close()

    def _event(self, message) -> FeedEvent | None:
        if message.error():
            log.warning("change feed: %s", message.error())
            return None
        return parse(self.views[message.topic()], message)

    async def _deliver(self, batch: list[FeedEvent]) -> None:
        await self.dispatch(batch)
        # Only once dispatched: a subscriber registering meanwhile was sent these events.
        for item in batch:
            self.positions[item.view] = max(self.positions.get(item.view, 0), item.offset + 1)


def _next_messages(consumer: Consumer, wait_s: float = 0.2) -> list:
    """The next message as soon as it arrives (waiting at most `wait_s`), with whatever
    else has arrived already. (`consume(n, timeout)` alone waits for n messages or the
    whole timeout: up to 200 ms more latency for every change.)"""
    first = consumer.poll(wait_s)
    if first is None:
        return []
    return [first, *consumer.consume(BATCH_EVENTS - 1, timeout=0)]
