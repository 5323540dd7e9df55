"""A graph query's batch as Spark's foreachBatch would hand it, for tests that call the
graph's batch function themselves (engine.graph.GraphBatch)."""

from __future__ import annotations

import json

from engine.graph import graph_sources
from engine.rebuild import log_range


def graph_records(spark, settings, catalog, since: dict[str, dict[str, int]]):
    """The Kafka records of the graph's topics after `since` (topic -> partition ->
    offset), as the graph query's batch holds them (as Kafka has them); and where they
    end."""
    sources = graph_sources(catalog)
    ends = {s.topic: {str(p): high for p, (_, high) in
                      log_range(settings.kafka_bootstrap, s.topic).items()} for s in sources}
    starts = {t: {p: since.get(t, {}).get(p, 0) for p in parts} for t, parts in ends.items()}
    raw = (spark.read.format("kafka")
           .option("kafka.bootstrap.servers", settings.kafka_bootstrap)
           .option("subscribe", ",".join(s.topic for s in sources))
           .option("startingOffsets", json.dumps(starts))
           .option("endingOffsets", json.dumps(ends)).load())
    return raw, ends
