"""The demo domain: an online shop with customers and orders, an order view that carries
each customer's current tier (a view over views), current totals per customer over it
(a view over a view), and sales per product per minute over the raw order stream."""

from __future__ import annotations

import datetime

import strawberry

from schema.catalog import Catalog, Relationship, Source, View, ViewKind
from schema.permissions import Grant, RowRule

ORDERS = Source(
    name="orders",
    topic="orders",
    schema="order_id STRING, customer_id STRING, product_id STRING, amount DOUBLE, "
    "status STRING, ts TIMESTAMP",
    key="order_id",
    event_time="ts",
    watermark="30 seconds",
)

# A compacted topic: the latest value per customer_id is the customer.
CUSTOMERS = Source(
    name="customers",
    topic="customers",
    schema="customer_id STRING, name STRING, tier STRING, country STRING",
    key="customer_id",
)


@strawberry.type(description="A customer of the shop, as last updated.")
class Customer:
    customer_id: str
    name: str
    tier: str
    country: str


@strawberry.type(description="An order as last updated, as the orders topic says it.")
class OrderRecord:
    order_id: str
    customer_id: str
    product_id: str
    amount: float
    status: str
    ts: datetime.datetime


@strawberry.type(description="An order with its current status and its customer's current tier.")
class Order:
    order_id: str
    customer_id: str
    product_id: str
    amount: float
    status: str
    ts: datetime.datetime
    # Null until the customer is known to the Customer view (LEFT JOIN).
    customer_tier: str | None
    customer_country: str | None


@strawberry.type(description="Totals of each customer's current orders, cancelled ones left out.")
class CustomerStats:
    customer_id: str
    order_count: int
    total_spent: float
    avg_order: float
    max_order: float
    min_order: float
    last_order_at: datetime.datetime


@strawberry.type(description="Orders placed per product per one-minute window of event time.")
class ProductSales:
    product_id: str
    window_start: datetime.datetime
    window_end: datetime.datetime
    order_count: int
    revenue: float


# Who may read what (besides the admin role). A `customer` token carries the customer's
# id in its `customer_id` claim and sees only that customer's rows; the tier is an
# internal segment, hidden from customers. An `analyst` sees every row but no names.
OWN_ROWS = (RowRule("customer_id", claim="customer_id"),)
CUSTOMER_GRANTS = (Grant("customer", rows=OWN_ROWS, hidden=("tier",)),
                   Grant("analyst", hidden=("name",)))


CUSTOMER = View(
    name="Customer",
    source="customers",
    sql="SELECT customer_id, name, tier, country FROM customers",
    key=("customer_id",),
    graphql_type=Customer,
    kind=ViewKind.UPSERT,
    indexes=("tier", "country"),
    relationships=(
        Relationship("stats", "CustomerStats", (("customer_id", "customer_id"),)),
        Relationship("orders", "Order", (("customer_id", "customer_id"),), many=True),
    ),
    grants=CUSTOMER_GRANTS,
)

# Stream semantics, latest per key: each order as its last event says (a tombstone
# deletes it).
ORDER_RECORD = View(
    name="OrderRecord",
    source="orders",
    sql="SELECT order_id, customer_id, product_id, amount, status, ts FROM orders",
    key=("order_id",),
    graphql_type=OrderRecord,
    kind=ViewKind.UPSERT,
    indexes=("customer_id",),
    grants=(Grant("analyst"),),  # customers read their orders through Order
)

# Table semantics, a view-to-view join that follows both sides: a customer's tier change
# rewrites the tier on every order of that customer.
ORDER = View(
    name="Order",
    source="OrderRecord",
    sql="""
        SELECT o.order_id, o.customer_id, o.product_id, o.amount, o.status, o.ts,
               c.tier AS customer_tier, c.country AS customer_country
        FROM OrderRecord o
        LEFT JOIN Customer c ON o.customer_id = c.customer_id
    """,
    key=("order_id",),
    graphql_type=Order,
    kind=ViewKind.TABLE,
    indexes=("customer_id", "status", "amount", "ts"),
    relationships=(Relationship("customer", "Customer", (("customer_id", "customer_id"),)),),
    dimensions=("Customer",),
    grants=(Grant("customer", rows=OWN_ROWS, hidden=("customer_tier",)), Grant("analyst")),
)

# Table semantics over a view: the totals of each customer's current orders. A
# cancellation takes the order out of the totals, a deleted order leaves them, a customer
# with no current order has no row.
CUSTOMER_STATS = View(
    name="CustomerStats",
    source="Order",
    sql="""
        SELECT customer_id,
               count(*) AS order_count,
               CAST(sum(amount) AS DOUBLE) AS total_spent,
               CAST(avg(amount) AS DOUBLE) AS avg_order,
               CAST(max(amount) AS DOUBLE) AS max_order,
               CAST(min(amount) AS DOUBLE) AS min_order,
               max(ts) AS last_order_at
        FROM `Order`
        WHERE status <> 'cancelled'
        GROUP BY customer_id
    """,
    key=("customer_id",),
    graphql_type=CustomerStats,
    kind=ViewKind.TABLE,
    indexes=("total_spent", "order_count"),
    relationships=(Relationship("customer", "Customer", (("customer_id", "customer_id"),)),),
    grants=(Grant("customer", rows=OWN_ROWS), Grant("analyst")),
)

# Stream semantics, windowed: placed events per product per one-minute window of event
# time. Events later than the 30 s watermark are dropped (and counted as late).
PRODUCT_SALES = View(
    name="ProductSales",
    source="orders",
    sql="""
        SELECT product_id,
               w.start AS window_start,
               w.end AS window_end,
               order_count,
               revenue
        FROM (
            SELECT product_id,
                   window(ts, '1 minute') AS w,
                   count(*) AS order_count,
                   CAST(sum(amount) AS DOUBLE) AS revenue
            FROM orders
            WHERE status = 'placed'
            GROUP BY product_id, window(ts, '1 minute')
        )
    """,
    key=("product_id", "window_start"),
    graphql_type=ProductSales,
    kind=ViewKind.WINDOW,
    indexes=("product_id", "window_start"),
    grants=(Grant("analyst"),),  # not for customers: the shop's sales
)

CATALOG: Catalog = Catalog.of(
    sources=[ORDERS, CUSTOMERS],
    views=[CUSTOMER, ORDER_RECORD, ORDER, CUSTOMER_STATS, PRODUCT_SALES],
)
