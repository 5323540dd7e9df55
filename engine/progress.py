"""Record what Spark's query progress says about each view in its Redis meta hash:
the Kafka offsets covered, the event-time watermark and the late events dropped."""

from __future__ import annotations

import json

import redis
from pyspark.sql.streaming import StreamingQueryListener

from engine.views import view_of_query
from schema.storage import META_LATE_EVENTS, META_OFFSETS, META_WATERMARK, meta_key

# Fenced on the batch id, so a replayed progress event does not count late events twice.
_LATE_ONCE_LUA = f"""
local seen = redis.call('HGET', KEYS[1], 'progress_batch')
if seen and tonumber(seen) >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'progress_batch', ARGV[1],
           '{META_OFFSETS}', ARGV[2], '{META_WATERMARK}', ARGV[3])
redis.call('HINCRBY', KEYS[1], '{META_LATE_EVENTS}', ARGV[4])
return 1
"""


class ProgressRecorder(StreamingQueryListener):
    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url
        self.redis = redis.Redis.from_url(redis_url)
        self.record = self.redis.register_script(_LATE_ONCE_LUA)

    def onQueryStarted(self, event) -> None:  # noqa: N802 - Spark's API
        pass

    def onQueryProgress(self, event) -> None:  # noqa: N802
        progress = event.progress
        view = view_of_query(progress.name)
        if view is None:
            return
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
                args=[progress.batchId, json.dumps(offsets), watermark, late],
            )
        except redis.RedisError:
            pass  # informational; the next progress event writes it again

    def onQueryIdle(self, event) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event) -> None:  # noqa: N802
        pass
