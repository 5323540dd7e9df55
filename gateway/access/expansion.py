"""The size of a document with its fragments expanded, and a validation rule that refuses
fragment-spread bombs before any other limit walks them.

A "billion laughs" document is short (fragment F0 spreads F1 fifty times, F1 spreads F2
fifty times, ...) but selects 50^n fields once expanded. graphql-core's own rules and its
executor handle it (they merge fields and remember fragments they visited), but
Strawberry's depth and alias limiters, like any walk that follows every spread, expand it
in full: minutes of CPU for a few kilobytes. Counting each fragment once and multiplying
makes the check linear in the document.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from graphql import (
    ASTValidationRule,
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    InlineFragmentNode,
    OperationDefinitionNode,
    ParallelVisitor,
    SelectionSetNode,
    ValidationContext,
)


def expanded_fields(document: DocumentNode) -> int:
    """Fields the document's operations select with every fragment spread replaced by its
    fragment (counted again at each spread). Each fragment is sized once; a fragment cycle
    (refused by validation anyway) counts as empty where it closes."""
    fragments = {d.name.value: d for d in document.definitions
                 if isinstance(d, FragmentDefinitionNode)}
    sizes: dict[str, int] = {}
    visiting: set[str] = set()

    def fragment_size(name: str) -> int:
        if name in sizes:
            return sizes[name]
        if name in visiting or name not in fragments:
            return 0
        visiting.add(name)
        size = selections_size(fragments[name].selection_set)
        visiting.discard(name)
        sizes[name] = size
        return size

    def selections_size(selection_set: SelectionSetNode | None) -> int:
        total = 0
        for selection in selection_set.selections if selection_set else ():
            if isinstance(selection, FieldNode):
                total += 1 + selections_size(selection.selection_set)
            elif isinstance(selection, InlineFragmentNode):
                total += selections_size(selection.selection_set)
            elif isinstance(selection, FragmentSpreadNode):
                total += fragment_size(selection.name.value)
        return total

    return sum(selections_size(d.selection_set) for d in document.definitions
               if isinstance(d, OperationDefinitionNode))


def guarded_rules(rules: Sequence[type[ASTValidationRule]], max_fields: int
                  ) -> type[ASTValidationRule]:
    """One validation rule: refuses a document selecting more than `max_fields` fields
    once expanded (code LIMIT_FIELDS); otherwise runs `rules` (built only then, since
    some do all their work when built)."""

    class FieldsGuard(ASTValidationRule):
        def __init__(self, context: ValidationContext) -> None:
            super().__init__(context)
            fields = expanded_fields(context.document)
            inner: list[Any] = []
            if fields > max_fields:
                context.report_error(GraphQLError(
                    f"the document selects {fields} fields once its fragments are expanded; "
                    f"the limit is {max_fields} (gateway_max_fields)",
                    extensions={"code": "LIMIT_FIELDS"}))
            else:
                inner = [rule(context) for rule in rules]
            self.inner = ParallelVisitor(inner)

        def get_enter_leave_for_kind(self, kind: str) -> Any:
            return self.inner.get_enter_leave_for_kind(kind)  # the visit goes to `rules`

    return FieldsGuard
