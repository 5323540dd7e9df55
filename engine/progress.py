"""Count each view's late events (those behind its watermark, which Spark drops) from
Spark's query progress into the view's Redis meta hash."""

from __future__ import annotations

import redis
from pyspark.sql.streaming import StreamingQueryListener

from engine.views import parse_query_name
from schema.storage import META_LATE_EVENTS, meta_key

# Fenced on the batch id per generation, so a replayed progress event does not count late
# events twice; a rebuild's generation keeps its own count until it is switched in (the
# same "name:g<gen>" scheme as schema.storage.APPLY_BATCH_LUA).
_COUNT_LATE_LUA = f"""
local live = redis.call('HGET', KEYS[1], 'generation')
local gen = ARGV[2]
if live and tonumber(gen) < tonumber(live) then return -1 end
local g = ':g' .. gen
local seen = redis.call('HGET', KEYS[1], 'progress_batch' .. g)
if seen and tonumber(seen) >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'progress_batch' .. g, ARGV[1])
local late = redis.call('HINCRBY', KEYS[1], '{META_LATE_EVENTS}' .. g, ARGV[3])
if (not live) or live == gen then
  redis.call('HSET', KEYS[1], '{META_LATE_EVENTS}', late)
end
return 1
"""


class ProgressRecorder(StreamingQueryListener):
    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url
        self.redis = redis.Redis.from_url(redis_url)
        self.count_late = self.redis.register_script(_COUNT_LATE_LUA)

    def onQueryStarted(self, event) -> None:  # noqa: N802 - Spark's API
        pass

    def onQueryProgress(self, event) -> None:  # noqa: N802
        progress = event.progress
        named = parse_query_name(progress.name)
        if named is None:
            return
        view, generation = named
        late = sum(op.numRowsDroppedByWatermark for op in progress.stateOperators)
        try:
            self.count_late(keys=[meta_key(view)], args=[progress.batchId, generation, late])
        except redis.RedisError:
            pass  # informational; a lost count is the price of not failing the query

    def onQueryIdle(self, event) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event) -> None:  # noqa: N802
        pass
