"""One GraphQL schema per role, built from the catalog as that role may see it.

A role's catalog holds only the views granted to it, each with its hidden fields left out
of the type (and of its filter, sort and cursor: only visible indexes stay), and only the
relationships between granted views that join on visible fields. Building the ordinary
schema from it gives introspection, validation and SDL that show the role exactly what it
may query: a hidden field is "cannot query field", not an empty value.

Schemas are built at start-up for the admin role, every role named in a grant and the
anonymous role; any other role a token names gets the schema of a role without grants
(shared, so unknown role names cannot grow memory).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import strawberry

from schema.catalog import Catalog, FieldInfo, View, graphql_fields

NO_GRANTS = "\x00no-grants"  # the role name used for roles the catalog never grants


def restrict_catalog(catalog: Catalog, role: str) -> Catalog:
    """The catalog as `role` sees it (see the module docstring)."""
    grants = {name: g for name, view in catalog.views.items()
              for g in view.grants if g.role == role}
    hidden = {name: set(g.hidden) for name, g in grants.items()}
    views: dict[str, View] = {}
    for name in grants:
        view = catalog.views[name]
        relationships = tuple(
            r for r in view.relationships
            if r.target in grants and not any(mine in hidden[name] or theirs in hidden[r.target]
                                              for mine, theirs in r.on))
        views[name] = dataclasses.replace(
            view,
            graphql_type=_without(view, hidden[name]) if hidden[name] else view.graphql_type,
            indexes=tuple(i for i in view.indexes if i not in hidden[name]),
            relationships=relationships)
    return Catalog(sources=catalog.sources, views=views)


def _without(view: View, hidden: set[str]) -> type:
    """The view's Strawberry type without the hidden fields (names, types, descriptions
    and the type's own name and description kept)."""
    fields: dict[str, FieldInfo] = graphql_fields(view)
    definition = view.graphql_type.__strawberry_definition__  # type: ignore[attr-defined]
    descriptions = {f.python_name: f.description for f in definition.fields}
    annotations: dict[str, Any] = {}
    attrs: dict[str, Any] = {}
    for name, info in fields.items():
        if name in hidden:
            continue
        annotations[name] = info.python_type | None if info.nullable else info.python_type
        attrs[name] = strawberry.field(name=info.graphql_name, description=descriptions[name])
    attrs["__annotations__"] = annotations
    return strawberry.type(type(view.graphql_type.__name__, (), attrs), name=definition.name,
                           description=definition.description)


class RoleSchemas:
    """The schema each role queries; `build(catalog, admin)` makes one."""

    def __init__(self, catalog: Catalog, admin_role: str, admin_schema: Any,
                 roles: set[str], build: Callable[[Catalog, bool], Any]) -> None:
        self.admin_role = admin_role
        self.schemas: dict[str, Any] = {admin_role: admin_schema}
        for role in sorted(roles | {NO_GRANTS}):
            if role not in self.schemas:
                self.schemas[role] = build(restrict_catalog(catalog, role), False)

    def get(self, role: str) -> Any:
        schema = self.schemas.get(role)
        return schema if schema is not None else self.schemas[NO_GRANTS]


def granted_roles(catalog: Catalog) -> set[str]:
    return {g.role for view in catalog.views.values() for g in view.grants}
