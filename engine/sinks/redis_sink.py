"""Apply one batch to Redis atomically, fenced by batch id (see schema.storage)."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from schema.catalog import FieldInfo, View
from schema.redis_client import connect as connect_redis
from schema.redis_client import is_cluster, queue_script
from schema.storage import (
    APPLY_BATCH_LUA,
    META_LATE_EVENTS,
    BatchWrites,
    ChangeEvent,
    Op,
    apply_batch_args,
    complete_field,
    decode_row,
    encode_row,
    fence_field,
    generation_field,
    index_entry,
    index_key,
    iso_utc,
    meta_key,
    outbox_events,
    outbox_key,
    row_key,
    state_key,
    states_complete_key,
)


@dataclass(frozen=True)
class Before:
    """What Redis holds of a view's generation before a batch is applied."""

    rows: dict[str, dict[str, Any]]  # the stored rows of the keys asked for
    fence: int | None  # the last batch Redis holds (None: Redis lost the meta)
    complete: bool  # Redis holds every row: the first batch or a full re-warm marked it so,
    # and a flush or a restart lost the mark
    # The same rows as Redis stores them (JSON text): the change events' previous rows and
    # Delta's pre-images take them as they are
    encoded: dict[str, bytes] = dataclasses.field(default_factory=dict)


def _same_value(stored: Any, value: Any) -> bool:
    """Whether a stored value (JSON form) is the new value; False when unsure."""
    if isinstance(value, datetime.datetime) and isinstance(stored, str):
        return iso_utc(value) == stored
    return type(stored) is type(value) and stored == value


@dataclass(frozen=True)
class RowWrites:
    """How a batch of one view's rows becomes its Redis writes: the rows' keys and values,
    and the index entries they add and remove. Pure and picklable (no client, no GraphQL
    class), so that Spark's tasks build a batch's writes as the driver does
    (engine.task_upsert)."""

    view: str
    indexes: tuple[tuple[str, Any], ...]  # (indexed field, its Python type)

    @classmethod
    def of(cls, view: View, fields: Mapping[str, FieldInfo]) -> RowWrites:
        return cls(view.name, tuple((f, fields[f].python_type) for f in view.indexes))

    def changed_indexed(self, old: Mapping[str, Any] | None,
                        row: Mapping[str, Any]) -> tuple[str, ...]:
        """The indexed fields whose value may differ between the stored row (JSON form)
        and the new one: only theirs index entries can change. Most updates change none
        (a customer's tier reaching their orders leaves the orders' indexes alone)."""
        if old is None:
            return tuple(f for f, _ in self.indexes)
        changed: tuple[str, ...] = ()
        for field, _ in self.indexes:  # a loop, not a generator: asked for every update
            if not _same_value(old.get(field), row.get(field)):
                changed += (field,)
        return changed

    def batch_writes(self, generation: int, upserts: Mapping[str, Mapping[str, Any]],
                     deletes: Iterable[str], old_rows: Mapping[str, Mapping[str, Any]],
                     extra_ops: Sequence[Op] = ()) -> BatchWrites:
        """The batch's writes: `upserts` set, `deletes` deleted, their index entries moved
        from what `old_rows` (the stored rows, JSON form) had; `extra_ops` beside them."""
        writes = BatchWrites(extra_ops)
        sets, deleted = writes.arguments("set"), writes.arguments("del")
        # Per batch, not per row: the row keys' prefix, and each index's key and the lists
        # its writes go to (an insert's entries are appended straight to its ZADD).
        prefix = row_key(self.view, generation, "")
        index_keys = {f: index_key(self.view, generation, f) for f, _ in self.indexes}
        types = dict(self.indexes)
        indexes = [(field, python_type, writes.arguments("zadd", index_keys[field]))
                   for field, python_type in self.indexes]

        def entries(row: Mapping[str, Any] | None, key: str, fields: Iterable[str]
                    ) -> set[tuple]:
            found = set()
            if row is None:
                return found
            for field in fields:
                entry = index_entry(types[field], row.get(field), key)
                if entry is not None:
                    found.add((index_keys[field], *entry))
            return found

        for key, row in upserts.items():
            sets += (prefix + key, encode_row(row).decode())
            stored = old_rows.get(key)
            if stored is None:  # an insert: nothing to take out of the indexes
                for field, python_type, zadd in indexes:
                    entry = index_entry(python_type, row.get(field), key)
                    if entry is not None:
                        zadd += entry
                continue
            changed = self.changed_indexed(stored, row)
            if not changed:
                continue
            old, new = entries(stored, key, changed), entries(row, key, changed)
            for index, _, member in old - new:
                writes.arguments("zrem", index).append(member)
            for index, score, member in new - old:
                writes.arguments("zadd", index).extend((score, member))
        for key in deletes:
            deleted.append(prefix + key)
            for index, _, member in entries(old_rows.get(key), key, types):
                writes.arguments("zrem", index).append(member)
        return writes


def read_before(client: Any, view: str, generation: int, keys: list[str]) -> Before:
    """What Redis holds of `view`'s generation before a batch, in one round trip: the
    stored rows of `keys` (their index entries must go, and change events carry them as
    `before`), the fence and the complete mark. Only the engine writes a view, and the
    apply is fenced, so reading first is safe."""
    rows_keys = [row_key(view, generation, k) for k in keys]
    meta = (meta_key(view), fence_field(generation), complete_field(generation))
    if is_cluster(client):
        # A cluster pipeline refuses MGET; the keys share the view's slot, so one MGET
        # of the client does (a round trip more).
        stored = [client.mget(rows_keys)] if keys else []
        fence, complete = client.hmget(*meta)
    else:
        pipe = client.pipeline(transaction=False)
        if keys:
            pipe.mget(rows_keys)
        pipe.hmget(*meta)
        *stored, (fence, complete) = pipe.execute()
    found = {k: v for k, v in zip(keys, stored[0], strict=True) if v} if keys else {}
    return Before({k: decode_row(v) for k, v in found.items()},
                  None if fence is None else int(fence), complete is not None, found)


def read_states(client: Any, view: str, generation: int, keys: list[str]
                ) -> tuple[dict[str, bytes], bool]:
    """The stored aggregate states of `keys` (engine.aggregates), by key, and whether
    every group of the generation has one (its first batch marked it so)."""
    hash_key = state_key(view, generation)
    pipe = client.pipeline(transaction=False)
    if keys:
        pipe.hmget(hash_key, keys)
    pipe.exists(states_complete_key(view, generation))
    *found, complete = pipe.execute()
    states = zip(keys, found[0], strict=True) if keys else ()
    return {k: v for k, v in states if v is not None}, bool(complete)


class RedisSink:
    def __init__(self, redis_url: str, view: View, fields: Mapping[str, FieldInfo]) -> None:
        self.view = view
        self.fields = fields
        self.writes = RowWrites.of(view, fields)
        # Two clients, for the two kinds of command: reads of many small arguments (a
        # batch's previous rows, one MGET of thousands of keys) packed by hiredis in C,
        # and a batch's apply of a few arguments of megabytes, packed without a copy.
        self.client = connect_redis(redis_url)
        self.apply_client = connect_redis(redis_url, large_arguments=True)
        self.apply_script = self.apply_client.register_script(APPLY_BATCH_LUA)

    def before(self, generation: int, keys: list[str]) -> Before:
        """What Redis holds before a batch (read_before)."""
        return read_before(self.client, self.view.name, generation, keys)

    def apply(
        self,
        batch_id: int,
        generation: int,
        upserts: Mapping[str, Mapping[str, Any]],
        deletes: set[str],
        meta: Mapping[str, Any],
        old_rows: Mapping[str, Mapping[str, Any]],
        outbox: bytes = b"",
        extra_ops: Sequence[Op] = (),
        client: Any = None,
        writes: bytes | None = None,
    ) -> int | None:
        """APPLIED, REPLAYED (Redis already holds this batch) or RETIRED (a rebuild
        replaced this generation), as schema.storage names them. `outbox` (the batch's
        change events) is stored with the rows, atomically, and so are `extra_ops` (an
        aggregate view's states). `writes`: the batch's writes built already, as the
        script's JSON (by Spark's tasks, engine.task_upsert); then `upserts`, `deletes`,
        `old_rows` and `extra_ops` are not used. Given a pipeline as `client`, the apply
        is queued on it and its answer comes with the pipeline's."""
        built = writes if writes is not None else self.writes.batch_writes(
            generation, upserts, deletes, old_rows, extra_ops)
        args = apply_batch_args(batch_id, generation, meta, built, outbox)
        keys = [meta_key(self.view.name), outbox_key(self.view.name, generation)]
        if client is not None:
            queue_script(client, self.apply_script, keys, args)
            return None
        return int(self.apply_script(keys=keys, args=args))

    def states(self, generation: int, keys: list[str]) -> tuple[dict[str, bytes], bool]:
        """The stored aggregate states of `keys` (read_states)."""
        return read_states(self.client, self.view.name, generation, keys)

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
        self.apply_client.close()
