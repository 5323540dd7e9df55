"""What a list asks for: `where` conditions, the order and the page, checked against the
view's key and indexes, and the same semantics applied in memory (Delta reads, combined
filters). Pure logic: no I/O.

Rows here are in their stored JSON form (schema.storage.encode_row): strings for
timestamps and dates. Every comparison goes through `sortable`, which orders values the
way the Redis indexes do (strings by code point, everything else by its index score).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from graphql import GraphQLError

from schema.catalog import FieldInfo, View
from schema.storage import from_json_value, index_score, key_of

OPERATORS = ("eq", "in", "lt", "lte", "gt", "gte", "prefix")
KEY_OPERATORS = ("eq", "in")
MAX_IN_VALUES = 1000


class QueryError(GraphQLError):
    """A request the gateway refuses, with a machine-readable code in extensions."""

    def __init__(self, message: str, code: str, **details: Any) -> None:
        super().__init__(message, extensions={"code": code, **details})


@dataclass(frozen=True)
class Condition:
    field: str  # python name
    op: str
    value: Any  # typed value; a tuple for `in`


@dataclass(frozen=True)
class Order:
    field: str  # python name of an indexed field
    descending: bool = False


@dataclass(frozen=True)
class Page:
    limit: int
    backward: bool = False  # `last`/`before`
    cursor: tuple[Any, str] | None = None  # (sortable value, key) of `after`/`before`


def is_string(info: FieldInfo) -> bool:
    return info.spark_type == "string"


def sortable(info: FieldInfo, value: Any) -> Any:
    """A value in the order its index keeps: str for strings, the index score otherwise."""
    if is_string(info):
        return str(value)
    if isinstance(value, str):
        value = from_json_value(info.python_type, value)
    return index_score(info.python_type, value)


def filterable(view: View) -> tuple[str, ...]:
    """Fields a list may filter on: the key columns, then the indexes."""
    return tuple(dict.fromkeys([*view.key, *view.indexes]))


def _names(fields: Mapping[str, FieldInfo], names: Iterable[str]) -> str:
    return ", ".join(fields[n].graphql_name for n in names)


def parse_where(
    view: View, fields: Mapping[str, FieldInfo], where: Mapping[str, Mapping[str, Any]]
) -> list[Condition]:
    """`where` as {python field: {operator: value}} (absent operators left out)."""
    conditions: list[Condition] = []
    for name, ops in where.items():
        info = fields[name]
        if name not in view.indexes and name not in view.key:
            raise QueryError(
                f"{view.name} cannot be filtered on {info.graphql_name}: it has no index, and "
                f"the gateway never scans a whole view. Filter on the key or an indexed field: "
                f"{_names(fields, filterable(view))}.",
                "FIELD_NOT_INDEXED", view=view.name, field=info.graphql_name,
                indexed=[fields[n].graphql_name for n in filterable(view)],
            )
        for op, value in ops.items():
            if name not in view.indexes and op not in KEY_OPERATORS:
                raise QueryError(
                    f"{view.name}.{info.graphql_name} is a key column without an index: it takes "
                    f"only eq and in. Range and prefix filters work on the indexed fields: "
                    f"{_names(fields, view.indexes) or '(none)'}.",
                    "FIELD_NOT_INDEXED", view=view.name, field=info.graphql_name,
                    indexed=[fields[n].graphql_name for n in view.indexes],
                )
            if op == "prefix" and not is_string(info):
                raise QueryError(f"prefix works on strings, not on {info.graphql_name}",
                                 "BAD_FILTER", field=info.graphql_name)
            if op == "in":
                values = tuple(dict.fromkeys(value))
                if not values or len(values) > MAX_IN_VALUES:
                    raise QueryError(
                        f"`in` on {info.graphql_name} needs 1 to {MAX_IN_VALUES} values",
                        "BAD_FILTER", field=info.graphql_name)
                value = values
            if op not in OPERATORS:
                raise QueryError(f"unknown operator {op}", "BAD_FILTER")
            conditions.append(Condition(name, op, value))
    return conditions


def parse_order(
    view: View, fields: Mapping[str, FieldInfo], field: str | None, descending: bool,
    conditions: Sequence[Condition],
) -> Order:
    """The explicit order, else the first filtered index, else the view's first index."""
    if field is not None:
        if field not in view.indexes:
            raise QueryError(
                f"{view.name} cannot be sorted by {fields[field].graphql_name}: it has no "
                f"index. Sort by an indexed field: {_names(fields, view.indexes) or '(none)'}.",
                "FIELD_NOT_INDEXED", view=view.name, field=fields[field].graphql_name,
                indexed=[fields[n].graphql_name for n in view.indexes],
            )
        return Order(field, descending)
    for condition in conditions:
        if condition.field in view.indexes:
            return Order(condition.field, descending)
    if view.indexes:
        return Order(view.indexes[0], descending)
    if len(view.key) == 1:
        return Order(view.key[0], descending)  # only key lookups get here (no index at all)
    raise QueryError(f"{view.name} has no index to list it by: filter on its key "
                     f"({_names(fields, view.key)}) with eq or in", "FIELD_NOT_INDEXED")


def key_lookup(view: View, conditions: Sequence[Condition]) -> list[str] | None:
    """The keys the conditions pin down with eq/in on every key column, else None."""
    per_column: dict[str, set[Any]] = {}
    for c in conditions:
        if c.field in view.key and c.op in KEY_OPERATORS:
            values = {c.value} if c.op == "eq" else set(c.value)
            per_column[c.field] = per_column[c.field] & values if c.field in per_column else values
    if set(per_column) != set(view.key):
        return None
    combos: list[dict[str, Any]] = [{}]
    for column in view.key:
        combos = [dict(c, **{column: v}) for c in combos for v in sorted(per_column[column])]
        if len(combos) > MAX_IN_VALUES:
            raise QueryError(f"the key filter names more than {MAX_IN_VALUES} keys", "BAD_FILTER")
    return [key_of(c, view.key) for c in combos]


def matches(row: Mapping[str, Any], conditions: Sequence[Condition],
            fields: Mapping[str, FieldInfo]) -> bool:
    for c in conditions:
        raw = row.get(c.field)
        if raw is None:
            return False
        info = fields[c.field]
        have = sortable(info, raw)
        if c.op == "in":
            if have not in {sortable(info, v) for v in c.value}:
                return False
            continue
        if c.op == "prefix":
            if not have.startswith(c.value):
                return False
            continue
        want = sortable(info, c.value)
        ok = {"eq": have == want, "lt": have < want, "lte": have <= want,
              "gt": have > want, "gte": have >= want}[c.op]
        if not ok:
            return False
    return True


def sort_key(row: Mapping[str, Any], key: str, order: Order,
             fields: Mapping[str, FieldInfo]) -> tuple[Any, str] | None:
    """(order value, key); None when the order field is null (such rows have no index entry)."""
    value = row.get(order.field)
    return None if value is None else (sortable(fields[order.field], value), key)


def paginate(items: list[tuple[tuple[Any, str], Any]], order: Order,
             page: Page) -> tuple[list[tuple[tuple[Any, str], Any]], bool]:
    """Items sorted ascending by their sort key -> this page (in order) and whether more
    rows lie beyond it in the paging direction."""
    ordered = list(reversed(items)) if order.descending else items
    if page.backward:
        ordered = list(reversed(ordered))
    if page.cursor is not None:
        # Past the cursor in the reading direction.
        forward_is_greater = order.descending == page.backward
        cursor = page.cursor
        ordered = [i for i in ordered if (i[0] > cursor) == forward_is_greater and i[0] != cursor]
    chosen = ordered[: page.limit]
    more = len(ordered) > page.limit
    if page.backward:
        chosen.reverse()
    return chosen, more


# --- Cursors: opaque to clients, (order value, key) inside --------------------------------


def encode_cursor(position: tuple[Any, str]) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(list(position))).decode().rstrip("=")


def decode_cursor(text: str, order: Order, fields: Mapping[str, FieldInfo]) -> tuple[Any, str]:
    try:
        raw = orjson.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        value, key = raw
        expected = str if is_string(fields[order.field]) else (int, float)
        if not isinstance(key, str) or not isinstance(value, expected) or isinstance(value, bool):
            raise ValueError("cursor of another order")
    except (ValueError, TypeError, binascii.Error, orjson.JSONDecodeError):
        raise QueryError(
            "invalid cursor: use a cursor this list returned with the same orderBy",
            "BAD_CURSOR") from None
    return (value if isinstance(value, str) else float(value)), key


def make_page(first: int | None, after: str | None, last: int | None, before: str | None,
              order: Order, fields: Mapping[str, FieldInfo], default_size: int,
              max_size: int) -> Page:
    if first is not None and last is not None:
        raise QueryError("pass either first (with after) or last (with before), not both",
                         "BAD_PAGE")
    if (first is not None and before is not None) or (last is not None and after is not None):
        raise QueryError("page forward with first/after or backward with last/before",
                         "BAD_PAGE")
    backward = last is not None or (first is None and before is not None)
    size = last if backward else first
    if size is None:
        size = default_size
    if size < 0:
        raise QueryError("first and last must not be negative", "BAD_PAGE")
    if size > max_size:
        raise QueryError(f"page size {size} exceeds the limit of {max_size} rows per page "
                         f"(gateway_max_page_size)", "LIMIT_PAGE_SIZE", limit=max_size)
    cursor_text = before if backward else after
    cursor = decode_cursor(cursor_text, order, fields) if cursor_text is not None else None
    return Page(size, backward, cursor)
