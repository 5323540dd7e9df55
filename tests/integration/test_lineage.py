"""Lineage read off Spark's analyzed plan: what the incremental step of views over views
relies on, for the shapes the demo's views take (a join that follows both sides, an
aggregate over a view, a filter, aliases)."""

from __future__ import annotations

import pytest

from engine.analyzer import SQL_LOCK
from engine.lineage import Column, EquiJoin, lineage

pytestmark = pytest.mark.integration


@pytest.fixture
def tables(spark):
    with SQL_LOCK:
        spark.createDataFrame(
            [], "order_id STRING, customer_id STRING, amount DOUBLE, status STRING"
        ).createOrReplaceTempView("OrderRecord")
        spark.createDataFrame([], "customer_id STRING, tier STRING, country STRING"
                              ).createOrReplaceTempView("Customer")
        yield spark


def test_a_join_traces_each_side_and_its_condition(tables):
    found = lineage(tables, """
        SELECT o.order_id, o.customer_id, o.amount * 2 AS doubled,
               c.tier AS customer_tier, c.country
        FROM OrderRecord o LEFT JOIN Customer c ON o.customer_id = c.customer_id""")
    assert found.inputs == ("OrderRecord", "Customer")
    assert found.source_of("order_id") == Column("OrderRecord", "order_id")
    assert found.source_of("customer_tier") == Column("Customer", "tier")
    assert found.source_of("country") == Column("Customer", "country")
    assert found.source_of("doubled") is None
    assert found.equalities == ((Column("Customer", "customer_id"),
                                 Column("OrderRecord", "customer_id")),)
    assert found.grouped_by is None


def test_an_aggregate_traces_its_groups(tables):
    found = lineage(tables, """
        SELECT customer_id AS customer, count(*) AS n, max(amount) AS biggest
        FROM OrderRecord WHERE status <> 'cancelled' GROUP BY customer_id""")
    assert found.source_of("customer") == Column("OrderRecord", "customer_id")
    assert found.source_of("n") is None and found.source_of("biggest") is None
    assert found.grouped_by == (Column("OrderRecord", "customer_id"),)


def test_an_aggregate_over_a_join_groups_by_the_joined_side(tables):
    found = lineage(tables, """
        SELECT c.tier, sum(o.amount) AS revenue
        FROM OrderRecord o JOIN Customer c ON c.customer_id = o.customer_id
        GROUP BY c.tier""")
    assert found.source_of("tier") == Column("Customer", "tier")
    assert found.grouped_by == (Column("Customer", "tier"),)
    assert (Column("Customer", "customer_id"), Column("OrderRecord", "customer_id")) \
        in found.equalities


def test_a_plain_projection_is_told_apart_from_any_computation(tables):
    picked = lineage(tables, "SELECT order_id, customer_id AS buyer, amount FROM OrderRecord")
    assert picked.plain_projection
    assert picked.source_of("buyer") == Column("OrderRecord", "customer_id")
    assert lineage(tables, "SELECT * FROM Customer").plain_projection
    for sql in (
        "SELECT order_id, amount * 2 AS amount FROM OrderRecord",
        "SELECT order_id, CAST(amount AS INT) AS amount FROM OrderRecord",
        "SELECT order_id FROM OrderRecord WHERE status <> 'cancelled'",
        "SELECT DISTINCT order_id FROM OrderRecord",
        "SELECT customer_id, count(*) AS n FROM OrderRecord GROUP BY customer_id",
        "SELECT o.order_id, c.tier FROM OrderRecord o JOIN Customer c "
        "ON o.customer_id = c.customer_id",
        "SELECT order_id FROM OrderRecord LIMIT 3",
        "SELECT order_id, 'x' AS tag FROM OrderRecord",
    ):
        assert not lineage(tables, sql).plain_projection, sql


def test_a_projected_join_is_told_apart_from_any_other_join(tables):
    left = lineage(tables, """
        SELECT o.order_id, o.amount, c.tier AS customer_tier
        FROM OrderRecord o LEFT JOIN Customer c ON o.customer_id = c.customer_id""")
    assert left.projected_join == EquiJoin("left", Column("OrderRecord", "customer_id"),
                                           Column("Customer", "customer_id"))
    # The sides are the plan's, whichever way the equality is written.
    inner = lineage(tables, """
        SELECT c.tier, o.order_id FROM Customer c
        JOIN OrderRecord o ON o.customer_id = c.customer_id""")
    assert inner.projected_join == EquiJoin("inner", Column("Customer", "customer_id"),
                                            Column("OrderRecord", "customer_id"))
    for sql in (
        "SELECT o.order_id, c.tier FROM OrderRecord o RIGHT JOIN Customer c "
        "ON o.customer_id = c.customer_id",
        "SELECT o.order_id, c.tier FROM OrderRecord o FULL JOIN Customer c "
        "ON o.customer_id = c.customer_id",
        "SELECT o.order_id, c.tier FROM OrderRecord o JOIN Customer c "
        "ON o.customer_id = c.customer_id AND c.tier = 'gold'",
        "SELECT o.order_id, c.tier FROM OrderRecord o JOIN Customer c "
        "ON o.customer_id = c.customer_id WHERE o.amount > 1",
        "SELECT o.order_id, upper(c.tier) AS tier FROM OrderRecord o JOIN Customer c "
        "ON o.customer_id = c.customer_id",
        "SELECT o.order_id, c.tier FROM OrderRecord o JOIN Customer c "
        "ON o.customer_id < c.customer_id",
        "SELECT c.tier, count(*) AS n FROM OrderRecord o JOIN Customer c "
        "ON o.customer_id = c.customer_id GROUP BY c.tier",
        "SELECT order_id FROM OrderRecord",
    ):
        assert lineage(tables, sql).projected_join is None, sql
