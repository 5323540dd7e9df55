"""Spark SQL evaluated in the driver, for the few shapes whose Spark semantics are simple to
match exactly.

The graph query computes its views over rows it holds in the driver. Handing a handful of
rows to Spark costs 50 to 250 ms a query on two cores however few the rows (a local
relation built, the query analysed and planned, a job when it groups: docs/engine-plan.md,
"Freshness"), and the demo's `ProductSales` and `CustomerStats` each ran such queries on
the path of every batch. Their SQL is plain: a WHERE of comparisons, columns, casts to a
number, `count`, `sum`, `min`, `max`, a tumbling `window`. This module compiles that
subset to Python functions that answer what Spark answers (ANSI mode, Spark's default),
for aggregates' steps (engine.aggregates), stream aggregates (engine.driver_groups) and
table views that pick and filter one input's columns (engine.incremental):
- three-valued logic: a comparison with a null is null, `AND`, `OR` and `NOT` as SQL has
  them, a WHERE keeps the rows that are true;
- values as Spark's rows carry them (engine.frames.rows_of): times aware in UTC, doubles
  as floats, also from rows in JSON form (Redis holds times as text);
- doubles compare as Spark compares them (NaN equals NaN and is larger than any number),
  an integer meets a double as a double;
- `x / 0`, or a sum or cast beyond a BIGINT, is an error in Spark: here it raises
  `OutsideSubset`, and the caller runs the Spark query, which answers as it always did.
Anything else (other functions, decimals, implicit casts between text and numbers, `CASE`,
arithmetic but `/`) is refused when compiling (`OutsideSubset`), and that view keeps its
Spark queries. tests/integration/test_driver_sql.py compares both on random rows.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import sqlglot
from pyspark.sql import SparkSession
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DateType,
    DoubleType,
    IntegerType,
    LongType,
    NullType,
    StringType,
    StructType,
    TimestampType,
)
from sqlglot import exp

from engine.frames import frame_of, rows_of

Row = Mapping[str, Any]
Expr = Callable[[Row], Any]


class OutsideSubset(Exception):
    """The SQL (when compiling) or a value (when evaluating) is not one this module answers
    as Spark would: the Spark query must answer it."""


def _time(value: Any) -> datetime.datetime:
    parsed = datetime.datetime.fromisoformat(value) if isinstance(value, str) else value
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=datetime.UTC)
    return parsed.astimezone(datetime.UTC)


def _boolean(value: Any) -> bool:
    return value == "true" if isinstance(value, str) else bool(value)


def _date(value: Any) -> datetime.date:
    return datetime.date.fromisoformat(value) if isinstance(value, str) else value


# A column's value as Spark answers it, from a row in JSON form or with Python values.
SPARK_VALUE: dict[type[DataType], Callable[[Any], Any]] = {
    StringType: str, LongType: int, IntegerType: int, DoubleType: float, BooleanType: _boolean,
    TimestampType: _time, DateType: _date,
}

_INTEGRAL = (IntegerType, LongType)
_NUMBER = (IntegerType, LongType, DoubleType)
_LONG_MIN, _LONG_MAX = -(2 ** 63), 2 ** 63 - 1
_INT_MAX = 2 ** 31 - 1


def checked_long(value: int) -> int:
    """A BIGINT result: beyond its range Spark (ANSI) fails the query."""
    if not _LONG_MIN <= value <= _LONG_MAX:
        raise OutsideSubset("BIGINT overflow")
    return value


def double_order(value: float) -> tuple[int, float]:
    """A double's place in Spark's order: NaN after every number, equal to itself."""
    return (1, 0.0) if math.isnan(value) else (0, value)


@dataclass(frozen=True)
class Typed:
    """A compiled expression and the Spark type of its value."""

    fn: Expr
    type: DataType


def _column_type(types: Mapping[str, DataType], name: str) -> DataType:
    found = types.get(name)
    if found is None:
        raise OutsideSubset(f"no column {name}")
    if type(found) not in SPARK_VALUE:
        raise OutsideSubset(f"column {name} of type {found.simpleString()}")
    return found


def compile_expression(node: exp.Expression, types: Mapping[str, DataType]) -> Typed:
    """`node` over rows with columns of `types`; raises OutsideSubset outside the subset."""
    compile_node = _COMPILERS.get(type(node))
    if compile_node is None:
        raise OutsideSubset(f"{node.sql('spark')} is not evaluated in the driver")
    return compile_node(node, types)


def _column(node: exp.Column, types: Mapping[str, DataType]) -> Typed:
    name = node.name
    kind = _column_type(types, name)
    convert = SPARK_VALUE[type(kind)]

    def value(row: Row) -> Any:
        found = row.get(name)
        return None if found is None else convert(found)
    return Typed(value, kind)


def _constant(value: Any, kind: DataType) -> Typed:
    return Typed(lambda _row: value, kind)


def _literal(node: exp.Literal, _types: Mapping[str, DataType]) -> Typed:
    if node.is_string:
        return _constant(node.this, StringType())
    text = str(node.this)
    if not text.isdigit():
        raise OutsideSubset(f"the number {text} (a decimal or double literal)")
    value = int(text)
    if value <= _INT_MAX:
        return _constant(value, IntegerType())
    if value <= _LONG_MAX:
        return _constant(value, LongType())
    raise OutsideSubset(f"the number {text} (a decimal literal)")


def _negative(node: exp.Neg, types: Mapping[str, DataType]) -> Typed:
    inner = compile_expression(node.this, types)
    if not isinstance(node.this, exp.Literal) or not isinstance(inner.type, _INTEGRAL):
        raise OutsideSubset(f"{node.sql('spark')}")
    return _constant(-inner.fn({}), inner.type)


def _comparable(left: DataType, right: DataType) -> Callable[[Any], Any] | None:
    """How two operands' values are compared (a key for each), or None if Spark would cast
    one to the other's type in ways this module does not follow."""
    if isinstance(left, NullType) or isinstance(right, NullType):
        return lambda v: v  # the comparison is null whatever the other side
    if isinstance(left, _NUMBER) and isinstance(right, _NUMBER):
        if isinstance(left, DoubleType) or isinstance(right, DoubleType):
            return lambda v: double_order(float(v))
        return lambda v: v
    if type(left) is type(right) and isinstance(left, StringType | BooleanType | TimestampType
                                                | DateType):
        return lambda v: v  # text compares by code point, as UTF-8 bytes do
    return None


_COMPARE: dict[type[exp.Expression], Callable[[Any, Any], bool]] = {
    exp.EQ: lambda a, b: a == b, exp.NEQ: lambda a, b: a != b,
    exp.GT: lambda a, b: a > b, exp.GTE: lambda a, b: a >= b,
    exp.LT: lambda a, b: a < b, exp.LTE: lambda a, b: a <= b,
}


def _comparison(node: exp.Binary, types: Mapping[str, DataType]) -> Typed:
    left = compile_expression(node.left, types)
    right = compile_expression(node.right, types)
    order = _comparable(left.type, right.type)
    if order is None:
        raise OutsideSubset(f"{node.sql('spark')} compares {left.type.simpleString()} "
                            f"with {right.type.simpleString()}")
    compare = _COMPARE[type(node)]

    def value(row: Row) -> bool | None:
        a, b = left.fn(row), right.fn(row)
        if a is None or b is None:
            return None
        return compare(order(a), order(b))
    return Typed(value, BooleanType())


def _boolean_operand(node: exp.Expression, types: Mapping[str, DataType]) -> Expr:
    operand = compile_expression(node, types)
    if not isinstance(operand.type, BooleanType | NullType):
        raise OutsideSubset(f"{node.sql('spark')} is not a condition")
    return operand.fn


def _junction(node: exp.And | exp.Or, types: Mapping[str, DataType]) -> Typed:
    """AND (false decides it) or OR (true decides it); else null if either side is null."""
    left, right = _boolean_operand(node.left, types), _boolean_operand(node.right, types)
    decides = isinstance(node, exp.Or)

    def value(row: Row) -> bool | None:
        a = left(row)
        if a is decides:
            return decides
        b = right(row)
        if b is decides:
            return decides
        return None if a is None or b is None else not decides
    return Typed(value, BooleanType())


def _not(node: exp.Not, types: Mapping[str, DataType]) -> Typed:
    inner = _boolean_operand(node.this, types)

    def value(row: Row) -> bool | None:
        found = inner(row)
        return None if found is None else not found
    return Typed(value, BooleanType())


def _is(node: exp.Is, types: Mapping[str, DataType]) -> Typed:
    if not isinstance(node.expression, exp.Null):
        raise OutsideSubset(f"{node.sql('spark')}")
    inner = compile_expression(node.this, types).fn
    return Typed(lambda row: inner(row) is None, BooleanType())


def _in(node: exp.In, types: Mapping[str, DataType]) -> Typed:
    if node.args.get("query") or node.args.get("field") or node.args.get("unnest"):
        raise OutsideSubset(f"{node.sql('spark')}")
    this = compile_expression(node.this, types)
    options = [compile_expression(e, types) for e in node.expressions]
    orders = [_comparable(this.type, o.type) for o in options]
    if not options or any(o is None for o in orders):
        raise OutsideSubset(f"{node.sql('spark')} mixes types")

    def value(row: Row) -> bool | None:
        found = this.fn(row)
        if found is None:
            return None
        unknown = False
        for option, order in zip(options, orders, strict=True):
            other = option.fn(row)
            if other is None:
                unknown = True
            elif order(found) == order(other):  # type: ignore[misc]
                return True
        return None if unknown else False
    return Typed(value, BooleanType())


def _null(_node: exp.Null, _types: Mapping[str, DataType]) -> Typed:
    return _constant(None, NullType())


def _true_or_false(node: exp.Boolean, _types: Mapping[str, DataType]) -> Typed:
    return _constant(bool(node.this), BooleanType())


def _paren(node: exp.Paren, types: Mapping[str, DataType]) -> Typed:
    return compile_expression(node.this, types)


def _cast(node: exp.Cast, types: Mapping[str, DataType]) -> Typed:
    inner = compile_expression(node.this, types)
    target = node.to.this
    fn = inner.fn
    if target == exp.DataType.Type.DOUBLE and isinstance(inner.type, (*_NUMBER, NullType)):
        return Typed(lambda row: None if (v := fn(row)) is None else float(v), DoubleType())
    if target == exp.DataType.Type.BIGINT and isinstance(inner.type, (*_INTEGRAL, NullType)):
        return Typed(fn, LongType())
    raise OutsideSubset(f"{node.sql('spark')}")


def _if(node: exp.If, types: Mapping[str, DataType]) -> Typed:
    condition = _boolean_operand(node.this, types)
    true = compile_expression(node.args["true"], types)
    false_node = node.args.get("false")
    false = compile_expression(false_node, types) if false_node is not None \
        else _constant(None, NullType())
    kinds = [t for t in (true.type, false.type) if not isinstance(t, NullType)]
    if len({type(t) for t in kinds}) > 1:
        raise OutsideSubset(f"{node.sql('spark')} has branches of two types")
    kind = kinds[0] if kinds else NullType()
    return Typed(lambda row: true.fn(row) if condition(row) is True else false.fn(row), kind)


def _divide(node: exp.Div, types: Mapping[str, DataType]) -> Typed:
    left = compile_expression(node.this, types)
    right = compile_expression(node.expression, types)
    if not all(isinstance(t.type, (*_NUMBER, NullType)) for t in (left, right)):
        raise OutsideSubset(f"{node.sql('spark')} divides what is not a number")

    def value(row: Row) -> float | None:
        a, b = left.fn(row), right.fn(row)
        if a is None or b is None:
            return None
        if b == 0:
            raise OutsideSubset("division by zero")  # Spark (ANSI) fails the query
        return float(a) / float(b)
    return Typed(value, DoubleType())


_COMPILERS: dict[type[exp.Expression], Callable[[Any, Mapping[str, DataType]], Typed]] = {
    exp.Column: _column, exp.Literal: _literal, exp.Neg: _negative, exp.Null: _null,
    exp.Boolean: _true_or_false, exp.Paren: _paren, exp.And: _junction, exp.Or: _junction,
    exp.Not: _not, exp.Is: _is, exp.In: _in, exp.If: _if, exp.Div: _divide,
    # sqlglot reads Spark's CAST as TRY_CAST (NULL where a cast fails); the casts taken
    # here (integers to BIGINT, numbers to DOUBLE) cannot fail, so both are the same.
    exp.Cast: _cast, exp.TryCast: _cast,
    **{kind: _comparison for kind in _COMPARE},
}


def compile_filter(node: exp.Expression | None, types: Mapping[str, DataType]
                   ) -> Callable[[Row], bool]:
    """A WHERE: the rows it keeps are those for which it is true (None: every row)."""
    if node is None:
        return lambda _row: True
    condition = _boolean_operand(node, types)
    return lambda row: condition(row) is True


def parse(sql: str) -> exp.Expression:
    """The view's SQL as sqlglot reads it; SQL that Spark takes and sqlglot cannot read
    (`GROUP BY window(...)` first, `LATERAL VIEW`) is outside the subset, not an error."""
    try:
        return sqlglot.parse_one(sql, read="spark")
    except sqlglot.errors.ParseError as exc:
        raise OutsideSubset(f"sqlglot cannot read it: {exc}") from exc


class InDriver(Protocol):
    """A query compiled for the driver: a Projection, or engine.driver_groups' query."""

    def rows(self, rows: Sequence[Row]) -> list[dict[str, Any]]: ...


def driver_or_spark(session: SparkSession, in_driver: InDriver | None, sql: str,
                    rows: Sequence[Row], schema: StructType, table: str
                    ) -> list[dict[str, Any]]:
    """`sql` over `rows` (registered as `table`): in the driver when `in_driver` is given
    and answers as Spark would, else as a Spark query over a local relation, which also
    reports what Spark fails on."""
    if in_driver is not None:
        try:
            return in_driver.rows(rows)
        except OutsideSubset:
            pass
    frame_of(session, rows, schema).createOrReplaceTempView(table)
    return rows_of(session.sql(sql), len(rows))


# Clauses a SELECT evaluated here may not have (a grouped one may have GROUP BY).
_CLAUSES = ("joins", "with", "order", "limit", "offset", "qualify", "windows", "laterals",
            "pivots", "having", "distinct")


def has_clauses(select: exp.Expression, *also: str) -> bool:
    """Whether `select` has a clause beyond SELECT, FROM, WHERE and GROUP BY (or `also`)."""
    return any(select.args.get(a) for a in (*_CLAUSES, *also))


def from_of(select: exp.Expression) -> exp.Expression | None:
    """What `select` reads: a table, a subquery, or None."""
    source = select.args.get("from_") or select.args.get("from")
    return None if source is None else source.this


def only_table(select: exp.Select) -> exp.Table:
    """The one table `select` reads; its columns may be qualified by its name or alias
    only (`w.start` of a struct column is not a column of the table: refused)."""
    table = from_of(select)
    if not isinstance(table, exp.Table):
        raise OutsideSubset("not a SELECT of one table")
    name = table.alias_or_name
    for column in select.find_all(exp.Column):
        if column.table and column.table != name or column.args.get("db"):
            raise OutsideSubset(f"{column.sql('spark')} is not a column of the table")
    return table


def schema_types(schema: StructType) -> dict[str, DataType]:
    return {f.name: f.dataType for f in schema.fields}


@dataclass(frozen=True)
class Projection:
    """`SELECT <expressions> FROM <one table> [WHERE ...]` over rows in the driver."""

    columns: tuple[tuple[str, Expr], ...]  # output name -> its expression
    where: Callable[[Row], bool]
    table: str  # the table it reads

    @classmethod
    def compile(cls, sql: str, types: Mapping[str, DataType]) -> Projection:
        tree = parse(sql)
        if not isinstance(tree, exp.Select) or has_clauses(tree, "group"):
            raise OutsideSubset("not a projection of one table")
        table = only_table(tree)
        columns = []
        for projection in tree.expressions:
            name = projection.alias_or_name
            if not name or isinstance(projection, exp.Star):
                raise OutsideSubset(f"the column {projection.sql('spark')} has no name")
            columns.append((name, compile_expression(projection.unalias(), types).fn))
        where = tree.args.get("where")
        return cls(tuple(columns),
                   compile_filter(where.this if where is not None else None, types), table.name)

    def rows(self, rows: Sequence[Row]) -> list[dict[str, Any]]:
        return [{name: fn(row) for name, fn in self.columns} for row in rows if self.where(row)]
