"""MERGE one batch into the view's Delta table, idempotent on (app id, batch id).

The MERGE runs in the engine's process, not Spark: a batch's changed rows are a small local
collection, and a Spark MERGE of a few hundred rows costs seconds of jobs and planning on
a small machine (it dominated every batch). Tables have deletion vectors on
(engine.maintenance.table_properties): the MERGE marks the rows it replaces in their files
and writes only the new rows (engine.sinks.dv_merge), so a batch costs the rows it changes.
A table without them (made before), or a view that deletes by other columns than its key,
gets delta-rs's MERGE, which rewrites every file a changed key falls in.
The table is created by Spark (change data feed on) and read by Spark, delta-rs and the
gateway, which all read deletion vectors.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

import pyarrow as pa
from delta.tables import DeltaTable as SparkDeltaTable
from deltalake import CommitProperties, DeltaTable, Transaction
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from engine import maintenance
from engine.maintenance import MaintenanceResult, history_seconds
from engine.sinks.dv_merge import DeletionVectorMerge, supports_deletion_vectors
from engine.sinks.rows_table import json_exact
from engine.task_delta import DeltaInTask, WrittenShare
from schema.arrow_rows import arrow_rows
from schema.catalog import View
from schema.delta_read import live_rows, plain_schema, values_filter
from schema.storage import commit_batch_id, decode_row, encode_row, key_of, parse_key

DELETED = "_deleted"


def ensure_table(session: SparkSession, path: str, schema: StructType) -> None:
    """Create the table with the change data feed on, if it does not exist yet."""
    if DeltaTable.is_deltatable(path) and (
            [f.name for f in DeltaTable(path).schema().fields] == schema.fieldNames()):
        # Already there, with these columns: a restart skips Spark's builder, which
        # loads the table's snapshot with Spark jobs (seconds per view on a cold JVM).
        # On object storage too: delta-rs reads s3a:// with the variables
        # export_s3_environment set, as the engine's MERGEs do.
        return
    (
        SparkDeltaTable.createIfNotExists(session)
        .location(path)
        .addColumns(schema)
        .property("delta.enableChangeDataFeed", "true")
        .property("delta.enableDeletionVectors", "true")
        # A commit per batch: checkpoint often, so that readers (the stream-static joins,
        # the gateway) replay a few JSON commits, not up to the default hundred.
        .property("delta.checkpointInterval", "10")
        .execute()
    )


def _quoted(column: str) -> str:
    return '"' + column.replace('"', '""') + '"'


Result = TypeVar("Result")


def _one_at_a_time(method: Callable[..., Result]) -> Callable[..., Result]:
    """A DeltaSink method that holds the sink's lock while it runs."""

    @functools.wraps(method)
    def serialized(self: DeltaSink, *args: Any, **kwargs: Any) -> Result:
        with self._lock:
            return method(self, *args, **kwargs)

    return serialized


class DeltaSink:
    """One per view and generation; the only writer of its table."""

    def __init__(self, path: str, view: View, app_id: str) -> None:
        self.path = path
        self.view = view
        self.app_id = app_id
        self._table: DeltaTable | None = None
        self._source_schema: pa.Schema | None = None
        self._vectors = DeletionVectorMerge(path, view.key)
        # Maintenance runs in a thread of its own (engine.maintenance.BackgroundMaintenance)
        # while a batch may read rows here: one operation at a time on the table object and
        # the deletion-vector writer's state (maintain calls compact: reentrant).
        self._lock = threading.RLock()

    @_one_at_a_time
    def close(self) -> None:
        """Forget the table's state kept in memory (its snapshot, its files and keys); a
        later use reads it again. Waits for an operation running on the sink (maintenance
        in its thread), as the table's next MERGE would."""
        self._table = None
        self._vectors = DeletionVectorMerge(self.path, self.view.key)

    def _load(self) -> DeltaTable:
        if self._table is None:
            self._table = DeltaTable(self.path)
            # The MERGE source: the table's columns and the delete flag (fixed per sink).
            # Every column nullable: a deleted row carries only its `delete_on` columns,
            # also where the table declares a column non-nullable (a view's `count(*)`).
            target = pa.schema(self._table.schema().to_arrow())
            self._source_schema = pa.schema(
                [field.with_nullable(True) for field in target]
                + [pa.field(DELETED, pa.bool_(), nullable=False)])
        else:
            self._table.update_incremental()
        return self._table

    @_one_at_a_time
    def keys_changed_after(self, batch_id: int) -> set[str]:
        """The keys of the rows that commits of batches after `batch_id` changed, from the
        table's change data feed (each commit's userMetadata names its batch)."""
        table = self._load()
        batches = ((c["version"], commit_batch_id(c)) for c in table.history())
        later = [version for version, batch in batches if batch is not None and batch > batch_id]
        if not later:
            return set()
        changes = pa.table(table.load_cdf(starting_version=min(later),
                                          columns=list(self.view.key)))
        return {key_of(row, self.view.key) for row in changes.select(self.view.key).to_pylist()}

    @_one_at_a_time
    def rows(self, keys: Collection[str]) -> dict[str, dict[str, Any]]:
        """The stored rows of `keys` (absent ones left out), in Redis's JSON form. Between
        batches the table holds exactly what the previous batch left: its MERGE is the last
        step of a commit."""
        if not keys:
            return {}
        table = self._load()
        first = self.view.key[0]
        kind = plain_schema(table).field(first).type
        # By the first key column, pushed into the read (files pruned by their statistics);
        # the whole key is checked below.
        data = live_rows(table, values_filter(first, kind,
                                              {parse_key(self.view, k)[0] for k in keys}))
        wanted = set(keys)
        found = {}
        for row in arrow_rows(data):
            key = key_of(row, self.view.key)
            if key in wanted:
                found[key] = decode_row(encode_row(row))
        return found

    @_one_at_a_time
    def compact(self, target_file_bytes: int) -> MaintenanceResult:
        """Merge the small files and rewrite the files with many deleted rows
        (engine.maintenance): the engine's own compaction for a table with deletion vectors,
        delta-rs's for one without."""
        started = time.monotonic()
        table = self._load()
        if not supports_deletion_vectors(table):
            return maintenance.compact(self.path, target_file_bytes)
        removed, added = self._vectors.rewrite(table, target_file_bytes)
        return MaintenanceResult(removed, added, 0, time.monotonic() - started)

    @_one_at_a_time
    def maintain(self, target_file_bytes: int) -> MaintenanceResult:
        """Compaction, then vacuum, old change data and vector files, checkpoint and log
        cleanup (engine.maintenance)."""
        started = time.monotonic()
        compacted = self.compact(target_file_bytes)
        kept = maintenance.maintain(self.path, self.view)
        table = self._load()
        released = (self._vectors.delete_released_vectors(table, history_seconds(self.view))
                    if supports_deletion_vectors(table) else [])
        return MaintenanceResult(compacted.files_removed, compacted.files_added,
                                 kept.files_vacuumed + len(released),
                                 time.monotonic() - started)

    @_one_at_a_time
    def task_writer(self, s3: Mapping[str, str]) -> DeltaInTask | None:
        """The table as Spark's tasks write their shares' files (engine.task_delta), when
        they can: a table with deletion vectors, whose columns rows in Redis's JSON form
        make as they are (the caller checks that the view deletes by its key). `s3`: the
        AWS variables of an s3a:// root (schema.object_store.s3_environment)."""
        table = self._load()
        schema = plain_schema(table)
        if not (supports_deletion_vectors(table) and json_exact(schema)):
            return None
        return DeltaInTask(self.path, tuple(self.view.key), schema,
                           table.metadata().configuration.get(
                               "delta.enableChangeDataFeed") == "true",
                           tuple(sorted(s3.items())))

    @_one_at_a_time
    def merge_written(self, batch_id: int, shares: Sequence[WrittenShare],
                      metadata: Mapping[str, Any], ready: Callable[[], Any] = lambda: None
                      ) -> bool | None:
        """Commit the files Spark's tasks wrote of batch `batch_id` (engine.task_delta):
        True once committed; False when the table already holds the batch (a replay);
        None when the driver must merge the batch's rows itself (the tasks' previous rows
        are not Delta's: DeletionVectorMerge.commit_written). The files are deleted unless
        committed. `ready` as for merge."""
        names = [name for share in shares for name in share.names()]
        table = self._load()
        if self._holds(table, batch_id):
            self.discard(names)
            return False
        header = self._header(batch_id, json.dumps(dict(metadata), default=str))
        if self._vectors.commit_written(table, shares, header, ready):
            return True
        self.discard(names)
        return None

    def discard(self, names: Sequence[str]) -> None:
        """Delete files written for the table and never committed (engine.task_delta)."""
        self._vectors.delete(names)

    def _holds(self, table: DeltaTable, batch_id: int) -> bool:
        """Whether the table holds the batch already (a replay), by Delta's own idempotency
        record: the app id's last transaction version."""
        done = table.transaction_version(self.app_id)
        return done is not None and done >= batch_id

    def _header(self, batch_id: int, user_metadata: str) -> list[dict[str, Any]]:
        """The first actions of a batch's commit: its commitInfo, and its transaction
        (app id, batch id), which makes the commit idempotent."""
        now = int(time.time() * 1000)
        return [
            {"commitInfo": {"timestamp": now, "operation": "MERGE",
                            "operationParameters": {"deletionVectors": "true"},
                            "userMetadata": user_metadata, "clientVersion": "viewgate",
                            "isBlindAppend": False}},
            {"txn": {"appId": self.app_id, "version": batch_id, "lastUpdated": now}},
        ]

    @_one_at_a_time
    def merge(
        self,
        batch_id: int,
        rows: Sequence[Mapping[str, Any]],
        deleted: Sequence[Mapping[str, Any]],
        delete_on: Sequence[str],
        metadata: Mapping[str, Any],
        previous: Mapping[str, Mapping[str, Any] | bytes] | None = None,
        ready: Callable[[], Any] = lambda: None,
    ) -> bool:
        """False when the table already holds this batch (a replay). `previous`: the rows the
        batch's keys had before it (key_of -> row in Redis's JSON form, decoded or as Redis
        stores it), for the change data feed's pre-images; keys it lacks are read from the
        table. `ready()` is called before the commit, as late as the writer allows
        (DeletionVectorMerge.merge: after the files are written): it may block until the
        commit is due, or raise to commit nothing.

        A batch that changes no row is recorded all the same, as a commit holding only its
        transaction: Redis records every batch id, and readers compare the two (a re-warm
        waits for Delta to reach Redis's batch; `asOf: {version}` finds it in Delta)."""
        table = self._load()
        if self._holds(table, batch_id):
            return False
        user_metadata = json.dumps(dict(metadata), default=str)
        commit = CommitProperties(
            custom_metadata={"userMetadata": user_metadata},
            app_transactions=[Transaction(self.app_id, batch_id)],
        )
        if (rows or deleted) and tuple(delete_on) == tuple(self.view.key) and (
                supports_deletion_vectors(table)):
            header = self._header(batch_id, user_metadata)
            before = previous or {}
            # Rows as Redis stores them (text, or decoded) make the same Arrow as typed ones
            # (rows_table), except where a column needs Python's types: only then decoded,
            # row by row.
            needs_types = not json_exact(plain_schema(table))

            def previous_row(key: str) -> Mapping[str, Any] | bytes | None:
                row = before.get(key)
                if row is None or not needs_types:
                    return row
                return decode_row(row if isinstance(row, bytes) else encode_row(row), self.view)

            self._vectors.merge(table, rows, deleted, header, previous_row, ready)
            return True
        ready()  # delta-rs writes and commits in one call
        if not rows and not deleted:
            table.create_write_transaction([], mode="append", schema=table.schema(),
                                           commit_properties=commit)
            return True
        source_schema = self._source_schema
        columns = [c for c in source_schema.names if c != DELETED]
        records = [{**{c: r.get(c) for c in columns}, DELETED: False} for r in rows]
        # A deleted row needs only its `delete_on` columns (the rest may be in JSON form).
        records += [{**dict.fromkeys(columns), **{c: d.get(c) for c in delete_on},
                     DELETED: True} for d in deleted]
        source = pa.Table.from_pylist(records, schema=source_schema)

        def match(keys: Sequence[str]) -> str:
            return " AND ".join(f"t.{_quoted(c)} = s.{_quoted(c)}" for c in keys)

        condition = (
            f"(NOT s.{DELETED} AND {match(self.view.key)}) OR (s.{DELETED} AND {match(delete_on)})"
            if deleted
            else match(self.view.key)
        )
        values = {_quoted(c): f"s.{_quoted(c)}" for c in columns}
        (
            # Not streamed: delta-rs then prunes the target's files by the source's key range
            # (their min/max statistics) before it scans them, so a batch reads and rewrites
            # the files its keys fall in, not the whole table (streamed, it scanned every
            # file: 600 ms a batch at 2 million rows against 40 ms, docs/benchmarks.md).
            table.merge(
                source, condition, source_alias="s", target_alias="t", commit_properties=commit,
                streamed_exec=False,
            )
            .when_matched_delete(predicate=f"s.{DELETED}")
            .when_matched_update(updates=values, predicate=f"NOT s.{DELETED}")
            .when_not_matched_insert(updates=values, predicate=f"NOT s.{DELETED}")
            .execute()
        )
        return True
