"""`viewgate rebuild VIEW`: recompute a view from the earliest retained offset into a new
generation beside the live one, then switch readers over atomically.

The live generation keeps serving (and the running engine keeps updating it) until the
switch. The rebuild catches up in capped batches, then once more over what arrived
meanwhile, then switches; the running engine notices and carries the new generation on
from the rebuild's checkpoint, so no event between the two is lost.
"""

from __future__ import annotations

import fcntl
import json
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from engine.analysis import analyse
from engine.generations import (
    discard_generations_above,
    reconcile_generation,
    retire_generation,
    switch_generation,
    switch_generations,
)
from engine.graph import graph_sources, graph_views, start_graph_query
from engine.maintenance import configure_table
from engine.runner import record_progress
from engine.sinks.delta_sink import ensure_table
from engine.topics import ensure_view_topics
from engine.views import start_view_query
from schema.catalog import Catalog
from schema.redis_client import connect as connect_redis
from schema.settings import Settings
from schema.storage import delta_table_path

# Rows per catch-up batch: bounds the driver's memory and shows progress as it goes.
REBUILD_BATCH_OFFSETS = 200_000


class RebuildError(RuntimeError):
    pass


@dataclass
class RebuildProgress:
    """Offsets consumed of those the log held when the rebuild started."""

    view: str
    generation: int
    done: int
    total: int


@dataclass
class RebuildResult:
    view: str
    old_generation: int
    new_generation: int
    offsets: int
    seconds: float


def log_range(bootstrap: str, topic: str, timeout_s: float = 30) -> dict[int, tuple[int, int]]:
    """{partition: (earliest retained offset, end offset)} of a topic, now."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "viewgate-rebuild-probe"})
    try:
        partitions = consumer.list_topics(topic, timeout=timeout_s).topics[topic].partitions
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)
            for p in partitions
        }
    finally:
        consumer.close()


def _consumed(query: StreamingQuery, topic: str, start: dict[int, int]) -> int:
    """Offsets the query has committed beyond `start`, from its last progress."""
    progress = query.lastProgress
    if not progress:
        return 0
    done = 0
    for source in progress.get("sources", []):
        end = json.loads(source.get("endOffset") or "{}")
        for partition, offset in end.get(topic, {}).items():
            done += max(0, int(offset) - start.get(int(partition), 0))
    return done


@contextmanager
def _exclusive(settings: Settings, view: str):
    """One rebuild of a view at a time on this machine."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    path = Path(settings.data_dir) / f".rebuild-{view}.lock"
    with path.open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RebuildError(f"a rebuild of {view} is already running here") from None
        yield


def rebuild_view(
    spark: SparkSession,
    settings: Settings,
    catalog: Catalog,
    view_name: str,
    on_progress: Callable[[RebuildProgress], None] = lambda _: None,
    batch_offsets: int = REBUILD_BATCH_OFFSETS,
) -> RebuildResult:
    if view_name not in catalog.views:
        raise RebuildError(f"no view {view_name}; the catalog has {', '.join(catalog.views)}")
    if view_name in {v.name for v in graph_views(catalog)}:
        return rebuild_graph(spark, settings, catalog, view_name, on_progress, batch_offsets)
    view = catalog.view(view_name)
    source = catalog.source_of(view)
    started = time.monotonic()
    with _exclusive(settings, view.name):
        schema = analyse(spark, catalog)[view.name]
        ensure_view_topics(settings, catalog)
        client = connect_redis(settings.redis_url)
        try:
            live = reconcile_generation(settings, client, view.name)
            new = live + 1
            discard_generations_above(settings, client, view.name, live)
            path = delta_table_path(settings.delta_location, view.name, new)
            ensure_table(spark, path, schema)
            configure_table(path, view, settings.delta_target_file_bytes)
            record_progress(spark, settings.redis_url)

            first = log_range(settings.kafka_bootstrap, source.topic)
            start = {p: low for p, (low, _) in first.items()}
            total = sum(high - low for low, high in first.values())
            done = 0
            # Twice: all the log held at the start, then what arrived during the first run.
            for _ in range(2):
                query = start_view_query(
                    spark,
                    settings,
                    catalog,
                    view,
                    new,
                    available_now=True,
                    max_offsets=batch_offsets,
                )
                try:
                    # Raises the query's error if it fails.
                    while not query.awaitTermination(0.5):
                        done = max(done, _consumed(query, source.topic, start))
                        on_progress(RebuildProgress(view.name, new, done, max(total, done)))
                except Exception as exc:
                    query.stop()
                    raise RebuildError(
                        f"rebuilding {view.name} failed; generation {live} still serves: {exc}"
                    ) from exc
                done = max(done, _consumed(query, source.topic, start))
                on_progress(RebuildProgress(view.name, new, done, max(total, done)))
                now = log_range(settings.kafka_bootstrap, source.topic)
                total = sum(high - start.get(p, low) for p, (low, high) in now.items())

            switch_generation(settings, client, view.name, new)
            retire_generation(settings, client, view.name, live)
        finally:
            client.close()
    return RebuildResult(view.name, live, new, done, time.monotonic() - started)


def rebuild_graph(
    spark: SparkSession,
    settings: Settings,
    catalog: Catalog,
    view_name: str,
    on_progress: Callable[[RebuildProgress], None] = lambda _: None,
    batch_offsets: int = REBUILD_BATCH_OFFSETS,
) -> RebuildResult:
    """Rebuild a view the graph query runs: the views over views derive from the views
    they read under the graph's one batch id, so every view of the graph is recomputed
    together into one new generation and switched at once (engine.graph). Dead letters are
    not sent again: the live generation sent them."""
    views = [v.name for v in graph_views(catalog)]
    topics = [s.topic for s in graph_sources(catalog)]
    started = time.monotonic()
    with _exclusive(settings, "_graph"):
        schemas = analyse(spark, catalog)
        ensure_view_topics(settings, catalog)
        client = connect_redis(settings.redis_url)
        try:
            live = {name: reconcile_generation(settings, client, name) for name in views}
            new = max(live.values()) + 1
            for name in views:
                discard_generations_above(settings, client, name, live[name])
                path = delta_table_path(settings.delta_location, name, new)
                ensure_table(spark, path, schemas[name])
                configure_table(path, catalog.view(name), settings.delta_target_file_bytes)
            record_progress(spark, settings.redis_url)
            generations = dict.fromkeys(views, new)

            first = {t: log_range(settings.kafka_bootstrap, t) for t in topics}
            start = {t: {p: low for p, (low, _) in r.items()} for t, r in first.items()}
            total = sum(high - low for r in first.values() for low, high in r.values())
            done = 0

            def consumed(query: StreamingQuery) -> int:
                return sum(_consumed(query, t, start[t]) for t in topics)

            for _ in range(2):  # all the log held at the start, then what arrived meanwhile
                query = start_graph_query(
                    spark, settings, catalog, generations, schemas, available_now=True,
                    max_offsets=batch_offsets, dead_letters=False)
                try:
                    while not query.awaitTermination(0.5):
                        done = max(done, consumed(query))
                        on_progress(RebuildProgress(view_name, new, done, max(total, done)))
                except Exception as exc:
                    query.stop()
                    raise RebuildError(
                        f"rebuilding {', '.join(views)} (the views of the graph query, "
                        f"rebuilt together) failed; the live generations still serve: {exc}"
                    ) from exc
                done = max(done, consumed(query))
                on_progress(RebuildProgress(view_name, new, done, max(total, done)))
                now = {t: log_range(settings.kafka_bootstrap, t) for t in topics}
                total = sum(high - start[t].get(p, low)
                            for t, r in now.items() for p, (low, high) in r.items())

            switch_generations(settings, client, generations)
            for name in views:
                retire_generation(settings, client, name, live[name])
        finally:
            client.close()
    return RebuildResult(view_name, live[view_name], new, done, time.monotonic() - started)
