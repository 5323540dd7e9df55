"""The graph computed by its read's Spark tasks gives what the driver gives: the upsert
views (engine.task_upsert) and the views over views after them (engine.task_tables), with
the same Redis rows and indexes, the same change events (previous rows included: tier
changes, cancellations, deleted orders), the same Delta tables. The same records go
through two graphs, one with the tasks' path and one without; the batch function runs as
Spark's foreachBatch would call it.
"""

from __future__ import annotations

import datetime
import itertools
import json
import random

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
from engine.runner import prepare
from schema.arrow_rows import arrow_rows
from schema.delta_read import live_rows
from schema.storage import commit_batch_id, delta_table_path, index_key, key_of

pytestmark = pytest.mark.integration

UPSERTS = ("Customer", "OrderRecord")  # the demo's upsert views: columns of their source
TABLES = ("Order", "CustomerStats")  # its views over views: routed by customer_id
VIEWS = (*UPSERTS, *TABLES, "ProductSales")


def _rounded(row):
    """A row with its floats rounded: the tasks fold ProductSales' sums, and add a
    customer's changes to CustomerStats' sums, in another order (engine.task_read,
    engine.task_tables), which may move a float's last bits."""
    if row is None:
        return None
    return json.dumps({k: round(v, 6) if isinstance(v, float) else v
                       for k, v in row.items()}, sort_keys=True, default=str)


def _moved(orders):
    """An order of the first batch given to another customer (a group move)."""
    order = next(o for o in orders[:400] if o[2] is not None)
    other = next(json.loads(o[2])["customer_id"] for o in orders[:400] if o[2] is not None
                 and json.loads(o[2])["customer_id"] != json.loads(order[2])["customer_id"])
    return (order[0], order[1], json.dumps({**json.loads(order[2]), "customer_id": other}))


def _without_customer(orders):
    """A new order with no customer: CustomerStats' row for the null customer has no key
    (the driver dead-letters it)."""
    last = json.loads(next(o for o in reversed(orders) if o[2] is not None)[2])
    order = {**last, "order_id": "O-NONE", "customer_id": None}
    return (orders[0][0], "O-NONE", json.dumps(order))


EXTRA = {"in-place": lambda orders: [], "group-move": lambda orders: [_moved(orders)],
         "no-customer": lambda orders: [_without_customer(orders)]}


class _Graph:
    """A graph named `name`, on topics and a Redis database of its own, with or without
    the tasks' path; its batches run by hand, as Spark's foreachBatch would call them."""

    def __init__(self, spark, settings, tmp_path, task_read: bool, redis_db: int,
                 name: str, task_delta: bool = True) -> None:
        self.prefix = name.replace("-", "")
        self.settings = isolated(settings, tmp_path / name, redis_db=redis_db).model_copy(
            update={"engine_task_read": task_read, "engine_task_tables": task_read,
                    "engine_task_delta": task_read and task_delta,
                    "engine_task_read_min_records": 0, "engine_driver_fetch_max_records": 0,
                    "changefeed_prefix": f"{name}."})
        self.client = redis.Redis.from_url(self.settings.redis_url)
        self.client.flushdb()
        self.catalog = catalog_on(self.prefix)
        generations, schemas = prepare(spark, self.settings, self.catalog)
        self.step = GraphBatch(spark, self.settings, self.catalog, generations, schemas,
                               str(tmp_path / name / "checkpoint"), dead_letters=False)
        self.ends: dict = {}
        self.spark = spark
        self.delta_in_tasks: list[set[str]] = []  # per batch run: views whose files tasks wrote

    def on_topics(self, records: list) -> list:
        """Records of the shop's topics (no prefix) on this graph's topics."""
        return [(f"{self.prefix}.{topic}", key, value) for topic, key, value in records]

    def run(self, batch_id: int, records: list) -> set[str]:
        """One batch of `records` (on this graph's topics): the views Spark's tasks
        computed in it."""
        produce(self.settings.kafka_bootstrap, records)
        batch, self.ends = graph_records(self.spark, self.settings, self.catalog, self.ends)
        self.step(batch, batch_id)
        self.delta_in_tasks.append(
            {v for v in VIEWS if f"{v}_delta_in_tasks" in self.step.timings})
        return {v for v in VIEWS if f"{v}_in_tasks" in self.step.timings}

    def rows(self) -> dict:
        return {v: {k: _rounded(r) for k, r in redis_rows(self.client, v).items()}
                for v in VIEWS}

    def delta_rows(self) -> dict:
        return {v: {key_of(r, self.catalog.view(v).key): _rounded(r) for r in arrow_rows(
            live_rows(DeltaTable(delta_table_path(self.settings.delta_location, v, 0))))}
            for v in VIEWS}

    def close(self) -> None:
        self.step.close()
        self.client.close()


def _run(spark, settings, tmp_path, task_read: bool, redis_db: int, case: str,
         task_delta: bool = True):
    """Two batches of the same events through a graph; what each view published in the
    second, its Redis rows and index entries, its Delta rows, and which views the tasks
    computed in each batch. `case`: what the second batch adds to the shop's events
    (EXTRA)."""
    graph = _Graph(spark, settings, tmp_path, task_read, redis_db,
                   f"upsert{'tasks' if task_read else 'driver'}-{case}", task_delta)
    settings, client, catalog = graph.settings, graph.client, graph.catalog
    customers, orders = in_time_events(graph.prefix, 800)
    half = len(customers) // 2
    in_tasks = [graph.run(0, customers[:half] + orders[:400])]
    assert view_mismatches(client, customers[:half], orders[:400]) == []

    # Batch 1: tier changes among its customer events, order updates and deletes.
    orders = orders + EXTRA[case](orders)
    feeds = {v: feed_ends(settings.kafka_bootstrap, v, settings.changefeed_prefix)
             for v in VIEWS}
    in_tasks.append(graph.run(1, customers[half:] + orders[400:]))
    assert view_mismatches(client, customers, orders) == []
    published = {v: sorted((e.key, e.op, _rounded(e.row), _rounded(e.before), e.version)
                           for _, e in feed_changes(settings.kafka_bootstrap, v, feeds[v],
                                                    settings.changefeed_prefix))
                 for v in VIEWS}
    # Scores rounded as the rows are: the tasks sum a group's changes in another order.
    indexes = {(v, f): sorted((m, round(score, 6)) for m, score in client.zrange(
        index_key(v, 0, f), 0, -1, withscores=True))
               for v in VIEWS for f in catalog.view(v).indexes}
    delta = graph.delta_rows()
    changes = {v: _batch_changes(delta_table_path(settings.delta_location, v, 0), 1)
               for v in VIEWS}
    rows = graph.rows()
    graph.close()
    return in_tasks, published, rows, indexes, delta, changes, graph.delta_in_tasks


def _batch_changes(path: str, batch_id: int) -> list:
    """The change data feed of the commit of batch `batch_id` (its userMetadata's)."""
    table = DeltaTable(path)
    version = next(c["version"] for c in table.history()
                   if commit_batch_id(c) == batch_id)
    changes = pa.table(table.load_cdf(starting_version=version, ending_version=version))
    return sorted((r.pop("_change_type"), _rounded(r)) for r in changes.drop_columns(
        ["_commit_version", "_commit_timestamp"]).to_pylist())


@pytest.mark.parametrize("case", list(EXTRA))
def test_the_tasks_compute_the_views_as_the_driver_does(spark, settings, tmp_path, case):
    dbs = {"in-place": (17, 18), "group-move": (19, 30), "no-customer": (9, 10)}[case]
    # One case with the driver writing Delta from the rows of the tasks' events.
    task_delta = case != "no-customer"
    tasks = _run(spark, settings, tmp_path, True, dbs[0], case, task_delta)
    driver = _run(spark, settings, tmp_path, False, dbs[1], case)
    # The first batch meets an empty Redis without its complete mark: the tasks cannot
    # know the previous rows, so the driver computes it. The second is the tasks'; an
    # order moved to another customer would be half in two tasks of the second stage,
    # and a row without a key is the driver's to dead-letter: then the tasks hand the
    # views over views back to the driver.
    assert tasks[0] == [set(), {*UPSERTS, *TABLES} if case == "in-place" else set(UPSERTS)]
    assert driver[0] == [set(), set()]
    published_t, published_d = tasks[1], driver[1]
    for view in VIEWS:
        assert published_t[view] == published_d[view], view
    ops = {op for view in (*UPSERTS, *TABLES) for _, op, *_ in published_t[view]}
    assert {"insert", "update", "delete"} <= ops  # the batch had every kind of change
    assert tasks[2] == driver[2]  # Redis rows
    assert tasks[3] == driver[3]  # index entries
    assert tasks[4] == driver[4]  # Delta
    for view in VIEWS:
        assert tasks[5][view] == driver[5][view], view  # Delta's change data of batch 1
    assert {kind for view in (*UPSERTS, *TABLES) for kind, _ in tasks[5][view]} == {
        "insert", "update_preimage", "update_postimage", "delete"}
    # The tasks that computed a view wrote its Delta files, which the driver committed.
    assert tasks[6] == (tasks[0] if task_delta else [set(), set()])
    assert driver[6] == driver[0]


def _random_batches(rng: random.Random, count: int) -> list[tuple[list, list]]:
    """`count` batches of shop events (topic names without a prefix): customers arrive and
    change tier; orders are placed, paid, cancelled, deleted, and in every second batch
    from the second one on, some are given to another customer (group moves). Event
    times only grow, so no event is late."""
    tiers = ("bronze", "silver", "gold")
    customers: dict[str, dict] = {}
    orders: dict[str, dict] = {}
    start = datetime.datetime(2026, 11, 30, tzinfo=datetime.UTC)
    stamps = itertools.count()
    order_ids = itertools.count(1)  # never reused: a new order is not a moved one

    def order_event(order: dict) -> tuple:
        order["ts"] = (start + datetime.timedelta(seconds=next(stamps))).isoformat()
        return ("orders", order["order_id"], json.dumps(order))

    batches = []
    for number in range(count):
        customer_events, order_events = [], []
        previous = sorted(orders)  # orders stored before this batch
        for _ in range(rng.randrange(3, 8)):  # new customers
            customer_id = f"C{len(customers) + 1}"
            customers[customer_id] = {"customer_id": customer_id, "name": customer_id,
                                      "tier": rng.choice(tiers), "country": "NL"}
            customer_events.append(("customers", customer_id,
                                    json.dumps(customers[customer_id])))
        for customer in rng.sample(sorted(customers), min(3, len(customers))):  # tiers
            customers[customer]["tier"] = rng.choice(tiers)
            customer_events.append(("customers", customer, json.dumps(customers[customer])))
        for _ in range(rng.randrange(20, 40)):  # placed
            order_id = f"O{next(order_ids)}"
            orders[order_id] = {"order_id": order_id,
                                "customer_id": rng.choice(sorted(customers)),
                                "product_id": f"P{rng.randrange(4)}",
                                "amount": round(rng.uniform(1, 100), 2), "status": "placed"}
            order_events.append(order_event(orders[order_id]))
        live = sorted(orders)
        for order_id in rng.sample(live, min(10, len(live))):  # paid or cancelled
            orders[order_id]["status"] = rng.choice(("paid", "cancelled"))
            order_events.append(order_event(orders[order_id]))
        moved = rng.sample(previous, 2) if number % 2 == 1 else []
        for order_id in moved:  # given to another customer
            owner = orders[order_id]["customer_id"]
            orders[order_id]["customer_id"] = rng.choice(sorted(set(customers) - {owner}))
            order_events.append(order_event(orders[order_id]))
        kept = [o for o in live if o not in moved]
        for order_id in rng.sample(kept, min(3, len(kept))):  # deleted
            del orders[order_id]
            order_events.append(("orders", order_id, None))
        batches.append((customer_events, order_events))
    return batches


def test_random_batches_through_the_tasks_equal_their_batch_computation(
        spark, settings, tmp_path):
    """Property-style: random tier changes, status changes, deletes and group moves, batch
    after batch; after each, both graphs hold what the batch computation of every event
    so far gives, and the same rows. The tasks compute the views over views in the
    batches without a move and hand them back in those with one."""
    graphs = [_Graph(spark, settings, tmp_path, True, 9, "randomtasks"),
              _Graph(spark, settings, tmp_path, False, 10, "randomdriver")]
    seen_customers: list = []
    seen_orders: list = []
    computed = []
    try:
        for batch_id, (customers, orders) in enumerate(_random_batches(random.Random(7), 6)):
            seen_customers += customers
            seen_orders += orders
            by_tasks = [graph.run(batch_id, graph.on_topics(customers + orders))
                        for graph in graphs]
            computed.append(by_tasks[0])
            assert by_tasks[1] == set()
            assert graphs[0].delta_in_tasks[-1] == by_tasks[0]  # their files by the tasks
            for graph in graphs:
                assert view_mismatches(graph.client, graph.on_topics(seen_customers),
                                       graph.on_topics(seen_orders)) == [], (batch_id,
                                                                             graph.prefix)
            assert graphs[0].rows() == graphs[1].rows(), batch_id
            assert graphs[0].delta_rows() == graphs[1].delta_rows(), batch_id
    finally:
        for graph in graphs:
            graph.close()
    both = {*UPSERTS, *TABLES}
    # The first batch meets an empty Redis; then odd batches move orders.
    assert computed == [set(), set(UPSERTS), both, set(UPSERTS), both, set(UPSERTS)]
