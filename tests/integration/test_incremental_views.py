"""The incremental step of views over views, property-style: random batches of order and
customer changes (inserts, updates, group moves, status changes in and out of a WHERE,
tier changes, deletes) flow through a join view and an aggregate over it; after every batch
each view equals its SQL run as a Spark batch query over its inputs' current rows."""

from __future__ import annotations

import datetime
import random

import pytest
from pyspark.sql.types import StructType

from engine.aggregates import AggregateStep, StateCodec, partial_schema, plan_aggregate
from engine.analyzer import SQL_LOCK
from engine.incremental import (
    Change,
    Key,
    Row,
    TableView,
    projected_rows,
    recompute,
    view_changes,
)
from engine.lineage import lineage
from engine.projected_join import ProjectedJoin
from schema.storage import encode_row

pytestmark = pytest.mark.integration

SCHEMAS = {
    "OrderRecord": "order_id STRING, customer_id STRING, amount DOUBLE, status STRING, "
                   "ts TIMESTAMP",
    "Customer": "customer_id STRING, tier STRING",
    "Order": "order_id STRING, customer_id STRING, amount DOUBLE, status STRING, "
             "ts TIMESTAMP, customer_tier STRING",
}
ORDER_SQL = """
    SELECT o.order_id, o.customer_id, o.amount, o.status, o.ts, c.tier AS customer_tier
    FROM OrderRecord o LEFT JOIN Customer c ON o.customer_id = c.customer_id"""
STATS_SQL = """
    SELECT customer_id, count(*) AS order_count, sum(amount) AS total_spent,
           min(amount) AS min_order, max(amount) AS max_order,
           count(DISTINCT status) AS statuses, max_by(order_id, amount) AS biggest_order,
           max(ts) AS last_order_at
    FROM `Order` WHERE status <> 'cancelled' GROUP BY customer_id"""
# Times as the engine's rows carry them (aware, UTC); Spark's batch query answers naive UTC.
START = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
# A view that picks, computes and filters columns of one view (engine.incremental's
# projected_rows evaluates it in the driver): rows enter and leave it as orders change.
BIG_SQL = """
    SELECT order_id, customer_id, CAST(amount AS DOUBLE) AS amount, customer_tier,
           IF(status = 'placed', ts, NULL) AS placed_at
    FROM `Order` WHERE status <> 'cancelled' AND amount > 100"""
KEYS = {"OrderRecord": ("order_id",), "Customer": ("customer_id",), "Order": ("order_id",),
        "CustomerStats": ("customer_id",), "BigOrder": ("order_id",)}


class Tables:
    """Every input's current rows in memory: {table: {key: row}}."""

    def __init__(self) -> None:
        self.data: dict[str, dict[Key, Row]] = {t: {} for t in KEYS}

    def rows_where(self, table: str, column: str, values: set) -> list[Row]:
        return [dict(r) for r in self.data[table].values() if r.get(column) in values]

    def apply(self, table: str, changes: dict[Key, Change]) -> None:
        for key, (_, new) in changes.items():
            if new is None:
                self.data[table].pop(key, None)
            else:
                self.data[table][key] = new

    def stored(self, table: str):
        return lambda keys: {k: self.data[table][k] for k in keys if k in self.data[table]}


def _schema(spark, ddl: str) -> StructType:
    return spark.createDataFrame([], ddl).schema


def _batch(rng: random.Random, tables: Tables, next_order: list[int]) -> dict[str, dict]:
    """A batch of random source changes: {table: {key: (previous, new)}}."""
    out: dict[str, dict[Key, Change]] = {"OrderRecord": {}, "Customer": {}}
    for _ in range(rng.randint(1, 12)):
        roll = rng.random()
        customers = tables.data["Customer"]
        orders = tables.data["OrderRecord"]
        if roll < 0.2 or not customers:  # a customer appears or changes tier
            cid = f"C{rng.randrange(6)}"
            new = {"customer_id": cid, "tier": rng.choice(["gold", "silver", "bronze"])}
            key, table, row = (cid,), "Customer", new
        elif roll < 0.27:  # a customer is deleted (its orders keep a null tier)
            key, table, row = rng.choice(list(customers)), "Customer", None
        elif roll < 0.55 or not orders:  # a new order
            next_order[0] += 1
            oid = f"O{next_order[0]:04d}"
            row = {"order_id": oid, "customer_id": f"C{rng.randrange(7)}",
                   "amount": float(rng.randrange(1, 500)), "status": "placed",
                   "ts": START + datetime.timedelta(minutes=rng.randrange(10_000))}
            key, table = (oid,), "OrderRecord"
        elif roll < 0.9:  # an order changes: status (in or out of the WHERE), customer, amount
            key = rng.choice(list(orders))
            row = dict(orders[key])
            what = rng.random()
            if what < 0.5:
                row["status"] = rng.choice(["paid", "shipped", "cancelled", "placed"])
            elif what < 0.8:
                row["customer_id"] = f"C{rng.randrange(7)}"  # moves to another group
            elif what < 0.9:
                row["amount"] = float(rng.randrange(1, 500))
            else:
                row["ts"] = START + datetime.timedelta(minutes=rng.randrange(10_000))
            table = "OrderRecord"
        else:  # an order is deleted
            key, table, row = rng.choice(list(orders)), "OrderRecord", None
        previous = out[table][key][0] if key in out[table] else tables.data[table].get(key)
        out[table][key] = (previous, row)
        tables.apply(table, {key: (previous, row)})
    return {t: {k: c for k, c in changes.items() if c[0] != c[1]} for t, changes in out.items()}


def _batch_query(spark, sql: str, tables: Tables, inputs: dict[str, StructType],
                 key: tuple[str, ...]) -> dict[Key, Row]:
    with SQL_LOCK:
        for table, schema in inputs.items():
            spark.createDataFrame(list(tables.data[table].values()), schema
                                  ).createOrReplaceTempView(table)
        rows = [r.asDict(recursive=True) for r in spark.sql(sql).collect()]
    for row in rows:
        row.update((c, v.replace(tzinfo=datetime.UTC)) for c, v in row.items()
                   if isinstance(v, datetime.datetime))
    return {tuple(r[k] for k in key): r for r in rows}


@pytest.mark.parametrize(("seed", "join_in"), [(1, "spark"), (2, "spark"), (1, "driver"),
                                               (3, "driver")])
def test_views_over_views_equal_their_batch_query_after_every_batch(spark, seed, join_in):
    """`join_in`: Order's join as a Spark query, or evaluated in the driver
    (engine.projected_join), as the graph runs it."""
    schemas = {t: _schema(spark, ddl) for t, ddl in SCHEMAS.items()}
    order = TableView("Order", ORDER_SQL, ("order_id",),
                      {"OrderRecord": schemas["OrderRecord"], "Customer": schemas["Customer"]})
    stats = TableView("CustomerStats", STATS_SQL, ("customer_id",), {"Order": schemas["Order"]})
    with SQL_LOCK:
        for table, schema in schemas.items():
            spark.createDataFrame([], schema).createOrReplaceTempView(table)
        order_lineage, stats_lineage = lineage(spark, order.sql), lineage(spark, stats.sql)
    big = TableView("BigOrder", BIG_SQL, ("order_id",), {"Order": schemas["Order"]})
    with SQL_LOCK:
        big_lineage = lineage(spark, big.sql)
    join = ProjectedJoin.plan(order, order_lineage, KEYS)
    picked = projected_rows(big)
    assert join is not None and picked is not None
    assert projected_rows(order) is None and projected_rows(stats) is None  # a join, a group
    evaluate = join.rows if join_in == "driver" else None
    rng, tables, counter = random.Random(seed), Tables(), [0]
    retracted = 0
    for _ in range(6):
        sources = _batch(rng, tables, counter)
        changed = {t: list(c.values()) for t, c in sources.items() if c}
        order_changes = view_changes(spark, order, order_lineage, changed, tables,
                                     tables.stored("Order"), evaluate=evaluate)
        tables.apply("Order", order_changes)
        tables.apply("BigOrder", view_changes(
            spark, big, big_lineage, {"Order": list(order_changes.values())}, tables,
            tables.stored("BigOrder"), evaluate=picked if join_in == "driver" else None))
        stats_changes = view_changes(spark, stats, stats_lineage,
                                     {"Order": list(order_changes.values())}, tables,
                                     tables.stored("CustomerStats"))
        tables.apply("CustomerStats", stats_changes)
        retracted += sum(1 for old, new in stats_changes.values() if old and not new)

        assert tables.data["Order"] == _batch_query(spark, ORDER_SQL, tables, order.inputs,
                                                    order.key)
        assert tables.data["CustomerStats"] == _batch_query(
            spark, STATS_SQL, tables, stats.inputs, stats.key)
        assert tables.data["BigOrder"] == _batch_query(spark, BIG_SQL, tables, big.inputs,
                                                       big.key)
    assert tables.data["CustomerStats"], "the sequence never produced a group"
    assert tables.data["BigOrder"], "no order ever met the WHERE"


# The same totals as an aggregate the engine keeps from states (engine.aggregates): only
# functions that split into partial states, and a HAVING over them.
SPLIT_SQL = """
    SELECT customer_id, count(*) AS order_count, sum(amount) AS total_spent,
           CAST(avg(amount) AS DOUBLE) AS avg_order, min(amount) AS min_order,
           max(amount) AS max_order, count(status) AS with_status,
           min(ts) AS first_order_at, max(ts) AS last_order_at
    FROM `Order` WHERE status <> 'cancelled' GROUP BY customer_id HAVING count(*) < 40"""


def _close_rows(got: dict[Key, Row], want: dict[Key, Row]) -> bool:
    """Equal rows, floats within rounding (sums kept by addition and subtraction)."""
    def close(a, b) -> bool:
        if isinstance(a, float) and isinstance(b, float):
            return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))
        return a == b
    return got.keys() == want.keys() and all(
        got[k].keys() == want[k].keys() and all(close(got[k][c], want[k][c]) for c in got[k])
        for k in got)


@pytest.mark.parametrize(("seed", "in_driver"), [(3, True), (4, True), (5, False)])
def test_an_aggregate_kept_from_states_equals_its_batch_query_after_every_batch(
        spark, seed, in_driver):
    """With its partial and final queries evaluated in the driver (engine.driver_sql) and
    as Spark queries."""
    schemas = {t: _schema(spark, ddl) for t, ddl in SCHEMAS.items()}
    order = TableView("Order", ORDER_SQL, ("order_id",),
                      {"OrderRecord": schemas["OrderRecord"], "Customer": schemas["Customer"]})
    plan = plan_aggregate(SPLIT_SQL, ("customer_id",))
    assert plan is not None and plan.table == "Order"
    with SQL_LOCK:
        for table, schema in schemas.items():
            spark.createDataFrame([], schema).createOrReplaceTempView(table)
        order_lineage = lineage(spark, order.sql)
        view_schema = spark.sql(SPLIT_SQL).schema
        step = AggregateStep(plan, StateCodec(plan, partial_schema(spark, plan,
                                                                   schemas["Order"])),
                             schemas["Order"], in_driver=in_driver)
        assert step.evaluated_in_driver is in_driver
        assert [(f.name, f.dataType) for f in step.final_schema(spark).fields] == [
            (f.name, f.dataType) for f in view_schema.fields]
    rng, tables, counter = random.Random(seed), Tables(), [0]
    states: dict[str, str] = {}  # as Redis holds them: encoded
    kept = recomputed = 0
    for _ in range(25):
        sources = _batch(rng, tables, counter)
        changed = {t: list(c.values()) for t, c in sources.items() if c}
        order_changes = view_changes(spark, order, order_lineage, changed, tables,
                                     tables.stored("Order"))
        tables.apply("Order", order_changes)
        with SQL_LOCK:
            found, new_states = step.changes(
                spark, list(order_changes.values()), lambda k: k[0],
                lambda texts: ({t: step.codec.decode(states[t]) for t in texts
                                if t in states}, True),
                tables.stored("CustomerStats"),
                lambda keys: tables.rows_where("Order", "customer_id", {k[0] for k in keys}))
        recomputed += step.recomputed
        kept += len(new_states) - step.recomputed
        for text, state in new_states.items():
            if state is None:
                states.pop(text, None)
            else:
                states[text] = step.codec.encode(state)
        tables.apply("CustomerStats", found)
        want = _batch_query(spark, SPLIT_SQL, tables, {"Order": schemas["Order"]},
                            ("customer_id",))
        assert _close_rows(tables.data["CustomerStats"], want), (
            tables.data["CustomerStats"], want)
    # Most groups were combined from their states; some were recomputed (an extreme left).
    assert kept > recomputed > 0, (kept, recomputed)


def test_a_projected_join_answers_what_spark_answers(spark):
    """Rows in JSON form and with Python values mixed (Redis's and this batch's), a null
    join value, a customer missing, and the inner join, against the Spark query."""
    schemas = {t: _schema(spark, ddl) for t, ddl in SCHEMAS.items()}
    orders = [
        {"order_id": "O1", "customer_id": "C1", "amount": 10.0, "status": "placed",
         "ts": "2026-01-01T10:00:00.123456Z"},  # in JSON form, as Redis holds it
        {"order_id": "O2", "customer_id": "C2", "amount": 3, "status": "paid",
         "ts": START},  # as the batch computed it; an integral amount
        {"order_id": "O3", "customer_id": None, "amount": None, "status": None, "ts": None},
        {"order_id": "O4", "customer_id": "C9", "amount": 1.5, "status": "placed",
         "ts": "2026-01-02T00:00:00Z"},  # no such customer
    ]
    customers = [{"customer_id": "C1", "tier": "gold"}, {"customer_id": "C2", "tier": None}]
    keys = {(o["order_id"],) for o in orders}
    gathered = {"OrderRecord": orders, "Customer": customers}
    for sql in (ORDER_SQL, ORDER_SQL.replace("LEFT JOIN", "JOIN")):
        view = TableView("Order", sql, ("order_id",), {
            "OrderRecord": schemas["OrderRecord"], "Customer": schemas["Customer"]})
        with SQL_LOCK:
            for table, schema in schemas.items():
                spark.createDataFrame([], schema).createOrReplaceTempView(table)
            found = lineage(spark, sql)
        join = ProjectedJoin.plan(view, found, KEYS)
        assert join is not None
        want = recompute(spark.newSession(), view, gathered, keys)
        got = join.rows(gathered, keys)
        # As the engine compares and stores them: the same text, columns in the same order.
        assert {k: encode_row(r) for k, r in got.items()} == \
            {k: encode_row(r) for k, r in want.items()}
        assert got == want
        assert len(got) == (4 if "LEFT" in sql else 2)
    # A join on a column that is not the right input's key, or a key that is not the left
    # input's, keeps the Spark query.
    assert ProjectedJoin.plan(view, found, {**KEYS, "Customer": ("tier",)}) is None
    other_key = TableView("Order", ORDER_SQL, ("customer_id",), view.inputs)
    assert ProjectedJoin.plan(other_key, found, KEYS) is None
    # A join on columns of another type than text or integers, too.
    by_time = TableView("Order", ORDER_SQL, ("order_id",), {
        "OrderRecord": schemas["OrderRecord"],
        "Customer": _schema(spark, "customer_id TIMESTAMP, tier STRING")})
    assert ProjectedJoin.plan(by_time, found, KEYS) is None
