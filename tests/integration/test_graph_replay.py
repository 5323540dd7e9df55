"""A batch that reached Redis for some views of the graph only (the engine died while its
one round trip to Redis was being written) is replayed exactly: the views that hold it are
not computed again (their stored change events stand), the others are, reading their
inputs' rows with the batch's changes laid over them, and in the end every view equals the
batch computation, the graph's marks name the batch, and each view's change feed carries
each change once per version. The graph's batch function runs here as Spark's foreachBatch
would call it, over the same Kafka records."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
import redis
from deltalake import DeltaTable
from engine_process import feed_changes, feed_ends, in_time_events
from graph_batches import graph_records
from shop_views import (
    catalog_on,
    isolated,
    produce,
    redis_rows,
    view_mismatches,
)

from engine.graph import GraphBatch
from engine.metrics import rows_changed_total
from engine.runner import prepare
from engine.sinks.deletion_vectors import descriptor_file
from schema.arrow_rows import arrow_rows
from schema.catalog import View
from schema.delta_read import live_rows
from schema.storage import (
    GRAPH_APPLYING,
    GRAPH_VERSION,
    ViewMeta,
    delta_app_id,
    delta_table_path,
    graph_key,
    key_of,
    meta_key,
)

pytestmark = pytest.mark.integration

PREFIX = "partial"
VIEWS = ("Customer", "OrderRecord", "Order", "CustomerStats", "ProductSales")
HELD = ("OrderRecord", "CustomerStats")  # applied before the engine died


def _died_mid_apply(held):
    """GraphBatch._apply as it goes when the engine dies after Redis took the views
    `held`'s applies of the batch, and before it took the others' (a large batch's Delta
    MERGEs already writing their files)."""
    def died_mid_apply(self, batch_id, pending, while_redis_applies=None):
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(graph_key(self.generation), GRAPH_APPLYING, batch_id)
        for name in held:
            self.committers[name].queue_apply(pending[name], pipe)
        if while_redis_applies is not None:
            while_redis_applies()
        pipe.execute()
        raise RuntimeError("the engine died in the middle of its Redis round trip")
    return died_mid_apply


def _unlogged_files(path: str) -> list[str]:
    """The table's data, change-data and deletion-vector files that no commit of its log
    names: what a MERGE cut short before its commit (its batch failed while it wrote them)
    would leave behind."""
    logged = set()
    for entry in Path(path, "_delta_log").glob("*.json"):
        for line in entry.read_text().splitlines():
            for kind, action in json.loads(line).items():
                if kind in ("add", "remove", "cdc"):
                    logged.add(action["path"])
                    vector = action.get("deletionVector")
                    if vector and vector["storageType"] == "u":
                        logged.add(descriptor_file(vector))
    files = {str(f.relative_to(path)) for f in Path(path).rglob("*")
             if f.is_file() and "_delta_log" not in f.parts
             and f.suffix in (".parquet", ".bin")}
    return sorted(files - logged)


def _delta_mismatches(client, settings, catalog) -> list[str]:
    """The graph's views whose Delta table holds other keys than their Redis rows (or, for
    CustomerStats, other counts), does not hold batch 1 as its app's last transaction, or
    holds a file no commit names."""
    problems = []
    for view in VIEWS:
        path = delta_table_path(settings.delta_location, view, 0)
        table = DeltaTable(path)
        in_redis = redis_rows(client, view)
        in_delta = {key_of(row, catalog.view(view).key): row
                    for row in arrow_rows(live_rows(table))}
        last = table.transaction_version(delta_app_id(view, 0))
        if last != 1:
            problems.append(f"{view}: its last transaction is {last}, not batch 1")
        if set(in_delta) != set(in_redis):
            problems.append(f"{view}: other keys in Delta than in Redis")
        elif view == "CustomerStats" and any(
                row["order_count"] != in_redis[k]["order_count"] for k, row in in_delta.items()):
            problems.append(f"{view}: other counts in Delta than in Redis")
        unlogged = _unlogged_files(path)
        if unlogged:
            problems.append(f"{view}: files no commit names: {unlogged}")
    return problems


def _batch_updates(settings, view: View, batch_id: int) -> list[tuple[dict, dict]]:
    """The (pre-image, post-image) pairs of the updates in the Delta commit of `batch_id`."""
    table = DeltaTable(delta_table_path(settings.delta_location, view.name, 0))
    version = next(c["version"] for c in table.history()
                   if json.loads(c.get("userMetadata") or "{}").get("batch_id") == batch_id)
    changes = pa.table(table.load_cdf(starting_version=version, ending_version=version))
    meta = {"_change_type", "_commit_version", "_commit_timestamp"}
    images: dict[str, dict[str, dict]] = {"update_preimage": {}, "update_postimage": {}}
    for row in arrow_rows(changes):
        if row["_change_type"] in images:
            images[row["_change_type"]][key_of(row, view.key)] = {
                k: v for k, v in row.items() if k not in meta}
    pre, post = images["update_preimage"], images["update_postimage"]
    return [(pre[k], post[k]) for k in sorted(pre)]


@pytest.mark.parametrize("task_read", [False, True], ids=["driver-read", "task-read"])
def test_a_batch_applied_to_some_views_only_is_replayed_exactly(
        spark, settings, tmp_path, monkeypatch, task_read):
    """Also with the batch's records folded by Spark's tasks (engine.task_read): the
    replay recomputes ProductSales from what the tasks folded of the same records. The
    MERGEs start while Redis applies (as a large batch's do), so the death calls off
    MERGEs that were writing their files: they leave none."""
    settings = isolated(settings, tmp_path, redis_db=24).model_copy(
        update={"engine_task_read": task_read, "engine_early_merge_changes": 0})
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
    batch, ends = graph_records(spark, settings, catalog, {})
    step(batch, 0)
    assert view_mismatches(client, customers[:half], orders[:300]) == []

    # Batch 1 (tier changes among its customer events, so Order follows both sides)
    # reaches Redis for OrderRecord and CustomerStats only, then the engine dies.
    produce(settings.kafka_bootstrap, customers[half:] + orders[300:])
    feeds = {view: feed_ends(settings.kafka_bootstrap, view) for view in VIEWS}
    batch, _ = graph_records(spark, settings, catalog, ends)

    with monkeypatch.context() as patch:
        patch.setattr(GraphBatch, "_apply", _died_mid_apply(HELD))
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
    # Read by the tasks, the upsert view not held is computed by them too (task_upsert).
    assert ("Customer_in_tasks" in step.timings) == task_read
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
    # Delta got batch 1 once, from the views' changes as Redis holds them, and no file
    # outside its log.
    assert _delta_mismatches(client, settings, catalog) == []
    client.close()


@pytest.mark.parametrize("early", [False, True], ids=["merges-after-redis", "merges-early"])
def test_a_view_whose_apply_finds_its_batch_in_redis_merges_the_stored_changes(
        spark, settings, tmp_path, monkeypatch, early):
    """Redis may hold a batch that the graph did not find held when the batch began (a
    writer of the same generation applied it meanwhile). Such a view's apply says
    REPLAYED, and its stored change events replace the computed ones, also in its Delta
    MERGE: a MERGE started while Redis applied (a large batch's) is called off and started
    again from the stored ones. The views here are ones no other view reads, so only their
    Delta tables can tell."""
    settings = isolated(settings, tmp_path, redis_db=28).model_copy(
        update={"engine_early_merge_changes": 0 if early else 10**9})
    client = redis.Redis.from_url(settings.redis_url)
    client.flushdb()
    prefix = f"{PREFIX}replayed{'early' if early else ''}"
    catalog = catalog_on(prefix)
    generations, schemas = prepare(spark, settings, catalog)
    customers, orders = in_time_events(prefix, 400)
    produce(settings.kafka_bootstrap, customers[:100] + orders[:200])
    step = GraphBatch(spark, settings, catalog, generations, schemas,
                      str(tmp_path / "checkpoint"), dead_letters=False)
    batch, ends = graph_records(spark, settings, catalog, {})
    step(batch, 0)
    produce(settings.kafka_bootstrap, customers[100:] + orders[200:])
    batch, _ = graph_records(spark, settings, catalog, ends)
    leaves = ("CustomerStats", "ProductSales")
    with monkeypatch.context() as patch:
        patch.setattr(GraphBatch, "_apply", _died_mid_apply(leaves))
        with pytest.raises(RuntimeError, match="middle of its Redis round trip"):
            step(batch, 1)
    with monkeypatch.context() as patch:
        patch.setattr(GraphBatch, "_fences", lambda self, batch_id: (set(), set()))
        step(batch, 1)
    assert {v for v in VIEWS if f"{v}_compute_ms" in step.timings} == set(VIEWS)
    assert view_mismatches(client, customers, orders) == []
    assert _delta_mismatches(client, settings, catalog) == []
    # Computed again over Redis holding batch 1, an update's previous row would be its new
    # row: batch 1's change data must hold the stored changes, whose previous rows are
    # batch 0's.
    for view in leaves:
        updates = _batch_updates(settings, catalog.view(view), batch_id=1)
        assert updates and all(before != after for before, after in updates), view
    client.close()

