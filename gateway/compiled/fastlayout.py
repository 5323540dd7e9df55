"""What compiled plans (gateway.compiled.fastpath, gateway.compiled.fastlists) share: how
a selection of scalar fields is compiled into columns and how a stored row is laid out with
them, with the schema's own scalar serializers so the bytes match the general path's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from graphql import (
    FieldNode,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLScalarType,
    GraphQLString,
)

from gateway.types.types import ViewTypes
from schema.storage import from_json_value


class NotCompilable(Exception):
    """The document (at compile time) or this request (at run time) is the general path's."""


@dataclass(frozen=True)
class Column:
    response_key: str
    source: str | None  # python field name; None for __typename
    python_type: Any
    serialize: Callable[[Any], Any] | None
    non_null: bool
    text: bool = False  # a str field served as String: a stored str is its own answer


def fields(selection_set: Any) -> list[FieldNode]:
    selections = list(selection_set.selections)
    if not all(isinstance(s, FieldNode) for s in selections):
        raise NotCompilable("fragments")
    return selections


def plain(node: FieldNode) -> None:
    """Refuse what a compiled selection does not handle: directives and arguments."""
    if node.directives or node.arguments:
        raise NotCompilable("directives or arguments")


def response_key(node: FieldNode) -> str:
    return (node.alias or node.name).value


def unique(keys: list[str]) -> None:
    if len(set(keys)) != len(keys):
        raise NotCompilable("repeated response keys")


def column(node: FieldNode, vt: ViewTypes, object_type: GraphQLObjectType) -> Column:
    """A scalar field (or __typename) of a view's object type."""
    plain(node)
    if node.selection_set is not None:
        raise NotCompilable("not a scalar field")
    if node.name.value == "__typename":
        return Column(response_key(node), None, None, None, True)
    info = next((f for f in vt.fields.values() if f.graphql_name == node.name.value), None)
    definition = object_type.fields.get(node.name.value)
    if info is None or definition is None:
        raise NotCompilable("not a column")
    non_null = isinstance(definition.type, GraphQLNonNull)
    scalar = definition.type.of_type if non_null else definition.type
    if not isinstance(scalar, GraphQLScalarType):
        raise NotCompilable("not a scalar")
    return Column(response_key(node), info.python_name, info.python_type, scalar.serialize,
                  non_null, info.python_type is str and scalar is GraphQLString)


def value(c: Column, type_name: str, row: dict[str, Any]) -> Any:
    if c.source is None:
        return type_name
    raw = row.get(c.source)
    if c.text and raw.__class__ is str:
        return raw  # what from_json_value and GraphQLString's serialize return for it
    if raw is None:
        if c.non_null:
            raise NotCompilable("a non-null field is null: let the general path say so")
        return None
    assert c.serialize is not None
    return c.serialize(from_json_value(c.python_type, raw))


def layout(columns: tuple[Column, ...], type_name: str, row: dict[str, Any]) -> dict[str, Any]:
    return {c.response_key: value(c, type_name, row) for c in columns}
