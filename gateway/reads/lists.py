"""A page of a list, from the cheapest source that answers it exactly:

- every key column pinned by eq/in: those rows by key;
- conditions only on the order's index (one range): that index, read page by page with
  LIMIT, counted with ZCOUNT/ZLEXCOUNT;
- conditions on several fields: the smallest matching index range (at most
  `gateway_max_candidates` entries), its rows filtered, sorted and paged in memory;
- Redis down, its indexes incomplete, or `asOf`: the Delta table, filtered in memory with
  the same semantics.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.reads.delta_store import AsOf
from gateway.reads.filters import (
    Condition,
    Order,
    Page,
    QueryError,
    is_string,
    key_lookup,
    matches,
    paginate,
    sort_key,
)
from gateway.reads.freshness import Freshness
from gateway.reads.indexes import Range, after_cursor, ranges
from gateway.reads.reads import Reads, seen_delta, seen_redis
from gateway.reads.redis_store import Meta, RedisUnavailable
from schema.catalog import View
from schema.storage import key_of, split_index_member

Item = tuple[tuple[Any, str], dict[str, Any]]  # (position, row)
RowLoader = Callable[[Sequence[str]], Awaitable[list[dict[str, Any] | None]]]


@dataclass
class ListResult:
    items: list[Item]
    more: bool  # rows lie beyond this page in the paging direction
    total: int


class Incomplete(Exception):
    """Redis's indexes of the view may be partial (see gateway.reads.reads)."""


async def list_rows(reads: Reads, fresh: Freshness, load: RowLoader, view: View,
                    conditions: Sequence[Condition], order: Order, page: Page,
                    as_of: AsOf | None) -> ListResult:
    if as_of is None:
        keys = key_lookup(view, conditions)
        if keys is not None:
            rows = await load(keys)
            return _in_memory(reads, view, list(zip(keys, rows, strict=True)), conditions,
                              order, page)
        try:
            return await _from_redis(reads, fresh, load, view, conditions, order, page)
        except (RedisUnavailable, Incomplete):
            pass
    rows, snapshot = await reads.delta_read(view, conditions, as_of=as_of)
    fresh.note(view.name, seen_delta(snapshot), as_of=as_of is not None)
    return _in_memory(reads, view, [(key_of(r, view.key), r) for r in rows], conditions,
                      order, page)


def _in_memory(reads: Reads, view: View, keyed: Sequence[tuple[str, dict | None]],
               conditions: Sequence[Condition], order: Order, page: Page) -> ListResult:
    fields = reads.fields[view.name]
    items: list[Item] = []
    for key, row in keyed:
        if row is None or not matches(row, conditions, fields):
            continue
        position = sort_key(row, key, order, fields)
        if position is not None:
            items.append((position, row))
    items.sort(key=lambda item: item[0])
    chosen, more = paginate(items, order, page)
    return ListResult(chosen, more, len(items))


def check_complete(reads: Reads, view: View, meta: Meta, fresh: Freshness) -> None:
    if not meta.complete:
        reads.ensure_complete(view)
        raise Incomplete(view.name)
    fresh.note(view.name, seen_redis(meta))


async def _from_redis(reads: Reads, fresh: Freshness, load: RowLoader, view: View,
                      conditions: Sequence[Condition], order: Order, page: Page) -> ListResult:
    fields = reads.fields[view.name]
    by_field: dict[str, list[Condition]] = {}
    for c in conditions:
        by_field.setdefault(c.field, []).append(c)
    info = fields[order.field]
    order_ranges = ranges(info, by_field.get(order.field, [])) if order.field in by_field \
        else [Range()]
    if set(by_field) <= {order.field} and len(order_ranges) == 1:
        return await _index_page(reads, fresh, load, view, order, page, order_ranges[0])
    return await _candidates(reads, fresh, load, view, conditions, by_field, order, page)


async def _index_page(reads: Reads, fresh: Freshness, load: RowLoader, view: View,
                      order: Order, page: Page, whole: Range) -> ListResult:
    info = reads.fields[view.name][order.field]
    reverse = order.descending != page.backward
    r = after_cursor(whole, info, page.cursor, reverse) if page.cursor is not None else whole
    limit = page.limit + 1  # one more tells whether more rows follow
    if is_string(info):
        meta, members, total = await reads.redis.lex_page(
            view.name, order.field, r, reverse, limit, [whole])
        keys = [split_index_member(m.decode())[1] for m in members]
    else:
        meta, members, total = await reads.redis.score_page(
            view.name, order.field, r, reverse, limit, page.cursor, [whole])
        keys = [m.decode() for m in members]
    check_complete(reads, view, meta, fresh)
    more = len(keys) > page.limit
    keys = keys[: page.limit]
    rows = await load(keys) if keys else []
    fields = reads.fields[view.name]
    items: list[Item] = []
    for key, row in zip(keys, rows, strict=True):
        position = sort_key(row, key, order, fields) if row is not None else None
        if position is not None:  # a row deleted since its index entry was read is skipped
            items.append((position, row))
    if page.backward:
        items.reverse()
    return ListResult(items, more, total)


async def _candidates(reads: Reads, fresh: Freshness, load: RowLoader, view: View,
                      conditions: Sequence[Condition], by_field: dict[str, list[Condition]],
                      order: Order, page: Page) -> ListResult:
    fields = reads.fields[view.name]
    drivers = [f for f in by_field if f in view.indexes]
    if not drivers:
        raise QueryError(
            f"{view.name}: filter on every key column ({', '.join(view.key)}) or on an "
            f"indexed field ({', '.join(view.indexes) or 'none'})", "FIELD_NOT_INDEXED",
            view=view.name)
    best: tuple[int, str, list[Range]] | None = None
    for name in drivers:
        field_ranges = ranges(fields[name], by_field[name])
        meta, count = await reads.redis.counts(view.name, name, is_string(fields[name]),
                                               field_ranges)
        check_complete(reads, view, meta, fresh)
        if best is None or count < best[0]:
            best = (count, name, field_ranges)
    assert best is not None
    count, name, field_ranges = best
    limit = reads.settings.gateway_max_candidates
    if count > limit:
        raise QueryError(
            f"this filter on {view.name} matches {count} entries of its narrowest index "
            f"({fields[name].graphql_name}), more than the {limit} the gateway combines with "
            f"other conditions (gateway_max_candidates): narrow the filter",
            "LIMIT_CANDIDATES", limit=limit)
    lex = is_string(fields[name])
    meta, per_range = await reads.redis.members(view.name, name, lex, field_ranges)
    check_complete(reads, view, meta, fresh)
    keys = list(dict.fromkeys(
        split_index_member(m.decode())[1] if lex else m.decode()
        for members in per_range for m in members))
    rows = await load(keys) if keys else []
    return _in_memory(reads, view, list(zip(keys, rows, strict=True)), conditions, order, page)
