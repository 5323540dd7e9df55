"""Apply one batch to Redis atomically, fenced by batch id (see schema.storage)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redis

from schema.catalog import FieldInfo, View
from schema.storage import (
    APPLY_BATCH_LUA,
    META_LATE_EVENTS,
    ChangeEvent,
    apply_batch_args,
    complete_field,
    decode_row,
    encode_row,
    fence_field,
    generation_field,
    index_entry,
    index_key,
    meta_key,
    op_del,
    op_set,
    op_zadd,
    op_zrem,
    outbox_events,
    outbox_key,
    row_key,
)


class RedisSink:
    def __init__(self, redis_url: str, view: View, fields: Mapping[str, FieldInfo]) -> None:
        self.view = view
        self.fields = fields
        self.client = redis.Redis.from_url(redis_url)
        self.apply_script = self.client.register_script(APPLY_BATCH_LUA)

    def _index_entries(self, row: Mapping[str, Any] | None, key: str, gen: int) -> set[tuple]:
        entries = set()
        if row is None:
            return entries
        for field in self.view.indexes:
            entry = index_entry(self.fields[field].python_type, row.get(field), key)
            if entry is not None:
                entries.add((index_key(self.view.name, gen, field), *entry))
        return entries

    def previous_rows(self, generation: int, keys: list[str]) -> dict[str, dict[str, Any]]:
        """The stored rows of `keys` (absent ones left out): their index entries must go, and
        change events carry them as `before`. Only the engine writes a view, and the apply
        is fenced, so reading first is safe."""
        if not keys:
            return {}
        stored = self.client.mget([row_key(self.view.name, generation, k) for k in keys])
        return {k: decode_row(v) for k, v in zip(keys, stored, strict=True) if v}

    def fence(self, generation: int) -> int | None:
        """The last batch Redis holds of the generation (None: Redis lost the meta)."""
        value = self.client.hget(meta_key(self.view.name), fence_field(generation))
        return None if value is None else int(value)

    def holds_every_row(self, generation: int) -> bool:
        """Whether Redis holds every row of the generation: the first batch or a full
        re-warm by the gateway marked it so, and a flush or a restart lost the mark."""
        return bool(self.client.hexists(meta_key(self.view.name), complete_field(generation)))

    def apply(
        self,
        batch_id: int,
        generation: int,
        upserts: Mapping[str, Mapping[str, Any]],
        deletes: set[str],
        meta: Mapping[str, Any],
        old_rows: Mapping[str, Mapping[str, Any]],
        outbox: bytes = b"",
    ) -> int:
        """APPLIED, REPLAYED (Redis already holds this batch) or RETIRED (a rebuild
        replaced this generation), as schema.storage names them. `outbox` (the batch's
        change events) is stored with the rows, atomically."""
        ops = []
        for key, row in upserts.items():
            ops.append(op_set(row_key(self.view.name, generation, key), encode_row(row)))
            old = self._index_entries(old_rows.get(key), key, generation)
            new = self._index_entries(row, key, generation)
            ops += [op_zrem(k, m) for k, _, m in old - new]
            ops += [op_zadd(k, s, m) for k, s, m in new - old]
        for key in deletes:
            ops.append(op_del(row_key(self.view.name, generation, key)))
            old = self._index_entries(old_rows.get(key), key, generation)
            ops += [op_zrem(k, m) for k, _, m in old]
        args = apply_batch_args(batch_id, generation, meta, ops, outbox)
        keys = [meta_key(self.view.name), outbox_key(self.view.name, generation)]
        return int(self.apply_script(keys=keys, args=args))

    def outbox(self, generation: int, batch_id: int) -> list[ChangeEvent] | None:
        """The change events stored with `batch_id`; None if a later batch replaced them."""
        return outbox_events(self.client.get(outbox_key(self.view.name, generation)), batch_id)

    def late_events(self, generation: int) -> int:
        """Late events counted so far (up to the previous batch: Spark reports a batch's
        count after it, see engine.progress)."""
        field = generation_field(META_LATE_EVENTS, generation)
        return int(self.client.hget(meta_key(self.view.name), field) or 0)

    def close(self) -> None:
        self.client.close()
