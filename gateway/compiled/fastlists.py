"""Compiled list fields: a Relay connection (`edges { cursor node }`, `pageInfo`,
`totalCount`) whose nodes select scalar fields and to-one relationships by key, each
selecting scalar fields.

The page itself comes from the resolver's own code (gateway.types.types.connection_page) with
arguments coerced and converted as graphql-core and Strawberry do it for the general path;
the plan only replaces graphql-core's per-field execution: the related rows of a page are
read in one batched read per relationship and every value is serialized by the schema's
scalar types, so the answer's bytes are the general path's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphql import FieldNode, GraphQLField, GraphQLObjectType, GraphQLSchema
from graphql.execution.values import VariableValues, get_argument_values
from strawberry.types.arguments import convert_arguments
from strawberry.utils.str_converters import to_camel_case

from gateway.compiled.fastlayout import (
    Column,
    NotCompilable,
    column,
    fields,
    layout,
    plain,
    response_key,
    unique,
    value,
)
from gateway.reads.filters import encode_cursor
from gateway.reads.freshness import Freshness
from gateway.reads.reads import Reads
from gateway.types.types import ViewTypes, connection_page
from schema.catalog import Relationship
from schema.storage import from_json_value, key_of

PAGE_INFO = {"hasNextPage", "hasPreviousPage", "startCursor", "endCursor", "__typename"}


@dataclass(frozen=True)
class _Related:
    """A to-one relationship by the target's key, with its scalar columns."""

    response_key: str
    relationship: Relationship
    target: ViewTypes
    columns: tuple[Column, ...]


@dataclass(frozen=True)
class _Edge:
    response_key: str
    part: str  # "node", "cursor" or "__typename"


class ListPlan:
    def __init__(self, node: FieldNode, definition: GraphQLField, strawberry_schema: Any,
                 vt: ViewTypes, selection: list[tuple[str, str, Any]],
                 node_fields: tuple[Column | _Related, ...]) -> None:
        self.response_key = response_key(node)
        self.node = node
        self.definition = definition
        self.arguments = strawberry_schema.get_field_for_type(node.name.value,
                                                              "Query").arguments
        self.scalar_registry = strawberry_schema.schema_converter.scalar_registry
        self.config = strawberry_schema.config
        self.vt = vt
        self.selection = selection  # (response key, connection field, sub-selection)
        self.node_fields = node_fields
        # The views it reads: the list's, and those of its to-one relationships.
        self.views = frozenset([vt.view.name, *(f.target.view.name for f in node_fields
                                                if isinstance(f, _Related))])

    async def run(self, reads: Reads, fresh: Freshness, variables: VariableValues,
                  settings: Any) -> dict[str, Any]:
        raw = get_argument_values(self.definition, self.node, variables)
        kwargs = convert_arguments(raw, self.arguments, scalar_registry=self.scalar_registry,
                                   config=self.config)
        view = self.vt.view

        async def load(keys: Any) -> list[dict[str, Any] | None]:
            return await reads.rows(view, list(keys), fresh)

        page = await connection_page(reads, fresh, load, self.vt, settings, kwargs)
        related = {r.response_key: await _related_rows(reads, fresh, self.vt, r, page.items)
                   for r in self.node_fields if isinstance(r, _Related)}
        out: dict[str, Any] = {}
        for key, name, sub in self.selection:
            if name == "__typename":
                out[key] = f"{view.name}Connection"
            elif name == "totalCount":
                out[key] = page.total
            elif name == "pageInfo":
                items = page.items
                values = {"hasNextPage": page.has_next, "hasPreviousPage": page.has_previous,
                          "__typename": "PageInfo",
                          # Cursors are encoded only where the selection shows them.
                          "startCursor": encode_cursor(items[0][0]) if items else None,
                          "endCursor": encode_cursor(items[-1][0]) if items else None}
                out[key] = {k: values[n] for k, n in sub}
            else:  # edges
                out[key] = [self._edge(sub, i, position, row, related)
                            for i, (position, row) in enumerate(page.items)]
        return out

    def _edge(self, parts: list[_Edge], i: int, position: tuple[Any, str],
              row: dict[str, Any],
              related: dict[str, list[dict[str, Any] | None]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for part in parts:
            if part.part == "cursor":
                out[part.response_key] = encode_cursor(position)
            elif part.part == "__typename":
                out[part.response_key] = f"{self.vt.view.name}Edge"
            else:
                out[part.response_key] = self._node(i, row, related)
        return out

    def _node(self, i: int, row: dict[str, Any],
              related: dict[str, list[dict[str, Any] | None]]) -> dict[str, Any]:
        name = self.vt.view.name
        out: dict[str, Any] = {}
        for f in self.node_fields:
            if isinstance(f, Column):
                out[f.response_key] = value(f, name, row)
            else:
                target = related[f.response_key][i]
                out[f.response_key] = None if target is None else layout(
                    f.columns, f.target.view.name, target)
        return out


async def _related_rows(reads: Reads, fresh: Freshness, vt: ViewTypes, r: _Related,
                        items: list[tuple[Any, dict[str, Any]]]) -> list[dict[str, Any] | None]:
    """Per row of the page, its related row: one batched read of the distinct keys."""
    target = r.target.view
    on = r.relationship.on
    # One str column: the stored value is the key (what key_of makes of it).
    text = len(on) == 1 and vt.fields[on[0][0]].python_type is str
    keys: list[str | None] = []
    for _, row in items:
        if text:
            raw = row.get(on[0][0])
            if raw is None or raw.__class__ is str:
                keys.append(raw)
                continue
        # The key as the general path's resolver builds it, from the typed values.
        values = {theirs: from_json_value(vt.fields[mine].python_type, row.get(mine))
                  for mine, theirs in on}
        keys.append(None if any(v is None for v in values.values())
                    else key_of(values, target.key))
    distinct = list(dict.fromkeys(k for k in keys if k is not None))
    found = dict(zip(distinct, await reads.rows(target, distinct, fresh), strict=True)) \
        if distinct else {}
    return [None if k is None else found[k] for k in keys]


def compile_list(node: FieldNode, schema: GraphQLSchema, strawberry_schema: Any,
                 vt: ViewTypes, types: dict[str, ViewTypes]) -> ListPlan:
    """A list root field as a plan; NotCompilable for any other shape."""
    if node.directives or node.selection_set is None:
        raise NotCompilable("directives")
    query = schema.query_type
    assert query is not None
    definition = query.fields[node.name.value]
    selection: list[tuple[str, str, Any]] = []
    node_fields: tuple[Column | _Related, ...] = ()
    for child in fields(node.selection_set):
        plain(child)
        name = child.name.value
        if name in ("__typename", "totalCount"):
            if child.selection_set is not None:
                raise NotCompilable("selection on a scalar")
            selection.append((response_key(child), name, None))
        elif name == "pageInfo" and child.selection_set is not None:
            parts = []
            for part in fields(child.selection_set):
                plain(part)
                if part.name.value not in PAGE_INFO or part.selection_set is not None:
                    raise NotCompilable("pageInfo field")
                parts.append((response_key(part), part.name.value))
            unique([k for k, _ in parts])
            selection.append((response_key(child), name, parts))
        elif name == "edges" and child.selection_set is not None:
            edge, node_fields = _edges(child, schema, vt, types, node_fields)
            selection.append((response_key(child), name, edge))
        else:
            raise NotCompilable("connection field")
    unique([key for key, _, _ in selection])
    return ListPlan(node, definition, strawberry_schema, vt, selection, node_fields)


def _edges(node: FieldNode, schema: GraphQLSchema, vt: ViewTypes,
           types: dict[str, ViewTypes],
           before: tuple[Column | _Related, ...]) -> tuple[list[_Edge], tuple]:
    if before:
        raise NotCompilable("edges selected twice")
    parts: list[_Edge] = []
    node_fields: tuple[Column | _Related, ...] = ()
    for child in fields(node.selection_set):
        plain(child)
        name = child.name.value
        if name in ("cursor", "__typename") and child.selection_set is None:
            parts.append(_Edge(response_key(child), name))
        elif name == "node" and child.selection_set is not None and not node_fields:
            parts.append(_Edge(response_key(child), "node"))
            node_fields = tuple(_node_field(f, schema, vt, types)
                                for f in fields(child.selection_set))
            unique([f.response_key for f in node_fields])
        else:
            raise NotCompilable("edge field")
    unique([p.response_key for p in parts])
    if any(p.part == "node" for p in parts) and not node_fields:
        raise NotCompilable("empty node")
    return parts, node_fields


def _node_field(node: FieldNode, schema: GraphQLSchema, vt: ViewTypes,
                types: dict[str, ViewTypes]) -> Column | _Related:
    object_type = schema.get_type(vt.view.name)
    assert isinstance(object_type, GraphQLObjectType)
    if node.selection_set is None:
        return column(node, vt, object_type)
    plain(node)
    rel = next((r for r in vt.view.relationships if to_camel_case(r.name) == node.name.value),
               None)
    if rel is None or rel.many:
        raise NotCompilable("not a to-one relationship")
    target = types[rel.target]
    if {theirs for _, theirs in rel.on} != set(target.view.key):
        raise NotCompilable("a relationship not by the target's key")
    target_type = schema.get_type(rel.target)
    assert isinstance(target_type, GraphQLObjectType)
    columns = tuple(column(c, target, target_type) for c in fields(node.selection_set))
    unique([c.response_key for c in columns])
    return _Related(response_key(node), rel, target, columns)
