"""One Structured Streaming query per view, by kind.

UPSERT views are stateless: each batch keeps the last record per key (by offset),
deletes tombstoned keys, and runs the view's SQL over the rest as a batch query (so a
stream-static join reads the dimension's latest Delta snapshot). AGGREGATE and WINDOW
views run their SQL on the stream itself, with state in RocksDB, in update mode.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.streaming import StreamingQuery

from engine.analyzer import SQL_LOCK
from engine.collector import keep_collector_out_of_batches
from engine.commit import ViewCommitter
from engine.deadletter import DeadLetterWriter
from engine.dimensions import Dimensions
from engine.query_resources import release_stopped, start_holding
from engine.sources import (
    bad_records,
    classify,
    read_kafka,
    record_key,
    source_columns,
    source_events,
    valid_records,
)
from schema.catalog import Catalog, Source, View, ViewKind
from schema.settings import Settings
from schema.storage import delta_table_path, read_current_generation


def query_name(view: View, generation: int) -> str:
    return f"view:{view.name}:g{generation}"


# Queries that run several views (engine.graph): query name -> [(view, generation)].
_QUERY_VIEWS: dict[str, list[tuple[str, int]]] = {}


def register_query_views(name: str, views: list[tuple[str, int]]) -> None:
    _QUERY_VIEWS[name] = list(views)


def query_views(name: str | None) -> list[tuple[str, int]]:
    """The (view, generation) pairs a query runs: one for a view's query, several for the
    graph query, none for other queries (dead letters)."""
    parts = (name or "").split(":")
    if len(parts) == 3 and parts[0] == "view" and parts[2].startswith("g"):
        return [(parts[1], int(parts[2][1:]))]
    return list(_QUERY_VIEWS.get(name or "", ()))


@contextmanager
def scheduler_pool(spark: SparkSession, name: str) -> Iterator[None]:
    """Start a query in a FAIR scheduler pool of its own (the stream thread inherits the
    pool), so that the queries share the cores instead of queueing behind each other."""
    context = spark.sparkContext
    context.setLocalProperty("spark.scheduler.pool", name)
    try:
        yield
    finally:
        context.setLocalProperty("spark.scheduler.pool", None)


def checkpoint_path(settings: Settings, view: View, generation: int) -> str:
    return f"{settings.checkpoint_location}/{view.name}/g{generation}"


def _register_dimensions(session: SparkSession, settings: Settings, view: View) -> None:
    """The dimensions of a streaming SQL: Delta reads that Spark refreshes every batch."""
    for dim in view.dimensions:
        generation = read_current_generation(settings.delta_location, dim)
        path = delta_table_path(settings.delta_location, dim, generation)
        session.read.format("delta").load(path).createOrReplaceTempView(dim)


def _rows(frame: DataFrame) -> list[dict]:
    return [row.asDict(recursive=True) for row in frame.collect()]


def start_view_query(
    spark: SparkSession,
    settings: Settings,
    catalog: Catalog,
    view: View,
    generation: int,
    *,
    available_now: bool = False,
    max_offsets: int | None = None,
) -> StreamingQuery:
    source = catalog.source_of(view)
    classified = classify(read_kafka(spark, settings, source.topic, max_offsets), source)
    # Only upsert views delete, by the source key a tombstone carries.
    delete_on = (source.key,) if view.kind is ViewKind.UPSERT else view.key
    checkpoint = checkpoint_path(settings, view, generation)
    release_stopped()  # what this view's previous query held, if it stopped
    committer = ViewCommitter(settings, view, generation, delete_on, checkpoint)
    if view.kind is ViewKind.UPSERT:
        writer = valid_records(classified).writeStream.foreachBatch(
            _upsert_batch(settings, view, source, committer)
        )
    else:
        events = source_events(classified, source)
        # The watermark bounds window state; a plain GROUP BY keeps every group anyway.
        if view.kind is ViewKind.WINDOW and source.event_time and source.watermark:
            events = events.withWatermark(source.event_time, source.watermark)
        with SQL_LOCK:
            events.createOrReplaceTempView(source.name)
            _register_dimensions(spark, settings, view)
            output = spark.sql(view.sql)
        writer = output.writeStream.outputMode("update").foreachBatch(
            lambda batch, batch_id: committer.commit(batch_id, _rows(batch))
        )
    writer = writer.queryName(query_name(view, generation)).option("checkpointLocation", checkpoint)
    trigger = {"availableNow": True} if available_now else {"processingTime": view.trigger}
    keep_collector_out_of_batches()  # the batches' rows go by reference counting
    with scheduler_pool(spark, query_name(view, generation)):
        return start_holding(committer, lambda: writer.trigger(**trigger).start())


def _upsert_batch(settings: Settings, view: View, source: Source, committer: ViewCommitter):
    columns = source_columns(source)
    dimensions = Dimensions(settings, view.dimensions)

    def commit(batch: DataFrame, batch_id: int) -> None:
        # One Spark job reads the batch; keeping the last record per key happens here on
        # the driver. A window over the batch cost a shuffle and a second job per batch,
        # which dominated the freshness of small batches.
        latest: dict[str, Row] = {}
        for record in batch.select("_kafka_key", "_tombstone", *columns).collect():
            # A key lives in one partition, in order.
            latest[record_key(record["_kafka_key"], record, source.key)] = record
        deleted = [{source.key: key} for key, r in latest.items() if r["_tombstone"]]
        live = [tuple(r)[2:] for r in latest.values() if not r["_tombstone"]]
        rows: list[dict] = []
        if live:
            session = batch.sparkSession
            with SQL_LOCK:
                session.createDataFrame(live, schema=source.schema).createOrReplaceTempView(
                    source.name
                )
                dimensions.register(session)
                output = session.sql(view.sql)
            rows = _rows(output)
        committer.commit(batch_id, rows, deleted)

    return commit


def start_deadletter_query(
    spark: SparkSession,
    settings: Settings,
    catalog: Catalog,
    source: Source,
    *,
    available_now: bool = False,
) -> StreamingQuery:
    classified = classify(read_kafka(spark, settings, source.topic), source)
    release_stopped()  # what this source's previous dead-letter query held, if it stopped
    writer = DeadLetterWriter(settings.kafka_bootstrap, settings.redis_url, catalog, source)
    trigger = (
        {"availableNow": True} if available_now else {"processingTime": settings.deadletter_trigger}
    )
    with scheduler_pool(spark, f"deadletters:{source.name}"):
        return start_holding(writer, lambda: (
            bad_records(classified)
            .writeStream.foreachBatch(writer)
            .queryName(f"deadletters:{source.name}")
            .option(
                "checkpointLocation", f"{settings.checkpoint_location}/_deadletters/{source.name}"
            )
            .trigger(**trigger)
            .start()
        ))
