"""Run the engine: check the catalog with Spark, create the tables, start one query
per view and one dead-letter query per source, and keep them running."""

from __future__ import annotations

import logging
import threading

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


def prepare(spark: SparkSession, settings: Settings, catalog: Catalog) -> dict[str, StructType]:
    """Analyse every view and make sure its current Delta table and meta exist."""
    schemas = analyse(spark, catalog)
    ensure_topics(settings.kafka_bootstrap, catalog)
    client = redis.Redis.from_url(settings.redis_url)
    try:
        for name, schema in schemas.items():
            generation = read_current_generation(settings.delta_location, name)
            ensure_table(spark, delta_table_path(settings.delta_location, name, generation), schema)
            write_current_generation(settings.delta_location, name, generation)
            client.hsetnx(meta_key(name), META_GENERATION, generation)
    finally:
        client.close()
    return schemas


def start_all(
    spark: SparkSession,
    settings: Settings,
    catalog: Catalog,
    *,
    available_now: bool = False,
) -> list[StreamingQuery]:
    schemas = prepare(spark, settings, catalog)
    spark.streams.addListener(ProgressRecorder(settings.redis_url))
    queries = [
        start_deadletter_query(spark, settings, catalog, source, available_now=available_now)
        for source in catalog.sources.values()
        if catalog.views_reading(source.name)
    ]
    for view in catalog.views.values():
        generation = read_current_generation(settings.delta_location, view.name)
        queries.append(
            start_view_query(
                spark,
                settings,
                catalog,
                view,
                schemas[view.name],
                generation,
                available_now=available_now,
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
