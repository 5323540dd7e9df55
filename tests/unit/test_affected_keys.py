"""Which keys of a view over views a change of one input affects, from its lineage."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.affected import KeysByLookup, KeysFromRows, UntraceableKey, plan_affected
from engine.analysis import unindexed_reads
from engine.incremental import Read, gather_plan
from engine.lineage import Column, Lineage
from schema import demo
from schema.catalog import Catalog

ORDER_WITH_TIER = Lineage(
    inputs=("OrderRecord", "Customer"),
    outputs={"order_id": Column("OrderRecord", "order_id"),
             "customer_id": Column("OrderRecord", "customer_id"),
             "customer_tier": Column("Customer", "tier"), "amount": None},
    equalities=((Column("Customer", "customer_id"), Column("OrderRecord", "customer_id")),),
    grouped_by=None,
)
STATS = Lineage(
    inputs=("Order",),
    outputs={"customer_id": Column("Order", "customer_id"), "n": None},
    equalities=(),
    grouped_by=(Column("Order", "customer_id"),),
)


def test_a_change_of_the_driving_side_affects_its_own_keys():
    plan = plan_affected("Order", ["order_id"], ORDER_WITH_TIER, "OrderRecord")
    assert plan == KeysFromRows(("order_id",))
    assert plan.keys([{"order_id": "O1"}, None, {"order_id": "O2"}]) == {("O1",), ("O2",)}


def test_a_change_of_the_joined_side_is_looked_up_by_the_join_column():
    plan = plan_affected("Order", ["order_id"], ORDER_WITH_TIER, "Customer")
    assert plan == KeysByLookup("OrderRecord", ("order_id",), match="customer_id",
                                changed="customer_id")
    # A tier change: the customer before and after (same id), and a deleted customer.
    rows = [{"customer_id": "C1", "tier": "gold"}, {"customer_id": "C1", "tier": "silver"},
            {"customer_id": "C2"}, None]
    assert plan.values(rows) == {"C1", "C2"}


def test_a_group_move_affects_the_old_group_and_the_new():
    plan = plan_affected("CustomerStats", ["customer_id"], STATS, "Order")
    before, after = {"customer_id": "C1"}, {"customer_id": "C2"}
    assert plan.keys([before, after]) == {("C1",), ("C2",)}


def test_a_computed_key_is_refused_with_the_fix():
    computed = Lineage(("Order",), {"day": None}, (), ())
    with pytest.raises(UntraceableKey) as error:
        plan_affected("Daily", ["day"], computed, "Order")
    assert error.value.problem.view == "Daily" and "GROUP BY" in error.value.problem.fix


def test_a_key_from_an_input_not_joined_to_the_changed_one_is_refused():
    unjoined = Lineage(("A", "B"), {"k": Column("A", "k")}, (), None)
    with pytest.raises(UntraceableKey, match="no condition equates"):
        plan_affected("V", ["k"], unjoined, "B")


def test_the_gather_plan_reads_the_driving_input_by_key_then_follows_the_joins():
    plan = gather_plan("Order", ["order_id"], ORDER_WITH_TIER, ["OrderRecord", "Customer"])
    assert plan == [Read("OrderRecord", "order_id"),
                    Read("Customer", "customer_id", "OrderRecord", "customer_id")]
    unjoined = Lineage(("A", "B"), {"k": Column("A", "k")}, (), None)
    with pytest.raises(UntraceableKey, match="no join equality connects B to A"):
        gather_plan("V", ["k"], unjoined, ["A", "B"])


def test_validate_warns_about_a_read_redis_cannot_answer():
    order = demo.CATALOG.views["Order"]
    stats = demo.CATALOG.views["CustomerStats"]
    # The demo indexes what its views over views read by: no warning.
    assert unindexed_reads(order, ORDER_WITH_TIER, demo.CATALOG) == []
    assert unindexed_reads(stats, STATS, demo.CATALOG) == []
    # Without OrderRecord's index of customer_id, a tier change finds the customer's
    # orders by scanning OrderRecord's Delta files.
    record = demo.CATALOG.views["OrderRecord"]
    unindexed = Catalog.of(demo.CATALOG.sources.values(), [
        replace(record, indexes=tuple(i for i in record.indexes if i != "customer_id")),
        *(v for n, v in demo.CATALOG.views.items() if n != "OrderRecord")])
    [warning] = unindexed_reads(order, ORDER_WITH_TIER, unindexed)
    assert warning.startswith("Order reads OrderRecord by customer_id")
    assert "add 'customer_id' to OrderRecord's indexes" in warning
