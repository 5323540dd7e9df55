"""One execution per change for the subscribers that asked the same thing.

A change message (and a live list's page) is one Python object however many subscribers
it goes to (gateway.subscriptions.subscriptions builds it once). For each event
graphql-core executes every subscription's selection set over that object, so 10,000
subscribers of one key cost 10,000 identical executions. Subscribers with the same
document, variables and scope (`share_scope` of the connection's context: whatever else a
result depends on, such as the role) get the same result, so the first execution is kept
on the message and the others take it.

Only the variables below the subscription's root field count: the root field's own
arguments choose the source stream (which key, which filter) and its resolver returns the
message itself for every event, so they cannot change what is executed over a message.
Thousands of tabs each watching the changes of their own customers share one execution.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import Counter, OrderedDict
from typing import Any

import orjson
from graphql import FieldNode, FragmentSpreadNode, Node, OperationDefinitionNode, OperationType
from graphql.language import VariableDefinitionNode, VariableNode
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext

RESULTS = "_viewgate_results"  # attribute of a shared message: share key -> result


def shared(message: Any) -> Any:
    """Mark `message` as sent to many subscribers: their executions over it are shared."""
    object.__setattr__(message, RESULTS, {})
    return message


def share_key(executor: Any) -> tuple | None:
    """What makes two subscriptions' results over one message equal; None: no sharing
    (a document parsed without its source text)."""
    operation = executor.operation
    if operation.loc is None:
        return None
    below = variables_below_root(operation)
    coerced = executor.variable_values.coerced
    if below is not None:
        coerced = {name: value for name, value in coerced.items() if name in below}
    # A str: orjson's bytes keep their 4 KiB output buffer, held here per subscription.
    variables = orjson.dumps(coerced, default=repr, option=orjson.OPT_SORT_KEYS).decode()
    scope = getattr(executor.context_value, "share_scope", None)
    name = operation.name.value if operation.name else None
    return id(executor.schema), operation.loc.source.body, name, variables, scope


_BELOW: OrderedDict[int, tuple[OperationDefinitionNode, frozenset[str] | None]] = \
    OrderedDict()
BELOW_CACHE = 1024  # operations (parsed documents are cached and shared: few distinct)


def variables_below_root(operation: OperationDefinitionNode) -> frozenset[str] | None:
    """The variables a subscription's per-event results may depend on: every one its
    operation uses except in its root field's arguments. None: all of them (the root
    selection is not one plain field, or a fragment spread may use any)."""
    kept = _BELOW.get(id(operation))
    if kept is not None and kept[0] is operation:
        return kept[1]
    roots = operation.selection_set.selections
    below: frozenset[str] | None = None
    if len(roots) == 1 and isinstance(roots[0], FieldNode):
        used = _variables(operation)
        if used is not None:
            in_arguments = Counter[str]()
            for argument in roots[0].arguments or ():
                in_arguments.update(_variables(argument) or ())
            below = frozenset(name for name, count in used.items()
                              if count > in_arguments[name])
    _BELOW[id(operation)] = (operation, below)
    if len(_BELOW) > BELOW_CACHE:
        _BELOW.popitem(last=False)
    return below


def _variables(node: Node) -> Counter[str] | None:
    """How often each variable is used under `node` (definitions do not count); None if
    a fragment spread is there (its fragment is elsewhere in the document)."""
    found = Counter[str]()
    spreads = False

    def walk(node: Node) -> None:
        nonlocal spreads
        if isinstance(node, VariableNode):
            found[node.name.value] += 1
            return
        if isinstance(node, FragmentSpreadNode):
            spreads = True
        if isinstance(node, VariableDefinitionNode):
            return
        for key in node.keys:
            value = getattr(node, key, None)
            if isinstance(value, Node):
                walk(value)
            elif isinstance(value, (list, tuple)):
                for item in value:
                    if isinstance(item, Node):
                        walk(item)
    walk(node)
    return None if spreads else found


class SharedResultsExecutor(StrawberryGraphQLCoreExecutionContext):
    """graphql-core's executor, sharing per-event results of equal subscriptions."""

    _share_key: tuple | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Once per subscription, when it starts (not in the middle of a fan-out); its
        # events' executors are copies and keep it.
        if self.operation.operation is OperationType.SUBSCRIPTION:
            self._share_key = share_key(self)

    def execute_operation(self, serially: bool | None = None) -> Any:
        results = getattr(self.root_value, RESULTS, None)
        if results is None or self._share_key is None:
            return super().execute_operation(serially)
        kept = results.get(self._share_key)
        # The key holds the schema's id: the kept one must be this very schema.
        if kept is not None and kept[0] is self.schema:
            return kept[1]
        result = super().execute_operation(serially)
        if inspect.isawaitable(result):  # async resolvers: the others await the same one
            result = asyncio.ensure_future(result)
        results[self._share_key] = (self.schema, result)
        return result
