"""Rows of a view by key: Redis first, Delta for what Redis lacks, and Redis re-warmed
with what Delta returned.

A miss goes to Delta unless Delta already said "absent" at the version Redis is still at
(a small negative cache), so looking up keys that do not exist stays cheap. Re-warming is
fenced (schema.storage.WARM_ROWS_LUA): it never overwrites a newer engine batch nor brings
back a deleted row. When no full re-warm has completed since Redis was last emptied, the
indexes may be partial: lists then read Delta and a full re-warm runs in the background.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import orjson

from gateway.ops.metrics import DELTA_READS, REDIS_ROWS
from gateway.reads.delta_store import AsOf, DeltaStore, Snapshot
from gateway.reads.filters import Condition
from gateway.reads.freshness import Freshness, Seen
from gateway.reads.redis_store import Meta, RedisStore, RedisUnavailable
from schema.catalog import Catalog, FieldInfo, View, graphql_fields
from schema.settings import Settings
from schema.storage import (
    Op,
    encode_row,
    index_entry,
    index_key,
    key_of,
    op_set,
    op_zadd,
    op_zrem,
    row_key,
)

log = logging.getLogger("viewgate.gateway")

WARM_CHUNK_ROWS = 500
NEGATIVE_CACHE_SIZE = 100_000


def seen_redis(meta: Meta) -> Seen:
    return Seen(meta.version, meta.watermark, meta.committed_at_ms, "redis")


def seen_delta(snapshot: Snapshot) -> Seen:
    return Seen(snapshot.batch if snapshot.batch >= 0 else None, None,
                snapshot.committed_at_ms or None, "delta", snapshot.delta_version)


class Reads:
    """App-wide: the stores, the negative cache and the background re-warms."""

    def __init__(self, catalog: Catalog, settings: Settings) -> None:
        self.catalog = catalog
        self.settings = settings
        self.redis = RedisStore(settings.redis_url, settings.gateway_redis_timeout_s,
                                settings.gateway_redis_retry_ms, settings.gateway_meta_cache_ms)
        self.delta = DeltaStore(settings.delta_location)
        self.fields: dict[str, dict[str, FieldInfo]] = {
            name: graphql_fields(view) for name, view in catalog.views.items()}
        self._absent: OrderedDict[tuple[str, int, str], int] = OrderedDict()
        self._tasks: set[asyncio.Task] = set()
        self._full_warms: dict[str, asyncio.Task] = {}

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.redis.close()

    def _background(self, coroutine: Any) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def delta_read(self, view: View, conditions: Sequence[Condition] = (),
                         keys: Sequence[str] | None = None, as_of: AsOf | None = None,
                         reason: str = "fallback") -> tuple[list[dict], Snapshot]:
        DELTA_READS.labels(view.name, "time_travel" if as_of is not None else reason).inc()
        return await asyncio.to_thread(self.delta.read, view, conditions, keys, as_of)

    async def current_version(self, view: str) -> int | None:
        """The version a query would read now: Redis's, or Delta's when Redis has none."""
        try:
            meta = await self.redis.meta(view)
            if meta.version is not None:
                return meta.version
        except RedisUnavailable:
            pass
        _, snapshot = await self.delta_read(self.catalog.view(view), keys=[])
        return snapshot.batch if snapshot.batch >= 0 else None

    # --- rows by key ----------------------------------------------------------------------

    async def rows(self, view: View, keys: Sequence[str],
                   fresh: Freshness) -> list[dict[str, Any] | None]:
        """The rows of `keys` (None where there is none), aligned with `keys`."""
        try:
            meta, stored = await self.redis.rows(view.name, keys)
        except RedisUnavailable:
            rows, snapshot = await self.delta_read(view, keys=keys)
            fresh.note(view.name, seen_delta(snapshot))
            found = {key_of(r, view.key): r for r in rows}
            return [found.get(k) for k in keys]
        if meta.version is not None:  # else Redis holds nothing of the view: Delta answers
            fresh.note(view.name, seen_redis(meta))
        found = {k: orjson.loads(v) for k, v in zip(keys, stored, strict=True) if v is not None}
        REDIS_ROWS.labels("hit").inc(len(found))
        REDIS_ROWS.labels("miss").inc(len(keys) - len(found))
        missing = [k for k in keys if k not in found and not self._known_absent(view, meta, k)]
        if missing:
            rows, snapshot = await self.delta_read(view, keys=missing)
            fresh.note(view.name, seen_delta(snapshot))
            from_delta = {key_of(r, view.key): r for r in rows}
            found.update(from_delta)
            self._remember_absent(view, meta, snapshot, set(missing) - set(from_delta))
            if from_delta:
                self._background(self._warm_rows(view, meta, snapshot, from_delta))
        return [found.get(k) for k in keys]

    def _known_absent(self, view: View, meta: Meta, key: str) -> bool:
        fence = self._absent.get((view.name, meta.generation, key))
        return fence is not None and meta.fence is not None and fence == meta.fence

    def _remember_absent(self, view: View, meta: Meta, snapshot: Snapshot,
                         keys: set[str]) -> None:
        # Only when Delta had caught up with what Redis holds (see the module docstring).
        if meta.fence is None or snapshot.batch < meta.fence \
                or snapshot.generation != meta.generation:
            return
        for key in keys:
            self._absent[(view.name, meta.generation, key)] = meta.fence
        while len(self._absent) > NEGATIVE_CACHE_SIZE:
            self._absent.popitem(last=False)

    # --- re-warming -----------------------------------------------------------------------

    def _index_entries(self, view: View, generation: int, key: str,
                       row: dict[str, Any] | None) -> set[tuple[str, float, str]]:
        if row is None:
            return set()
        fields = self.fields[view.name]
        entries = set()
        # The catalog's view: a role's copy lists only the indexes it may see.
        for name in self.catalog.views[view.name].indexes:
            entry = index_entry(fields[name].python_type, row.get(name), key)
            if entry is not None:
                entries.add((index_key(view.name, generation, name), *entry))
        return entries

    def _ops(self, view: View, generation: int, rows: dict[str, dict],
             old: dict[str, dict | None]) -> list[Op]:
        ops: list[Op] = []
        for key, row in rows.items():
            ops.append(op_set(row_key(view.name, generation, key), encode_row(row)))
            before = self._index_entries(view, generation, key, old.get(key))
            after = self._index_entries(view, generation, key, row)
            ops += [op_zrem(k, m) for k, _, m in before - after]
            ops += [op_zadd(k, s, m) for k, s, m in after - before]
        return ops

    async def _warm_rows(self, view: View, meta: Meta, snapshot: Snapshot,
                         rows: dict[str, dict]) -> None:
        """Write back rows Redis missed (they were absent: no old index entries)."""
        if snapshot.generation != meta.generation or snapshot.batch < (meta.fence or -1):
            return
        ops = self._ops(view, meta.generation, rows, {})
        await self.redis.warm(view.name, meta.generation, meta.fence, snapshot.batch,
                              snapshot.committed_at_ms, False, ops)

    def ensure_complete(self, view: View) -> None:
        """Start a full re-warm of the view unless one is running."""
        task = self._full_warms.get(view.name)
        if task is None or task.done():
            self._full_warms[view.name] = self._background(self.warm_all(view))

    async def warm_all(self, view: View, attempts: int = 20) -> bool:
        """Copy the whole Delta snapshot into Redis (rows and indexes) and mark the view
        complete. Retried while the engine moves Redis ahead of Delta meanwhile."""
        pause = 0.05
        why = "no attempt"
        for _ in range(attempts):
            try:
                why = await self._warm_all_once(view)
                if why is None:
                    return True
            except RedisUnavailable:
                return False
            except Exception:  # a background task: log it, lists keep reading Delta
                log.exception("re-warming %s from Delta failed", view.name)
                return False
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)
        # Lists keep reading Delta; the next one that finds the view incomplete tries again.
        log.warning("re-warming %s gave up after %d attempts: %s", view.name, attempts, why)
        return False

    async def _warm_all_once(self, view: View) -> str | None:
        """None once the view is complete, else why this attempt could not finish it."""
        meta = await self.redis.meta(view.name)
        if meta.complete:
            return None
        rows, snapshot = await self.delta_read(view, reason="rewarm")
        if snapshot.generation != meta.generation or snapshot.batch < (meta.fence or -1):
            return (f"Delta (generation {snapshot.generation}, batch {snapshot.batch}) has not "
                    f"caught up with Redis (generation {meta.generation}, batch {meta.fence})")
        generation, fence = meta.generation, meta.fence
        by_key = {key_of(r, view.key): r for r in rows}
        keys = list(by_key)
        chunks = [keys[i:i + WARM_CHUNK_ROWS] for i in range(0, len(keys), WARM_CHUNK_ROWS)]
        for i, chunk in enumerate(chunks or [[]]):
            stored = await self.redis.get_rows(view.name, generation, chunk) if chunk else []
            old = {k: orjson.loads(v) for k, v in zip(chunk, stored, strict=True) if v}
            ops = self._ops(view, generation, {k: by_key[k] for k in chunk}, old)
            last = i == max(len(chunks) - 1, 0)
            if not await self.redis.warm(view.name, generation, fence, snapshot.batch,
                                         snapshot.committed_at_ms, last, ops):
                return (f"Redis refused the copy from batch {fence}: an engine batch "
                        "landed meanwhile, or Redis failed")
            if fence is None and snapshot.batch >= 0:
                fence = snapshot.batch  # the script recorded the snapshot as the fence
        return None
