"""The SQL the driver evaluates (engine.driver_sql, engine.driver_groups) answers what Spark
answers: random rows with nulls, NaN, -0.0, times before the epoch and rows in JSON form,
run through both, for every expression of the subset; and what is outside the subset is
refused, so that Spark keeps it."""

from __future__ import annotations

import datetime
import math
import random

import pytest
from pyspark.sql.types import StructType

from engine.analyzer import SQL_LOCK
from engine.driver_groups import grouped_query
from engine.driver_sql import OutsideSubset, Projection, schema_types
from engine.frames import frame_of, rows_of
from schema.demo import PRODUCT_SALES
from schema.storage import iso_utc

pytestmark = pytest.mark.integration

DDL = "s STRING, i INT, l BIGINT, d DOUBLE, b BOOLEAN, t TIMESTAMP"
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)

PROJECTIONS = [
    "SELECT s, i, d FROM t WHERE s = 'a'",
    "SELECT s, l FROM t WHERE s <> 'a' AND i > 3",
    "SELECT s FROM t WHERE d < 2 OR s IS NULL",
    "SELECT i FROM t WHERE NOT (d >= i)",
    "SELECT d FROM t WHERE d = d AND d <> 0",  # NaN equals itself in Spark; -0.0 is 0
    "SELECT d FROM t WHERE d > 1000000",  # NaN is larger than any number
    "SELECT s FROM t WHERE s IN ('a', 'b', NULL)",
    "SELECT s FROM t WHERE NOT s IN ('a', 'c')",
    "SELECT i, l FROM t WHERE i <> -3 AND l >= 2 AND l <= 9000000000",
    "SELECT b, t FROM t WHERE b",
    "SELECT t FROM t WHERE t IS NOT NULL AND NOT b",
    "SELECT t FROM t WHERE b IS NULL OR (b = true AND i < 5)",
    "SELECT CAST(i AS DOUBLE) AS x, CAST(l AS BIGINT) AS y, CAST(i AS BIGINT) AS z FROM t",
    "SELECT d / i AS q, l / 2 AS h FROM t WHERE i <> 0",
    "SELECT IF(i = 0, NULL, d / i) AS q, IF(b, s, NULL) AS r FROM t",
    "SELECT s AS renamed, t AS at FROM t WHERE s >= 'b'",
    "SELECT x.s, x.i FROM t AS x WHERE x.i > 0",
]

REFUSED = [
    "SELECT upper(s) AS u FROM t",
    "SELECT s FROM t WHERE s = 1",  # Spark casts text to a number: not followed here
    "SELECT s FROM t WHERE d > 1.5",  # a decimal literal
    "SELECT CASE WHEN b THEN s END AS c FROM t",
    "SELECT i + 1 AS j FROM t",
    "SELECT CAST(s AS INT) AS n FROM t",
    "SELECT s FROM t WHERE t > '2026-01-01'",
    "SELECT s, count(*) AS n FROM t GROUP BY s",
    "SELECT * FROM t",
    "SELECT s FROM t WHERE w.start IS NULL",  # a field of a struct, not a column
    "SELECT s FROM (SELECT s FROM t)",
    "SELECT s FROM t GROUP BY window(t, '1 hour')",  # Spark reads it, sqlglot cannot
]


def _row(rng: random.Random) -> dict:
    moment = EPOCH + datetime.timedelta(seconds=rng.randint(-200_000, 2_000_000_000),
                                        microseconds=rng.randint(0, 999_999))
    row = {
        "s": rng.choice(["a", "b", "c", "é", "", None]),
        "i": rng.choice([0, 1, 3, 4, 7, -3, None]),
        "l": rng.choice([2, 9_000_000_001, -5, 0, None]),
        "d": rng.choice([0.0, -0.0, 1.5, 2.0, 1e7, float("nan"), 3, None]),
        "b": rng.choice([True, False, None]),
        "t": rng.choice([moment, iso_utc(moment), None]),  # Python, or as Redis holds it
    }
    return row


def _same(got: list[dict], want: list[dict]) -> bool:
    def close(a, b) -> bool:
        if isinstance(a, float) and isinstance(b, float):
            return (math.isnan(a) and math.isnan(b)) or a == b or \
                abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
        return a == b and type(a) is type(b)

    def order(rows: list[dict]) -> list[dict]:
        return sorted(rows, key=lambda r: repr(sorted((k, repr(v)) for k, v in r.items())))
    got, want = order(got), order(want)
    return len(got) == len(want) and all(
        g.keys() == w.keys() and all(close(g[k], w[k]) for k in g)
        for g, w in zip(got, want, strict=True))


@pytest.fixture(scope="module")
def schema(spark) -> StructType:
    return spark.createDataFrame([], DDL).schema


def _spark_rows(spark, sql: str, rows: list[dict], schema: StructType, table: str) -> list[dict]:
    with SQL_LOCK:
        frame_of(spark, rows, schema).createOrReplaceTempView(table)
        return rows_of(spark.sql(sql), len(rows))


@pytest.mark.parametrize("sql", PROJECTIONS)
def test_a_projection_answers_what_spark_answers(spark, schema, sql):
    rng = random.Random(sql)
    rows = [_row(rng) for _ in range(300)]
    projection = Projection.compile(sql, schema_types(schema))
    want = _spark_rows(spark, sql, rows, schema, "t")
    got = projection.rows(rows)
    assert want, "the rows never met the condition: the case checks nothing"
    assert _same(got, want), (sql, got[:5], want[:5])


@pytest.mark.parametrize("sql", REFUSED)
def test_what_is_outside_the_subset_is_refused(schema, sql):
    with pytest.raises(OutsideSubset):
        Projection.compile(sql, schema_types(schema))


def test_a_division_by_zero_leaves_it_to_spark(schema):
    projection = Projection.compile("SELECT d / i AS q FROM t", schema_types(schema))
    with pytest.raises(OutsideSubset):
        projection.rows([{"d": 1.0, "i": 0}])


GROUPED = [
    PRODUCT_SALES.sql.replace("FROM orders", "FROM t").replace("product_id", "s")
    .replace("amount", "d").replace("status = 'placed'", "b").replace("window(ts", "window(t"),
    """SELECT s, count(*) AS n, count(i) AS with_i, sum(i) AS total, min(d) AS low,
              max(d) AS high, min(t) AS first, max(s) AS last_s, sum(l) AS big
       FROM t WHERE i <> 7 GROUP BY s""",
    """SELECT w.start AS ws, i, n, w.end AS we FROM (SELECT window(t, '10 seconds') AS w, i,
              count(*) AS n FROM t GROUP BY i, window(t, '10 seconds'))""",
    "SELECT b, x, w.start AS at FROM (SELECT b, window(t, '1 hour') AS w, "
    "CAST(sum(i) AS DOUBLE) AS x FROM t GROUP BY b, window(t, '1 hour'))",
]


@pytest.mark.parametrize("sql", GROUPED)
def test_a_grouped_aggregate_answers_what_spark_answers(spark, schema, sql):
    rng = random.Random(sql)
    rows = [_row(rng) for _ in range(400)]
    # Few distinct times, so that windows hold several rows (and some are before 1970).
    for row in rows:
        if row["t"] is not None:
            row["t"] = EPOCH + datetime.timedelta(seconds=rng.choice([-61, -5, 0, 59, 3600]),
                                                  microseconds=rng.choice([0, 1, 999_999]))
    query = grouped_query(sql, schema)
    assert query is not None, sql
    want = _spark_rows(spark, sql, rows, schema, "t")
    got = query.rows(rows)
    assert len(want) > 3, "too few groups: the case checks little"
    assert _same(got, want), (sql, sorted(map(repr, got))[:5], sorted(map(repr, want))[:5])


@pytest.mark.parametrize("sql", [
    "SELECT s, avg(d) AS a FROM t GROUP BY s",  # not kept by the stream aggregates
    "SELECT s, count(DISTINCT i) AS n FROM t GROUP BY s",
    "SELECT d, count(*) AS n FROM t GROUP BY d",  # a group on doubles
    "SELECT window(t, '1 minute', '30 seconds') AS w, count(*) AS n FROM t "
    "GROUP BY window(t, '1 minute', '30 seconds')",  # sliding
    "SELECT s, sum(i) + 1 AS n FROM t GROUP BY s",
    "SELECT window(t, '1 hour') AS w, count(*) AS n FROM t "  # a struct column
    "GROUP BY window(t, '1 hour')",
])
def test_grouped_aggregates_outside_the_subset_keep_spark(schema, sql):
    assert grouped_query(sql, schema) is None


def test_the_demo_aggregates_are_evaluated_in_the_driver(spark):
    """The demo's ProductSales (a windowed stream aggregate) and CustomerStats (kept from
    its groups' states) are both answered in the driver, so neither runs Spark queries on
    the path of a batch."""
    from engine.aggregates import AggregateStep, StateCodec, partial_schema, plan_aggregate
    from schema.demo import CUSTOMER_STATS, ORDERS

    orders = spark.createDataFrame([], ORDERS.schema).schema
    assert grouped_query(PRODUCT_SALES.sql, orders) is not None
    order = spark.createDataFrame([], "order_id STRING, customer_id STRING, product_id STRING, "
                                      "amount DOUBLE, status STRING, ts TIMESTAMP, "
                                      "customer_tier STRING, customer_country STRING").schema
    plan = plan_aggregate(CUSTOMER_STATS.sql, CUSTOMER_STATS.key)
    assert plan is not None
    with SQL_LOCK:
        step = AggregateStep(plan, StateCodec(plan, partial_schema(spark, plan, order)), order)
    assert step.evaluated_in_driver
