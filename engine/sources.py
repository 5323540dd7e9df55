"""Read a declared source from Kafka and classify every record: valid, tombstone, or bad.

Bad records keep their original bytes and carry a reason in `_error`; they go to the
dead-letter topic instead of the view, and never stop the query.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from schema.catalog import Source, parse_ddl
from schema.settings import Settings

CORRUPT = "_corrupt"
META_COLUMNS = ("_kafka_key", "_raw", "_topic", "_partition", "_offset", "_tombstone", "_error")


FETCH_MAX_WAIT_MS = 5

# How long one call of the Kafka clients Spark runs may wait. When a broker dies, the admin
# client that lists each batch's end offsets keeps routing the call to the partition leader
# it cached, which is gone, until the call's `default.api.timeout.ms` (60 s by default:
# kafka-clients 3.9, the behaviour KAFKA-20673 fixes). Spark then retries with a new admin
# client, which asks the brokers left for the new leaders. On the cluster profile a killed
# broker stalled every view for 60 s that way. Kafka refuses an api timeout shorter than
# the request timeout, so both are set.
KAFKA_CALL_TIMEOUT_MS = 10_000


def read_kafka(
    spark: SparkSession, settings: Settings, topic: str, max_offsets: int | None = None
) -> DataFrame:
    """The topic from its earliest retained offset; `max_offsets` (default: the setting
    max_offsets_per_trigger) caps each batch."""
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", settings.kafka_bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        # Compacted topics have offset gaps by design; a gap is not data loss here.
        .option("failOnDataLoss", "false")
        # A batch reads only offsets that exist (up to the end its planning saw), yet its
        # tasks' consumers waited on fetches for up to the broker's default 500 ms: a warm
        # read of 500 records took 256 ms at the median and 361 at p90, against 113 and 128
        # with this (a count of each batch at 1,000 events/s on 2 cores, 2026-11-27).
        .option("kafka.fetch.max.wait.ms", str(FETCH_MAX_WAIT_MS))
        .option("kafka.request.timeout.ms", str(KAFKA_CALL_TIMEOUT_MS))
        .option("kafka.default.api.timeout.ms", str(KAFKA_CALL_TIMEOUT_MS))
    )
    max_offsets = max_offsets or settings.max_offsets_per_trigger
    if max_offsets:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets))
    return reader.load()


def _parsed(source: Source) -> Column:
    return F.from_json(
        F.col("value").cast("string"),
        f"{source.schema}, {CORRUPT} STRING",
        {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT},
    )


def classify(raw: DataFrame, source: Source) -> DataFrame:
    """Kafka rows -> source columns plus META_COLUMNS (`_error` null for good records)."""
    parsed = _parsed(source)
    frame = raw.select(
        F.col("key").cast("string").alias("_kafka_key"),
        F.col("value").alias("_raw"),
        F.col("topic").alias("_topic"),
        F.col("partition").alias("_partition"),
        F.col("offset").alias("_offset"),
        parsed.alias("_v"),
    )
    tombstone = F.col("_raw").isNull()
    frame = frame.withColumn("_tombstone", tombstone).withColumn("_error", _error(source))
    return frame.select(*META_COLUMNS, "_v.*").drop(CORRUPT)


def value_column(index: int) -> str:
    """The column `classify_sources` parses the `index`-th source's records into."""
    return f"_v{index}"


def classify_sources(raw: DataFrame, sources: list[Source]) -> DataFrame:
    """Kafka rows of several sources' topics -> META_COLUMNS plus, per source, its parsed
    value as a struct (`value_column(i)`, null for the other sources' records)."""
    topic = F.col("topic")
    frame = raw.select(
        F.col("key").cast("string").alias("_kafka_key"),
        F.col("value").alias("_raw"),
        topic.alias("_topic"),
        F.col("partition").alias("_partition"),
        F.col("offset").alias("_offset"),
        *[F.when(topic == s.topic, _parsed(s)).alias(value_column(i))
          for i, s in enumerate(sources)],
    )
    error = F.coalesce(*[F.when(F.col("_topic") == s.topic, _error(s, value_column(i)))
                         for i, s in enumerate(sources)])
    frame = frame.withColumn("_tombstone", F.col("_raw").isNull()).withColumn("_error", error)
    # The raw bytes only for the dead letters: good records are read as parsed values, and
    # not carrying every record's bytes to the driver makes the batch's one collect lighter.
    raw = F.when(F.col("_error").isNotNull(), F.col("_raw")).alias("_raw")
    return frame.select(*[raw if c == "_raw" else c for c in META_COLUMNS],
                        *[value_column(i) for i in range(len(sources))])


def _error(source: Source, parsed: str = "_v") -> Column:
    value = F.col(parsed)
    reason = (
        F.when(
            F.col("_raw").isNull() & F.col("_kafka_key").isNull(), F.lit("tombstone without a key")
        )
        .when(F.col("_raw").isNull(), F.lit(None))
        .when(
            F.length("_raw") > source.max_record_bytes,
            F.format_string(
                f"oversized record: %d bytes > {source.max_record_bytes}", F.length("_raw")
            ),
        )
        .when(value.isNull() | value[CORRUPT].isNotNull(), F.lit("malformed JSON or a wrong type"))
        .when(value[source.key].isNull(), F.lit(f"missing key field {source.key}"))
    )
    if source.event_time:
        reason = reason.when(
            value[source.event_time].isNull(),
            F.lit(f"missing event time field {source.event_time}"),
        )
    return reason


def record_key(kafka_key: str | None, value: Mapping[str, Any], key_field: str) -> str:
    """What a good record is deduplicated by: its Kafka key, or, for a record produced
    without one, its value's key field (never null in a good record), so that keyless
    records of different keys are not taken for one. (A keyless tombstone is bad.)"""
    return kafka_key if kafka_key is not None else str(value[key_field])


def valid_records(classified: DataFrame) -> DataFrame:
    return classified.filter(F.col("_error").isNull())


def source_events(classified: DataFrame, source: Source) -> DataFrame:
    """The valid, non-tombstone records as the source's columns: what aggregates read."""
    return valid_records(classified).filter(~F.col("_tombstone")).select(*source_columns(source))


def bad_records(classified: DataFrame) -> DataFrame:
    return classified.filter(F.col("_error").isNotNull())


def source_columns(source: Source) -> list[str]:
    return list(parse_ddl(source.schema))
