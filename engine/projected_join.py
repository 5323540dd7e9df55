"""A view that only picks columns of two inputs joined on the right one's key, evaluated
in the driver instead of as a Spark query.

The incremental step (engine.incremental) runs a view's SQL over the rows it gathered, a
Spark batch query over local relations. On two cores each such query costs 150 to 350 ms
however few its rows (docs/engine-plan.md, "Freshness"), and the demo's `Order` (orders
with their customer's current tier) is on the path of every batch to `CustomerStats`. Its
SQL is a projection of `OrderRecord LEFT JOIN Customer ON o.customer_id = c.customer_id`,
and Spark's analyzed plan says so (engine.lineage, `Lineage.projected_join`): nothing is
computed, filtered or grouped. When the right input's join column is its key, each left
row meets at most one right row, and the answer is a lookup: a dictionary of the right
rows by that column, and each gathered left row with the right row's columns (null when a
left join finds none; dropped when an inner join does). A null never matches, as in SQL.

Values come out as Spark's would: each output column copies an input column of a known
Spark type, converted from the JSON form the rows may be in (Redis holds times as text).
Only types whose values convert exactly are taken (text, integers, doubles, booleans,
dates and times; the join columns text or integers); any other type, a join on a column
that is not the right input's whole key, or a view key that is not the left input's keep
the Spark query.
tests/integration/test_incremental_views.py checks both against Spark's batch query.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import IntegerType, LongType, StringType

from engine.driver_sql import SPARK_VALUE
from engine.incremental import Key, Row, TableView, json_value, rows_by_key
from engine.lineage import Lineage

# Join columns compared as Python values compare them, as Spark does (no text form of a
# time to normalise, no NaN that Spark's join matches and Python's does not).
_JOINABLE = (StringType, LongType, IntegerType)


@dataclass(frozen=True)
class _Output:
    name: str
    right: bool  # taken from the right input's row
    column: str
    convert: Callable[[Any], Any]


class ProjectedJoin:
    """The rows of a view whose SQL only joins two inputs on the right one's key."""

    def __init__(self, kind: str, left: str, right: str, left_on: str, right_on: str,
                 outputs: Sequence[_Output], key: Sequence[str]) -> None:
        self.inner = kind == "inner"
        self.left, self.right = left, right
        self.left_on, self.right_on = left_on, right_on
        self.outputs = tuple(outputs)
        self.key = tuple(key)

    @classmethod
    def plan(cls, view: TableView, lineage: Lineage,
             input_keys: Mapping[str, Sequence[str]]) -> ProjectedJoin | None:
        """The view's join, or None if its SQL is not one this evaluates exactly."""
        join = lineage.projected_join
        if join is None or tuple(input_keys.get(join.right.table, ())) != (join.right.name,):
            return None
        for side in (join.left, join.right):
            schema = view.inputs.get(side.table)
            if schema is None or side.name not in schema.fieldNames() \
                    or not isinstance(schema[side.name].dataType, _JOINABLE):
                return None
        left_key = tuple(input_keys.get(join.left.table, ()))
        traced = [lineage.source_of(k) for k in view.key]
        if not left_key or any(c is None or c.table != join.left.table for c in traced) \
                or sorted(c.name for c in traced if c is not None) != sorted(left_key):
            return None  # the view's key must be the left rows' own key: one row each
        outputs = []
        for name, source in lineage.outputs.items():
            assert source is not None  # projected_join: every column is a copy
            schema = view.inputs.get(source.table)
            if schema is None or source.name not in schema.fieldNames():
                return None
            convert = SPARK_VALUE.get(type(schema[source.name].dataType))
            if convert is None:
                return None
            outputs.append(_Output(name, source.table == join.right.table, source.name,
                                   convert))
        return cls(join.kind, join.left.table, join.right.table, join.left.name,
                   join.right.name, outputs, view.key)

    def rows(self, gathered: Mapping[str, list[Row]], keys: set[Key]) -> dict[Key, Row]:
        """The affected keys' new rows from the gathered input rows (as
        engine.incremental.recompute answers them)."""
        return rows_by_key(self._joined(gathered), self.key, keys)

    def _joined(self, gathered: Mapping[str, list[Row]]) -> Iterator[Row]:
        by_value: dict[Any, Row] = {}
        for row in gathered.get(self.right, []):
            value = row.get(self.right_on)
            if value is not None:
                by_value[json_value(value)] = row
        for left in gathered.get(self.left, []):
            value = left.get(self.left_on)
            right = by_value.get(json_value(value)) if value is not None else None
            if right is None and self.inner:
                continue
            row = {}
            for o in self.outputs:
                raw = (right if o.right else left)
                value = raw.get(o.column) if raw is not None else None
                row[o.name] = None if value is None else o.convert(value)
            yield row
