"""Exactly once under failure: the engine, run as `viewgate engine`, is killed with SIGKILL
(driver script and Spark's JVM at once) at several points of a commit and at a random
moment, restarted each time, and in the end every view must equal a batch computation
over the same events: nothing lost, nothing counted twice, in Redis, Delta and the
change feed."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis
from deltalake import DeltaTable
from engine_process import (
    EngineProcess,
    delta_rows,
    feed_changes,
    feed_ends,
    in_time_events,
)
from shop_views import (
    catalog_on,
    delta_frame,
    expected_customers,
    isolated,
    produce,
    redis_rows,
    view_mismatches,
)

from engine.rebuild import log_range
from schema.storage import ChangeEvent, ViewMeta, delta_table_path, meta_key
from viewgate.stack.process import wait_until

pytestmark = pytest.mark.integration

PREFIX = "kill"
VIEWS = ("Customer", "OrderRecord", "Order", "CustomerStats", "ProductSales")


def _metric(engine: EngineProcess, name: str, value: str, label: str = "view",
            **labels: str) -> float | None:
    """One sample of the running engine's /metrics, the one whose `label` is `value` (and
    whose other `labels` are theirs); None when it is not there (yet)."""
    return engine.metric(name, **{label: value, **labels})


@pytest.fixture
def engine(settings, tmp_path) -> Iterator[EngineProcess]:
    settings = isolated(settings, tmp_path / "data", redis_db=3)
    process = EngineProcess(settings, tmp_path, PREFIX)
    try:
        yield process
    finally:
        process.stop()


def _covered(client: redis.Redis, bootstrap: str, views: dict[str, str]) -> bool:
    """Every view's recorded offsets reach the end of its source topic."""
    for view, topic in views.items():
        offsets = ViewMeta.from_fields(client.hgetall(meta_key(view))).offsets.get(topic, {})
        for partition, (_, end) in log_range(bootstrap, topic).items():
            if int(offsets.get(str(partition), 0)) < end:
                return False
    return True


def test_sigkill_at_any_point_loses_nothing_and_counts_nothing_twice(engine):
    settings = engine.settings
    bootstrap = settings.kafka_bootstrap
    client = redis.Redis.from_url(settings.redis_url)
    catalog = catalog_on(PREFIX)
    source_topic = {v: catalog.source_of(catalog.view(v)).topic for v in VIEWS}
    customers, orders = in_time_events(PREFIX, 3000)
    size = len(orders) // 6 + 1
    chunks = [orders[i : i + size] for i in range(0, len(orders), size)]
    feed_start = {view: feed_ends(bootstrap, view) for view in VIEWS}

    # Half the customer events first; the rest (tier changes among them) arrive with the
    # orders, so the kills also catch Order following a change of its joined side.
    early, late = customers[: len(customers) // 2], customers[len(customers) // 2 :]
    step = len(late) // len(chunks) + 1  # contiguous: each key's events stay in order
    late_parts = [late[i * step : (i + 1) * step] for i in range(len(chunks))]
    chunks = [chunk + part for chunk, part in zip(chunks, late_parts, strict=True)]
    produce(bootstrap, early)
    engine.start()
    want_customers = len(expected_customers(early))
    wait_until(
        lambda: delta_rows(settings, "Customer") == want_customers,
        timeout_s=180,
        what="the customers to be in Delta",
    )
    # The engine's Prometheus metrics say the same: Customer caught up on its source.
    wait_until(lambda: _metric(engine, "viewgate_view_kafka_lag_events", "Customer") == 0
               and _metric(engine, "viewgate_view_version", "Customer") >= 0,
               timeout_s=60, what="the engine's /metrics to show Customer caught up")
    assert _metric(engine, "viewgate_view_processed_rows_per_second", "Customer") is not None
    engine.kill()

    # Each run gets fresh orders, and dies at a different step of some commit: after the
    # graph's Redis apply (every view applied, no change published: the replay computes
    # nothing and republishes the outboxes), after the change feed of a view over views
    # (the deepest view's feed not yet), after the Delta MERGE of the graph's first view
    # (the others' maybe not), and in the stream aggregate's query.
    # Every other run starts its batches' Delta MERGEs while Redis applies them, as a
    # large batch's do (VIEWGATE_ENGINE_EARLY_MERGE_CHANGES): the kills after Redis and
    # after the first MERGE then find MERGEs writing their files, not yet committed.
    failpoints = ["after_redis:CustomerStats", "after_changefeed:Order",
                  "after_delta:OrderRecord", "after_delta:ProductSales"]
    for i, (chunk, failpoint) in enumerate(zip(chunks, failpoints, strict=False)):
        produce(bootstrap, chunk)
        engine.start(failpoint, VIEWGATE_ENGINE_EARLY_MERGE_CHANGES="0" if i % 2 == 0
                     else "1000000000")
        engine.wait_killed()

    # A kill from outside, at a moment when CustomerStats has just committed a batch and
    # the other views are somewhere in theirs.
    produce(bootstrap, chunks[4])
    before = ViewMeta.from_fields(client.hgetall(meta_key("CustomerStats"))).version
    engine.start()
    wait_until(
        lambda: ViewMeta.from_fields(client.hgetall(meta_key("CustomerStats"))).version > before,
        timeout_s=180,
        what="a CustomerStats commit",
    )
    engine.kill()

    # The last run completes everything.
    produce(bootstrap, chunks[5])
    engine.start()
    wait_until(
        lambda: _covered(client, bootstrap, source_topic),
        timeout_s=240,
        what="every view to catch up",
    )

    assert view_mismatches(client, customers, orders) == []
    # The last run's batches were fetched from Kafka by the driver (engine.driver_fetch),
    # as live batches are. Run with the driver's fetch off and the read in Spark's tasks
    # (VIEWGATE_ENGINE_DRIVER_FETCH_MAX_RECORDS=0, VIEWGATE_ENGINE_TASK_READ=true and
    # VIEWGATE_ENGINE_TASK_READ_MIN_RECORDS=0), the tasks read them and computed the
    # upsert views (engine.task_upsert), and with VIEWGATE_ENGINE_TASK_TABLES=true the
    # views over views (engine.task_tables), with VIEWGATE_ENGINE_TASK_DELTA=true writing
    # their Delta files (engine.task_delta).
    if settings.engine_driver_fetch_max_records or not settings.engine_task_read:
        assert (_metric(engine, "viewgate_graph_batch_reads_total", "fetch", "path") or 0) > 0
    else:
        assert (_metric(engine, "viewgate_graph_batch_reads_total", "tasks", "path") or 0) > 0
        for view in ("OrderRecord", *(("CustomerStats",) if settings.engine_task_tables
                                      else ())):
            assert (_metric(engine, "viewgate_graph_views_by_tasks_total", view,
                            by="tasks") or 0) > 0, view
            if settings.engine_task_delta:  # VIEWGATE_ENGINE_TASK_DELTA=true: and their files
                assert (_metric(engine, "viewgate_graph_delta_commits_by_tasks_total", view,
                                by="tasks") or 0) > 0, view

    for view in VIEWS:
        # Delta holds as many rows as Redis, and no batch was merged twice.
        frame = delta_frame(settings, view)
        assert len(frame) == len(redis_rows(client, view)), view
        history = DeltaTable(delta_table_path(settings.delta_location, view, 0)).history()
        batches = [
            json.loads(c["userMetadata"])["batch_id"] for c in history if c.get("userMetadata")
        ]
        assert len(batches) == len(set(batches)), f"{view}: a batch was merged twice"

        # The change feed: a repeated (key, version) is the same change; after dropping
        # repeats, each key's versions rise, each change's `before` is the row of the key's
        # previous change (also across the crash after the Redis apply, which the outbox
        # covers), its op follows from both, and the last change is what Redis holds.
        seen: dict[tuple[str, int], ChangeEvent] = {}
        last: dict[str, ChangeEvent] = {}
        for _, event in feed_changes(bootstrap, view, feed_start[view]):
            first = seen.setdefault((event.key, event.version), event)
            assert (first.op, first.row, first.before) == (event.op, event.row, event.before), \
                f"{view} {event.key}"
            if first is not event:
                continue
            previous = last.get(event.key)
            if previous is not None:
                assert event.version > previous.version, f"{view} {event.key}"
            assert event.before == (previous.row if previous else None), f"{view} {event.key}"
            want_op = "delete" if event.row is None else (
                "update" if event.before is not None else "insert")
            assert event.op == want_op, f"{view} {event.key}"
            last[event.key] = event
        live = {k: e.row for k, e in last.items() if e.op != "delete"}
        assert live == redis_rows(client, view), f"{view}: the change feed's last word differs"
    client.close()
