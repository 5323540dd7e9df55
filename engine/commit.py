"""Commit one micro-batch of one view to its three sinks, exactly once.

Order: Redis first (readers see the batch without waiting on Delta), then the change
feed (only once Redis holds the rows), then Delta. Each step is idempotent on the
batch id, so when Spark replays a batch after a crash at any point, the steps that
already happened are no-ops and the rest complete. The Delta step may run on an
executor (the view graph overlaps it with the next views' work); the batch is done
when it is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor, Future
from typing import Any

from engine.batch_offsets import read_batch_offsets
from engine.failpoints import failpoint
from engine.maintenance import MaintenanceSchedule, maintain
from engine.metrics import MAINTENANCE_SECONDS, observe_rejected
from engine.sinks.changefeed import ChangeFeed
from engine.sinks.delta_sink import DeltaSink
from engine.sinks.redis_sink import Before, RedisSink
from engine.sinks.rejects import Rejects, split_keyless
from schema.catalog import View, graphql_fields
from schema.settings import Settings
from schema.storage import (
    REPLAYED,
    RETIRED,
    ChangeEvent,
    Op,
    change_op,
    changefeed_topic,
    deadletter_topic,
    decode_row,
    delta_app_id,
    delta_table_path,
    encode_row,
    key_of,
    outbox_value,
    parse_key,
)

log = logging.getLogger("viewgate.engine.commit")

# The batch each view is committing right now, for the engine's stop line.
IN_FLIGHT: dict[str, int] = {}


class ViewCommitter:
    def __init__(
        self,
        settings: Settings,
        view: View,
        generation: int,
        delete_on: Sequence[str] = (),
        checkpoint: str | None = None,
        source: str | None = None,
    ) -> None:
        """`source`: the source whose dead-letter topic takes the view's rows with a null
        key (default: the view's own source; a view over views names the source at the end
        of its chain, catalog.source_of)."""
        self.view = view
        self.checkpoint = checkpoint
        self.generation = generation
        self.delete_on = tuple(delete_on) or view.key
        self.redis = RedisSink(settings.redis_url, view, graphql_fields(view))
        self.feed = ChangeFeed(settings.kafka_bootstrap,
                               changefeed_topic(view.name, settings.changefeed_prefix))
        self.rejects = Rejects(settings.kafka_bootstrap, deadletter_topic(source or view.source),
                               view.name, view.key)
        self.delta = DeltaSink(
            delta_table_path(settings.delta_location, view.name, generation),
            view,
            app_id=delta_app_id(view.name, generation),
        )
        self.target_file_bytes = settings.delta_target_file_bytes
        self.maintenance = MaintenanceSchedule(settings.delta_maintenance_interval_s)
        # The change events of the last batch committed (or replayed): the input of the
        # views that read this one (engine.graph).
        self.last_events: list[ChangeEvent] = []
        self.delta_done: Future[None] | None = None  # the last Delta step given an executor

    def _events(self, batch_id: int, now_ms: int, upserts: Mapping[str, dict[str, Any]],
                deletes: set[str], old_rows: Mapping[str, dict[str, Any]]) -> list[ChangeEvent]:
        def event(key: str, row: dict[str, Any] | None) -> ChangeEvent:
            before = old_rows.get(key)
            return ChangeEvent(self.view.name, key, change_op(before, row), row, before,
                               batch_id, self.generation, now_ms)
        return [event(k, r) for k, r in upserts.items()] + [event(k, None) for k in deletes]

    def _stale_in_redis(self, batch_id: int, fence: int | None,
                        own: set[str]) -> dict[str, dict[str, Any] | None]:
        """Rows Redis holds older than Delta (None: deleted since), outside `own`.

        Each batch is in Delta before the next one starts, so Redis holds batch_id - 1
        (its `fence`) unless it lost batches: flushed between a batch's Redis apply and its
        Delta commit, then re-warmed by the gateway from the Delta snapshot before that
        batch. The rows those batches changed are brought up to date with this batch,
        without change events (theirs went out with their batches)."""
        if fence is None or fence >= batch_id - 1:
            return {}
        keys = self.delta.keys_changed_after(fence) - own
        current = self.delta.rows(keys)
        log.warning("%s batch %d: Redis held batch %d, not %d; %d rows it missed taken from "
                    "Delta", self.view.name, batch_id, fence, batch_id - 1, len(keys),
                    extra={"view": self.view.name, "batch_id": batch_id})
        return {k: current.get(k) for k in keys}

    def commit(
        self,
        batch_id: int,
        rows: Sequence[Mapping[str, Any]],
        deleted: Sequence[Mapping[str, Any]] = (),
        before: Before | None = None,
        delta_in: Executor | None = None,
        extra_ops: Sequence[Op] = (),
    ) -> int:
        """`rows` are upserted; `deleted` hold the `delete_on` columns of deleted rows.
        `before` is what Redis held for (at least) their keys when the caller read it in
        this batch already (a view over views compares with it); else it is read here.
        With `delta_in`, the Delta step is submitted to it and `delta_done` is its future.
        `extra_ops` go to Redis in the batch's transaction (an aggregate view's states).
        Returns what the Redis apply said (schema.storage APPLIED, REPLAYED, RETIRED)."""
        IN_FLIGHT[self.view.name] = batch_id
        self.last_events = []
        self.delta_done = None
        try:
            return self._commit(batch_id, rows, deleted, before, delta_in, extra_ops)
        finally:
            if self.delta_done is None:  # else the commit is in flight until its Delta step
                IN_FLIGHT.pop(self.view.name, None)

    def _commit(self, batch_id: int, rows: Sequence[Mapping[str, Any]],
                deleted: Sequence[Mapping[str, Any]], before: Before | None,
                delta_in: Executor | None, extra_ops: Sequence[Op]) -> int:
        started = time.perf_counter()
        rows, keyless = split_keyless(rows, self.view.key)
        if keyless:
            self.rejects.publish(batch_id, keyless)
            observe_rejected(self.view.name, len(keyless))
            log.warning("%s batch %d: %d rows with a null key left out (dead-lettered)",
                        self.view.name, batch_id, len(keyless),
                        extra={"view": self.view.name, "batch_id": batch_id})
        now_ms = int(time.time() * 1000)
        meta: dict[str, Any] = {"committed_at_ms": now_ms}
        covered = read_batch_offsets(self.checkpoint, batch_id) if self.checkpoint else None
        if covered is not None:
            meta |= {"offsets": covered.offsets, "watermark": covered.watermark}
        upserts = {key_of(r, self.view.key): dict(r) for r in rows}
        deletes = {key_of(d, self.delete_on) for d in deleted}
        if before is None:
            before = self.redis.before(self.generation, [*upserts, *deletes])
        old_rows = before.rows
        missing = [k for k in (*upserts, *deletes) if k not in old_rows]
        if missing and not before.complete:
            # Redis lost rows (a flush, a restart without persistence) and the gateway has
            # not re-warmed them all yet: without their previous values an update would go
            # out as an insert, and a row leaving a filter would never reach its subscribers.
            old_rows = {**self.delta.rows(missing), **old_rows}
        events = self._events(batch_id, now_ms, upserts, deletes, old_rows)
        stale = self._stale_in_redis(batch_id, before.fence, set(upserts) | deletes)
        stale_upserts = {k: row for k, row in stale.items() if row is not None}
        stale_deletes = {k for k, row in stale.items() if row is None}
        if stale:
            # Their index entries come from what Redis holds of them, old as it is.
            old_rows = {**self.redis.before(self.generation, list(stale)).rows, **old_rows}
        status = self.redis.apply(batch_id, self.generation, {**stale_upserts, **upserts},
                                  deletes | stale_deletes, meta=meta, old_rows=old_rows,
                                  outbox=outbox_value(batch_id, events),
                                  extra_ops=extra_ops)
        if status == RETIRED:
            return status  # readers moved to a rebuilt generation; the engine restarts us
        if status == REPLAYED:
            # Redis holds this batch already, so the previous rows read above are its new
            # ones: publish what the first attempt stored (None: a later batch followed,
            # so this one's events went out before it, and Delta holds it too).
            stored_events = self.redis.outbox(self.generation, batch_id)
            events = stored_events or []
            if stored_events is not None:
                # Delta gets what Redis got: a view over views recomputed on a replay finds
                # its new rows stored already and would hand over no change at all.
                rows, deleted = self._rows_of(stored_events)
        self.last_events = events
        failpoint("after_redis", self.view.name)
        redis_done = time.perf_counter()
        self.feed.publish(events)
        failpoint("after_changefeed", self.view.name)
        feed_done = time.perf_counter()
        metadata = {
            "view": self.view.name,
            "batch_id": batch_id,
            "generation": self.generation,
            "late_events": self.redis.late_events(self.generation),
            **meta,
        }
        if delta_in is None:
            self._to_delta(batch_id, rows, deleted, metadata)
        else:
            self.delta_done = delta_in.submit(self._to_delta, batch_id, rows, deleted,
                                              metadata)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "%s batch %d: %d upserts, %d deletes; redis %.0f ms, feed %.0f ms",
                self.view.name, batch_id, len(upserts), len(deletes),
                (redis_done - started) * 1000, (feed_done - redis_done) * 1000,
                extra={"view": self.view.name, "batch_id": batch_id,
                       "timings": {"redis_ms": (redis_done - started) * 1000,
                                   "feed_ms": (feed_done - redis_done) * 1000}},
            )
        return status

    def _to_delta(self, batch_id: int, rows: Sequence[Mapping[str, Any]],
                  deleted: Sequence[Mapping[str, Any]], metadata: Mapping[str, Any]) -> None:
        try:
            self._merge(batch_id, rows, deleted, metadata)
        finally:
            IN_FLIGHT.pop(self.view.name, None)

    def _merge(self, batch_id: int, rows: Sequence[Mapping[str, Any]],
               deleted: Sequence[Mapping[str, Any]], metadata: Mapping[str, Any]) -> None:
        started = time.perf_counter()
        merged = self.delta.merge(batch_id, rows, deleted, self.delete_on, metadata=metadata)
        failpoint("after_delta", self.view.name)
        if merged and self.maintenance.due():  # a replayed batch leaves the table alone
            self._maintain(batch_id)
        if log.isEnabledFor(logging.DEBUG):
            delta_ms = (time.perf_counter() - started) * 1000
            log.debug("%s batch %d: delta %.0f ms", self.view.name, batch_id, delta_ms,
                      extra={"view": self.view.name, "batch_id": batch_id,
                             "timings": {"delta_ms": delta_ms}})

    def _rows_of(self, events: Sequence[ChangeEvent]
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The upserted rows (typed as the view's fields) and the deleted keys of events."""
        rows = [decode_row(encode_row(e.row), self.view) for e in events if e.row is not None]
        deleted = [dict(zip(self.view.key, parse_key(self.view, e.key), strict=True))
                   for e in events if e.row is None]
        return rows, deleted

    def _maintain(self, batch_id: int) -> None:
        """Delta maintenance between this batch and the next (engine.maintenance). A
        failure is logged and tried again an interval later: the batch is committed."""
        try:
            result = maintain(self.delta.path, self.view, self.target_file_bytes)
        except Exception as exc:  # noqa: BLE001 - delta-rs raises several kinds
            log.warning("%s: Delta maintenance after batch %d failed, next try in %.0f s: %s",
                        self.view.name, batch_id, self.maintenance.interval_s, exc,
                        extra={"view": self.view.name, "batch_id": batch_id})
        else:
            MAINTENANCE_SECONDS.labels(self.view.name).observe(result.seconds)
            log.info("%s: Delta maintenance after batch %d took %.1f s: %d files ordered "
                     "into %d, %d vacuumed", self.view.name, batch_id, result.seconds,
                     result.files_removed, result.files_added, result.files_vacuumed,
                     extra={"view": self.view.name, "batch_id": batch_id})
        self.maintenance.done()
