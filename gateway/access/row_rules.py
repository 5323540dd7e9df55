"""Row rules at request time: a role's grants (schema.permissions) with the caller's claims
filled in, as the same `Condition`s a list's `where` becomes.

Every read path applies them the same way: lists and filtered subscriptions add them to
their conditions (so the read narrows by them as by a filter), lookups, relationships and
change messages keep a row only if it matches them. `None` stands for no rules at all
(the admin role).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.reads.filters import Condition, matches
from schema.catalog import Catalog, FieldInfo
from schema.permissions import claim_value
from schema.storage import ChangeEvent, from_json_value


class ClaimError(Exception):
    """The token lacks a claim the role's rules read, or it has the wrong type."""


class RowScope:
    """What one caller may see of each view it was granted."""

    def __init__(self, role: str, conditions: Mapping[str, list[Condition]],
                 fields: Mapping[str, Mapping[str, FieldInfo]], claims_used: tuple) -> None:
        self.role = role
        self.conditions = conditions  # view -> conditions; views not granted are absent
        self.fields = fields
        # Everything that makes two callers' answers differ: the role and the claim values
        # its rules read (subscriptions share work between callers with equal keys).
        self.share_scope = (role, claims_used)

    def rules(self, view: str) -> list[Condition]:
        return self.conditions.get(view, [])

    def visible(self, view: str, row: Mapping[str, Any] | None) -> bool:
        if row is None or view not in self.conditions:
            return False
        return matches(row, self.conditions[view], self.fields[view])


def build_scope(catalog: Catalog, fields: Mapping[str, Mapping[str, FieldInfo]], role: str,
                claims: Mapping[str, Any]) -> RowScope:
    """The role's rules with `claims` filled in; ClaimError names a missing claim."""
    conditions: dict[str, list[Condition]] = {}
    used: dict[str, Any] = {}
    for view in catalog.views.values():
        grant = next((g for g in view.grants if g.role == role), None)
        if grant is None:
            continue
        view_conditions = []
        for rule in grant.rows:
            info = fields[view.name][rule.field]
            if rule.claim is None:
                value = rule.value
            else:
                value = typed_claim(info, rule.claim, claim_value(claims, rule.claim), role)
                used[rule.claim] = value
            view_conditions.append(Condition(rule.field, "eq", value))
        conditions[view.name] = view_conditions
    return RowScope(role, conditions, fields, tuple(sorted(used.items(), key=lambda i: i[0])))


def typed_claim(info: FieldInfo, claim: str, value: Any, role: str) -> Any:
    """A claim's JSON value as the field's Python value, as a `where` argument has it."""
    if value is None:
        raise ClaimError(f"the token lacks the claim {claim!r}, which the row rules of role "
                         f"{role!r} read")
    if isinstance(value, bool | dict | list):
        raise ClaimError(f"the claim {claim!r} must be a single value, not {value!r}")
    if info.spark_type == "string":
        return str(value)
    try:
        return from_json_value(info.python_type, value)
    except (TypeError, ValueError, ArithmeticError):
        raise ClaimError(f"the claim {claim!r} ({value!r}) does not fit field "
                         f"{info.graphql_name}") from None


# --- Helpers for callers that may have no scope (admin) ---------------------------------


def rules_of(scope: RowScope | None, view: str) -> list[Condition]:
    return [] if scope is None else scope.rules(view)


def allows(scope: RowScope | None, view: str, row: Mapping[str, Any] | None) -> bool:
    """Whether the caller may see `row` (a missing row is never visible)."""
    if row is None:
        return False
    return scope is None or scope.visible(view, row)


def seen_change(scope: RowScope | None, event: ChangeEvent,
                op: str | None) -> tuple[str | None, bool, bool]:
    """A change as the caller sees it: (op or None: not for it, show row, show before).

    A row entering the caller's visible set is an INSERT for it, one leaving it a DELETE
    without its new value, a change among rows it may not see is not sent at all.
    """
    if scope is None or op is None:
        return op, True, True
    was = scope.visible(event.view, event.before)
    now = scope.visible(event.view, event.row)
    if was and now:
        return op, True, True
    if now:
        return "INSERT", True, False
    if was:
        return "DELETE", False, True
    return None, False, False


def scoped(conditions: Sequence[Condition], scope: RowScope | None,
           view: str) -> list[Condition]:
    """A filter with the caller's rules joined to it (all must hold)."""
    return [*conditions, *rules_of(scope, view)]
