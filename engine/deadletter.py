"""Route bad records to the source's dead-letter topic with the reason, and count them
for every view that reads the source. One query per source; it never stops."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import Producer
from pyspark.sql import DataFrame

from engine.metrics import observe_dead_letters
from engine.sinks.changefeed import close_producer
from schema.catalog import Catalog, Source, parse_ddl
from schema.redis_client import connect as connect_redis
from schema.storage import META_DEAD_LETTERS, deadletter_topic, meta_key

# Once per view, each in its own meta hash (its slot in a Redis Cluster): the fence field
# names the query counting, whose batch ids it compares.
_COUNT_ONCE_LUA = f"""
-- KEYS[1] a view's meta hash; ARGV[1] fence field, ARGV[2] batch id, ARGV[3] count.
local seen = redis.call('HGET', KEYS[1], ARGV[1])
if seen and tonumber(seen) >= tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HINCRBY', KEYS[1], '{META_DEAD_LETTERS}', ARGV[3])
return 1
"""

_JSON_TYPES = {
    "string": (str, int, float, bool),
    "double": (int, float),
    "float": (int, float),
    "bigint": (int,),
    "int": (int,),
    "boolean": (bool,),
    "timestamp": (str, int),
    "date": (str,),
}


def explain(source: Source, raw: bytes | None, spark_reason: str) -> str:
    """A precise reason for a record Spark flagged, when we can tell one."""
    if raw is None or spark_reason.startswith(("oversized", "tombstone")):
        return spark_reason
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"malformed JSON: {exc}"
    if not isinstance(value, dict):
        return f"expected a JSON object, got {type(value).__name__}"
    for column, spark_type in parse_ddl(source.schema).items():
        if column not in value or value[column] is None:
            continue
        allowed = _JSON_TYPES.get(spark_type.split("(")[0])
        if allowed and (
            not isinstance(value[column], allowed)
            or (bool not in allowed and isinstance(value[column], bool))
        ):
            return f"field {column}: expected {spark_type}, got {type(value[column]).__name__}"
    return spark_reason


class DeadLetterWriter:
    def __init__(self, bootstrap: str, redis_url: str, catalog: Catalog, source: Source,
                 fence: str | None = None) -> None:
        self.source = source
        # The meta field that records the last batch counted: per query, whose batch ids
        # it compares (not ending in ":g<N>", which a generation switch would take for a
        # generation's own field).
        self.fence = f"dead_letter_batch:{fence or source.name}"
        self.topic = deadletter_topic(source.name)
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        self.redis = connect_redis(redis_url)
        self.count_once = self.redis.register_script(_COUNT_ONCE_LUA)
        self.meta_keys = [meta_key(v.name) for v in catalog.views_fed_by(source.name)]

    def close(self) -> None:
        close_producer(self.producer)
        self.redis.close()

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        self.publish(batch.select(
            "_kafka_key", "_raw", "_topic", "_partition", "_offset", "_error"
        ).collect(), batch_id)

    def publish(self, rows: Sequence[Mapping[str, Any]], batch_id: int) -> None:
        """Send the batch's bad records (META_COLUMNS of engine.sources) with their reasons,
        and count them once per batch id."""
        if not rows:
            return
        for row in rows:
            reason = explain(self.source, row["_raw"], row["_error"])
            self.producer.produce(
                self.topic,
                key=row["_kafka_key"].encode() if row["_kafka_key"] else None,
                value=bytes(row["_raw"]) if row["_raw"] is not None else None,
                headers={
                    "reason": reason.encode(),
                    "source.topic": row["_topic"].encode(),
                    "source.partition": str(row["_partition"]).encode(),
                    "source.offset": str(row["_offset"]).encode(),
                },
            )
            self.producer.poll(0)
        if self.producer.flush(60):
            raise RuntimeError(f"dead-letter topic {self.topic}: records left undelivered")
        counted = [self.count_once(keys=[meta], args=[self.fence, batch_id, len(rows)])
                   for meta in self.meta_keys]
        if 1 in counted:  # not a replayed batch
            observe_dead_letters(self.source.name, len(rows))
