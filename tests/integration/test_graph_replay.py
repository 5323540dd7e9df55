"""A batch that reached Redis for some views of the graph only (the engine died while its
one round trip to Redis was being written) is replayed exactly: the views that hold it are
not computed again (their stored change events stand), the others are, reading their
inputs' rows with the batch's changes laid over them, and in the end every view equals the
batch computation, the graph's marks name the batch, and each view's change feed carries
each change once per version. The graph's batch function runs here as Spark's foreachBatch
would call it, over the same Kafka records."""

from __future__ import annotations

import json

import pytest
import redis
from engine_process import feed_changes, feed_ends, in_time_events
from shop_views import catalog_on, isolated, produce, redis_rows, view_mismatches

from engine.graph import GraphBatch, graph_sources
from engine.metrics import rows_changed_total
from engine.rebuild import log_range
from engine.runner import prepare
from engine.sources import classify_sources
from schema.storage import (
    GRAPH_APPLYING,
    GRAPH_VERSION,
    ViewMeta,
    graph_key,
    meta_key,
)

pytestmark = pytest.mark.integration

PREFIX = "partial"
VIEWS = ("Customer", "OrderRecord", "Order", "CustomerStats", "ProductSales")
HELD = ("OrderRecord", "CustomerStats")  # applied before the engine died


def _records(spark, settings, catalog, since: dict[str, dict[str, int]]):
    """The Kafka records of the graph's topics after `since` (topic -> partition ->
    offset), as the graph query's batch would hold them; and where they end."""
    sources = graph_sources(catalog)
    ends = {s.topic: {str(p): high for p, (_, high) in
                      log_range(settings.kafka_bootstrap, s.topic).items()} for s in sources}
    starts = {t: {p: since.get(t, {}).get(p, 0) for p in parts} for t, parts in ends.items()}
    raw = (spark.read.format("kafka")
           .option("kafka.bootstrap.servers", settings.kafka_bootstrap)
           .option("subscribe", ",".join(s.topic for s in sources))
           .option("startingOffsets", json.dumps(starts))
           .option("endingOffsets", json.dumps(ends)).load())
    return classify_sources(raw, sources), ends


@pytest.mark.parametrize("task_read", [False, True], ids=["driver-read", "task-read"])
def test_a_batch_applied_to_some_views_only_is_replayed_exactly(
        spark, settings, tmp_path, monkeypatch, task_read):
    """Also with the batch's records folded by Spark's tasks (engine.task_read): the
    replay recomputes ProductSales from what the tasks folded of the same records."""
    settings = isolated(settings, tmp_path, redis_db=24).model_copy(
        update={"engine_task_read": task_read})
    client = redis.Redis.from_url(settings.redis_url)
    client.flushdb()
    prefix = f"{PREFIX}{'tasks' if task_read else ''}"  # topics of its own
    catalog = catalog_on(prefix)
    generations, schemas = prepare(spark, settings, catalog)
    customers, orders = in_time_events(prefix, 600)
    half = len(customers) // 2
    produce(settings.kafka_bootstrap, customers[:half] + orders[:300])
    step = GraphBatch(spark, settings, catalog, generations, schemas,
                      str(tmp_path / "checkpoint"), dead_letters=False)
    assert (step.task_read is not None) == task_read
    batch, ends = _records(spark, settings, catalog, {})
    step(batch, 0)
    assert view_mismatches(client, customers[:half], orders[:300]) == []

    # Batch 1 (tier changes among its customer events, so Order follows both sides)
    # reaches Redis for OrderRecord and CustomerStats only, then the engine dies.
    produce(settings.kafka_bootstrap, customers[half:] + orders[300:])
    feeds = {view: feed_ends(settings.kafka_bootstrap, view) for view in VIEWS}
    batch, _ = _records(spark, settings, catalog, ends)

    def died_mid_apply(self, batch_id, pending):
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(graph_key(self.generation), GRAPH_APPLYING, batch_id)
        for name in HELD:
            self.committers[name].queue_apply(pending[name], pipe)
        pipe.execute()
        raise RuntimeError("the engine died in the middle of its Redis round trip")

    with monkeypatch.context() as patch:
        patch.setattr(GraphBatch, "_apply", died_mid_apply)
        with pytest.raises(RuntimeError, match="middle of its Redis round trip"):
            step(batch, 1)
    versions = {v: ViewMeta.from_fields(client.hgetall(meta_key(v))).version for v in VIEWS}
    assert versions == {v: 1 if v in HELD else 0 for v in VIEWS}
    assert client.hget(graph_key(0), GRAPH_APPLYING) == b"1"

    # Spark replays batch 1: the held views are not computed again, the others are.
    counted = rows_changed_total()
    step(batch, 1)
    computed = {v for v in VIEWS if f"{v}_compute_ms" in step.timings}
    assert computed == set(VIEWS) - set(HELD)
    assert view_mismatches(client, customers, orders) == []
    assert {ViewMeta.from_fields(client.hgetall(meta_key(v))).version for v in VIEWS} == {1}
    assert client.hget(graph_key(0), GRAPH_VERSION) == b"1"
    assert client.hget(graph_key(0), GRAPH_APPLYING) is None
    published = 0
    for view in VIEWS:
        # One change per key in batch 1 (the held views' from their outbox), and the last
        # change of every key is what Redis holds.
        changes = [e for _, e in feed_changes(settings.kafka_bootstrap, view, feeds[view])]
        published += len(changes)
        assert changes and {e.version for e in changes} == {1}, view
        assert len({e.key for e in changes}) == len(changes), view
        rows = redis_rows(client, view)
        assert all((rows.get(e.key) is None) == (e.row is None) for e in changes), view
    # The rows the batch changed, as the engine's metric counts them: its change events.
    assert rows_changed_total() - counted == published
    client.close()
