"""Protection: limits on document size, tokens, depth, aliases and on the rows a query may
ask for (its cost), each failing with an error naming the limit and its setting.

Depth, aliases and tokens are Strawberry's own extensions. Their validation rules are
built once, so the validation cache (keyed by the rules) keeps hitting.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from graphql import (
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    GraphQLObjectType,
    GraphQLSchema,
    InlineFragmentNode,
    OperationDefinitionNode,
    SelectionSetNode,
    get_named_type,
)
from graphql.execution import ExecutionResult as GraphQLExecutionResult
from graphql.utilities import value_from_ast_untyped
from graphql.validation import NoSchemaIntrospectionCustomRule
from strawberry.extensions import (
    AddValidationRules,
    MaxAliasesLimiter,
    MaxTokensLimiter,
    ParserCache,
    QueryDepthLimiter,
    SchemaExtension,
    ValidationCache,
)

from gateway.access.expansion import guarded_rules
from gateway.access.operation_choice import RequireOperationName
from gateway.reads.filters import QueryError
from schema.settings import Settings

PAGED_ARGUMENTS = ("first", "last")


def schema_extensions(settings: Settings) -> list[Callable[[], SchemaExtension]]:
    """Per-request extension factories (Strawberry sets per-request state on them)."""
    depth = QueryDepthLimiter(max_depth=settings.gateway_max_depth).validation_rules
    aliases = MaxAliasesLimiter(max_alias_count=settings.gateway_max_aliases).validation_rules
    # The depth and alias limiters expand every fragment spread: a fragment-spread bomb
    # is refused (gateway.access.expansion) before they see it.
    guarded = [guarded_rules([*depth, *aliases], settings.gateway_max_fields)]
    size = settings.gateway_document_cache_size
    extensions: list[Callable[[], SchemaExtension]] = [
        lambda: MaxTokensLimiter(max_token_count=settings.gateway_max_tokens),
        lambda: AddValidationRules(guarded),
        lambda: ParserCache(maxsize=size),
        lambda: ValidationCache(maxsize=size),
        RequireOperationName,
        lambda: CostLimiter(settings),
    ]
    if not settings.gateway_introspection:
        # __schema and __type fail validation ("introspection has been disabled").
        no_introspection = [NoSchemaIntrospectionCustomRule]
        extensions.append(lambda: AddValidationRules(no_introspection))
    return extensions


def limit_code(error: GraphQLError) -> str | None:
    """The limit a parse or validation error of Strawberry's limiters reports, if any."""
    message = error.message
    if "exceeds maximum operation depth" in message:
        return "LIMIT_DEPTH"
    if "aliases found. Allowed" in message:
        return "LIMIT_ALIASES"
    if "Document contains more than" in message and "tokens" in message:
        return "LIMIT_TOKENS"
    return None


def query_cost(schema: GraphQLSchema, document: Any, operation_name: str | None,
               variables: Mapping[str, Any] | None, default_page: int,
               max_page: int) -> int:
    """Rows the operation may return: each list field's page size times the page sizes of
    the lists around it, summed. A page size above `max_page` fails at once."""
    fragments = {d.name.value: d for d in document.definitions
                 if isinstance(d, FragmentDefinitionNode)}
    operations = [d for d in document.definitions if isinstance(d, OperationDefinitionNode)]
    operation = next((o for o in operations
                      if operation_name is None or (o.name and o.name.value == operation_name)),
                     None)
    if operation is None or schema.query_type is None:
        return 0
    variables = variables or {}

    def page_size(node: FieldNode, has_page: bool) -> int:
        if not has_page:
            return 1
        size = default_page
        for argument in node.arguments or ():
            if argument.name.value in PAGED_ARGUMENTS:
                value = value_from_ast_untyped(argument.value, variables)
                if isinstance(value, int):
                    size = value
        if size > max_page:
            raise QueryError(
                f"{node.name.value} asks for {size} rows per page; the limit is {max_page} "
                f"(gateway_max_page_size)", "LIMIT_PAGE_SIZE", limit=max_page)
        return size

    def walk(selection_set: SelectionSetNode | None, parent: GraphQLObjectType,
             multiplier: int, seen: frozenset[str]) -> Iterator[int]:
        for selection in selection_set.selections if selection_set else ():
            if isinstance(selection, FieldNode):
                definition = parent.fields.get(selection.name.value)
                if definition is None:  # __typename and introspection
                    continue
                has_page = any(a in definition.args for a in PAGED_ARGUMENTS)
                rows = multiplier * page_size(selection, has_page)
                if has_page:
                    yield rows
                child = get_named_type(definition.type)
                if isinstance(child, GraphQLObjectType):
                    yield from walk(selection.selection_set, child, rows, seen)
            elif isinstance(selection, InlineFragmentNode):
                condition = selection.type_condition
                target = schema.get_type(condition.name.value) if condition else parent
                if isinstance(target, GraphQLObjectType):
                    yield from walk(selection.selection_set, target, multiplier, seen)
            elif isinstance(selection, FragmentSpreadNode):
                name = selection.name.value
                fragment = fragments.get(name)
                if fragment is not None and name not in seen:
                    target = schema.get_type(fragment.type_condition.name.value)
                    if isinstance(target, GraphQLObjectType):
                        yield from walk(fragment.selection_set, target, multiplier,
                                        seen | {name})

    try:
        return sum(walk(operation.selection_set, schema.query_type, 1, frozenset()))
    finally:
        # `walk` refers to itself through its closure: a cycle per query, left to the
        # garbage collector, unless the cell is cleared.
        walk = None  # type: ignore[assignment]  # noqa: F841


class CostLimiter(SchemaExtension):
    """Refuses, before any read, an operation whose lists could return more rows than
    `gateway_max_cost` (and any page above `gateway_max_page_size`)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def on_execute(self) -> Iterator[None]:
        context = self.execution_context
        s = self.settings
        try:
            cost = query_cost(context.schema._schema, context.graphql_document,
                              context.operation_name, context.variables,
                              s.gateway_default_page_size, s.gateway_max_page_size)
            if cost > s.gateway_max_cost:
                raise QueryError(
                    f"the query may return {cost} rows (page sizes multiplied along nested "
                    f"lists); the limit is {s.gateway_max_cost} (gateway_max_cost)",
                    "LIMIT_COST", cost=cost, limit=s.gateway_max_cost)
        except QueryError as error:
            context.result = GraphQLExecutionResult(data=None, errors=[error])
        yield
