"""To-many relationships: for a batch of parents, the target rows whose indexed field
equals each parent's value, in one Redis round trip for the index and one MGET for the
rows however many parents there are (Delta when Redis cannot answer)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.reads.filters import Condition, is_string, sortable
from gateway.reads.freshness import Freshness
from gateway.reads.indexes import ranges
from gateway.reads.lists import Incomplete, RowLoader, check_complete
from gateway.reads.reads import Reads, seen_delta
from gateway.reads.redis_store import RedisUnavailable
from schema.catalog import View
from schema.storage import key_of, split_index_member


async def related_rows(reads: Reads, fresh: Freshness, load: RowLoader, target: View,
                       field: str, values: Sequence[Any],
                       first: int | None) -> list[list[dict]]:
    """Per value: up to `first` (None: all) rows of `target` with `field` == value, ordered
    by key."""
    info = reads.fields[target.name][field]
    lex = is_string(info)
    per_value = [ranges(info, [Condition(field, "eq", v)]) for v in values]
    try:
        meta, members = await reads.redis.members(
            target.name, field, lex, [r[0] for r in per_value if r], limit=first)
        check_complete(reads, target, meta, fresh)
    except (RedisUnavailable, Incomplete):
        return await _from_delta(reads, fresh, target, field, values, first)
    found = iter(members)
    key_lists = [[split_index_member(m.decode())[1] if lex else m.decode() for m in next(found)]
                 if r else [] for r in per_value]
    every_key = list(dict.fromkeys(k for keys in key_lists for k in keys))
    rows = dict(zip(every_key, await load(every_key), strict=True)) if every_key else {}
    return [[rows[k] for k in keys if rows.get(k) is not None] for keys in key_lists]


async def _from_delta(reads: Reads, fresh: Freshness, target: View, field: str,
                      values: Sequence[Any], first: int | None) -> list[list[dict]]:
    info = reads.fields[target.name][field]
    condition = Condition(field, "in", tuple(dict.fromkeys(values)))
    rows, snapshot = await reads.delta_read(target, [condition])
    fresh.note(target.name, seen_delta(snapshot))
    groups: dict[Any, list[tuple[str, dict]]] = {}
    for row in rows:
        if row.get(field) is not None:
            groups.setdefault(sortable(info, row[field]), []).append((key_of(row, target.key), row))
    out = []
    for value in values:
        group = sorted(groups.get(sortable(info, value), []), key=lambda kr: kr[0])
        out.append([row for _, row in group[:first]])
    return out
