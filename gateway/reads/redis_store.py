"""The gateway's Redis reads (and its fenced re-warm), one round trip each.

Every read pipelines the view's meta before the data, so an answer knows the version it
was read at: the engine applies a batch atomically (one Lua script), so data read after
the meta is at least that fresh. Row keys embed the generation; the gateway guesses the
last one it saw and reads again in the rare case the meta names another.

When Redis fails, the store says so (RedisUnavailable) and stays quiet for
`gateway_redis_retry_ms`, so callers answer from Delta without waiting on a dead server.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from gateway.reads.indexes import PAGE_BY_SCORE_LUA, Range
from schema.redis_client import connect_async, queue_script
from schema.storage import (
    GRAPH_APPLYING,
    GRAPH_VERSION,
    META_COMMITTED_AT_MS,
    META_GENERATION,
    META_VERSION,
    META_WATERMARK,
    WARM_ROWS_LUA,
    Op,
    complete_field,
    fence_field,
    graph_key,
    index_key,
    meta_key,
    row_key,
    warm_rows_args,
)

# Rows by key with the meta they are at, in one command (the hot path: a pipeline costs the
# client more than one script call). Atomic, so the rows are exactly at the meta's version.
READ_ROWS_LUA = r"""
-- KEYS[1] meta hash, KEYS[2..] row keys; ARGV[1] the generation the keys were built for
local gen = ARGV[1]
local meta = redis.call('HMGET', KEYS[1], 'generation', 'version', 'watermark',
                        'committed_at_ms', 'version:g' .. gen, 'complete:g' .. gen)
local rows = {}
for i = 2, #KEYS, 1000 do
  local chunk = redis.call('MGET', unpack(KEYS, i, math.min(i + 999, #KEYS)))
  for _, row in ipairs(chunk) do rows[#rows + 1] = row end
end
return {meta, rows}
"""


class RedisUnavailable(Exception):
    """Redis cannot answer now; read Delta instead."""


@dataclass(frozen=True)
class Meta:
    """What the view's meta hash said when a read started."""

    generation: int
    version: int | None  # None: Redis has no meta for the view (never written or flushed)
    watermark: str | None
    committed_at_ms: int | None
    fence: int | None  # last batch applied to this generation
    complete: bool  # the gateway re-warmed every row: the indexes are whole


def _int(value: bytes | None) -> int | None:
    return None if value is None else int(value)


class RedisStore:
    def __init__(self, url: str, timeout_s: float, retry_ms: int, meta_cache_ms: int = 0) -> None:
        self.client = connect_async(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self.retry_s = retry_ms / 1000
        self._down_until = 0.0
        self._generation: dict[str, int] = {}
        self.meta_cache_s = meta_cache_ms / 1000
        self._meta_cache: dict[str, tuple[float, Meta]] = {}
        self._refreshing: set[str] = set()
        self._page_by_score = self.client.register_script(PAGE_BY_SCORE_LUA)
        self._read_rows = self.client.register_script(READ_ROWS_LUA)
        self._warm = self.client.register_script(WARM_ROWS_LUA)

    async def close(self) -> None:
        await self.client.aclose()

    @property
    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    def generation(self, view: str) -> int:
        return self._generation.get(view, 0)

    def _failed(self, exc: RedisError) -> RedisUnavailable:
        self._down_until = time.monotonic() + self.retry_s
        return RedisUnavailable(str(exc))

    def _meta(self, view: str, guessed: int, fields: list) -> Meta | None:
        """The meta from HMGET's answer, or None (and the new guess) if the generation
        is not the one the keys were built for."""
        gen, version, watermark, committed, fence, complete = fields
        actual = guessed if gen is None else int(gen)
        if actual != guessed:
            self._generation[view] = actual
            return None
        return Meta(actual, _int(version), watermark.decode() if watermark else None,
                    _int(committed), _int(fence), complete is not None)

    async def _run(self, view: str, build: Callable[[Any, int], None]) -> tuple[Meta, list]:
        """Pipeline HMGET meta + whatever `build(pipe, generation)` queues; returns the meta
        and the other replies, read again if the generation was not the one guessed."""
        if not self.available:
            raise RedisUnavailable("Redis failed recently")
        for _ in range(3):
            generation = self.generation(view)
            pipe = self.client.pipeline(transaction=False)
            pipe.hmget(meta_key(view), META_GENERATION, META_VERSION, META_WATERMARK,
                       META_COMMITTED_AT_MS, fence_field(generation), complete_field(generation))
            build(pipe, generation)
            try:
                replies = await pipe.execute()
            except RedisError as exc:
                raise self._failed(exc) from exc
            meta = self._meta(view, generation, replies[0])
            if meta is not None:
                return meta, replies[1:]
        raise RedisUnavailable(f"the generation of {view} keeps changing")

    async def meta(self, view: str) -> Meta:
        meta, _ = await self._run(view, lambda pipe, gen: None)
        return meta

    async def rows(self, view: str, keys: Sequence[str]) -> tuple[Meta, list[bytes | None]]:
        """The rows with the meta they are at least as fresh as. The meta read with the rows
        is reused for `meta_cache_ms`: meanwhile a plain MGET does (the meta's version then
        may trail the rows' by that long, never lead it)."""
        if not self.available:
            raise RedisUnavailable("Redis failed recently")
        now = time.monotonic()
        cached = self._meta_cache.get(view)
        # While one request refreshes an expired meta, the others keep the older one (still
        # honest: it trails the rows) instead of all running the script at once.
        if cached is not None and self.meta_cache_s > 0 and (
                now - cached[0] < self.meta_cache_s or view in self._refreshing):
            meta = cached[1]
            try:
                rows = await self.client.mget([row_key(view, meta.generation, k) for k in keys])
            except RedisError as exc:
                raise self._failed(exc) from exc
            return meta, rows
        self._refreshing.add(view)
        try:
            return await self._rows_with_meta(view, keys, now)
        finally:
            self._refreshing.discard(view)

    async def _rows_with_meta(self, view: str, keys: Sequence[str],
                              now: float) -> tuple[Meta, list[bytes | None]]:
        for _ in range(3):
            generation = self.generation(view)
            try:
                fields, rows = await self._read_rows(
                    keys=[meta_key(view), *(row_key(view, generation, k) for k in keys)],
                    args=[generation])
            except RedisError as exc:
                raise self._failed(exc) from exc
            meta = self._meta(view, generation, fields)
            if meta is not None:
                self._meta_cache[view] = (now, meta)
                return meta, rows
        raise RedisUnavailable(f"the generation of {view} keeps changing")

    async def lex_page(self, view: str, field: str, r: Range, reverse: bool, limit: int,
                       count: Sequence[Range]) -> tuple[Meta, list[bytes], int]:
        """Up to `limit` members of a string index in range `r`, and the entries in `count`."""
        def build(pipe: Any, gen: int) -> None:
            key = index_key(view, gen, field)
            low, high = r.lex()
            if reverse:
                pipe.zrevrangebylex(key, high, low, start=0, num=limit)
            else:
                pipe.zrangebylex(key, low, high, start=0, num=limit)
            for c in count:
                pipe.zlexcount(key, *c.lex())

        meta, replies = await self._run(view, build)
        return meta, replies[0], sum(replies[1:])

    async def score_page(self, view: str, field: str, r: Range, reverse: bool, limit: int,
                         cursor: tuple[float, str] | None,
                         count: Sequence[Range]) -> tuple[Meta, list[bytes], int]:
        """Up to `limit` members of a score index in `r`, past `cursor` among equal scores."""
        def build(pipe: Any, gen: int) -> None:
            key = index_key(view, gen, field)
            low, high = r.score()
            score, member = ("", "") if cursor is None else (repr(float(cursor[0])), cursor[1])
            queue_script(pipe, self._page_by_score, [key],
                         [low, high, "1" if reverse else "0", score, member, limit])
            for c in count:
                pipe.zcount(key, *c.score())

        meta, replies = await self._run(view, build)
        return meta, replies[0][0::2], sum(replies[1:])

    async def counts(self, view: str, field: str, lex: bool,
                     ranges: Sequence[Range]) -> tuple[Meta, int]:
        def build(pipe: Any, gen: int) -> None:
            key = index_key(view, gen, field)
            for r in ranges:
                if lex:
                    pipe.zlexcount(key, *r.lex())
                else:
                    pipe.zcount(key, *r.score())

        meta, replies = await self._run(view, build)
        return meta, sum(replies)

    async def members(self, view: str, field: str, lex: bool, ranges: Sequence[Range],
                      limit: int | None = None) -> tuple[Meta, list[list[bytes]]]:
        """Members of each range (at most `limit` each)."""
        def build(pipe: Any, gen: int) -> None:
            key = index_key(view, gen, field)
            page = {} if limit is None else {"start": 0, "num": limit}
            for r in ranges:
                if lex:
                    pipe.zrangebylex(key, *r.lex(), **page)
                else:
                    pipe.zrangebyscore(key, *r.score(), **page)

        return await self._run(view, build)

    async def graph_mark(self, generation: int) -> tuple[int | None, int | None]:
        """The view graph's `version` and `applying` marks (gateway.reads.consistency)."""
        if not self.available:
            raise RedisUnavailable("Redis failed recently")
        try:
            version, applying = await self.client.hmget(graph_key(generation), GRAPH_VERSION,
                                                        GRAPH_APPLYING)
        except RedisError as exc:
            raise self._failed(exc) from exc
        return _int(version), _int(applying)

    async def warm(self, view: str, generation: int, fence_seen: int | None, delta_batch: int,
                   committed_at_ms: int, complete: bool, ops: Sequence[Op]) -> bool:
        """Apply a re-warm (WARM_ROWS_LUA); False if an engine batch landed meanwhile."""
        if not self.available:
            return False
        args = warm_rows_args(generation, fence_seen, delta_batch, committed_at_ms, complete, ops)
        try:
            return await self._warm(keys=[meta_key(view)], args=args) == 1
        except RedisError as exc:
            self._failed(exc)
            return False

    async def get_rows(self, view: str, generation: int, keys: Sequence[str]) -> list:
        try:
            return await self.client.mget([row_key(view, generation, k) for k in keys])
        except RedisError as exc:
            raise self._failed(exc) from exc
