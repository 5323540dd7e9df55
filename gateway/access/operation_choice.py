"""GraphQL's GetOperation: a document with several operations must say, in
`operationName`, which one to run (a request error otherwise). Strawberry would run the
first one."""

from __future__ import annotations

from collections.abc import Iterator

from graphql import GraphQLError, OperationDefinitionNode
from strawberry.extensions import SchemaExtension


class RequireOperationName(SchemaExtension):
    """Listed after the validation cache: it adds its error to the validation errors."""

    def on_validate(self) -> Iterator[None]:
        context = self.execution_context
        document = context.graphql_document
        # What the client sent: the public `operation_name` falls back to the first
        # operation's name, which is how the first one came to run.
        if context._provided_operation_name is None and document is not None:
            count = sum(isinstance(d, OperationDefinitionNode) for d in document.definitions)
            if count > 1:
                context.pre_execution_errors = [
                    *(context.pre_execution_errors or []),
                    GraphQLError(f"the document has {count} operations; name the one to run "
                                 "in operationName",
                                 extensions={"code": "OPERATION_NAME_REQUIRED"}),
                ]
        yield
