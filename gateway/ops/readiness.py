"""/readyz: whether this gateway should get traffic. Ready when Redis answers, the change
feed is assigned, and every view has committed and is caught up: no source events waiting
longer than `gateway_ready_max_lag_s` since the view's last commit. A view that never
committed keeps the gateway not ready (its answers would be empty)."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Mapping
from typing import Any

import redis.asyncio as aioredis
from confluent_kafka import Consumer, KafkaException, TopicPartition
from starlette.requests import Request
from starlette.responses import JSONResponse

from schema.catalog import Catalog
from schema.settings import Settings
from schema.storage import ViewMeta, meta_key


class EndOffsets:
    """The sources' end offsets, from one long-lived consumer (not one per probe), read at
    most once per `ttl_s` however often /readyz is probed."""

    def __init__(self, bootstrap: str, topics: list[str], ttl_s: float = 1.0,
                 timeout_s: float = 3) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self._consumer: Consumer | None = None
        self._lock = threading.Lock()  # a consumer is not safe to share between threads
        self._read_at = -math.inf
        self._last: dict[str, dict[str, int]] | None = None

    def read(self) -> dict[str, dict[str, int]] | None:
        """topic -> partition -> next offset; None if Kafka does not answer."""
        with self._lock:
            if time.monotonic() - self._read_at < self.ttl_s:
                return self._last
            if self._consumer is None:
                self._consumer = Consumer({"bootstrap.servers": self.bootstrap,
                                           "group.id": "viewgate-readyz",
                                           "enable.auto.commit": False})
            try:
                self._last = self._read(self._consumer)
            except KafkaException:
                self._last = None
            self._read_at = time.monotonic()
            return self._last

    def _read(self, consumer: Consumer) -> dict[str, dict[str, int]]:
        metadata = consumer.list_topics(timeout=self.timeout_s)
        out: dict[str, dict[str, int]] = {}
        for topic in self.topics:
            found = metadata.topics.get(topic)
            out[topic] = {} if found is None else {
                str(p): consumer.get_watermark_offsets(TopicPartition(topic, p),
                                                       timeout=self.timeout_s)[1]
                for p in found.partitions}
        return out

    def close(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None


def end_offsets(bootstrap: str, topics: list[str]) -> dict[str, dict[str, int]] | None:
    """Once, for a command line: topic -> partition -> next offset; None if Kafka is down."""
    offsets = EndOffsets(bootstrap, topics, ttl_s=0)
    try:
        return offsets.read()
    finally:
        offsets.close()


def view_problems(catalog: Catalog, metas: Mapping[str, ViewMeta],
                  ends: Mapping[str, Mapping[str, int]] | None, now_ms: float,
                  max_lag_s: float) -> dict[str, str]:
    """View -> why it is not ready (views that are ready are left out)."""
    problems = {}
    for name, view in catalog.views.items():
        meta = metas[name]
        if meta.version < 0:
            problems[name] = "never committed"
            continue
        if ends is None:
            continue  # Kafka unreachable: the gateway can still serve what it has
        topic = catalog.source_of(view).topic
        waiting = meta.behind(topic, ends.get(topic, {}))
        age_s = (now_ms - meta.committed_at_ms) / 1000
        if waiting and age_s > max_lag_s:
            problems[name] = (f"{waiting} source events waiting; last commit {age_s:.0f} s ago "
                              f"(gateway_ready_max_lag_s={max_lag_s:g})")
    return problems


def readyz_endpoint(catalog: Catalog, settings: Settings, redis_client: aioredis.Redis,
                    feed_ready: Any, offsets: EndOffsets):

    async def readyz(_: Request) -> JSONResponse:
        checks: dict[str, Any] = {}
        try:
            async with redis_client.pipeline(transaction=False) as pipe:
                for name in catalog.views:
                    pipe.hgetall(meta_key(name))
                fields = await pipe.execute()
            metas = {n: ViewMeta.from_fields(f) for n, f in zip(catalog.views, fields,
                                                                 strict=True)}
            checks["redis"] = "ok"
        except Exception as exc:  # noqa: BLE001 - any failure means not ready
            return JSONResponse({"ready": False, "redis": f"unreachable: {exc}"}, 503)
        checks["changeFeed"] = "ok" if feed_ready() else "not assigned yet"
        ends = await asyncio.to_thread(offsets.read)
        checks["kafka"] = "ok" if ends is not None else "unreachable: lag unknown"
        views = view_problems(catalog, metas, ends, time.time() * 1000,
                              settings.gateway_ready_max_lag_s)
        checks["views"] = {name: views.get(name, "ok") for name in catalog.views}
        ready = checks["changeFeed"] == "ok" and not views
        return JSONResponse({"ready": ready, **checks}, 200 if ready else 503)

    return readyz
