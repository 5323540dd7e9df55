"""A view's Delta files written by the Spark task that computed its share of a batch (issue
16's part 3: "a batch's rows ... written by Spark tasks, with the driver only coordinating").

As Spark's own Delta writer does: each task writes its files, the driver commits them.
A task that computed a view's change events (engine.task_upsert, engine.task_tables)
writes, under the view's table root,
- a data file of the rows it upserts, sorted by key (a key's rows are all in one task);
- with the change data feed on, a change-data file: inserts, updates as pre- and
  post-images, deletes with the deleted row, from the previous rows the task read in Redis;
and hands the driver what the commit needs, not the rows: each file's add (or cdc) fields
and the encoded keys (engine.sinks.key_index) of the rows it wrote, changed and replaced.

The driver then marks the replaced rows with deletion vectors and commits the batch's one
transaction (engine.sinks.dv_merge.DeletionVectorMerge.commit_written), after checking that
the rows the tasks replaced are exactly those its key index finds live: if Redis (where the
tasks read the previous rows) and Delta disagree, it deletes the tasks' files and merges
the batch's rows itself. Files of a share the driver does not commit (a task handed the
view back, the batch failed first) are deleted by the driver; a process killed between the
write and the commit leaves them unreferenced, as its own MERGE's files would be.

Only for a table with deletion vectors, a view that deletes by its key, and columns Arrow's
JSON reader takes exactly (rows_table.json_exact): the rows are in Redis's JSON form, and
a task has no catalog to type them (DeltaSink.task_writer).
"""

from __future__ import annotations

import os
import pickle
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from engine.sinks.dv_merge import change_rows, encode_file, file_stats, upload
from engine.sinks.key_index import encode_keys
from engine.sinks.rows_table import rows_table
from schema.storage import ChangeEvent


@dataclass(frozen=True)
class WrittenShare:
    """What one task wrote of one view's batch; none of it is in the table yet."""

    data: Mapping[str, Any] | None  # the data file's add fields (None: no upserts)
    keys: np.ndarray  # the data file's keys, in its rows' order (the key index's)
    changed: np.ndarray  # the keys of every row the share upserts or deletes
    replaced: np.ndarray  # those whose previous row the task found (updated, deleted)
    change_data: Mapping[str, Any] | None  # the change-data file's cdc fields

    def names(self) -> list[str]:
        """The files written, relative to the table's root."""
        return [f["path"] for f in (self.data, self.change_data) if f is not None]

    def encoded(self) -> bytes:
        return pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)

    @staticmethod
    def decoded(data: bytes | None) -> WrittenShare | None:
        # Only the engine's own tasks write these bytes (an Arrow column of the job).
        return None if data is None else pickle.loads(data)  # noqa: S301


@dataclass(frozen=True)
class DeltaInTask:
    """A view's Delta table as a task writes its files; pickled to the tasks. `s3`: the
    AWS variables pyarrow needs for an s3a:// root (schema.object_store), which a task's
    process may not have."""

    root: str
    key: tuple[str, ...]
    schema: pa.Schema  # the table's columns (delta_read.plain_schema)
    change_data: bool  # delta.enableChangeDataFeed
    s3: tuple[tuple[str, str], ...] = ()

    def write(self, events: Sequence[ChangeEvent], partition: int = 0) -> bytes | None:
        """Write the files of a share's change `events` (WrittenShare.encoded); None when
        they change nothing. `partition`: the task's, in the files' names (as Spark's)."""
        for name, value in self.s3:
            os.environ.setdefault(name, value)
        upserted = [e for e in events if e.row is not None]
        # A key deleted that Redis did not hold is in neither table: nothing to write.
        deleted = [e for e in events if e.row is None and e.before is not None]
        if not upserted and not deleted:
            return None
        upserts = rows_table([e.row for e in upserted], self.schema)  # type: ignore[misc]
        upserts = upserts.sort_by([(c, "ascending") for c in self.key])
        updated = [_previous(e) for e in upserted if e.before is not None]
        gone = [_previous(e) for e in deleted]
        keys = encode_keys(upserts, self.key)
        olds = rows_table(updated + gone, self.schema)  # the replaced rows, as Redis held them
        old_keys = encode_keys(olds, self.key)
        files: dict[str, Any] = {}
        data = None
        if upserts.num_rows:
            name = f"part-{partition:05d}-{uuid.uuid4()}-c000.snappy.parquet"
            data = {**encode_file(name, upserts, files), "stats": file_stats(upserts)}
        change_data = None
        if self.change_data:
            name = f"_change_data/cdc-{partition:05d}-{uuid.uuid4()}.c000.snappy.parquet"
            replaced = set(old_keys[:len(updated)].tolist())
            changes = change_rows(upserts, [k in replaced for k in keys.tolist()], olds,
                                  len(updated))
            change_data = encode_file(name, changes, files)
        upload(self.root, files)
        gone_keys = old_keys[len(updated):]
        return WrittenShare(data, keys, np.concatenate([keys, gone_keys]), old_keys,
                            change_data).encoded()


def _previous(event: ChangeEvent) -> Any:
    """The row before the event as Redis returned it (its text), else as decoded."""
    return event.before_text or event.before
