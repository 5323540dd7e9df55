"""An upsert view's batch computed by the read's Spark tasks (issue 16's stage A:
docs/engine-plan.md, "The executors' design, corrected").

For an upsert view whose SQL only picks columns of its source, each task of the graph's
read (engine.task_read) turns its records' last row per key into what the driver's commit
sends for the view: the rows' Redis writes as the apply script's JSON, and the change
events' bytes (each with the row Redis held before the batch, which the task reads from
Redis). The driver joins the tasks' shares into the view's one fenced apply
(engine.graph), so the fences, the outbox and the graph's marks are the driver's as
before, and a retried task, reading Redis as the previous batch left it, returns the same.

A task hands the view back to the driver's own path (`TaskUpsert.ok` False) whenever its
answer could differ from the driver's: Redis not at the previous batch (a replay, lost
batches to bring back from Delta), rows missing from a Redis that lost its complete mark,
a row without a key (the driver dead-letters it), a record without a Kafka key (its key's
records may be in several tasks) or with a key that is not UTF-8.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from engine.incremental import json_value
from engine.sinks.redis_sink import Before, RowWrites, read_before
from engine.task_delta import DeltaInTask
from schema.redis_client import connect as connect_redis
from schema.storage import ChangeEvent, change_op, key_of

Row = dict[str, Any]

_clients: dict[str, Any] = {}  # per Python worker: one Redis client a URL, for every task
_clients_lock = threading.Lock()


def redis_client(url: str) -> Any:
    """The Python worker's Redis client for `url`, shared by its tasks."""
    with _clients_lock:
        found = _clients.get(url)
        if found is None:
            found = _clients[url] = connect_redis(url)
        return found


def route_value(row: Mapping[str, Any] | None, column: str) -> bytes | None:
    """A row's routing value (None: no row) for the views over views
    (engine.task_tables): its `column` in JSON form, as bytes, so that a value read from
    Redis and the same value computed compare equal."""
    return None if row is None else orjson.dumps(json_value(row.get(column)))


def task_partition() -> int:
    """The partition of the Spark task running this (0 outside one), for file names."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return 0 if context is None else context.partitionId()


def batch_events(view: str, generation: int, upserts: Mapping[str, Row],
                 deletes: Sequence[str], before: Before, batch_id: int, now_ms: int
                 ) -> list[ChangeEvent]:
    """A view's change events as a task computes them: the upserted rows by key, then the
    deleted keys, each with the row Redis held before the batch (`before`)."""
    def event(key: str, row: Row | None) -> ChangeEvent:
        old = before.rows.get(key)
        return ChangeEvent(view, key, change_op(old, row), row, old, batch_id, generation,
                           now_ms, before.encoded.get(key))
    return [event(k, r) for k, r in upserts.items()] + [event(k, None) for k in deletes]


@dataclass(frozen=True)
class TaskUpsert:
    """One task's share of one view's batch. `ok` False: the driver computes the view."""

    ok: bool
    writes: bytes = b"[]"  # schema.storage.BatchWrites.encoded()
    events: tuple[bytes, ...] = ()  # ChangeEvent.to_bytes(), upserts then deletes
    keys: tuple[str, ...] = ()  # each event's key (the driver forwards the bytes undecoded)
    # For the views over views (engine.task_tables): each event's bytes with its routing
    # value, once per value its previous and new rows have. Stays in the tasks.
    routed: tuple[tuple[bytes, bytes], ...] = ()
    # The Delta files the task wrote of its share (engine.task_delta.WrittenShare.encoded);
    # None: none (nothing changed, or the driver writes the view's Delta).
    files: bytes | None = None

    @classmethod
    def refused(cls) -> TaskUpsert:
        return cls(False)


@dataclass(frozen=True)
class UpsertInTask:
    """An upsert view whose SQL picks columns of its source (output column -> source
    column), as a task computes it; pickled to the tasks with the batch's id."""

    view: str
    generation: int
    key: tuple[str, ...]  # the view's key
    delete_on: str  # the source's key: a tombstone deletes the row of that key
    columns: tuple[tuple[str, str], ...]
    writes: RowWrites
    redis_url: str
    route: str | None = None  # the column views over views route its changes by
    delta: DeltaInTask | None = None  # its table, when the task writes its files too

    def compute(self, latest: Mapping[str, Row | None], batch_id: int, now_ms: int,
                routed: bool = False) -> TaskUpsert:
        """The view's share of the batch from its source's last record per key in this task
        (None: tombstoned); Redis is read as the previous batch left it. `routed`: its
        events also routed to the views over views (TaskUpsert.routed)."""
        upserts: dict[str, Row] = {}
        deletes: list[str] = []
        for source_key, value in latest.items():
            if value is None:
                deletes.append(key_of({self.delete_on: source_key}, (self.delete_on,)))
                continue
            row = {out: value[column] for out, column in self.columns}
            if any(row.get(k) is None for k in self.key):
                return TaskUpsert.refused()  # the driver dead-letters it
            upserts[key_of(row, self.key)] = row
        keys = [*upserts, *deletes]
        if not keys:
            return TaskUpsert(True)
        before = read_before(redis_client(self.redis_url), self.view, self.generation, keys)
        if not self._usable(before, keys, batch_id):
            return TaskUpsert.refused()
        events = batch_events(self.view, self.generation, upserts, deletes, before, batch_id,
                              now_ms)
        writes = self.writes.batch_writes(self.generation, upserts, deletes, before.rows)
        encoded = tuple(e.to_bytes() for e in events)
        return TaskUpsert(True, writes.encoded(), encoded, tuple(e.key for e in events),
                          self._routed(events, encoded) if routed else (),
                          self.delta.write(events, task_partition()) if self.delta else None)

    def _routed(self, events: list[ChangeEvent], encoded: tuple[bytes, ...]
                ) -> tuple[tuple[bytes, bytes], ...]:
        assert self.route is not None
        out = []
        for event, data in zip(events, encoded, strict=True):
            values = {route_value(event.before, self.route), route_value(event.row, self.route)}
            out += [(value, data) for value in values if value is not None]
        return tuple(out)

    def _usable(self, before: Before, keys: list[str], batch_id: int) -> bool:
        """Whether the driver would compute the same from what Redis holds: Redis at the
        previous batch (or with no fence at all, as the driver takes it), and every
        previous row known (ViewCommitter.prepare reads Delta otherwise)."""
        if before.fence is not None and before.fence != batch_id - 1:
            return False
        return before.complete or all(k in before.rows for k in keys)
