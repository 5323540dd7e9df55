"""Compiled queries: the gateway's hot path.

A document that executed cleanly through Strawberry (so it parsed, validated and passed
every limit) and consists only of lookups by key selecting scalar fields, and of lists
(gateway.compiled.fastlists), is compiled once into a plan: which rows to load (the same
`Reads.rows`, so the same Redis reads and Delta fallback) and how to lay out the answer.
Running the plan skips parsing, validation and graphql-core's per-field machinery; values
are serialized by the schema's own scalar types, so the bytes match what the general path
would send.

Anything else, and any surprise while running a plan (a variable of the wrong type, a
limit the variables now exceed, a missing value, a read error), goes to the general path,
which answers the same query with the proper GraphQL errors.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson
from graphql import (
    DocumentNode,
    FieldNode,
    GraphQLObjectType,
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
from graphql.execution.values import get_variable_values

from gateway.access.limits import query_cost
from gateway.compiled.fastlayout import Column, NotCompilable, column, fields, layout, unique
from gateway.compiled.fastlists import ListPlan, compile_list
from gateway.reads.consistency import GraphVersion
from gateway.reads.freshness import Freshness
from gateway.reads.reads import Reads
from gateway.types.types import ViewTypes, list_name, lookup_name
from schema.storage import key_of

_MAX_INT = 2**31 - 1


@dataclass(frozen=True)
class _Lookup:
    response_key: str
    types: ViewTypes
    arguments: tuple[tuple[str, Any, str | None], ...]  # (column, literal, variable name)
    columns: tuple[Column, ...]


@dataclass(frozen=True)
class _Typename:
    response_key: str


Root = _Lookup | ListPlan | _Typename


class Plan:
    def __init__(self, fast: FastPath, operation: OperationDefinitionNode,
                 document: DocumentNode, roots: list[Root],
                 variable_types: dict[str, tuple[type, bool]], defaults: dict[str, Any]) -> None:
        self.fast = fast
        self.operation = operation
        self.document = document
        self.roots = roots
        self.lookups = [r for r in roots if isinstance(r, _Lookup)]
        self.lists = [r for r in roots if isinstance(r, ListPlan)]
        self.variable_types = variable_types  # name -> (python type, non-null); lookups only
        self.defaults = defaults
        self.views = frozenset([*(r.types.view.name for r in self.lookups),
                                *(view for plan in self.lists for view in plan.views)])

    def _variables(self, given: dict[str, Any] | None) -> dict[str, Any] | None:
        """Variables of a lookup-only plan: strings and ints, checked without graphql-core."""
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

    async def run(self, reads: Reads, given: Any, graph: GraphVersion,
                  document: tuple[str, str | None]) -> bytes | None:
        if given is not None and not isinstance(given, dict):
            return None
        coerced = None
        try:
            if self.lists:
                # Lists take any input: coerce as graphql-core does for the general path,
                # and check the rows the variables now ask for against the cost limit.
                coerced = get_variable_values(self.fast.schema,
                                              self.operation.variable_definitions or (),
                                              given or {})
                if isinstance(coerced, list):
                    return None
                settings = self.fast.settings
                if query_cost(self.fast.schema, self.document, None, given,
                              settings.gateway_default_page_size,
                              settings.gateway_max_page_size) > settings.gateway_max_cost:
                    return None
                variables: dict[str, Any] | None = coerced.coerced
            else:
                variables = self._variables(given)
                if variables is None:
                    return None

            async def attempt() -> tuple[dict[str, Any], Freshness]:
                fresh = Freshness()
                values = await self._lookups(reads, fresh, variables)
                values.update((r.response_key, "Query") for r in self.roots
                              if isinstance(r, _Typename))
                for plan in self.lists:
                    assert coerced is not None
                    values[plan.response_key] = await plan.run(reads, fresh, coerced,
                                                               self.fast.settings)
                return values, fresh

            if graph.several(self.views):
                # Several views of the graph (a to-one relationship) read at one version.
                values, fresh = await graph.run(document, attempt)
                extensions = graph.extensions(fresh)
            else:  # the hot path: one view, nothing to bracket
                values, fresh = await attempt()
                extensions = {"freshness": fresh.report()}
        except (GraphQLError, NotCompilable, KeyError, ValueError, TypeError):
            return None
        data = {root.response_key: values[root.response_key] for root in self.roots}
        return orjson.dumps({"data": data, "extensions": extensions})

    async def _lookups(self, reads: Reads, fresh: Freshness,
                       variables: dict[str, Any]) -> dict[str, Any]:
        # One batched read per view, without a DataLoader's scheduling: a plan knows all
        # its keys up front.
        keys: dict[str, list[str]] = {}
        wanted = []
        for lookup in self.lookups:
            values = {col: variables[var] if var is not None else literal
                      for col, literal, var in lookup.arguments}
            key = key_of(values, lookup.types.view.key)
            keys.setdefault(lookup.types.view.name, []).append(key)
            wanted.append(key)
        found: dict[tuple[str, str], Any] = {}
        for name, view_keys in keys.items():
            unique_keys = list(dict.fromkeys(view_keys))
            rows = await reads.rows(self.fast.views[name], unique_keys, fresh)
            found.update(((name, k), r) for k, r in zip(unique_keys, rows, strict=True))
        out: dict[str, Any] = {}
        for lookup, key in zip(self.lookups, wanted, strict=True):
            row = found[(lookup.types.view.name, key)]
            out[lookup.response_key] = None if row is None else layout(
                lookup.columns, lookup.types.view.name, row)
        return out


class FastPath:
    def __init__(self, schema: Any, types: dict[str, ViewTypes], settings: Any) -> None:
        self.strawberry_schema = schema
        self.schema = schema._schema
        self.settings = settings
        self.max_plans = settings.gateway_document_cache_size
        self.types = types
        self.views = {vt.view.name: vt.view for vt in types.values()}
        self.lookups = {lookup_name(vt.view): vt for vt in types.values()}
        self.lists = {list_name(vt.view): vt for vt in types.values()}
        self.plans: OrderedDict[tuple[str, str | None], Plan | None] = OrderedDict()

    def learn(self, query: str, operation_name: str | None) -> None:
        """After a clean general-path run: compile the document (or remember it cannot)."""
        key = (query, operation_name)
        if key in self.plans:
            return
        try:
            plan: Plan | None = self._compile(query, operation_name)
        except NotCompilable:
            plan = None
        self.plans[key] = plan
        while len(self.plans) > self.max_plans:
            self.plans.popitem(last=False)

    async def run(self, query: str, operation_name: str | None, variables: Any,
                  reads: Reads, graph: GraphVersion) -> bytes | None:
        plan = self.plans.get((query, operation_name))
        if plan is None:
            return None
        return await plan.run(reads, variables, graph, (query, operation_name))

    def _compile(self, query: str, operation_name: str | None) -> Plan:
        document = parse(query, no_location=True)
        operations = [d for d in document.definitions if isinstance(d, OperationDefinitionNode)]
        if len(document.definitions) != len(operations) or len(operations) != 1:
            raise NotCompilable("fragments or several operations")
        operation = operations[0]
        if operation.operation is not OperationType.QUERY or operation.directives:
            raise NotCompilable("not a plain query")
        if operation_name is not None and (operation.name is None
                                           or operation.name.value != operation_name):
            raise NotCompilable("operation name")
        variable_types: dict[str, tuple[type, bool]] = {}
        defaults: dict[str, Any] = {}
        for definition in operation.variable_definitions or ():
            if definition.directives:
                raise NotCompilable("variable directives")
            var_type = definition.type
            non_null = isinstance(var_type, NonNullTypeNode)
            named = var_type.type if non_null else var_type
            if isinstance(named, NamedTypeNode) and named.name.value in ("String", "ID", "Int"):
                name = definition.variable.name.value
                variable_types[name] = (int if named.name.value == "Int" else str, non_null)
                if definition.default_value is not None:
                    defaults[name] = _literal(definition.default_value)
        roots: list[Root] = []
        for node in fields(operation.selection_set):
            if node.name.value == "__typename" and not node.directives:
                roots.append(_Typename((node.alias or node.name).value))
            elif node.name.value in self.lists:
                roots.append(compile_list(node, self.schema, self.strawberry_schema,
                                          self.lists[node.name.value], self.types))
            else:
                roots.append(self._lookup(node, variable_types))
        unique([r.response_key for r in roots])
        if len(variable_types) != len(operation.variable_definitions or ()) and not any(
                isinstance(r, ListPlan) for r in roots):
            raise NotCompilable("variable type")  # lookup-only plans check variables alone
        return Plan(self, operation, document, roots, variable_types, defaults)

    def _lookup(self, node: FieldNode, variable_types: dict[str, tuple[type, bool]]) -> _Lookup:
        vt = self.lookups.get(node.name.value)
        if vt is None or node.directives or node.selection_set is None:
            raise NotCompilable("not a lookup")
        by_graphql = {f.graphql_name: f for f in vt.fields.values()}
        arguments = []
        for argument in node.arguments or ():
            info = by_graphql.get(argument.name.value)
            if info is None or info.python_name not in vt.view.key \
                    or info.python_type not in (str, int):
                raise NotCompilable("argument")
            value = argument.value
            if isinstance(value, VariableNode):
                if variable_types.get(value.name.value, (None,))[0] is not info.python_type:
                    raise NotCompilable("variable of another type")
                arguments.append((info.python_name, None, value.name.value))
            else:
                arguments.append((info.python_name, _literal(value), None))
        if sorted(a[0] for a in arguments) != sorted(vt.view.key):
            raise NotCompilable("not every key column")
        object_type = self.schema.get_type(vt.view.name)
        assert isinstance(object_type, GraphQLObjectType)
        columns = tuple(column(child, vt, object_type) for child in fields(node.selection_set))
        unique([c.response_key for c in columns])
        return _Lookup((node.alias or node.name).value, vt, tuple(arguments), columns)


def _literal(node: Any) -> Any:
    if isinstance(node, StringValueNode):
        return node.value
    if isinstance(node, IntValueNode):
        return int(node.value)
    raise NotCompilable("literal")
