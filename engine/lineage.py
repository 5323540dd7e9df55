"""Where a view's output columns come from, read off Spark's analyzed plan of its SQL.

For views over views the engine must know which of a view's keys a change of one of its
inputs can affect, without running the view over its whole inputs. Spark's analyzed plan
says it: every output column that is a plain copy of an input column (through projections,
aliases, joins and GROUP BY), the conditions that equate two input columns (join keys), and
the input columns a view groups by. `Lineage` holds that, per input table and column name.

The plan is read as Spark serialises it (`LogicalPlan.toJSON`): a list of nodes in
pre-order, each expression a list of expression nodes in pre-order, attributes identified
by their `exprId`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

_ATTRIBUTE = "org.apache.spark.sql.catalyst.expressions.AttributeReference"
_ALIAS = "org.apache.spark.sql.catalyst.expressions.Alias"
_EQUAL = "org.apache.spark.sql.catalyst.expressions.EqualTo"
# Plan nodes that only pick and rename columns (a temporary view reads as View and
# SubqueryAlias over its relation).
_PROJECTION_NODES = {"Project", "SubqueryAlias", "View"}
_JOIN_KINDS = {"org.apache.spark.sql.catalyst.plans.Inner$": "inner",
               "org.apache.spark.sql.catalyst.plans.LeftOuter$": "left"}


@dataclass(frozen=True, order=True)
class Column:
    table: str  # the input's name as the SQL reads it (a view or a source)
    name: str


@dataclass(frozen=True)
class EquiJoin:
    """An inner or left join of two inputs on one equality of a column of each."""

    kind: str  # "inner" or "left"
    left: Column  # the left input's column
    right: Column  # the right input's column


@dataclass(frozen=True)
class Lineage:
    inputs: tuple[str, ...]  # the tables the SQL reads, in plan order
    outputs: Mapping[str, Column | None]  # output column -> the input column it copies
    equalities: tuple[tuple[Column, Column], ...]  # input columns a condition equates
    grouped_by: tuple[Column, ...] | None  # the GROUP BY columns; None: no aggregate
    # Only projections of one input's columns (renamed or not), nothing computed, filtered,
    # joined or grouped: its rows are the input's rows, columns picked.
    plain_projection: bool = False
    # Only projections of two inputs' columns joined on one equality (engine.projected_join),
    # nothing computed, filtered or grouped.
    projected_join: EquiJoin | None = None

    def source_of(self, output: str) -> Column | None:
        return self.outputs.get(output)


@dataclass
class _Node:
    fields: dict[str, Any]
    children: list[_Node]

    @property
    def kind(self) -> str:
        return self.fields["class"].rsplit(".", 1)[-1]


def _tree(nodes: list[dict[str, Any]]) -> _Node:
    """The pre-order list as a tree."""
    position = 0

    def build() -> _Node:
        nonlocal position
        fields = nodes[position]
        position += 1
        return _Node(fields, [build() for _ in range(fields["num-children"])])

    return build()


def _expr_id(expression: dict[str, Any]) -> int:
    return int(expression["exprId"]["id"])


def _copied_attribute(expression: list[dict[str, Any]]) -> int | None:
    """The exprId an output expression copies: an attribute, or an alias of one."""
    root = expression[0]
    if root["class"] == _ATTRIBUTE:
        return _expr_id(root)
    if root["class"] == _ALIAS and len(expression) == 2 and expression[1]["class"] == _ATTRIBUTE:
        return _expr_id(expression[1])
    return None


def _output_id(expression: list[dict[str, Any]]) -> tuple[str, int]:
    root = expression[0]
    return root["name"], _expr_id(root)


def _equalities(condition: list[dict[str, Any]]) -> Iterator[tuple[int, int]]:
    """Pairs of attributes an `a = b` in the condition equates (anywhere under ANDs)."""
    for i, node in enumerate(condition):
        if node["class"] == _EQUAL and i + 2 < len(condition):
            left, right = condition[i + 1], condition[i + 2]
            if left["class"] == _ATTRIBUTE and right["class"] == _ATTRIBUTE:
                yield _expr_id(left), _expr_id(right)


class _Walk:
    """Attributes (by exprId) traced to input columns, bottom-up through the plan."""

    def __init__(self) -> None:
        self.columns: dict[int, Column] = {}
        self.inputs: list[str] = []
        self.pairs: list[tuple[int, int]] = []
        self.grouping: list[int] | None = None
        self.kinds: set[str] = set()  # of every node but the leaves
        self.computed = False  # an output expression that is not a copy of an attribute
        # Each join: its kind, its condition, and the exprIds of its left side's output.
        self.joins: list[tuple[str | None, list[dict[str, Any]], set[int]]] = []

    def output(self, node: _Node, table: str | None = None) -> list[tuple[str, int]]:
        """The node's output attributes as (name, exprId), recording lineage on the way."""
        kind = node.kind
        if node.children:
            self.kinds.add(kind)
        if kind == "View":
            table = node.fields["desc"]["identifier"]["table"]
            self.inputs.append(table)
        outputs = [self.output(child, table) for child in node.children]
        if not node.children:  # a relation: its attributes are the input's columns
            attributes = [_output_id(e) for e in node.fields.get("output", [])]
            if table is not None:
                for name, expr_id in attributes:
                    self.columns[expr_id] = Column(table, name)
            return attributes
        if kind == "Join":
            condition = node.fields.get("condition") or []
            self.pairs += _equalities(condition)
            join_type = (node.fields.get("joinType") or {}).get("object")
            self.joins.append((_JOIN_KINDS.get(join_type), condition,
                               {expr_id for _, expr_id in outputs[0]}))
            return outputs[0] + outputs[1]
        if kind == "Filter":
            self.pairs += _equalities(node.fields.get("condition") or [])
        if kind in ("Project", "Aggregate"):
            key = "projectList" if kind == "Project" else "aggregateExpressions"
            if kind == "Aggregate":
                self.grouping = [_expr_id(e[0]) for e in node.fields["groupingExpressions"]
                                 if e[0]["class"] == _ATTRIBUTE]
            produced = []
            for expression in node.fields[key]:
                name, expr_id = _output_id(expression)
                copied = _copied_attribute(expression)
                self.computed |= copied is None
                if copied is not None and copied in self.columns:
                    self.columns[expr_id] = self.columns[copied]
                produced.append((name, expr_id))
            return produced
        return outputs[0] if outputs else []


def lineage_of_plan(plan_json: str) -> Lineage:
    """Lineage from an analyzed plan's JSON (`queryExecution().analyzed().toJSON()`)."""
    walk = _Walk()
    outputs = walk.output(_tree(json.loads(plan_json)))
    columns = walk.columns
    pairs = tuple(
        tuple(sorted((columns[a], columns[b])))
        for a, b in walk.pairs if a in columns and b in columns
    )
    grouped = None if walk.grouping is None else tuple(
        columns[g] for g in walk.grouping if g in columns)
    copies = {name: columns.get(expr_id) for name, expr_id in outputs}
    inputs = tuple(dict.fromkeys(walk.inputs))
    copied_only = not walk.computed and all(c is not None for c in copies.values())
    return Lineage(
        inputs=inputs,
        outputs=copies,
        equalities=tuple(dict.fromkeys(pairs)),  # type: ignore[arg-type]
        grouped_by=grouped,
        plain_projection=(len(inputs) == 1 and copied_only
                          and walk.kinds <= _PROJECTION_NODES),
        projected_join=(_equi_join(walk, columns)
                        if len(inputs) == 2 and copied_only
                        and walk.kinds <= _PROJECTION_NODES | {"Join"} else None),
    )


def _equi_join(walk: _Walk, columns: Mapping[int, Column]) -> EquiJoin | None:
    """The plan's one join, if it is inner or left on exactly `left.a = right.b`."""
    if len(walk.joins) != 1:
        return None
    kind, condition, left_side = walk.joins[0]
    if kind is None or len(condition) != 3 or condition[0]["class"] != _EQUAL:
        return None
    pairs = list(_equalities(condition))
    if len(pairs) != 1 or not all(i in columns for i in pairs[0]):
        return None
    a, b = pairs[0]
    if (a in left_side) == (b in left_side):
        return None  # both columns of one side: a filter, not a join
    left, right = (a, b) if a in left_side else (b, a)
    return EquiJoin(kind, columns[left], columns[right])


def plan_json(frame: Any) -> str:
    """A DataFrame's analyzed plan as lineage_of_plan reads it."""
    return frame._jdf.queryExecution().analyzed().toJSON()


def lineage(spark: Any, sql: str) -> Lineage:
    """The lineage of `sql` over the temporary views registered in `spark` (the engine
    registers each input as a temp view named as the SQL reads it; engine.analyzer keeps
    the analyses it makes across starts)."""
    return lineage_of_plan(plan_json(spark.sql(sql)))
