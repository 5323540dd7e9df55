"""Record what Spark's query progress says about each view into its Redis meta hash: late
events (those behind its watermark, which Spark drops), input and processing rates, the
last batch's duration, and why the view's query stopped if it failed. `viewgate status`
and the gateway read them from there."""

from __future__ import annotations

import json
import time

import redis
from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import (
    JStreamingQueryListener,
    QueryProgressEvent,
    StreamingQueryProgress,
)

from engine.failures import summarize
from engine.metrics import BatchRates, epoch_seconds, observe_failure, observe_progress
from engine.views import query_views
from schema.redis_client import connect as connect_redis
from schema.storage import (
    META_BATCH_MS,
    META_INPUT_RATE,
    META_LAST_ERROR,
    META_LATE_EVENTS,
    META_PROCESSING_RATE,
    META_PROGRESS_AT_MS,
    meta_key,
)

# Fenced on the batch id per generation, so a replayed progress event does not count late
# events twice; a rebuild's generation keeps its own figures until it is switched in (the
# same "name:g<gen>" scheme as schema.storage.APPLY_BATCH_LUA). A batch that got through
# clears the last error.
_RECORD_PROGRESS_LUA = f"""
local live = redis.call('HGET', KEYS[1], 'generation')
local gen = ARGV[2]
if live and tonumber(gen) < tonumber(live) then return -1 end
local g = ':g' .. gen
local is_live = (not live) or live == gen
local seen = redis.call('HGET', KEYS[1], 'progress_batch' .. g)
if seen and tonumber(seen) >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'progress_batch' .. g, ARGV[1])
local late = redis.call('HINCRBY', KEYS[1], '{META_LATE_EVENTS}' .. g, ARGV[3])
local fields = cjson.decode(ARGV[4])
fields['{META_LATE_EVENTS}'] = late
redis.call('HDEL', KEYS[1], '{META_LAST_ERROR}' .. g)
if is_live then redis.call('HDEL', KEYS[1], '{META_LAST_ERROR}') end
for name, value in pairs(fields) do
  redis.call('HSET', KEYS[1], name .. g, tostring(value))
  if is_live then redis.call('HSET', KEYS[1], name, tostring(value)) end
end
return 1
"""

_RECORD_ERROR_LUA = f"""
local live = redis.call('HGET', KEYS[1], 'generation')
local gen = ARGV[1]
if live and tonumber(gen) < tonumber(live) then return -1 end
redis.call('HSET', KEYS[1], '{META_LAST_ERROR}:g' .. gen, ARGV[2])
if (not live) or live == gen then redis.call('HSET', KEYS[1], '{META_LAST_ERROR}', ARGV[2]) end
return 1
"""

class _ProgressAsJson(JStreamingQueryListener):
    """PySpark's bridge builds each progress event from the JVM object field by field, one
    Py4J round trip per field and map entry: about 15% of the driver's Python time under
    load, holding the GIL the graph's batch needs. One round trip for the progress's JSON
    gives the same event."""

    def onQueryProgress(self, jevent) -> None:  # noqa: N802 - Spark's API
        progress = StreamingQueryProgress.fromJson(json.loads(jevent.progress().json()))
        self.pylistener.onQueryProgress(QueryProgressEvent(progress))


class ProgressRecorder(StreamingQueryListener):
    @property
    def _jlistener(self):
        if not hasattr(self, "_jlistenerobj"):
            from pyspark import SparkContext

            self._jlistenerobj = SparkContext._jvm.PythonStreamingQueryListenerWrapper(
                _ProgressAsJson(self))
        return self._jlistenerobj

    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url
        self.redis = connect_redis(redis_url)
        self.record_progress = self.redis.register_script(_RECORD_PROGRESS_LUA)
        self.record_error = self.redis.register_script(_RECORD_ERROR_LUA)
        self.names: dict[str, str] = {}  # query id -> query name, for terminations
        self.started: dict[str, float] = {}  # query id -> its last batch's start (epoch s)

    def onQueryStarted(self, event) -> None:  # noqa: N802 - Spark's API
        self.names[str(event.id)] = event.name

    def onQueryProgress(self, event) -> None:  # noqa: N802
        progress = event.progress
        started = epoch_seconds(progress.timestamp)
        previous = self.started.get(str(progress.id))
        self.started[str(progress.id)] = started
        rates = BatchRates.of(progress, started - previous if previous else None)
        late = sum(op.numRowsDroppedByWatermark for op in progress.stateOperators)
        stats = {
            META_INPUT_RATE: round(rates.input_per_s, 1),
            META_PROCESSING_RATE: round(rates.processed_per_s, 1),
            META_BATCH_MS: int(progress.batchDuration or 0),
            META_PROGRESS_AT_MS: int(time.time() * 1000),
        }
        for view, generation in query_views(progress.name):
            observe_progress(view, progress, rates)
            try:
                self.record_progress(keys=[meta_key(view)],
                                     args=[progress.batchId, generation, late,
                                           json.dumps(stats)])
            except redis.RedisError:
                pass  # informational; a lost figure is the price of not failing the query

    def onQueryIdle(self, event) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event) -> None:  # noqa: N802
        views = query_views(self.names.pop(str(event.id), None))
        self.started.pop(str(event.id), None)
        if not event.exception:
            return
        message = summarize(str(event.exception))
        for view, generation in views:
            observe_failure(view)
            try:
                self.record_error(keys=[meta_key(view)], args=[generation, message])
            except redis.RedisError:
                pass
