"""Which stream aggregates the view graph keeps from their own rows.

A view over a topic that aggregates (`AGGREGATE`, `WINDOW`) has stream semantics: every
event counts once and forever, nothing is taken back. When each of its output columns is
either a grouping value or one `count`, `sum`, `min` or `max` (optionally cast to a number),
the view's rows are their own state: the view's SQL over a batch's new events gives, per
key, what the batch adds, and adding that to the stored row (counts and sums added, min and
max compared) gives the new row. The view graph (engine.graph) runs such views beside the
others, under the same batch ids: one version for every view of the catalog that can be
kept so. Any other shape (`avg`, `count(DISTINCT)`, `HAVING`, joins, dimensions) keeps a
streaming query and versions of its own.

Both sides read this: the engine to run the view in the graph, the gateway to know which
views share the graph's version (schema.storage.graph_key).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from types import MappingProxyType

import sqlglot
from sqlglot import exp

GROUP = "group"  # a grouping value: the same in every partial row of a key
COMBINES = ("sum", "min", "max")  # how two partial values of an aggregate column combine

_NUMBERS = {exp.DataType.Type.TINYINT, exp.DataType.Type.SMALLINT, exp.DataType.Type.INT,
            exp.DataType.Type.BIGINT, exp.DataType.Type.FLOAT, exp.DataType.Type.DOUBLE,
            exp.DataType.Type.DECIMAL}
_NOT_ALLOWED = ("joins", "with", "order", "limit", "offset", "qualify", "windows", "laterals",
                "pivots", "having", "distinct")


@lru_cache(maxsize=256)
def combine_plan(sql: str, key: tuple[str, ...]) -> Mapping[str, str] | None:
    """Output column -> GROUP or how its partial values combine ("sum", "min", "max"), for a
    stream aggregate kept from its rows; None for any other SQL. The key must be grouping
    values."""
    try:
        outer = sqlglot.parse_one(sql, read="spark")
    except sqlglot.errors.ParseError:
        return None
    if not isinstance(outer, exp.Select) or _has_any(outer, _NOT_ALLOWED):
        return None
    inner, outer_selects = outer, None
    source = _from(outer)
    if outer.args.get("group") is None:
        # SELECT <picks of the inner columns> FROM (SELECT ... GROUP BY ...)
        if not isinstance(source, exp.Subquery) or outer.args.get("where"):
            return None
        inner, outer_selects = source.this, outer
        if not isinstance(inner, exp.Select) or _has_any(inner, _NOT_ALLOWED):
            return None
        source = _from(inner)
    group = inner.args.get("group")
    if group is None or not isinstance(source, exp.Table) or any(
            group.args.get(a) for a in ("rollup", "cube", "grouping_sets")):
        return None
    if any(inner.find_all(exp.Window, exp.Subquery)):
        return None
    grouped = {g.sql() for g in group.expressions}
    inner_kinds: dict[str, str] = {}
    for projection in inner.expressions:
        name = projection.alias_or_name
        kind = _kind(projection.unalias(), grouped)
        if kind is None or not name:
            return None
        inner_kinds[name] = kind
    if outer_selects is None:
        kinds = inner_kinds
    else:
        kinds = {}
        for projection in outer_selects.expressions:
            kind = _outer_kind(projection.unalias(), inner_kinds)
            if kind is None or not projection.alias_or_name:
                return None
            kinds[projection.alias_or_name] = kind
    if not key or any(kinds.get(k) != GROUP for k in key):
        return None
    return MappingProxyType(kinds)  # cached: shared by every caller


def _has_any(select: exp.Select, args: tuple[str, ...]) -> bool:
    return any(select.args.get(a) for a in args)


def _from(select: exp.Select) -> exp.Expression | None:
    source = select.args.get("from_") or select.args.get("from")
    return None if source is None else source.this


def _kind(expression: exp.Expression, grouped: set[str]) -> str | None:
    """A column of the aggregating SELECT: a grouping value, or a combinable aggregate."""
    if expression.sql() in grouped:
        return GROUP
    if isinstance(expression, exp.Cast | exp.TryCast):
        if expression.to.this not in _NUMBERS:
            return None
        expression = expression.this
    if isinstance(expression, exp.Count | exp.Sum):
        distinct = isinstance(expression.this, exp.Distinct)
        return None if distinct or expression.args.get("expressions") else "sum"
    if isinstance(expression, exp.Min | exp.Max):
        if expression.args.get("expressions"):  # min(a, b) is not the aggregate
            return None
        return "min" if isinstance(expression, exp.Min) else "max"
    if not list(expression.find_all(exp.AggFunc)) and all(
            c.sql() in grouped for c in expression.find_all(exp.Column)):
        return GROUP  # computed from grouping values only
    return None


def _outer_kind(expression: exp.Expression, inner: Mapping[str, str]) -> str | None:
    """A column of the outer SELECT: a pick of an inner column, or a field of a grouping
    value (`w.start` of a window)."""
    if isinstance(expression, exp.Column):
        if expression.table and inner.get(expression.table) == GROUP:
            return GROUP  # a field of a grouping struct
        return inner.get(expression.name)
    if isinstance(expression, exp.Dot):
        column = expression.this
        if isinstance(column, exp.Column) and inner.get(column.name) == GROUP:
            return GROUP
    return None
