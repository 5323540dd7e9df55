"""The demo shop on topics of a test's own, and independent pandas computations of what
every view must hold after a given list of events (the engine's answers are checked
against these)."""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import os
from pathlib import Path

import pandas as pd
import redis
from confluent_kafka import Producer
from deltalake import DeltaTable

from engine.runner import start_all
from schema import demo
from schema.catalog import Catalog
from schema.delta_read import live_rows
from schema.settings import Settings
from schema.storage import decode_row, delta_table_path, row_key
from viewgate.demo_events import CUSTOMERS_TOPIC, generate

Record = tuple[str, str | None, bytes | None]  # (topic, key, value); value None: tombstone


def catalog_on(prefix: str) -> Catalog:
    """The demo catalog reading topics of its own, so tests do not share data."""
    sources = [
        dataclasses.replace(s, topic=f"{prefix}.{s.topic}") for s in demo.CATALOG.sources.values()
    ]
    return Catalog.of(sources, demo.CATALOG.views.values())


# For an engine started as a subprocess: `--catalog shop_views:PREFIXED_CATALOG`.
PREFIXED_CATALOG = catalog_on(os.environ.get("SHOP_TOPIC_PREFIX", "unset"))


def isolated(settings: Settings, data_dir: Path, redis_db: int) -> Settings:
    """The session's Kafka and Redis, with a data folder and a Redis database of the test's
    own: Redis keys name views, not topics, so two tests' views would share them."""
    redis_url = f"{settings.redis_url.rsplit('/', 1)[0]}/{redis_db}"
    return settings.model_copy(update={"data_dir": data_dir, "redis_url": redis_url})


def shop_events(prefix: str, seed: int, count: int) -> tuple[list[Record], list[Record]]:
    """The first `count` seeded demo events on `prefix`'s topics: (customers, orders)."""
    customers: list[Record] = []
    orders: list[Record] = []
    for topic, key, value in itertools.islice(generate(seed=seed), count):
        (customers if topic == CUSTOMERS_TOPIC else orders).append(
            (f"{prefix}.{topic}", key, value)
        )
    return customers, orders


def produce(bootstrap: str, records: list[Record]) -> None:
    # Idempotence keeps the log in send order across retries (a fresh topic's first
    # requests often are retried); the expectations below assume that order.
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "message.max.bytes": 1_000_000}
    )
    for topic, key, value in records:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(60) == 0


def run_once(spark, settings, catalog) -> None:
    """Every view's query over all there is now (Spark's availableNow), then stop."""
    for query in start_all(spark, settings, catalog, available_now=True):
        assert query.awaitTermination(300), f"{query.name} did not finish"
        assert query.exception() is None, query.exception()
    for listener_query in spark.streams.active:
        listener_query.stop()


def redis_rows(client: redis.Redis, view: str, generation: int = 0) -> dict[str, dict]:
    keys = list(client.scan_iter(match=row_key(view, generation, "*"), count=1000))
    values = client.mget(keys) if keys else []
    prefix = row_key(view, generation, "")
    # A key the engine deleted between the scan and the MGET comes back as None: gone.
    return {k.decode()[len(prefix) :]: decode_row(v)
            for k, v in zip(keys, values, strict=True) if v is not None}


def delta_frame(settings, view: str, generation: int = 0) -> pd.DataFrame:
    path = delta_table_path(settings.delta_location, view, generation)
    return live_rows(DeltaTable(path)).to_pandas()


def ts(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def expected_customers(customers: list[Record]) -> dict[str, dict]:
    latest: dict[str, dict] = {}
    for _, key, value in customers:
        if value is None:
            latest.pop(key, None)
        else:
            latest[key] = json.loads(value)
    return latest


def expected_order_records(orders: list[Record]) -> dict[str, dict]:
    """The latest event per order id (a tombstone deletes it)."""
    return expected_customers(orders)


def expected_orders(orders: list[Record], customers: dict[str, dict]) -> dict[str, dict]:
    """Latest order per id with its customer's current tier and country (a view-to-view
    join: the customers' final rows)."""
    return {
        key: order | {"customer_tier": customers.get(order["customer_id"], {}).get("tier"),
                      "customer_country": customers.get(order["customer_id"], {}).get("country")}
        for key, order in expected_order_records(orders).items()
    }


def placed(orders: list[Record]) -> pd.DataFrame:
    rows = [json.loads(v) for _, _, v in orders if v and json.loads(v)["status"] == "placed"]
    frame = pd.DataFrame(rows)
    frame["ts"] = pd.to_datetime(frame["ts"], utc=True)
    return frame


def expected_customer_stats(orders: list[Record]) -> pd.DataFrame:
    """Totals over each customer's current orders that are not cancelled."""
    current = [o for o in expected_order_records(orders).values() if o["status"] != "cancelled"]
    frame = pd.DataFrame(current, columns=["customer_id", "amount", "ts"])
    frame["ts"] = pd.to_datetime(frame["ts"], utc=True)
    return (
        frame
        .groupby("customer_id")
        .agg(
            order_count=("amount", "size"),
            total_spent=("amount", "sum"),
            avg_order=("amount", "mean"),
            max_order=("amount", "max"),
            min_order=("amount", "min"),
            last_order_at=("ts", "max"),
        )
    )


def expected_product_sales(orders: list[Record]) -> pd.DataFrame:
    frame = placed(orders)
    frame["window_start"] = frame["ts"].dt.floor("1min")
    return frame.groupby(["product_id", "window_start"]).agg(
        order_count=("amount", "size"), revenue=("amount", "sum")
    )


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b))


def view_mismatches(
    client: redis.Redis, customers: list[Record], orders: list[Record], generation: int = 0
) -> list[str]:
    """What differs between Redis and the batch computation, per view (empty: all equal).
    For the shop's events with no event late beyond the watermark."""
    problems: list[str] = []
    want_customers = expected_customers(customers)
    if redis_rows(client, "Customer", generation) != want_customers:
        problems.append("Customer")

    def same_order(row: dict, want: dict) -> bool:
        return ((row["customer_id"], row["status"], row["amount"], ts(row["ts"]))
                == (want["customer_id"], want["status"], want["amount"], ts(want["ts"])))

    got_records = redis_rows(client, "OrderRecord", generation)
    want_records = expected_order_records(orders)
    if set(got_records) != set(want_records) or not all(
            same_order(got_records[k], want_records[k]) for k in got_records):
        problems.append("OrderRecord")

    want_orders = expected_orders(orders, want_customers)
    got_orders = redis_rows(client, "Order", generation)
    if set(got_orders) != set(want_orders) or any(
        (row["status"], row["amount"], row["customer_tier"], ts(row["ts"]))
        != (want["status"], want["amount"], want["customer_tier"], ts(want["ts"]))
        for row, want in ((got_orders[k], want_orders[k]) for k in got_orders)
    ):
        problems.append("Order")

    stats = expected_customer_stats(orders)
    got_stats = redis_rows(client, "CustomerStats", generation)
    wrong = sorted(set(got_stats) ^ set(stats.index)) + [
        c for c, want in stats.iterrows() if c in got_stats and (
            got_stats[c]["order_count"] != want.order_count
            or not _close(got_stats[c]["total_spent"], want.total_spent)
            or ts(got_stats[c]["last_order_at"]) != want.last_order_at.to_pydatetime())]
    if wrong:
        first = wrong[0]
        problems.append(f"CustomerStats ({len(wrong)} customers, e.g. {first}: got "
                        f"{got_stats.get(first)}, want "
                        f"{stats.loc[first].to_dict() if first in stats.index else None})")

    sales = expected_product_sales(orders)
    got_sales = {
        (r["product_id"], ts(r["window_start"])): r
        for r in redis_rows(client, "ProductSales", generation).values()
    }
    want_sales = {(p, w.to_pydatetime()): v for (p, w), v in sales.iterrows()}
    if set(got_sales) != set(want_sales) or any(
        got_sales[k]["order_count"] != v.order_count
        or not _close(got_sales[k]["revenue"], v.revenue)
        for k, v in want_sales.items()
    ):
        problems.append("ProductSales")
    return problems
