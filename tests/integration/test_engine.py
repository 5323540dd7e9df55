"""The engine against real Kafka, Spark, Delta and Redis, checked against an independent
pandas computation over the same events."""

from __future__ import annotations

import dataclasses
import datetime
import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pyarrow as pa
import pytest
import redis
import strawberry
from confluent_kafka import Consumer
from deltalake import DeltaTable
from prometheus_client import REGISTRY
from shop_views import (
    catalog_on,
    delta_frame,
    expected_customer_stats,
    expected_customers,
    expected_orders,
    expected_product_sales,
    isolated,
    placed,
    produce,
    redis_rows,
    run_once,
    shop_events,
    ts,
)

from engine.analysis import analyse
from engine.commit import ViewCommitter
from engine.progress import ProgressRecorder
from engine.views import query_name as _query_name
from schema import demo
from schema.catalog import Catalog, View, ViewKind
from schema.delta_read import live_rows
from schema.storage import (
    REPLAYED,
    ViewMeta,
    deadletter_topic,
    delta_table_path,
    meta_key,
)
from viewgate.stack.process import wait_until
from viewgate.status import ViewStatus, collect

pytestmark = pytest.mark.integration

BAD_ORDERS = [
    (b"{not json", "malformed JSON"),
    (
        json.dumps(
            {
                "order_id": "X1",
                "customer_id": "C1",
                "product_id": "P1",
                "amount": "lots",
                "status": "placed",
                "ts": "2024-01-01T00:00:00Z",
            }
        ).encode(),
        "field amount",
    ),
    (
        json.dumps(
            {
                "customer_id": "C1",
                "product_id": "P1",
                "amount": 1.0,
                "status": "placed",
                "ts": "2024-01-01T00:00:00Z",
            }
        ).encode(),
        "missing key field order_id",
    ),
    (b"x" * 150_000, "oversized record"),
]


@strawberry.type(description="Orders per product in one-minute windows every 20 seconds.")
class ProductSalesSliding:
    product_id: str
    window_start: datetime.datetime
    window_end: datetime.datetime
    order_count: int
    revenue: float


# A sliding window beside the demo's tumbling one.
SLIDING_SALES = dataclasses.replace(
    demo.PRODUCT_SALES,
    name="ProductSalesSliding",
    graphql_type=ProductSalesSliding,
    sql=demo.PRODUCT_SALES.sql.replace(
        "window(ts, '1 minute')", "window(ts, '1 minute', '20 seconds')"
    ),
)


@strawberry.type(description="The average placed order per product, over every event.")
class AverageSale:
    product_id: str
    average_amount: float
    order_count: int


# An average cannot be kept from the view's rows (schema.stream_aggregates): this view keeps
# a Spark streaming aggregation of its own beside the graph.
AVERAGE_SALE = View(
    name="AverageSale",
    source="orders",
    sql="SELECT product_id, CAST(avg(amount) AS DOUBLE) AS average_amount, "
        "count(*) AS order_count FROM orders WHERE status = 'placed' GROUP BY product_id",
    key=("product_id",),
    graphql_type=AverageSale,
    kind=ViewKind.AGGREGATE,
)


@pytest.fixture(scope="module")
def shop(spark, settings, tmp_path_factory):
    """Run the engine over seeded demo events in three rounds, as the tests below read."""
    settings = isolated(settings, tmp_path_factory.mktemp("engine"), redis_db=1)
    # Delta maintenance after every batch, so every test below also checks that it changes
    # nothing a reader sees.
    settings = settings.model_copy(update={"delta_maintenance_interval_s": 0.001})
    test_catalog = catalog_on("engine-test")
    catalog = Catalog.of(
        test_catalog.sources.values(), [*test_catalog.views.values(), SLIDING_SALES, AVERAGE_SALE]
    )
    topics = {s.name: s.topic for s in catalog.sources.values()}
    customers, orders = shop_events("engine-test", seed=3, count=1500)

    # Round 1: customers, so that every order below finds its customer (stream-static join).
    produce(settings.kafka_bootstrap, customers)
    run_once(spark, settings, catalog)
    # Round 2: orders, with bad records among them.
    produce(settings.kafka_bootstrap, orders[:700])
    produce(
        settings.kafka_bootstrap,
        [(topics["orders"], f"bad{i}", v) for i, (v, _) in enumerate(BAD_ORDERS)],
    )
    produce(settings.kafka_bootstrap, orders[700:])
    run_once(spark, settings, catalog)
    # Round 3: one event far behind the watermark: counted as late, not aggregated.
    newest = max(ts(json.loads(v)["ts"]) for _, _, v in orders if v)
    late = {
        "order_id": "LATE1",
        "customer_id": "C00001",
        "product_id": "P-LATE",
        "amount": 5.0,
        "status": "placed",
        "ts": (newest - datetime.timedelta(minutes=10)).isoformat(),
    }
    produce(settings.kafka_bootstrap, [(topics["orders"], "LATE1", json.dumps(late).encode())])
    run_once(spark, settings, catalog)

    client = redis.Redis.from_url(settings.redis_url)
    yield {
        "settings": settings,
        "catalog": catalog,
        "customers": customers,
        "orders": orders,
        "late": late,
        "redis": client,
    }
    client.close()


def test_upsert_view_keeps_the_latest_row_per_key(shop):
    expected = expected_customers(shop["customers"])
    assert redis_rows(shop["redis"], "Customer") == expected
    delta = delta_frame(shop["settings"], "Customer")
    assert {r["customer_id"]: r for r in delta.to_dict("records")} == expected


def test_enriched_upsert_view_applies_updates_and_tombstones(shop):
    customers = expected_customers(shop["customers"])
    late = [(None, "LATE1", json.dumps(shop["late"]).encode())]
    latest = expected_orders(shop["orders"] + late, customers)
    assert any(v is None for _, _, v in shop["orders"]), "the events include deletes"
    rows = redis_rows(shop["redis"], "Order")
    assert set(rows) == set(latest)
    for key, row in rows.items():
        want = latest[key]
        assert (row["status"], row["amount"], row["customer_tier"]) == (
            want["status"],
            want["amount"],
            want["customer_tier"],
        ), key
        assert ts(row["ts"]) == ts(want["ts"])
    delta = delta_frame(shop["settings"], "Order")
    assert set(delta["order_id"]) == set(latest)


def test_delta_tables_are_maintained_between_batches(shop):
    settings = shop["settings"]
    path = delta_table_path(settings.delta_location, "Order", 0)
    table = DeltaTable(path)
    operations = [commit["operation"] for commit in table.history()]
    assert "OPTIMIZE" in operations, operations
    assert any(p.name.endswith(".checkpoint.parquet") for p in Path(path, "_delta_log").iterdir())
    # What readers see is what the batches wrote: Delta holds Redis's rows.
    rows = redis_rows(shop["redis"], "Order")
    assert sorted(live_rows(table)["order_id"].to_pylist()) == sorted(rows)


def test_aggregate_view_matches_a_batch_computation(shop):
    late = [(None, "LATE1", json.dumps(shop["late"]).encode())]
    expected = expected_customer_stats(shop["orders"] + late)
    rows = redis_rows(shop["redis"], "CustomerStats")
    assert set(rows) == set(expected.index)
    for customer_id, want in expected.iterrows():
        row = rows[customer_id]
        assert row["order_count"] == want.order_count
        assert row["total_spent"] == pytest.approx(want.total_spent)
        assert row["avg_order"] == pytest.approx(want.avg_order)
        assert (row["max_order"], row["min_order"]) == pytest.approx(
            (want.max_order, want.min_order)
        )
        assert ts(row["last_order_at"]) == want.last_order_at.to_pydatetime()
    delta = delta_frame(shop["settings"], "CustomerStats").set_index("customer_id")
    assert delta["order_count"].to_dict() == expected["order_count"].to_dict()


def _assert_windows(rows: dict[str, dict], expected: pd.DataFrame) -> None:
    """The view's one-minute windows equal the batch computation, window by window."""
    actual = {(r["product_id"], ts(r["window_start"])): r for r in rows.values()}
    want = {(p, w.to_pydatetime()): v for (p, w), v in expected.iterrows()}
    assert set(actual) == set(want), "the late event must not open a window"
    for key, value in want.items():
        assert actual[key]["order_count"] == value.order_count
        assert actual[key]["revenue"] == pytest.approx(value.revenue)
        assert ts(actual[key]["window_end"]) - key[1] == datetime.timedelta(minutes=1)


def _late_events_counted(client: redis.Redis, view: str) -> ViewMeta:
    """The view's meta once it counts a late event: Spark reports late events in its query
    progress, which reaches us asynchronously."""

    def meta() -> ViewMeta:
        return ViewMeta.from_fields(client.hgetall(meta_key(view)))

    wait_until(lambda: meta().late_events >= 1, timeout_s=30, what=f"{view}'s late event")
    return meta()


def test_window_view_matches_a_batch_computation_and_counts_late_events(shop):
    _assert_windows(
        redis_rows(shop["redis"], "ProductSales"), expected_product_sales(shop["orders"])
    )
    meta = _late_events_counted(shop["redis"], "ProductSales")
    assert meta.late_events == 1
    assert meta.watermark, "the watermark is recorded"


def test_sliding_window_view_matches_a_batch_computation(shop):
    frame = placed(shop["orders"])
    # Each event falls in the three 1-minute windows that start at the 20 s marks before it.
    last_start = frame["ts"].dt.floor("20s")
    frame = pd.concat(
        [frame.assign(window_start=last_start - pd.Timedelta(seconds=20 * k)) for k in range(3)]
    )
    expected = frame.groupby(["product_id", "window_start"]).agg(
        order_count=("amount", "size"), revenue=("amount", "sum")
    )
    _assert_windows(redis_rows(shop["redis"], "ProductSalesSliding"), expected)
    _late_events_counted(shop["redis"], "ProductSalesSliding")


def test_a_stream_aggregate_outside_the_graph_runs_a_query_of_its_own(shop):
    catalog = shop["catalog"]
    assert catalog.view("ProductSales").in_graph and not catalog.view("AverageSale").in_graph
    late = [(None, "LATE1", json.dumps(shop["late"]).encode())]  # no watermark: it counts
    frame = placed(shop["orders"] + late)
    want = frame.groupby("product_id")["amount"].agg(["mean", "size"])
    rows = redis_rows(shop["redis"], "AverageSale")
    assert set(rows) == set(want.index)
    for product, (mean, size) in want.iterrows():
        assert rows[product]["order_count"] == size
        assert rows[product]["average_amount"] == pytest.approx(mean)
    # Its own versions: its query's batches, not the graph's.
    meta = ViewMeta.from_fields(shop["redis"].hgetall(meta_key("AverageSale")))
    assert meta.version >= 0 and meta.offsets


def test_bad_records_are_dead_lettered_with_reasons_and_counted(shop):
    settings = shop["settings"]
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": "dlq-check",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([deadletter_topic("orders")])
    got = []
    try:
        for _ in range(120):
            message = consumer.poll(0.5)
            # The topic is named after the source, not its topic: other tests' shops
            # dead-letter into it too. This shop's bad records are keyed bad<i>.
            mine = {f"bad{i}".encode() for i in range(len(BAD_ORDERS))}
            if message is not None and not message.error() and message.key() in mine:
                got.append((message.value(), dict(message.headers())["reason"].decode()))
            if len(got) >= len(BAD_ORDERS):
                break
    finally:
        consumer.close()
    assert len(got) == len(BAD_ORDERS)
    for (raw, reason), (sent, expected_reason) in zip(sorted(got), sorted(BAD_ORDERS), strict=True):
        assert raw == sent, [r for _, r in got]
        assert expected_reason in reason, reason
    for view in ("Order", "CustomerStats", "ProductSales"):
        meta = ViewMeta.from_fields(shop["redis"].hgetall(meta_key(view)))
        assert meta.dead_letters == len(BAD_ORDERS)
        assert meta.version >= 0 and meta.offsets


def test_offsets_and_watermark_are_recorded_with_each_commit_in_redis_and_delta(shop):
    settings = shop["settings"]
    for view in ("CustomerStats", "ProductSales"):
        meta = ViewMeta.from_fields(shop["redis"].hgetall(meta_key(view)))
        topic = shop["catalog"].source_of(shop["catalog"].view(view)).topic
        assert sum(meta.offsets[topic].values()) == len(shop["orders"]) + len(BAD_ORDERS) + 1
        history = DeltaTable(delta_table_path(settings.delta_location, view, 0)).history()
        commits = [json.loads(c["userMetadata"]) for c in history if c.get("userMetadata")]
        newest = max(commits, key=lambda c: c["batch_id"])
        assert newest["view"] == view and newest["committed_at_ms"] > 0
        assert newest["late_events"] >= 0 and newest["generation"] == 0
        assert sum(newest["offsets"][topic].values()) <= sum(meta.offsets[topic].values())
    # The late event's batch changed CustomerStats, so its Delta commit covers everything.
    stats = ViewMeta.from_fields(shop["redis"].hgetall(meta_key("CustomerStats")))
    history = DeltaTable(delta_table_path(settings.delta_location, "CustomerStats", 0)).history()
    newest = max(
        (json.loads(c["userMetadata"]) for c in history if c.get("userMetadata")),
        key=lambda c: c["batch_id"],
    )
    assert newest["offsets"] == stats.offsets and newest["batch_id"] == stats.version
    # The change data feed records every MERGE (updates with their pre- and post-images).
    path = delta_table_path(settings.delta_location, "CustomerStats", 0)
    changes = pa.table(DeltaTable(path).load_cdf(starting_version=0))
    assert {"insert", "update_preimage", "update_postimage"} <= set(
        changes.column("_change_type").to_pylist()
    )
    # Each pre-image (made from the row Redis held) is the row the key's previous commit
    # left, with the table's types.
    meta_columns = {"_change_type", "_commit_version", "_commit_timestamp"}
    last: dict[str, dict] = {}
    checked = 0
    for change in sorted(changes.to_pylist(), key=lambda c: (
            c["_commit_version"], c["_change_type"] != "update_preimage")):
        row = {k: v for k, v in change.items() if k not in meta_columns}
        if change["_change_type"] == "update_preimage":
            assert row == last[row["customer_id"]]
            checked += 1
        elif change["_change_type"] in ("insert", "update_postimage"):
            last[row["customer_id"]] = row
    assert checked
    sales = ViewMeta.from_fields(shop["redis"].hgetall(meta_key("ProductSales")))
    newest_event = max(ts(json.loads(v)["ts"]) for _, _, v in shop["orders"] if v)
    assert ts(sales.watermark) == newest_event - datetime.timedelta(seconds=30)


def test_status_shows_every_view_caught_up_with_spark_progress(shop):
    settings, catalog = shop["settings"], shop["catalog"]

    def rows() -> dict[str, ViewStatus]:
        return {r.view: r for r in collect(settings, catalog)}

    # Spark reports progress asynchronously, after each batch.
    wait_until(lambda: all(r.batch_ms > 0 for r in rows().values()), timeout_s=30,
               what="every view's batch time in its meta")
    status = rows()
    assert set(status) == set(catalog.views)
    for row in status.values():
        assert row.version >= 0 and row.committed_at_ms > 0, row
        assert row.lag == 0 and row.last_error == "", row
    for view in ("Order", "CustomerStats", "ProductSales"):
        assert status[view].dead_letters == len(BAD_ORDERS)
    assert status["ProductSales"].watermark and status["ProductSales"].late_events >= 1


def test_engine_metrics_count_late_and_dead_lettered_events(shop):
    # Counters of this process (the engine ran in it); other tests' engines add to them.
    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0

    wait_until(lambda: sample("viewgate_view_late_events_total", view="ProductSales") >= 1,
               timeout_s=30, what="the late event in the engine's metrics")
    assert sample("viewgate_dead_letters_total", source="orders") >= len(BAD_ORDERS)
    assert sample("viewgate_view_batch_duration_seconds_count", view="CustomerStats") >= 1
    assert sample("viewgate_view_kafka_lag_events", view="CustomerStats") == 0


def test_a_failed_query_leaves_its_reason_until_a_batch_gets_through(shop):
    client, view = shop["redis"], "FailingView"
    recorder = ProgressRecorder(shop["settings"].redis_url)
    query_id = "11111111-2222-3333-4444-555555555555"
    name = _query_name(SimpleNamespace(name=view), 0)
    recorder.onQueryStarted(SimpleNamespace(id=query_id, name=name))
    recorder.onQueryTerminated(SimpleNamespace(
        id=query_id, exception="org.apache.spark.SparkException: the sink failed\n\tat ..."))
    meta = ViewMeta.from_fields(client.hgetall(meta_key(view)))
    assert meta.last_error == "org.apache.spark.SparkException: the sink failed"
    progress = SimpleNamespace(
        id=query_id, name=name, batchId=7, stateOperators=[], inputRowsPerSecond=12.0,
        processedRowsPerSecond=30.5, batchDuration=250, numInputRows=60, sources=[],
        eventTime={}, timestamp="2026-11-23T00:00:00.000Z",
        durationMs={"triggerExecution": 250})
    recorder.onQueryProgress(SimpleNamespace(progress=progress))
    meta = ViewMeta.from_fields(client.hgetall(meta_key(view)))
    assert meta.last_error == "" and meta.batch_ms == 250
    assert meta.input_rate == 12.0 and meta.processing_rate == 30.5
    client.delete(meta_key(view))


def test_a_replayed_batch_changes_neither_redis_nor_delta(shop):
    settings, catalog = shop["settings"], shop["catalog"]
    view = catalog.view("Customer")
    meta = ViewMeta.from_fields(shop["redis"].hgetall(meta_key("Customer")))
    before_rows = redis_rows(shop["redis"], "Customer")
    table = DeltaTable(delta_table_path(settings.delta_location, "Customer", 0))
    before_version = table.version()

    committer = ViewCommitter(settings, view, 0, ("customer_id",))
    tampered = dict(next(iter(before_rows.values())), name="REPLAYED")
    status = committer.commit(meta.version, [tampered])

    assert status == REPLAYED
    assert redis_rows(shop["redis"], "Customer") == before_rows
    table.update_incremental()
    assert table.version() == before_version
    assert "REPLAYED" not in set(delta_frame(settings, "Customer")["name"])


def test_spark_analysis_names_the_view_field_and_fix_of_a_mismatch(spark):
    import strawberry

    from schema.catalog import View, ViewKind
    from schema.errors import CatalogError

    @strawberry.type
    class ProductRevenue:
        product_id: str
        revenue: int  # the SQL yields a double

    view = View(
        name="ProductRevenue",
        source="orders",
        sql="SELECT product_id, CAST(sum(amount) AS DOUBLE) AS revenue FROM orders "
        "GROUP BY product_id",
        key=("product_id",),
        graphql_type=ProductRevenue,
        kind=ViewKind.AGGREGATE,
    )
    catalog = Catalog.of(demo.CATALOG.sources.values(), [*demo.CATALOG.views.values(), view])
    with pytest.raises(CatalogError) as error:
        analyse(spark, catalog)
    message = str(error.value)
    assert "view ProductRevenue, field revenue" in message
    assert "Fix:" in message
