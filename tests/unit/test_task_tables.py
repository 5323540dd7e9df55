"""The pure parts of the views over views computed by Spark's tasks (engine.task_tables):
which column each view is routed by, how an upsert view's changes are routed, and when
the tasks hand the views over views back to the driver. Their results against the
driver's are checked on a real graph in tests/integration/test_views_in_tasks.py."""

from __future__ import annotations

from types import SimpleNamespace

from pyspark.sql.types import StructType

from engine.incremental import TableView
from engine.lineage import Column, Lineage
from engine.projected_join import ProjectedJoin
from engine.sinks.redis_sink import RowWrites
from engine.task_tables import TableInTask, TaskTable, compute_tables, plan_routes
from engine.task_upsert import UpsertInTask, route_value
from schema.catalog import graphql_fields
from schema.demo import CATALOG
from schema.storage import ChangeEvent

NOWHERE = "redis://127.0.0.1:1/0"  # reaching Redis would fail the test

ORDER = TableView("Order", "", ("order_id",), {"OrderRecord": StructType(),
                                               "Customer": StructType()})
ORDER_LINEAGE = Lineage(
    ("OrderRecord", "Customer"),
    {"order_id": Column("OrderRecord", "order_id"),
     "customer_id": Column("OrderRecord", "customer_id"),
     "customer_tier": Column("Customer", "tier")},
    ((Column("OrderRecord", "customer_id"), Column("Customer", "customer_id")),), None)
ORDER_JOIN = ProjectedJoin("left", "OrderRecord", "Customer", "customer_id", "customer_id",
                           (), ("order_id",))
STATS = TableView("CustomerStats", "", ("customer_id",), {"Order": StructType()})
STATS_LINEAGE = Lineage(("Order",), {"customer_id": Column("Order", "customer_id"),
                                     "order_count": None},
                        (), (Column("Order", "customer_id"),))


def _aggregate(table: str, *group: str):
    return SimpleNamespace(plan=SimpleNamespace(table=table, group=group))


def test_the_demo_graph_is_routed_by_customer():
    routes = plan_routes([(ORDER, ORDER_LINEAGE, ORDER_JOIN, None),
                          (STATS, STATS_LINEAGE, None, _aggregate("Order", "customer_id"))])
    assert routes == {"OrderRecord": "customer_id", "Customer": "customer_id",
                      "Order": "customer_id", "CustomerStats": "customer_id"}


def test_views_partitioned_by_two_values_stay_with_the_driver():
    # Totals per product over the orders joined by customer: two values, no one partition.
    by_product = plan_routes([(ORDER, ORDER_LINEAGE, ORDER_JOIN, None),
                              (STATS, STATS_LINEAGE, None, _aggregate("Order", "product_id"))])
    assert by_product is None
    # A view that is neither a join the driver evaluates nor a one-column aggregate.
    assert plan_routes([(ORDER, ORDER_LINEAGE, None, None)]) is None
    assert plan_routes([(STATS, STATS_LINEAGE, None,
                         _aggregate("Order", "customer_id", "status"))]) is None
    # The group column must be one of the view's own columns, for the views over it.
    hidden = Lineage(("Order",), {"order_count": None}, (), (Column("Order", "customer_id"),))
    assert plan_routes([(STATS, hidden, None, _aggregate("Order", "customer_id"))]) is None


def _event(view: str, key: str, before, row) -> ChangeEvent:
    op = "insert" if before is None else "delete" if row is None else "update"
    return ChangeEvent(view, key, op, row, before, 5, 0, 0)


def test_a_change_is_routed_once_for_each_value_it_has():
    view = CATALOG.views["OrderRecord"]
    spec = UpsertInTask("OrderRecord", 0, ("order_id",), "order_id", (), RowWrites.of(
        view, graphql_fields(view)), NOWHERE, route="customer_id")
    placed = _event("OrderRecord", "O1", None, {"order_id": "O1", "customer_id": "C1"})
    moved = _event("OrderRecord", "O2", {"order_id": "O2", "customer_id": "C1"},
                   {"order_id": "O2", "customer_id": "C2"})
    gone = _event("OrderRecord", "O3", {"order_id": "O3", "customer_id": "C2"}, None)
    events = [placed, moved, gone]
    routed = spec._routed(events, tuple(e.to_bytes() for e in events))
    assert sorted(routed) == sorted([
        (b'"C1"', placed.to_bytes()), (b'"C1"', moved.to_bytes()),
        (b'"C2"', moved.to_bytes()), (b'"C2"', gone.to_bytes())])
    assert route_value({"customer_id": None}, "customer_id") == b"null"
    assert route_value(None, "customer_id") is None


def _order_in_task() -> TableInTask:
    view = CATALOG.views["Order"]
    return TableInTask("Order", 0, ("order_id",), "customer_id", ORDER, ORDER_LINEAGE,
                       ORDER_JOIN, None, RowWrites.of(view, graphql_fields(view)))


def test_a_row_moved_to_another_value_hands_the_views_back():
    moved = _event("OrderRecord", "O2", {"order_id": "O2", "customer_id": "C1"},
                   {"order_id": "O2", "customer_id": "C2"})
    shares = compute_tables([_order_in_task()], {"OrderRecord": "customer_id",
                                                 "Customer": "customer_id",
                                                 "Order": "customer_id"},
                            {}, [moved.to_bytes(), moved.to_bytes()], NOWHERE, 5, 0)
    assert [(s.ok, s.handed_back) for s in shares] == [
        (False, "Order: a row moved to another routing value")]


def test_a_task_whose_inputs_did_not_change_writes_nothing():
    # Only a change of a view the view over views does not read (none reaches Redis).
    other = _event("ProductSales", "P1", None, {"product_id": "P1"})
    shares = compute_tables([_order_in_task()], {"Order": "customer_id"}, {},
                            [other.to_bytes()], NOWHERE, 5, 0)
    assert shares == [TaskTable(True, b"[]", ())]
