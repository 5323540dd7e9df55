"""Commit one micro-batch of one view to its three sinks, exactly once.

Order: prepare (the batch's writes and change events, nothing written), Redis (readers
see the batch without waiting on Delta), then the change feed (only once Redis holds the
rows), then Delta. Each write is idempotent on the batch id, so when Spark replays a batch
after a crash at any point, the steps that already happened are no-ops and the rest
complete. `commit` runs the steps for one view; the view graph (engine.graph) prepares
all its views first and applies them to Redis together.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.batch_offsets import read_batch_offsets
from engine.failpoints import failpoint
from engine.maintenance import MaintenanceSchedule, background_for
from engine.metrics import (
    MAINTENANCE_SECONDS,
    MAINTENANCE_WAIT_SECONDS,
    observe_delta_by_tasks,
    observe_rejected,
)
from engine.sinks.changefeed import ChangeFeed
from engine.sinks.delta_sink import DeltaSink
from engine.sinks.redis_sink import Before, RedisSink
from engine.sinks.rejects import Rejects, split_keyless
from engine.task_delta import WrittenShare
from engine.task_tables import TaskTable
from engine.task_upsert import TaskUpsert
from schema.catalog import View, graphql_fields
from schema.settings import Settings
from schema.storage import (
    REPLAYED,
    RETIRED,
    ChangeEvent,
    EncodedEvents,
    Op,
    change_op,
    changefeed_topic,
    deadletter_topic,
    decode_row,
    delta_app_id,
    delta_table_path,
    encode_row,
    join_writes,
    key_of,
    outbox_value,
    parse_key,
)

log = logging.getLogger("viewgate.engine.commit")

# A batch's rows for the driver's MERGE: the upserted rows, the deleted keys, the previous
# rows by key (DeltaSink.merge).
MergedRows = tuple[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]],
                   Mapping[str, Mapping[str, Any] | bytes]]

# The batch each view is committing right now, for the engine's stop line.
IN_FLIGHT: dict[str, int] = {}


@dataclass
class Pending:
    """One view's batch between its computation and its commit: the change events (what
    subscribers and the views over this one see), the rows and deleted keys for Delta, and
    the Redis writes (with rows Redis had lost brought back up to date, see
    ViewCommitter._stale_in_redis)."""

    batch_id: int
    events: Sequence[ChangeEvent]
    # None: the events' (a batch the tasks computed; taken from them only if the driver
    # merges its rows, ViewCommitter.to_delta).
    rows: Sequence[Mapping[str, Any]] | None
    deleted: Sequence[Mapping[str, Any]] | None
    meta: dict[str, Any]
    redis_upserts: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    redis_deletes: set[str] = field(default_factory=set)
    old_rows: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    extra_ops: Sequence[Op] = ()
    applied: bool = False  # Redis holds the batch (applied now, or by an earlier attempt)
    # The Redis writes built already (by Spark's tasks, engine.task_upsert), as the apply
    # script's JSON: then redis_upserts, redis_deletes and old_rows are empty.
    built_writes: bytes | None = None
    # The Delta files the tasks wrote (engine.task_delta), until to_delta commits or
    # deletes them; None when the driver writes the batch's rows.
    written: list[WrittenShare] | None = None
    delta_by_tasks: bool = False  # the Delta commit was of the tasks' files

    def new_rows(self) -> dict[str, Mapping[str, Any] | None]:
        """Key text -> the row as this batch leaves it (None: deleted), for every key whose
        row differs from what Redis held before the batch."""
        rows: dict[str, Mapping[str, Any] | None] = {e.key: e.row for e in self.events}
        rows.update(self.redis_upserts)
        rows.update(dict.fromkeys(self.redis_deletes))
        return rows


def offsets_fields(checkpoint: str | None, batch_id: int) -> dict[str, Any]:
    """What a batch covers (its Kafka end offsets and watermark, from the query's
    checkpoint) as a view's meta records it beside the batch's rows; none without one."""
    covered = read_batch_offsets(checkpoint, batch_id) if checkpoint else None
    return {} if covered is None else {"offsets": covered.offsets,
                                       "watermark": covered.watermark}


class ViewCommitter:
    def __init__(
        self,
        settings: Settings,
        view: View,
        generation: int,
        delete_on: Sequence[str] = (),
        checkpoint: str | None = None,
        source: str | None = None,
        maintenance_phase: float = 0.0,
    ) -> None:
        """`source`: the source whose dead-letter topic takes the view's rows with a null
        key (default: the view's own source; a view over views names the source at the end
        of its chain, catalog.source_of). `maintenance_phase`: where in their intervals the
        table's compaction and maintenance start (engine.maintenance.MaintenanceSchedule)."""
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
        self.maintenance = MaintenanceSchedule(settings.delta_maintenance_interval_s,
                                               phase=maintenance_phase)
        self.compaction = MaintenanceSchedule(settings.delta_compact_interval_s,
                                              phase=maintenance_phase)
        self.background = background_for(self.delta.path, view.name)

    def close(self) -> None:
        """Release the producers, Redis clients and Delta state (engine.query_resources)."""
        self.feed.close()
        self.rejects.close()
        self.redis.close()
        self.delta.close()

    def _events(self, batch_id: int, now_ms: int, upserts: Mapping[str, dict[str, Any]],
                deletes: set[str], old_rows: Mapping[str, dict[str, Any]],
                old_texts: Mapping[str, bytes]) -> list[ChangeEvent]:
        """`old_texts`: the previous rows Redis returned, as it stores them (Before.encoded);
        each is the text of the key's row in `old_rows` (a row Delta filled in has none)."""
        def event(key: str, row: dict[str, Any] | None) -> ChangeEvent:
            before = old_rows.get(key)
            return ChangeEvent(self.view.name, key, change_op(before, row), row, before,
                               batch_id, self.generation, now_ms, old_texts.get(key))
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

    def commit(self, batch_id: int, rows: Sequence[Mapping[str, Any]],
               deleted: Sequence[Mapping[str, Any]] = ()) -> int:
        """Commit one batch of this view alone: prepare, Redis, change feed, Delta (the
        graph runs these steps for all its views at once, engine.graph). `rows` are
        upserted; `deleted` hold the `delete_on` columns of deleted rows. Returns what the
        Redis apply said (schema.storage APPLIED, REPLAYED, RETIRED)."""
        pending = self.prepare(batch_id, rows, deleted)
        try:
            started = time.perf_counter()
            status = self.redis.apply(**self._apply_args(pending))
            if log.isEnabledFor(logging.DEBUG):
                redis_ms = (time.perf_counter() - started) * 1000
                log.debug("%s batch %d: %d upserts, %d deletes; redis %.0f ms", self.view.name,
                          batch_id, len(pending.redis_upserts), len(pending.redis_deletes),
                          redis_ms, extra={"view": self.view.name, "batch_id": batch_id,
                                           "timings": {"redis_ms": redis_ms}})
            self.applied(pending, status)
            if status == RETIRED:
                return status  # readers moved to a rebuilt generation; the engine restarts us
            failpoint("after_redis", self.view.name)
            self.publish(pending)
            self.to_delta(pending)
        finally:
            IN_FLIGHT.pop(self.view.name, None)
        return status

    def prepare(
        self,
        batch_id: int,
        rows: Sequence[Mapping[str, Any]],
        deleted: Sequence[Mapping[str, Any]] = (),
        before: Before | None = None,
        extra_ops: Sequence[Op] = (),
        meta: Mapping[str, Any] | None = None,
        covers: Mapping[str, Any] | None = None,
    ) -> Pending:
        """The batch's writes and change events, nothing written yet (rows with a null key
        go to the dead-letter topic). `before` is what Redis held for (at least) their keys
        when the caller read it in this batch already (a view over views compares with
        it); else it is read here. `extra_ops` go to Redis in the batch's apply (an
        aggregate view's states), and so do `meta` fields (a stream aggregate's watermark).
        `covers`: the batch's offsets_fields when the caller read them already (the graph
        reads them once for all its views); else they are read here."""
        IN_FLIGHT[self.view.name] = batch_id
        rows, keyless = split_keyless(rows, self.view.key)
        if keyless:
            self.rejects.publish(batch_id, keyless)
            observe_rejected(self.view.name, len(keyless))
            log.warning("%s batch %d: %d rows with a null key left out (dead-lettered)",
                        self.view.name, batch_id, len(keyless),
                        extra={"view": self.view.name, "batch_id": batch_id})
        now_ms = int(time.time() * 1000)
        fields: dict[str, Any] = {"committed_at_ms": now_ms}
        fields |= offsets_fields(self.checkpoint, batch_id) if covers is None else covers
        fields |= meta or {}
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
        events = self._events(batch_id, now_ms, upserts, deletes, old_rows, before.encoded)
        stale = self._stale_in_redis(batch_id, before.fence, set(upserts) | deletes)
        if stale:
            # Their index entries come from what Redis holds of them, old as it is.
            old_rows = {**self.redis.before(self.generation, list(stale)).rows, **old_rows}
        return Pending(
            batch_id, events, rows, deleted, fields,
            redis_upserts={**{k: r for k, r in stale.items() if r is not None}, **upserts},
            redis_deletes=deletes | {k for k, r in stale.items() if r is None},
            old_rows=old_rows, extra_ops=extra_ops)

    def prepared_by_tasks(self, batch_id: int, shares: Sequence[TaskUpsert | TaskTable],
                          now_ms: int, covers: Mapping[str, Any]) -> Pending | None:
        """The batch as Spark's tasks computed it (an upsert view, engine.task_upsert, or a
        view over views, engine.task_tables), one share a task, joined into one apply;
        None when a task handed the view back or two tasks wrote one key (a key's records
        in two tasks): then the caller computes it. `now_ms`: the commit time the tasks
        gave the events; `covers` as for prepare."""
        written = [w for share in shares if share.ok
                   for w in [WrittenShare.decoded(share.files)] if w is not None]
        if not all(share.ok for share in shares):
            self.discard(written)
            return None
        keys = [k for share in shares for k in share.keys]
        if len(set(keys)) < len(keys):
            self.discard(written)
            return None
        fields: dict[str, Any] = {"committed_at_ms": now_ms, **covers}
        # The events as the tasks encoded them: decoded only if something reads them.
        events = EncodedEvents([e for share in shares for e in share.events], keys)
        return Pending(batch_id, events, None, None, fields,
                       built_writes=join_writes(share.writes for share in shares),
                       written=written or None)

    def discard(self, written: Sequence[WrittenShare] | Pending | None) -> None:
        """Delete Delta files the tasks wrote that will not be committed (of a Pending:
        those it still holds)."""
        shares = written
        if isinstance(written, Pending):
            shares, written.written = written.written, None
        if shares:
            self.delta.discard([name for share in shares for name in share.names()])

    def _deleted_key(self, key: str) -> dict[str, Any]:
        """A deleted row's `delete_on` columns from its key text: typed as the view's key
        when they are its key (a view over views), else the source key's text."""
        if self.delete_on == self.view.key:
            return dict(zip(self.view.key, parse_key(self.view, key), strict=True))
        return {self.delete_on[0]: key}

    def stored(self, batch_id: int) -> Pending:
        """The batch as Redis already holds it (a replay after a crash past the Redis
        apply): the outbox's events, the same rows for Delta; nothing to write to Redis.
        None in the outbox means a later batch followed, so Delta holds this one too."""
        IN_FLIGHT[self.view.name] = batch_id
        events = self.redis.outbox(self.generation, batch_id)
        pending = Pending(batch_id, [], [], [], {}, applied=True)
        if events is not None:
            pending.events = events
            pending.rows, pending.deleted = self._rows_of(events)
        return pending

    def _apply_args(self, pending: Pending) -> dict[str, Any]:
        return {"batch_id": pending.batch_id, "generation": self.generation,
                "upserts": pending.redis_upserts, "deletes": pending.redis_deletes,
                "meta": pending.meta, "old_rows": pending.old_rows,
                "outbox": outbox_value(pending.batch_id, pending.events),
                "extra_ops": pending.extra_ops, "writes": pending.built_writes}

    def queue_apply(self, pending: Pending, pipe: Any) -> None:
        """Queue the batch's fenced Redis apply on `pipe` (a pipeline of the graph's one
        Redis client), so that every view of a batch is applied in one round trip."""
        self.redis.apply(**self._apply_args(pending), client=pipe)

    def applied(self, pending: Pending, status: int) -> None:
        """Take what the Redis apply said. REPLAYED: Redis holds this batch already, so
        the previous rows read were its new ones: the events and Delta's rows are what the
        first attempt stored (a view over views recomputed on a replay would hand over no
        change at all)."""
        if status == REPLAYED:
            self.discard(pending)  # the first attempt's rows are committed from the outbox
            replayed = self.stored(pending.batch_id)
            pending.events, pending.rows, pending.deleted = (
                replayed.events, replayed.rows, replayed.deleted)
        pending.applied = True

    def publish(self, pending: Pending) -> None:
        """The batch's change events to the view's change feed (Redis holds the rows)."""
        self.send(pending)()

    def send(self, pending: Pending) -> Callable[[], None]:
        """Start publishing the batch's change events; the function returned waits until
        the broker has them (the graph overlaps its views' deliveries)."""
        started = time.perf_counter()
        delivered = self.feed.send(pending.events)

        def wait() -> None:
            delivered(60)
            failpoint("after_changefeed", self.view.name)
            if log.isEnabledFor(logging.DEBUG):
                feed_ms = (time.perf_counter() - started) * 1000
                log.debug("%s batch %d: %d changes; feed %.0f ms", self.view.name,
                          pending.batch_id, len(pending.events), feed_ms,
                          extra={"view": self.view.name, "batch_id": pending.batch_id,
                                 "timings": {"feed_ms": feed_ms}})
        return wait

    def to_delta(self, pending: Pending, ready: Callable[[], Any] = lambda: None) -> None:
        """MERGE the batch into the view's Delta table (idempotent on the batch id); the
        view's commit is no longer in flight once it is done. `ready`: called before the
        MERGE commits (DeltaSink.merge), so the graph can write the MERGE's files while
        Redis applies the batch and commit it only once Redis holds it; what it raises
        (a cancelled gate: nothing to commit) comes out of here."""
        metadata = {
            "view": self.view.name,
            "batch_id": pending.batch_id,
            "generation": self.generation,
            "late_events": self.redis.late_events(self.generation),
            **pending.meta,
        }
        try:
            written, pending.written = pending.written, None  # the MERGE's from here
            pending.delta_by_tasks = self._merge(pending.batch_id,
                                                 lambda: self._merged_rows(pending), metadata,
                                                 ready, written)
        finally:
            IN_FLIGHT.pop(self.view.name, None)

    def _merged_rows(self, pending: Pending) -> MergedRows:
        """What the driver's MERGE of the batch takes: the rows, the deleted keys, the
        previous rows (an event's `before` is what Redis held, or Delta's row where Redis
        had none, as Redis returned it where the event has that text; a replay's events
        do not)."""
        previous = {e.key: e.before_text or e.before for e in pending.events
                    if e.before is not None}
        if pending.rows is None or pending.deleted is None:
            # Rows in JSON form (as a replay's), which Delta's MERGE takes as they are.
            return ([e.row for e in pending.events if e.row is not None],
                    [self._deleted_key(e.key) for e in pending.events if e.row is None],
                    previous)
        return pending.rows, pending.deleted, previous

    def _merge(self, batch_id: int, merged_rows: Callable[[], MergedRows],
               metadata: Mapping[str, Any], ready: Callable[[], Any] = lambda: None,
               written: Sequence[WrittenShare] | None = None) -> bool:
        """The batch's MERGE: of the files the tasks `written` when there are and Delta
        takes them (DeltaSink.merge_written), else of the rows `merged_rows()` gives.
        Whether the tasks' files were committed."""
        started = time.perf_counter()
        waited = self.background.wait()  # never a MERGE and maintenance on the table at once
        if waited:
            MAINTENANCE_WAIT_SECONDS.labels(self.view.name).observe(waited)
        merged = (self.delta.merge_written(batch_id, written, metadata, ready)
                  if written else None)
        by_tasks = merged is True
        if written:
            observe_delta_by_tasks(self.view.name, by_tasks)
        if merged is None:
            if written:
                log.warning("%s batch %d: the tasks' previous rows are not Delta's; the "
                            "driver merges the batch's rows", self.view.name, batch_id,
                            extra={"view": self.view.name, "batch_id": batch_id})
            rows, deleted, previous = merged_rows()
            merged = self.delta.merge(batch_id, rows, deleted, self.delete_on,
                                      metadata=metadata, previous=previous, ready=ready)
        failpoint("after_delta", self.view.name)
        if merged and self.maintenance.due():  # a replayed batch leaves the table alone
            self.background.start(lambda: self._maintain(batch_id))
        elif merged and self.compaction.due():
            self.background.start(lambda: self._maintain(batch_id, small_files_only=True))
        if log.isEnabledFor(logging.DEBUG):
            delta_ms = (time.perf_counter() - started) * 1000
            log.debug("%s batch %d: delta %.0f ms (%.0f ms waiting for maintenance)%s",
                      self.view.name, batch_id, delta_ms, waited * 1000,
                      ", files written by Spark's tasks" if by_tasks else "",
                      extra={"view": self.view.name, "batch_id": batch_id,
                             "timings": {"delta_ms": delta_ms,
                                         "maintenance_wait_ms": waited * 1000}})
        return by_tasks

    def _rows_of(self, events: Sequence[ChangeEvent]
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The upserted rows (typed as the view's fields) and the deleted keys of events."""
        rows = [decode_row(encode_row(e.row), self.view) for e in events if e.row is not None]
        deleted = [dict(zip(self.view.key, parse_key(self.view, e.key), strict=True))
                   for e in events if e.row is None]
        return rows, deleted

    def _maintain(self, batch_id: int, small_files_only: bool = False) -> None:
        """Delta maintenance after this batch's MERGE, the whole of it or the compaction of
        small files, beside the next batches (in the table's BackgroundMaintenance,
        engine.maintenance). A failure is logged and tried again an interval later: the
        batch is committed."""
        schedule = self.compaction if small_files_only else self.maintenance
        what = "compaction" if small_files_only else "maintenance"
        try:
            result = (self.delta.compact(self.target_file_bytes) if small_files_only
                      else self.delta.maintain(self.target_file_bytes))
        except Exception as exc:  # noqa: BLE001 - delta-rs raises several kinds
            log.warning("%s: Delta %s after batch %d failed, next try in %.0f s: %s",
                        self.view.name, what, batch_id, schedule.interval_s, exc,
                        extra={"view": self.view.name, "batch_id": batch_id})
        else:
            MAINTENANCE_SECONDS.labels(self.view.name).observe(result.seconds)
            if not small_files_only:
                self.compaction.done()  # maintenance compacted the table whole
            log.info("%s: Delta %s after batch %d took %.1f s: %d files into %d, %d "
                     "vacuumed", self.view.name, what, batch_id, result.seconds,
                     result.files_removed, result.files_added, result.files_vacuumed,
                     extra={"view": self.view.name, "batch_id": batch_id})
        schedule.done()
