"""Run the engine: check the catalog with Spark, create the tables, start one query
per view and one dead-letter query per source, and keep them running."""

from __future__ import annotations

import logging
import threading
import weakref

import redis
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import StructType

from engine.analysis import analyse
from engine.progress import ProgressRecorder
from engine.sinks.delta_sink import ensure_table
from engine.topics import ensure_topics
from engine.views import start_deadletter_query, start_view_query
from schema.catalog import Catalog
from schema.settings import Settings
from schema.storage import (
    META_GENERATION,
    delta_table_path,
    meta_key,
    read_current_generation,
    write_current_generation,
)

log = logging.getLogger("viewgate.engine")


# The progress listener each session has, so that starting queries again (tests, restarts
# in one process) does not stack listeners that each write every progress event.
_recorders: weakref.WeakKeyDictionary[SparkSession, ProgressRecorder] = weakref.WeakKeyDictionary()


def prepare(
    spark: SparkSession, settings: Settings, catalog: Catalog
) -> dict[str, tuple[StructType, int]]:
    """Analyse every view and make sure its current Delta table and meta exist.
    Returns each view's output schema and current generation."""
    schemas = analyse(spark, catalog)
    ensure_topics(settings.kafka_bootstrap, catalog)
    prepared: dict[str, tuple[StructType, int]] = {}
    client = redis.Redis.from_url(settings.redis_url)
    try:
        for name, schema in schemas.items():
            generation = read_current_generation(settings.delta_location, name)
            ensure_table(spark, delta_table_path(settings.delta_location, name, generation), schema)
            write_current_generation(settings.delta_location, name, generation)
            client.hsetnx(meta_key(name), META_GENERATION, generation)
            prepared[name] = (schema, generation)
    finally:
        client.close()
    return prepared


def _record_progress(spark: SparkSession, redis_url: str) -> None:
    current = _recorders.get(spark)
    if current is not None and current.redis_url == redis_url:
        return
    if current is not None:
        spark.streams.removeListener(current)
    recorder = ProgressRecorder(redis_url)
    spark.streams.addListener(recorder)
    _recorders[spark] = recorder


def start_all(
    spark: SparkSession,
    settings: Settings,
    catalog: Catalog,
    *,
    available_now: bool = False,
) -> list[StreamingQuery]:
    prepared = prepare(spark, settings, catalog)
    _record_progress(spark, settings.redis_url)
    queries = [
        start_deadletter_query(spark, settings, catalog, source, available_now=available_now)
        for source in catalog.sources.values()
        if catalog.views_reading(source.name)
    ]
    for view in catalog.views.values():
        schema, generation = prepared[view.name]
        queries.append(
            start_view_query(
                spark, settings, catalog, view, schema, generation, available_now=available_now
            )
        )
    return queries


def run_until_stopped(queries: list[StreamingQuery], stop: threading.Event) -> None:
    """Block until `stop` is set or a query fails (then raise its error)."""
    while not stop.wait(1.0):
        for query in queries:
            if not query.isActive:
                error = query.exception()
                if error is not None:
                    raise RuntimeError(f"query {query.name} failed: {error}")
    for query in queries:
        query.stop()
