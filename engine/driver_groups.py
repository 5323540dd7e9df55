"""A grouped aggregate evaluated in the driver: the SQL of a stream aggregate such as the
demo's `ProductSales` (placed orders per product per one-minute window), answered over a
batch's events without a Spark job.

Spark answers a `GROUP BY` over local rows with a job of its own (200 to 250 ms on two
cores for a few hundred rows: docs/engine-plan.md), on the path of every batch. The shape
taken here is the one schema.stream_aggregates keeps from its rows, with expressions of
engine.driver_sql's subset:

    SELECT <picks of the inner columns, or w.start / w.end of a window>
    FROM (SELECT <grouping values>, <count(*) | count(x) | sum(x) | min(x) | max(x),
                  each optionally cast>
          FROM <source> [WHERE ...]
          GROUP BY <columns> [, window(<time column>, '<n> <unit>')])

(or the inner SELECT alone). As Spark answers it: a tumbling window's start is the event
time less its remainder by the window's length (from the epoch), its end one length later,
and a row whose time is null is in no window (Spark filters it out); `count` counts
non-null values, `sum`, `min` and `max` skip nulls and are null over none; a sum of
integers is a BIGINT, and beyond its range Spark fails (OutsideSubset here). Doubles
are summed in the events' order, so a sum may differ from Spark's (which adds partitions
separately) in its last bits, as two Spark runs may. Groups on doubles are refused (Spark
groups NaN with NaN and -0.0 with 0.0).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import (
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    StructType,
    TimestampType,
)
from sqlglot import exp

from engine.driver_sql import (
    Expr,
    OutsideSubset,
    Row,
    Typed,
    checked_long,
    compile_expression,
    compile_filter,
    double_order,
    from_of,
    has_clauses,
    only_table,
    parse,
    schema_types,
)
from schema.catalog import parse_duration_ms

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MICRO = datetime.timedelta(microseconds=1)
_AGGREGATES = (exp.Count, exp.Sum, exp.Min, exp.Max)


@dataclass(frozen=True)
class _Window:
    """window(<time column>, '<length>') as a grouping value: (start, end)."""

    time: Expr
    length_us: int

    def of(self, row: Row) -> tuple[datetime.datetime, datetime.datetime] | None:
        moment = self.time(row)
        if moment is None:
            return None
        micros = (moment - _EPOCH) // _MICRO
        start = micros - micros % self.length_us  # Python's % rounds down, as Spark's does
        return (_EPOCH + start * _MICRO, _EPOCH + (start + self.length_us) * _MICRO)


@dataclass(frozen=True)
class _Aggregate:
    kind: str  # "count", "sum", "min" or "max"
    argument: Expr | None  # None: count(*)
    type: DataType  # of its value

    def add(self, state: Any, row: Row) -> Any:
        if self.argument is None:
            return state + 1
        value = self.argument(row)
        if value is None:
            return state
        if self.kind == "count":
            return state + 1
        if state is None:
            return value
        if self.kind == "sum":
            return state + value if isinstance(value, float) else checked_long(state + value)
        if isinstance(value, float):
            pick = min if self.kind == "min" else max
            return pick(state, value, key=double_order)
        return min(state, value) if self.kind == "min" else max(state, value)

    def empty(self) -> Any:
        return 0 if self.kind == "count" or self.argument is None else None


def _window(node: exp.Anonymous, types: Mapping[str, DataType]) -> _Window:
    arguments = node.expressions
    if len(arguments) != 2 or not isinstance(arguments[1], exp.Literal) \
            or not arguments[1].is_string:
        raise OutsideSubset(f"{node.sql('spark')}: only tumbling windows of a fixed length")
    time = compile_expression(arguments[0], types)
    if not isinstance(time.type, TimestampType):
        raise OutsideSubset(f"{node.sql('spark')}: the window of what is not a TIMESTAMP")
    try:
        length_ms = parse_duration_ms(arguments[1].this)
    except ValueError as exc:
        raise OutsideSubset(str(exc)) from exc
    return _Window(time.fn, length_ms * 1000)


def _is_window(node: exp.Expression) -> bool:
    return isinstance(node, exp.Anonymous) and str(node.this).lower() == "window"


def _aggregate(node: exp.AggFunc, types: Mapping[str, DataType]) -> _Aggregate:
    if not isinstance(node, _AGGREGATES) or node.args.get("expressions") \
            or isinstance(node.this, exp.Distinct):
        raise OutsideSubset(f"{node.sql('spark')} is not evaluated in the driver")
    kind = type(node).__name__.lower()
    if isinstance(node, exp.Count) and isinstance(node.this, exp.Star):
        return _Aggregate("count", None, LongType())
    argument = compile_expression(node.this, types)
    if kind == "count":
        return _Aggregate(kind, argument.fn, LongType())
    if kind == "sum":
        if isinstance(argument.type, DoubleType):
            return _Aggregate(kind, argument.fn, DoubleType())
        if not isinstance(argument.type, LongType | IntegerType):
            raise OutsideSubset(f"{node.sql('spark')}: a sum of what is not a number")
        return _Aggregate(kind, argument.fn, LongType())
    return _Aggregate(kind, argument.fn, argument.type)


class GroupedQuery:
    """A grouped aggregate's SQL (the shape in the module's docstring) over rows."""

    def __init__(self, sql: str, source: StructType) -> None:
        types = schema_types(source)
        outer = parse(sql)
        inner, picks = outer, None
        subquery = from_of(outer)
        if isinstance(subquery, exp.Subquery):
            inner, picks = subquery.this, outer
            if has_clauses(outer, "where", "group"):
                raise OutsideSubset("the outer SELECT does more than pick columns")
        if not isinstance(inner, exp.Select) or has_clauses(inner) \
                or inner.args.get("group") is None:
            raise OutsideSubset("not one grouped aggregate of one source")
        only_table(inner)
        group_nodes = inner.args["group"].expressions
        self.groups: list[Expr | _Window] = []
        group_types: dict[str, DataType] = {}
        for i, node in enumerate(group_nodes):
            if _is_window(node):
                self.groups.append(_window(node, types))
                continue
            compiled = compile_expression(node, types)
            if isinstance(compiled.type, DoubleType):
                raise OutsideSubset(f"a group on the double {node.sql('spark')}")
            self.groups.append(compiled.fn)
            group_types[f"__vg_group{i}"] = compiled.type
        self.where = compile_filter(
            inner.args["where"].this if inner.args.get("where") else None, types)
        by_sql = {node.sql(): i for i, node in enumerate(group_nodes)}
        self.aggregates: list[_Aggregate] = []
        self.columns: list[tuple[str, Callable[[Row], Any]]] = []  # of the inner SELECT
        self.windows: set[str] = set()  # inner columns that are windows
        for projection in inner.expressions:
            name = projection.alias_or_name
            node = projection.unalias()
            if not name:
                raise OutsideSubset(f"{projection.sql('spark')} has no name")
            if node.sql() in by_sql and _is_window(node):
                index = by_sql[node.sql()]
                self.columns.append((name, lambda g, i=index: g[f"__vg_group{i}"]))
                self.windows.add(name)
                continue
            self.columns.append((name, self._value(node, by_sql, group_types, types).fn))
        if picks is None and self.windows:
            raise OutsideSubset("a window as a column of the view (pick its start and end)")
        self.picks = None if picks is None else [self._pick(p) for p in picks.expressions]

    def _value(self, node: exp.Expression, by_sql: Mapping[str, int],
               group_types: dict[str, DataType], types: Mapping[str, DataType]) -> Typed:
        """An inner column: over a group's row of grouping values and aggregates."""
        node = node.copy()
        names = dict(group_types)
        for call in list(node.find_all(exp.AggFunc)):
            name = f"__vg_aggregate{len(self.aggregates)}"
            self.aggregates.append(_aggregate(call, types))
            names[name] = self.aggregates[-1].type
            if call is node:
                node = exp.column(name)
            else:
                call.replace(exp.column(name))
        for grouped in list(node.find_all(exp.Expression)):
            index = by_sql.get(grouped.sql())
            if index is not None and f"__vg_group{index}" in names:
                replaced = exp.column(f"__vg_group{index}")
                if grouped is node:
                    node = replaced
                else:
                    grouped.replace(replaced)
        return compile_expression(node, names)

    def _pick(self, projection: exp.Expression) -> tuple[str, Callable[[Row], Any]]:
        name, node = projection.alias_or_name, projection.unalias()
        inner = {n for n, _ in self.columns}
        if not isinstance(node, exp.Column) or not name:
            raise OutsideSubset(f"{projection.sql('spark')} is not a pick of a column")
        if node.table in self.windows and node.name in ("start", "end"):
            window, field = node.table, 0 if node.name == "start" else 1
            return name, lambda row: row[window][field]
        if node.table or node.name not in inner or node.name in self.windows:
            raise OutsideSubset(f"{projection.sql('spark')} is not a column of the subquery")
        column = node.name
        return name, lambda row: row[column]

    def rows(self, rows: Sequence[Row]) -> list[dict[str, Any]]:
        """The query's rows over `rows` (in no particular order, as Spark's)."""
        states: dict[tuple[Any, ...], list[Any]] = {}
        for row in rows:
            if not self.where(row):
                continue
            key = tuple(g.of(row) if isinstance(g, _Window) else g(row) for g in self.groups)
            if any(v is None for g, v in zip(self.groups, key, strict=True)
                   if isinstance(g, _Window)):
                continue  # Spark keeps a window's rows whose time is not null
            state = states.get(key)
            if state is None:
                state = states[key] = [a.empty() for a in self.aggregates]
            for i, aggregate in enumerate(self.aggregates):
                state[i] = aggregate.add(state[i], row)
        out = []
        for key, state in states.items():
            group = {f"__vg_group{i}": v for i, v in enumerate(key)}
            group.update({f"__vg_aggregate{i}": v for i, v in enumerate(state)})
            inner = {name: fn(group) for name, fn in self.columns}
            if self.picks is None:
                out.append(inner)
            else:
                out.append({name: pick(inner) for name, pick in self.picks})
        return out


def grouped_query(sql: str, source: StructType) -> GroupedQuery | None:
    """The query compiled, or None if it is not one this module evaluates (it keeps Spark)."""
    try:
        return GroupedQuery(sql, source)
    except OutsideSubset:
        return None
