"""The change feed fanned out to this process's subscribers.

One FeedConsumer per process hands batches of events here. Each event is checked once:
events of a generation other than the one the view serves are dropped (a rebuild's
catch-up), and so are repeats (the feed is at least once; repeats.RepeatFilter). The
subscriber index then says who receives it. When a rebuild switches a view's
generation, live values are read again and change subscribers are told to start over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.reads.filters import QueryError
from gateway.reads.reads import Reads
from gateway.reads.redis_store import RedisUnavailable
from gateway.subscriptions.feed import FeedConsumer, FeedEvent
from gateway.subscriptions.feed_history import FeedHistory
from gateway.subscriptions.repeats import RepeatFilter
from gateway.subscriptions.subscribers import SubscriberIndex
from schema.catalog import Catalog
from schema.settings import Settings
from schema.storage import changefeed_topic, read_current_generation

log = logging.getLogger("viewgate.gateway.fanout")

GENERATION_CHECK_S = 1.0  # how soon a switch without new events is noticed
FANOUT_NOTED = 1000  # a batch delivering this many messages is noted (FanoutStats.last_fanout)


@dataclass
class FanoutStats:
    delivered: int = 0  # messages put in subscriber buffers
    repeats: int = 0  # events dropped as already seen
    overflows: int = 0  # clients closed for reading too slowly
    evaluations: int = 0  # live list evaluations
    generation_switches: dict[str, int] = field(default_factory=dict)
    # The last batch that put at least FANOUT_NOTED messages in subscriber buffers: when the
    # feed reader had it, when its dispatch began (wall-clock ms), how long that took (ms),
    # the messages, and when its frames had been written (`written_ms`, set a turn of the
    # loop later). Where a change's time goes between the feed and the clients.
    last_fanout: dict[str, float] | None = None


def _note_written(noted: dict[str, float]) -> None:
    noted["written_ms"] = time.time() * 1000


class GenerationChanged:
    """Put in a live-by-key subscriber's buffer when its view switched generation."""


GENERATION_CHANGED = GenerationChanged()


def rebuilt_error(view: str, generation: int) -> QueryError:
    """For change subscribers: the feed of the new generation starts over."""
    return QueryError(
        f"view {view} was rebuilt (generation {generation}), so its changes start over: "
        "query it again and subscribe with afterVersion set to the version the query "
        "reports", "GENERATION_CHANGED", view=view, generation=generation)


class Fanout:
    def __init__(self, catalog: Catalog, settings: Settings, reads: Reads) -> None:
        self.catalog = catalog
        self.settings = settings
        self.reads = reads
        self.topics = {v: changefeed_topic(v, settings.changefeed_prefix) for v in catalog.views}
        self.index = SubscriberIndex(reads.fields)
        self.feed = FeedConsumer(settings.kafka_bootstrap, self.topics, self.dispatch)
        self.history = FeedHistory(settings.kafka_bootstrap)
        self.serving: dict[str, int] = {}
        self.stats = FanoutStats()
        self.repeats = RepeatFilter()
        self._watch: asyncio.Task | None = None
        self._stopping = False

    async def start(self) -> None:
        """Returns once the feed topics are assigned at their end: every change committed
        from then on reaches the subscribers."""
        for view in self.catalog.views:
            self.serving[view] = await self._generation(view)
        await self.feed.start()
        self._watch = asyncio.get_running_loop().create_task(self._watch_generations())

    async def stop(self) -> None:
        self._stopping = True
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await self.feed.stop()

    def position(self, view: str) -> int:
        return self.feed.positions.get(view, 0)

    # --- generations ------------------------------------------------------------------

    async def _generation(self, view: str) -> int:
        try:
            return (await self.reads.redis.meta(view)).generation
        except RedisUnavailable:
            return await asyncio.to_thread(read_current_generation,
                                           self.settings.delta_location, view)

    async def _refresh(self, view: str) -> None:
        generation = await self._generation(view)
        if generation != self.serving.get(view, 0):
            self.serving[view] = generation
            self._switched(view, generation)

    def _switched(self, view: str, generation: int) -> None:
        self.stats.generation_switches[view] = generation
        index = self.index.views[view]
        for subs in list(index.by_key.values()):
            for sub in list(subs):
                sub.put(GENERATION_CHANGED)
        error = rebuilt_error(view, generation)
        for group in list(index.filters.values()):
            for sub in list(group.subscribers):
                sub.fail(error)
        for live in list(index.lists.values()):
            live.generation_changed()

    async def _watch_generations(self) -> None:
        # The flag, not only the cancellation, ends the loop: a client library that turns
        # a cancellation into an error of its own (caught below) would leave it running,
        # and stop() waiting for it forever.
        while not self._stopping:
            await asyncio.sleep(GENERATION_CHECK_S)
            for view in self.catalog.views:
                if self._stopping:
                    return
                try:
                    await self._refresh(view)
                except Exception:  # a background check: try again next time
                    log.exception("reading %s's generation failed", view)

    # --- dispatch ---------------------------------------------------------------------

    async def dispatch(self, batch: list[FeedEvent]) -> None:
        """Deliver one batch. Every await comes first: from the first delivery on this
        runs without yielding, so a subscriber registers either before or after a batch."""
        for view in {e.view for e in batch if e.event.generation > self.serving.get(e.view, 0)}:
            await self._refresh(view)
        started, delivered = time.time(), self.stats.delivered
        for item in batch:
            self._deliver(item)
        if self.stats.delivered - delivered >= FANOUT_NOTED:
            noted = self.stats.last_fanout = {
                "received_ms": self.feed.received_ms, "dispatch_started_ms": started * 1000,
                "dispatch_ms": round((time.time() - started) * 1000, 1),
                "delivered": self.stats.delivered - delivered}
            # The frames the dispatch wrote leave at the end of the loop's turn, each
            # connection's by a callback queued meanwhile: one queued now runs after them.
            asyncio.get_running_loop().call_soon(_note_written, noted)

    def _deliver(self, item: FeedEvent) -> None:
        event = item.event
        if event.generation != self.serving.get(event.view, 0):
            return
        if self.repeats.repeat(event.view, event.generation, event.version, event.key):
            self.stats.repeats += 1
            return
        for sub, op in self.index.targets(event):
            sub.put((op, item))
            self.stats.delivered += 1
        for live in self.index.live_queries(event):
            live.changed()

    def report(self) -> Mapping[str, Any]:
        """What /subscriptions shows: for operators, tests and benchmarks."""
        lists = [live for v in self.index.views.values() for live in v.lists.values()]
        return {
            "feedReady": self.feed.ready,
            "positions": dict(self.feed.positions),
            "serving": dict(self.serving),
            "subscribers": self.index.subscriber_count()
            + sum(len(live.subscribers) for live in lists),  # type: ignore[attr-defined]
            "liveLists": len(lists),
            "delivered": self.stats.delivered,
            "repeats": self.stats.repeats,
            "overflows": self.stats.overflows,
            "evaluations": self.stats.evaluations,
            "lastFanout": self.stats.last_fanout,
        }
