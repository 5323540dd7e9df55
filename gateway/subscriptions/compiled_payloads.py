"""Compiled `next` payloads: a change message laid out without graphql-core's executor.

A subscriber of a busy view receives one message per changed row, and each went through
graphql-core's executor (resolve info, field collection, completion) to lay out a handful
of attributes: at the demo's 1,000 events a second that was most of the gateway's CPU
(docs/benchmarks.md, "Compiled change payloads"). Most subscriptions select only plain
fields of the change and of its rows (`op version row { name tier }`), and those are
attributes of the message object, serialized by their GraphQL types. Such a selection is
compiled once per plan (gateway.subscriptions.live_operations.Plan) into a tuple of
fields, and a message is laid out by reading them.

What compiles: one root field without directives, whose selection set, at any depth, is
fields of object types without arguments or directives (aliases are fine), each resolved
by Strawberry's default resolver (an attribute: no resolver of its own, no permission
classes or field extensions), and each a scalar, an enum or such an object; and no
middleware. Anything else (fragments, `@include`, a relationship such as `row {
customer { name } }`, lists) keeps the executor. At run time a value the executor would
answer with an error (a null in a non-null field, a value its scalar refuses) makes the
payload None, and the plan asks the executor, which says what went wrong.

tests/unit/test_compiled_payloads.py compares the two paths' payloads, byte for byte,
over the demo schema's change types.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from graphql import (
    FieldNode,
    GraphQLEnumType,
    GraphQLError,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLScalarType,
    OperationDefinitionNode,
    OperationType,
)

# Where Strawberry keeps a GraphQL field's definition (GraphQLCoreConverter.DEFINITION_BACKREF).
STRAWBERRY_FIELD = "strawberry-definition"


class NotCompiled(Exception):
    """The selection (when compiling) or the message (when laying out) is the executor's."""


@dataclass(frozen=True)
class Field:
    response_key: str
    attribute: str | None  # the Python attribute; None for __typename
    type_name: str  # the parent's GraphQL type, for __typename
    non_null: bool
    serialize: Callable[[Any], Any] | None  # a scalar's or an enum's
    selection: tuple[Field, ...] | None  # an object's fields


def compile_payload(executor: Any) -> Callable[[Any], str | None] | None:
    """The compiled payload of the subscription `executor` runs, or None if its
    selection is not one that compiles. The function answers None for a message the
    executor must lay out."""
    manager = getattr(executor, "middleware_manager", None)
    if manager is not None and manager.middlewares:
        return None
    operation: OperationDefinitionNode = executor.operation
    root_type = executor.schema.subscription_type
    if operation.operation is not OperationType.SUBSCRIPTION or root_type is None:
        return None
    roots = operation.selection_set.selections
    if len(roots) != 1 or not isinstance(roots[0], FieldNode) or roots[0].directives:
        return None
    root = roots[0]
    definition = root_type.fields.get(root.name.value)
    if definition is None or root.selection_set is None:
        return None
    object_type = _unwrap(definition.type)[0]
    if not isinstance(object_type, GraphQLObjectType):
        return None
    try:
        selection = _selection(object_type, root.selection_set)
    except NotCompiled:
        return None
    root_key = (root.alias or root.name).value

    def payload(message: Any) -> str | None:
        try:
            data = {root_key: _lay_out(selection, message)}
        except (NotCompiled, GraphQLError, TypeError, ValueError, AttributeError):
            return None
        return orjson.dumps({"data": data}).decode()

    return payload


def _unwrap(graphql_type: Any) -> tuple[Any, bool]:
    if isinstance(graphql_type, GraphQLNonNull):
        return graphql_type.of_type, True
    return graphql_type, False


def _selection(object_type: GraphQLObjectType, selection_set: Any) -> tuple[Field, ...]:
    out = []
    for node in selection_set.selections:
        if not isinstance(node, FieldNode) or node.directives or node.arguments:
            raise NotCompiled("fragments, directives or arguments")
        out.append(_field(object_type, node))
    keys = [f.response_key for f in out]
    if len(set(keys)) != len(keys):
        raise NotCompiled("a response key selected twice (the executor merges them)")
    return tuple(out)


def _field(object_type: GraphQLObjectType, node: FieldNode) -> Field:
    key = (node.alias or node.name).value
    name = node.name.value
    if name == "__typename":
        return Field(key, None, object_type.name, True, None, None)
    definition = object_type.fields.get(name)
    field = definition.extensions.get(STRAWBERRY_FIELD) if definition is not None else None
    if field is None or field.base_resolver is not None or field.permission_classes \
            or field.extensions:
        raise NotCompiled(f"{object_type.name}.{name} is not a plain attribute")
    inner, non_null = _unwrap(definition.type)
    if isinstance(inner, (GraphQLScalarType, GraphQLEnumType)):
        if node.selection_set is not None:
            raise NotCompiled("a selection under a leaf")
        return Field(key, field.python_name, object_type.name, non_null, inner.serialize, None)
    if isinstance(inner, GraphQLObjectType) and node.selection_set is not None:
        return Field(key, field.python_name, object_type.name, non_null, None,
                     _selection(inner, node.selection_set))
    raise NotCompiled(f"{object_type.name}.{name}: a list, an interface or a union")


def _lay_out(selection: tuple[Field, ...], source: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in selection:
        if field.attribute is None:
            out[field.response_key] = field.type_name
            continue
        value = getattr(source, field.attribute)
        if value is None:
            if field.non_null:
                raise NotCompiled("a null in a non-null field: the executor says so")
            out[field.response_key] = None
        elif field.selection is not None:
            out[field.response_key] = _lay_out(field.selection, value)
        else:
            assert field.serialize is not None
            out[field.response_key] = field.serialize(value)
    return out
