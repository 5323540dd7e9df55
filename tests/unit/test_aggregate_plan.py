"""Which views the engine keeps from per-group states (engine.aggregates), how two states
combine, and when a group must be recomputed from its rows. Pure logic: no Spark."""

from __future__ import annotations

import datetime

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from engine.aggregates import (
    ADDED,
    COUNT,
    REMOVED,
    SIDE,
    AggregateStep,
    Part,
    StateCodec,
    _combine,
    _extreme_left,
    plan_aggregate,
    relevant,
)
from engine.frames import _column
from schema.demo import CUSTOMER_STATS, ORDER


def test_the_demo_totals_split_into_partial_states_of_the_columns_they_read():
    plan = plan_aggregate(CUSTOMER_STATS.sql, CUSTOMER_STATS.key)
    assert plan is not None
    assert plan.table == "Order" and plan.group == ("customer_id",)
    assert plan.columns == {"customer_id", "amount", "status", "ts"}
    # One count and one sum of amount serve sum and avg; min and max each a column.
    assert sorted(p.kind for p in plan.parts) == ["count", "count", "max", "max", "min",
                                                  "sum"]
    assert "WHERE status <> 'cancelled'" in plan.partial_sql
    assert plan.partial_sql.endswith("GROUP BY customer_id, __vg_side")
    assert "GROUP BY" not in plan.final_sql and "FROM __vg_state AS `Order`" in plan.final_sql
    # The rows of a batch: no aggregate (no Spark job over local rows), the WHERE applied,
    # each argument once (amount serves count, sum, min and max; ts serves max).
    assert plan.rows_sql == ("SELECT customer_id, __vg_side, ts AS __vg_arg0, "
                             "amount AS __vg_arg1 FROM `Order` WHERE status <> 'cancelled'")
    assert {p.argument for p in plan.parts} == {"__vg_arg0", "__vg_arg1"}


@pytest.mark.parametrize("sql,key", [
    (ORDER.sql, ORDER.key),  # a join
    ("SELECT c, count(DISTINCT x) AS n FROM t GROUP BY c", ("c",)),
    ("SELECT c, max_by(x, y) AS b FROM t GROUP BY c", ("c",)),
    ("SELECT c, sum(x) OVER (PARTITION BY c) AS s FROM t", ("c",)),
    ("SELECT c, sum(x) AS s FROM t GROUP BY c", ("s",)),  # keyed by other than the group
    ("SELECT c, count(*) FILTER (WHERE x > 1) AS n FROM t GROUP BY c", ("c",)),
    ("SELECT c, sum(x) AS s FROM (SELECT * FROM t) GROUP BY c", ("c",)),
    ("SELECT c, x FROM t", ("c",)),  # no aggregate
])
def test_other_shapes_keep_the_recompute(sql, key):
    assert plan_aggregate(sql, key) is None


def test_having_becomes_a_filter_over_the_states():
    plan = plan_aggregate("SELECT c, sum(x) AS s FROM t GROUP BY c HAVING count(*) > 2", ("c",))
    assert plan is not None
    assert plan.final_sql.endswith("WHERE __vg_n > 2")


def test_the_rows_of_each_group_and_side_fold_into_counts_sums_and_extremes():
    plan = plan_aggregate("SELECT c, count(x) AS n, sum(x) AS s, min(x) AS lo, max(x) AS hi "
                          "FROM t GROUP BY c", ("c",))
    assert plan is not None
    partial = StructType([StructField("c", StringType()), StructField(COUNT, LongType())] + [
        StructField(p.name, LongType() if p.kind == "count" else DoubleType())
        for p in plan.parts])
    step = AggregateStep(plan, StateCodec(plan, partial), StructType(
        [StructField("c", StringType()), StructField("x", DoubleType())]))
    assert step.evaluated_in_driver  # no Spark session needed below
    rows = [{"c": "a", "x": 7.5}, {"c": "a", "x": 2.5}, {"c": "a", "x": None},
            {"c": "a", "x": 2.5}, {"c": "b", "x": -1.0}]
    states = step._partial(None, [{**r, SIDE: ADDED} for r in rows]
                           + [{"c": "a", "x": 100.0, SIDE: REMOVED}])

    def folded(group: str, side: str) -> dict:
        state = states[(group,), side]
        return {"rows": state[COUNT], **{p.kind: state[p.name] for p in plan.parts}}
    assert folded("a", ADDED) == {"rows": 4, "count": 3, "sum": 12.5, "min": 2.5, "max": 7.5}
    assert folded("b", ADDED) == {"rows": 1, "count": 1, "sum": -1.0, "min": -1.0, "max": -1.0}
    assert folded("a", REMOVED)["sum"] == 100.0


def test_counts_and_sums_combine_by_addition_and_subtraction():
    assert _combine(Part("c", "count"), 10, 3, 2) == 9
    assert _combine(Part("s", "sum", "c"), 100.0, 30.0, None) == 70.0
    assert _combine(Part("s", "sum", "c"), None, None, 5) == 5


def test_an_extreme_is_kept_unless_the_rows_that_left_took_it():
    low = Part("m", "min", "c")
    assert _combine(low, 5, 9, 3) == 3
    assert not _extreme_left(low, 5, 9, None)  # a larger value left
    assert _extreme_left(low, 5, 5, None)  # the minimum itself left: only rows can tell
    assert not _extreme_left(low, 5, 5, 5)  # it left and came back (a status update)
    assert _extreme_left(low, 5, 5, 7)  # it left, something larger came
    high = Part("m", "max", "c")
    assert _extreme_left(high, 9, 9, None) and not _extreme_left(high, 9, 4, None)
    assert not _extreme_left(high, 9, 9, 12)


def test_changes_that_touch_no_column_the_view_reads_are_dropped():
    plan = plan_aggregate(CUSTOMER_STATS.sql, CUSTOMER_STATS.key)
    order = {"order_id": "O1", "customer_id": "C1", "amount": 5.0, "status": "paid",
             "ts": "2024-01-01T00:00:00.000000Z", "customer_tier": "gold"}
    tier_change = (order, {**order, "customer_tier": "silver"})
    cancelled = (order, {**order, "status": "cancelled"})
    inserted = (None, order)
    assert relevant(plan, [tier_change, cancelled, inserted]) == [cancelled, inserted]


def test_states_round_trip_through_their_stored_form_with_times():
    plan = plan_aggregate("SELECT c, count(*) AS n, max(t) AS last, sum(x) AS s FROM t "
                          "GROUP BY c", ("c",))
    assert plan is not None
    types = {"count": LongType(), "max": TimestampType(), "sum": DoubleType()}
    schema = StructType([StructField("c", StringType()), StructField(COUNT, LongType()),
                         *(StructField(p.name, types[p.kind]) for p in plan.parts)])
    codec = StateCodec(plan, schema)
    when = datetime.datetime(2024, 5, 1, 12, 30, 1, 250000, tzinfo=datetime.UTC)
    values = {"count": 3, "max": when, "sum": 7.5}
    state = {COUNT: 3, **{p.name: values[p.kind] for p in plan.parts}}
    assert codec.decode(codec.encode(state)) == state


def test_a_time_column_mixing_text_and_datetimes_becomes_one_arrow_column():
    # An aggregate's previous rows are in JSON form, its new rows as Spark gave them.
    values = ["2024-01-01T00:00:00.123000Z",
              datetime.datetime(2024, 1, 2, tzinfo=datetime.UTC), None]
    column = _column(values, pa.timestamp("us", tz="UTC"))
    assert column.to_pylist() == [
        datetime.datetime(2024, 1, 1, 0, 0, 0, 123000, tzinfo=datetime.UTC),
        datetime.datetime(2024, 1, 2, tzinfo=datetime.UTC), None]
