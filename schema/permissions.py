"""Who may read a view, declared with the view: per role, row rules and hidden fields.

The rule language is deliberately small. A `Grant` gives one role a view; its `rows` are
conditions that must all hold for a row to be visible, each `field == claim` (a value of
the caller's token) or `field == constant`; `hidden` fields are left out of that role's
GraphQL type. A role without a grant on a view does not see the view at all; the admin
role (setting `auth_admin_role`) sees everything and needs no grants.

    View(..., grants=(
        Grant("customer", rows=(RowRule("customer_id", claim="customer_id"),),
              hidden=("customer_country",)),
        Grant("support"),                          # every row, every field
    ))

A row rule's field must be the view's key or one of its indexes (the gateway never scans
a whole view, so the rule must narrow a read as a filter does) and must not be hidden.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from schema.errors import Problem

_MISSING = object()


@dataclass(frozen=True)
class RowRule:
    """`field` equals the token's `claim` (a dotted path into the claims), or `value`."""

    field: str  # python field name of the view
    claim: str | None = None
    value: Any = _MISSING

    @property
    def constant(self) -> bool:
        return self.claim is None


@dataclass(frozen=True)
class Grant:
    role: str
    rows: tuple[RowRule, ...] = ()  # all must hold; none: every row
    hidden: tuple[str, ...] = ()  # python field names left out of the role's type


def claim_value(claims: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path of the claims (`a.b` reads claims["a"]["b"]), or None."""
    value: Any = claims
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def check_grants(view: str, grants: tuple[Grant, ...], fields: Mapping[str, Any],
                 filterable: tuple[str, ...]) -> list[Problem]:
    """Problems of a view's grants; `fields` maps python names to FieldInfo, `filterable`
    the key columns and indexes."""
    out: list[Problem] = []
    seen: set[str] = set()
    known = ", ".join(fields) or "(none)"
    for grant in grants:
        def problem(field: str | None, message: str, fix: str, role: str = grant.role) -> Problem:
            return Problem(view, field, f"grant to role {role!r}: {message}", fix)

        if not isinstance(grant, Grant):
            out.append(Problem(view, None, f"grants holds {grant!r}, not a Grant",
                               "declare grants as Grant(role, rows=..., hidden=...)"))
            continue
        if not grant.role or not isinstance(grant.role, str):
            out.append(problem(None, "the role is empty", "name the role"))
        if grant.role in seen:
            out.append(problem(None, "declared twice", "merge the grants of this role"))
        seen.add(grant.role)
        for name in grant.hidden:
            if name not in fields:
                out.append(problem(name, "hides a field the type does not have",
                                   f"hide one of: {known}"))
        for rule in grant.rows:
            if not isinstance(rule, RowRule):
                out.append(problem(None, f"rows holds {rule!r}, not a RowRule",
                                   "write RowRule(field, claim=...) or RowRule(field, value=...)"))
                continue
            info = fields.get(rule.field)
            if info is None:
                out.append(problem(rule.field, "row rule on a field the type does not have",
                                   f"use one of: {known}"))
                continue
            if rule.field not in filterable:
                out.append(problem(rule.field, "row rule on a field that is neither the key "
                                   "nor an index (the gateway never scans a whole view)",
                                   f"add {rule.field!r} to the view's indexes, or rule on one "
                                   f"of: {', '.join(filterable) or '(none)'}"))
            if rule.field in grant.hidden:
                out.append(problem(rule.field, "row rule on a field hidden from the role",
                                   "do not hide the field the rule reads"))
            if (rule.claim is None) == (rule.value is _MISSING):
                out.append(problem(rule.field, "a row rule needs exactly one of claim= or value=",
                                   "write RowRule(field, claim='name') or "
                                   "RowRule(field, value=constant)"))
            elif rule.claim is not None and not rule.claim.strip():
                out.append(problem(rule.field, "the claim name is empty", "name the claim"))
            elif rule.constant and not _fits(info.python_type, rule.value):
                out.append(problem(rule.field, f"constant {rule.value!r} does not fit the "
                                   f"field's type {getattr(info.python_type, '__name__', '?')}",
                                   "use a value of the field's type"))
    return out


def _fits(python_type: Any, value: Any) -> bool:
    if python_type is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if python_type is int:
        return isinstance(value, int) and not isinstance(value, bool)
    supertype = getattr(python_type, "__supertype__", python_type)  # strawberry.ID
    return isinstance(value, supertype)
