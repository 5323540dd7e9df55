"""Record what Spark's query progress says about each view in its Redis meta hash:
the Kafka offsets covered, the event-time watermark and the late events dropped."""

from __future__ import annotations

import json

import redis
from pyspark.sql.streaming import StreamingQueryListener

from engine.views import parse_query_name
from schema.storage import META_LATE_EVENTS, META_OFFSETS, META_WATERMARK, meta_key

# Fenced on the batch id per generation, so a replayed progress event does not count late
# events twice; a rebuild's generation keeps its own figures until it is switched in (the
# same "name:g<gen>" scheme as schema.storage.APPLY_BATCH_LUA).
_RECORD_PROGRESS_LUA = f"""
local live = redis.call('HGET', KEYS[1], 'generation')
local gen = ARGV[2]
if live and tonumber(gen) < tonumber(live) then return -1 end
local g = ':g' .. gen
local seen = redis.call('HGET', KEYS[1], 'progress_batch' .. g)
if seen and tonumber(seen) >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'progress_batch' .. g, ARGV[1],
           '{META_OFFSETS}' .. g, ARGV[3], '{META_WATERMARK}' .. g, ARGV[4])
local late = redis.call('HINCRBY', KEYS[1], '{META_LATE_EVENTS}' .. g, ARGV[5])
if (not live) or live == gen then
  redis.call('HSET', KEYS[1], '{META_OFFSETS}', ARGV[3], '{META_WATERMARK}', ARGV[4],
             '{META_LATE_EVENTS}', late)
end
return 1
"""


class ProgressRecorder(StreamingQueryListener):
    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url
        self.redis = redis.Redis.from_url(redis_url)
        self.record = self.redis.register_script(_RECORD_PROGRESS_LUA)

    def onQueryStarted(self, event) -> None:  # noqa: N802 - Spark's API
        pass

    def onQueryProgress(self, event) -> None:  # noqa: N802
        progress = event.progress
        named = parse_query_name(progress.name)
        if named is None:
            return
        view, generation = named
        offsets: dict[str, dict[str, int]] = {}
        for source in progress.sources:
            try:
                end = json.loads(source.endOffset) if source.endOffset else {}
            except (TypeError, ValueError):
                continue
            if isinstance(end, dict):
                for topic, partitions in end.items():
                    offsets.setdefault(topic, {}).update(partitions)
        watermark = (progress.eventTime or {}).get("watermark", "")
        late = sum(op.numRowsDroppedByWatermark for op in progress.stateOperators)
        try:
            self.record(
                keys=[meta_key(view)],
                args=[progress.batchId, generation, json.dumps(offsets), watermark, late],
            )
        except redis.RedisError:
            pass  # informational; the next progress event writes it again

    def onQueryIdle(self, event) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event) -> None:  # noqa: N802
        pass
