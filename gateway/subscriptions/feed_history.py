"""Reading a view's change feed backwards from the live end, for subscriptions that resume:
its retained range, where the changes after a version begin, and the events between two
offsets. Each call uses a short-lived consumer in a worker thread (the live reader,
gateway.subscriptions.feed, never seeks).

These consumers read what is already written, so they never let the broker hold a fetch
open waiting for new records (`fetch.wait.max.ms`, 500 ms by default). With the default,
every read that reached the end of the topic left such a fetch outstanding, and the next
position the bisection jumped to was fetched only after it: about half a second per step.
A resume a few versions back (all of its steps near the end) took 5 s, more than one 80
versions back."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from gateway.subscriptions.feed import FeedEvent, consumer_config, parse

CHUNK_EVENTS = 500
READ_TIMEOUT_S = 30.0
FETCH_WAIT_MS = 10  # how long the broker may hold a fetch waiting for new records


class FeedHistory:
    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap

    def _consumer(self) -> Consumer:
        return Consumer({**consumer_config(self.bootstrap),
                         "fetch.wait.max.ms": FETCH_WAIT_MS})

    async def bounds(self, topic: str) -> tuple[int, int]:
        """(low, high): the first retained offset and the next offset to be written."""
        def read() -> tuple[int, int]:
            consumer = self._consumer()
            try:
                return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
            finally:
                consumer.close()
        return await asyncio.to_thread(read)

    async def start_after_version(self, view: str, topic: str, generation: int, version: int,
                                  low: int, high: int) -> tuple[int, int | None]:
        """(start, first): the offset from which replaying finds every event of `generation`
        with a version above `version`, and the version of that generation's first retained
        event (None: none retained). Bisection: versions rise along the feed within a
        generation; other generations' events are stepped over."""
        def search() -> tuple[int, int | None]:
            consumer = self._consumer()
            try:
                first = self._first_of(consumer, view, topic, generation, low, high)
                lo, hi = low, high
                while lo < hi:
                    mid = (lo + hi) // 2
                    found = self._first_of(consumer, view, topic, generation, mid, high)
                    if found is None or found[1] > version:
                        hi = mid
                    else:
                        lo = found[0] + 1  # nothing up to that event is above `version`
                return lo, first[1] if first else None
            finally:
                consumer.close()
        return await asyncio.to_thread(search)

    def _first_of(self, consumer: Consumer, view: str, topic: str, generation: int,
                  offset: int, high: int) -> tuple[int, int] | None:
        """(offset, version) of the first event of `generation` at or after `offset`."""
        chunks = self._chunks(consumer, topic, view, offset, high)
        try:
            for chunk in chunks:
                for item in chunk:
                    if item.event.generation == generation:
                        return item.offset, item.event.version
        finally:
            chunks.close()
        return None

    def _chunks(self, consumer: Consumer, topic: str, view: str, start: int, end: int,
                stop: threading.Event | None = None):
        """Events [start, end) in chunks, until `stop` is set; raises TimeoutError if Kafka
        stops answering."""
        if start >= end:
            return
        consumer.assign([TopicPartition(topic, 0, start)])
        position = start
        deadline = time.monotonic() + READ_TIMEOUT_S
        while position < end and not (stop is not None and stop.is_set()):
            messages = consumer.consume(min(CHUNK_EVENTS, end - position), timeout=0.5)
            chunk = []
            for message in messages:
                if message.error() or message.offset() >= end:
                    continue
                position = message.offset() + 1
                item = parse(view, message)
                if item is not None:
                    chunk.append(item)
            if messages:
                deadline = time.monotonic() + READ_TIMEOUT_S
                yield chunk
            elif time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} from offset {position} timed out")

    async def replay(self, view: str, topic: str, start: int,
                     end: int) -> AsyncIterator[list[FeedEvent]]:
        """The events [start, end) in chunks, read chunk by chunk on a worker thread of the
        replay's own. Its consumer is opened, read and closed on that thread, in order: a
        replay ended while a read is in flight (its subscription completed, its client
        gone) closes the consumer after that read, never beside it. Closing a
        confluent-kafka consumer while another thread is in its `consume` crashed the
        gateway (a segmentation fault, seen in tests/integration/test_every_field.py)."""
        loop = asyncio.get_running_loop()
        worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="viewgate-replay")
        stop = threading.Event()  # ends a read in flight at its next poll (0.5 s at most)
        reading: dict[str, Any] = {}

        def read() -> list[FeedEvent] | None:
            if "chunks" not in reading:
                reading["consumer"] = consumer = self._consumer()
                reading["chunks"] = self._chunks(consumer, topic, view, start, end, stop)
            return next(reading["chunks"], None)

        def close() -> None:
            if "chunks" in reading:
                reading["chunks"].close()
                reading["consumer"].close()

        try:
            while True:
                chunk = await loop.run_in_executor(worker, read)
                if chunk is None:
                    return
                yield chunk
        finally:
            stop.set()
            closed = loop.run_in_executor(worker, close)  # queued after a read in flight
            worker.shutdown(wait=False)
            await closed
