"""Compiled point queries: the gateway's hot path.

A document that executed cleanly through Strawberry (so it parsed, validated and passed
every limit) and consists only of lookups by key selecting scalar fields is compiled once
into a plan: which rows to load (through the same per-request DataLoader, so the same
Redis MGET and Delta fallback) and how to lay out the answer. Running the plan skips
parsing, validation and graphql-core's per-field machinery; values are serialized by the
schema's own scalar types, so the bytes match what the general path would send.

Anything else, and any surprise while running a plan (a variable of the wrong type, a
missing value, a read error), goes to the general path, which answers the same query with
the proper GraphQL errors.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from graphql import (
    FieldNode,
    GraphQLNonNull,
    GraphQLScalarType,
    GraphQLSchema,
    IntValueNode,
    NamedTypeNode,
    NonNullTypeNode,
    OperationDefinitionNode,
    OperationType,
    StringValueNode,
    VariableNode,
    parse,
)
from graphql.error import GraphQLError

from gateway.types import RequestContext, ViewTypes, lookup_name
from schema.storage import from_json_value, key_of

_MAX_INT = 2**31 - 1


class _NotCompilable(Exception):
    pass


@dataclass(frozen=True)
class _Column:
    response_key: str
    source: str | None  # python field name; None for __typename
    python_type: Any
    serialize: Callable[[Any], Any] | None
    non_null: bool


@dataclass(frozen=True)
class _Lookup:
    response_key: str
    types: ViewTypes
    arguments: tuple[tuple[str, Any, str | None], ...]  # (column, literal, variable name)
    columns: tuple[_Column, ...]


class Plan:
    def __init__(self, lookups: list[_Lookup], variable_types: dict[str, tuple[type, bool]],
                 defaults: dict[str, Any]) -> None:
        self.lookups = lookups
        self.variable_types = variable_types  # name -> (python type, non-null)
        self.defaults = defaults

    def _variables(self, given: dict[str, Any] | None) -> dict[str, Any] | None:
        given = given or {}
        out = {}
        for name, (python_type, _) in self.variable_types.items():
            value = given.get(name, self.defaults.get(name))
            if python_type is int:
                if not isinstance(value, int) or isinstance(value, bool) or abs(value) > _MAX_INT:
                    return None
            elif not isinstance(value, str):
                return None
            out[name] = value
        return out

    async def run(self, context: RequestContext, given: dict[str, Any] | None) -> bytes | None:
        variables = self._variables(given)
        if variables is None:
            return None
        # One batched read per view (the same Reads.rows the DataLoaders batch into), without
        # the DataLoader's scheduling: a plan knows all its keys up front.
        keys: dict[str, list[str]] = {}
        views = {}
        wanted = []
        for lookup in self.lookups:
            values = {col: variables[var] if var is not None else literal
                      for col, literal, var in lookup.arguments}
            key = key_of(values, lookup.types.view.key)
            keys.setdefault(lookup.types.view.name, []).append(key)
            views[lookup.types.view.name] = lookup.types.view
            wanted.append(key)
        try:
            found: dict[tuple[str, str], Any] = {}
            for name, view_keys in keys.items():
                unique = list(dict.fromkeys(view_keys))
                rows = await context.reads.rows(views[name], unique, context.fresh)
                found.update(((name, k), r) for k, r in zip(unique, rows, strict=True))
            data: dict[str, Any] = {}
            for lookup, key in zip(self.lookups, wanted, strict=True):
                row = found[(lookup.types.view.name, key)]
                data[lookup.response_key] = None if row is None else _layout(lookup, row)
        except (GraphQLError, _NotCompilable, ValueError, TypeError):
            return None
        return orjson.dumps({"data": data, "extensions": {"freshness": context.fresh.report()}})


def _layout(lookup: _Lookup, row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for column in lookup.columns:
        if column.source is None:
            out[column.response_key] = lookup.types.view.name
            continue
        raw = row.get(column.source)
        if raw is None:
            if column.non_null:
                raise _NotCompilable("a non-null field is null: let the general path say so")
            out[column.response_key] = None
            continue
        assert column.serialize is not None
        out[column.response_key] = column.serialize(from_json_value(column.python_type, raw))
    return out


class FastPath:
    def __init__(self, schema: GraphQLSchema, types: dict[str, ViewTypes], max_plans: int):
        self.schema = schema
        self.max_plans = max_plans
        self.lookups = {lookup_name(vt.view): vt for vt in types.values()}
        self.plans: OrderedDict[tuple[str, str | None], Plan | None] = OrderedDict()

    def learn(self, query: str, operation_name: str | None) -> None:
        """After a clean general-path run: compile the document (or remember it cannot)."""
        key = (query, operation_name)
        if key in self.plans:
            return
        try:
            plan: Plan | None = self._compile(query, operation_name)
        except _NotCompilable:
            plan = None
        self.plans[key] = plan
        while len(self.plans) > self.max_plans:
            self.plans.popitem(last=False)

    async def run(self, query: str, operation_name: str | None, variables: Any,
                  context: RequestContext) -> bytes | None:
        plan = self.plans.get((query, operation_name))
        if plan is None:
            return None
        return await plan.run(context, variables)

    def _compile(self, query: str, operation_name: str | None) -> Plan:
        document = parse(query, no_location=True)
        operations = [d for d in document.definitions if isinstance(d, OperationDefinitionNode)]
        if len(document.definitions) != len(operations) or len(operations) != 1:
            raise _NotCompilable("fragments or several operations")
        operation = operations[0]
        if operation.operation is not OperationType.QUERY or operation.directives:
            raise _NotCompilable("not a plain query")
        if operation_name is not None and (operation.name is None
                                           or operation.name.value != operation_name):
            raise _NotCompilable("operation name")
        variable_types: dict[str, tuple[type, bool]] = {}
        defaults: dict[str, Any] = {}
        for definition in operation.variable_definitions or ():
            var_type = definition.type
            non_null = isinstance(var_type, NonNullTypeNode)
            named = var_type.type if non_null else var_type
            if not isinstance(named, NamedTypeNode) or named.name.value not in (
                    "String", "ID", "Int") or definition.directives:
                raise _NotCompilable("variable type")
            name = definition.variable.name.value
            variable_types[name] = (int if named.name.value == "Int" else str, non_null)
            if definition.default_value is not None:
                defaults[name] = _literal(definition.default_value)
        lookups = [self._lookup(node, variable_types)
                   for node in _fields(operation.selection_set)]
        if len({lk.response_key for lk in lookups}) != len(lookups):
            raise _NotCompilable("repeated response keys")
        return Plan(lookups, variable_types, defaults)

    def _lookup(self, node: FieldNode, variable_types: dict[str, tuple[type, bool]]) -> _Lookup:
        vt = self.lookups.get(node.name.value)
        if vt is None or node.directives or node.selection_set is None:
            raise _NotCompilable("not a lookup")
        by_graphql = {f.graphql_name: f for f in vt.fields.values()}
        arguments = []
        for argument in node.arguments or ():
            info = by_graphql.get(argument.name.value)
            if info is None or info.python_name not in vt.view.key \
                    or info.python_type not in (str, int):
                raise _NotCompilable("argument")
            value = argument.value
            if isinstance(value, VariableNode):
                if variable_types.get(value.name.value, (None,))[0] is not info.python_type:
                    raise _NotCompilable("variable of another type")
                arguments.append((info.python_name, None, value.name.value))
            else:
                arguments.append((info.python_name, _literal(value), None))
        if sorted(a[0] for a in arguments) != sorted(vt.view.key):
            raise _NotCompilable("not every key column")
        object_type = self.schema.get_type(vt.view.name)
        columns = []
        for child in _fields(node.selection_set):
            if child.directives or child.selection_set is not None or child.arguments:
                raise _NotCompilable("not a plain scalar field")
            response_key = (child.alias or child.name).value
            if child.name.value == "__typename":
                columns.append(_Column(response_key, None, None, None, True))
                continue
            info = by_graphql.get(child.name.value)
            definition = object_type.fields.get(child.name.value)  # type: ignore[union-attr]
            if info is None or definition is None:
                raise _NotCompilable("not a column")
            non_null = isinstance(definition.type, GraphQLNonNull)
            scalar = definition.type.of_type if non_null else definition.type
            if not isinstance(scalar, GraphQLScalarType):
                raise _NotCompilable("not a scalar")
            columns.append(_Column(response_key, info.python_name, info.python_type,
                                   scalar.serialize, non_null))
        if len({c.response_key for c in columns}) != len(columns):
            raise _NotCompilable("repeated response keys")
        return _Lookup((node.alias or node.name).value, vt, tuple(arguments), tuple(columns))


def _fields(selection_set: Any) -> list[FieldNode]:
    selections = list(selection_set.selections)
    if not all(isinstance(s, FieldNode) for s in selections):
        raise _NotCompilable("fragments")
    return selections


def _literal(node: Any) -> Any:
    if isinstance(node, StringValueNode):
        return node.value
    if isinstance(node, IntValueNode):
        return int(node.value)
    raise _NotCompilable("literal")
