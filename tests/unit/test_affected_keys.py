"""Which keys of a view over views a change of one input affects, from its lineage."""

from __future__ import annotations

import pytest

from engine.affected import KeysByLookup, KeysFromRows, UntraceableKey, plan_affected
from engine.lineage import Column, Lineage

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
