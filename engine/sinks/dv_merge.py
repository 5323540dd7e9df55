"""A batch's MERGE as deletion vectors plus one new file: its cost is the rows it changes.

For a batch of upserted rows and deleted keys, one commit:
- a new data file with the upserted rows (new keys and new versions of existing ones);
- for each file holding an old version of a changed or deleted key: the file removed with
  its old deletion vector and added again with a vector that also marks those rows;
- the vectors in one vector file (engine.sinks.deletion_vectors); the batch's `txn` (app
  id, batch id) and its userMetadata, as every engine commit;
- with the change data feed on, a change-data file: inserts, updates as pre- and
  post-images, deletes with the deleted row.
Nothing already written is rewritten then. Compaction (`rewrite`, the engine's, between
two batches) later merges the small files and rewrites the files whose vectors mark a
large share of their rows, without those rows; both delta-rs and delta-spark read the
vectors in between. delta-rs's OPTIMIZE would not do: it never rewrites a file of the
target size, however many of its rows are deleted, so vectors and dead rows would grow
without bound. Vector files no version within the view's history uses are deleted by
`delete_released_vectors` (delta-rs's VACUUM leaves them).
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs
import pyarrow.parquet as pq
from deltalake import DeltaTable
from pyroaring import BitMap

from engine.sinks import deletion_vectors as dv
from engine.sinks.delta_log import ActiveFiles, commit
from engine.sinks.key_index import KeyIndex, encode_keys
from engine.sinks.rows_table import rows_table
from schema.arrow_rows import arrow_rows
from schema.delta_read import plain_schema
from schema.object_store import filesystem, is_remote, read_bytes
from schema.storage import key_of

if TYPE_CHECKING:
    from engine.task_delta import WrittenShare

_STRING_STATS_MAX = 32  # as delta-spark: longer strings get no min/max here
# A file whose vector marks this share of its rows is rewritten without them, so vectors
# stay small (a batch writes the whole vector of every file it touches) and dead rows stay
# a bounded share of the table. The price: at most 3 live rows rewritten per dead row.
PURGE_SHARE = 0.25
# What one compaction rewrites at most, in target files' worth: a bounded pause between
# two batches. Small files always go; the files with the most dead rows go first.
REWRITE_BUDGET_FILES = 4
_VECTOR_FILE = re.compile(r"deletion_vector_[0-9a-f-]{36}\.bin")


def supports_deletion_vectors(table: DeltaTable) -> bool:
    return ("deletionVectors" in (table.protocol().reader_features or [])
            and table.metadata().configuration.get("delta.enableDeletionVectors") == "true")


class DeletionVectorMerge:
    """The MERGE of one table's only writer; keeps the table's files and keys in memory
    between batches and catches up with commits of others (maintenance) from the log."""

    def __init__(self, root: str, key: Sequence[str]) -> None:
        self.root = root.rstrip("/")
        self.key = tuple(key)
        self.files = ActiveFiles(self.root)
        self.index = KeyIndex()
        # path -> (its vector's id, the rows the vector marks), for files with a vector
        self._vectors: dict[str, tuple[str, BitMap]] = {}
        # vector file name -> when it was first seen unused (delete_released_vectors)
        self._released: dict[str, float] = {}

    def merge(self, table: DeltaTable, rows: Sequence[Mapping[str, Any]],
              deleted: Sequence[Mapping[str, Any]], header: Sequence[Mapping[str, Any]],
              previous: Callable[[str], Mapping[str, Any] | bytes | None] = lambda key: None,
              ready: Callable[[], Any] = lambda: None) -> None:
        """Commit `rows` (upserts) and `deleted` (key columns) as the next version after
        `table`'s, with the `header` actions (commitInfo, txn) first. `previous(key)`:
        the row a key (key_of) had, for the change data feed's pre-images (typed, or in
        Redis's JSON form, decoded or as text, where rows_table.json_exact holds); a key
        it has none for is read from its file. `ready()` is called once the files are
        written, before the log commit: it may block until the commit is due, or raise
        to commit nothing (the files written are then deleted, and what it raised comes
        out of here)."""
        self._catch_up(table.version())
        config = table.metadata().configuration
        schema = plain_schema(table)
        upserts = rows_table(rows, schema)  # other fields ignored
        upserts = upserts.sort_by([(c, "ascending") for c in self.key])
        gone = rows_table(deleted, pa.schema([schema.field(c) for c in self.key]))
        upsert_keys = encode_keys(upserts, self.key)
        gone_keys = encode_keys(gone, self.key)
        marked, live = self._locate(
            np.concatenate([upsert_keys, gone_keys]) if len(gone_keys) else upsert_keys)

        now = int(time.time() * 1000)
        actions: list[dict[str, Any]] = [dict(a) for a in header]
        # The files this commit adds (name relative to the root -> bytes), all written
        # once encoded, before the log entry that names them.
        files: dict[str, Any] = {}
        new_file = None
        if upserts.num_rows:
            new_file = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
            actions.append({"add": {**encode_file(new_file, upserts, files),
                                    "modificationTime": now, "dataChange": True,
                                    "stats": file_stats(upserts)}})
        # Only with updates or deletes: readers take an insert-only commit's adds as inserts.
        if live and config.get("delta.enableChangeDataFeed") == "true":
            changes = self._changes(schema, upserts, upsert_keys, gone, gone_keys, live,
                                    previous)
            name = f"_change_data/cdc-{uuid.uuid4()}.c000.snappy.parquet"
            actions.append({"cdc": {**encode_file(name, changes, files), "dataChange": False}})
        vectors = {path: self._deleted(path) | rows for path, rows in marked.items()}
        actions += self._mark(vectors, files)
        upload(self.root, files)
        self._commit(table, actions, vectors, list(files),
                     [] if new_file is None else [(new_file, upsert_keys)], ready)

    def commit_written(self, table: DeltaTable, shares: Sequence[WrittenShare],
                       header: Sequence[Mapping[str, Any]],
                       ready: Callable[[], Any] = lambda: None) -> bool:
        """Commit the files Spark's tasks wrote of one batch (engine.task_delta) as the
        next version after `table`'s, with the `header` actions first: their adds and
        change data, and deletion vectors marking the rows they replace. False, committing
        nothing, when the rows the tasks replaced (found in Redis) are not exactly the
        live ones of the keys they changed: the caller then merges the batch's rows
        itself. `ready` as for merge; the tasks' files are deleted when it raises."""
        self._catch_up(table.version())
        changed = [s.changed for s in shares]
        marked, live = self._locate(np.concatenate(changed))
        if set(live) != {k for s in shares for k in s.replaced.tolist()}:
            return False
        now = int(time.time() * 1000)
        actions: list[dict[str, Any]] = [dict(a) for a in header]
        actions += [{"add": {**s.data, "modificationTime": now, "dataChange": True}}
                    for s in shares if s.data is not None]
        written = [name for s in shares for name in s.names()]
        # As merge: change data only with updates or deletes (the tasks cannot know).
        if live and table.metadata().configuration.get("delta.enableChangeDataFeed") == "true":
            actions += [{"cdc": {**s.change_data, "dataChange": False}}
                        for s in shares if s.change_data is not None]
        else:
            self.delete([s.change_data["path"] for s in shares if s.change_data is not None])
            written = [s.data["path"] for s in shares if s.data is not None]
        files: dict[str, Any] = {}
        vectors = {path: self._deleted(path) | rows for path, rows in marked.items()}
        actions += self._mark(vectors, files)
        upload(self.root, files)
        self._commit(table, actions, vectors, [*files, *written],
                     [(s.data["path"], s.keys) for s in shares if s.data is not None], ready)
        return True

    def _commit(self, table: DeltaTable, actions: list[dict[str, Any]],
                vectors: Mapping[str, BitMap], files: Sequence[str],
                added: Sequence[tuple[str, np.ndarray]], ready: Callable[[], Any]) -> None:
        """Commit `actions` once `ready()` returns (what it raises: `files`, the commit's
        files written, are deleted and nothing is committed), then take the new version in:
        the files' vectors, the `added` files' keys (name, keys in its rows' order), a
        log checkpoint when one is due."""
        version = self.files.version + 1
        try:
            ready()
        except BaseException:
            self.delete(files)  # no commit: its files would be nobody's
            raise
        commit(self.root, version, actions)

        self.files.apply(actions)
        self.files.version = version
        self._vectors.update(
            {path: (dv.unique_id(self.files.files[path]["deletionVector"]), rows)
             for path, rows in vectors.items()})
        for name, keys in added:
            self.index.add(name, keys)
        if added:
            self.index.settle()
        config = table.metadata().configuration
        checkpoint_interval = int(config.get("delta.checkpointInterval", 100))
        if version % checkpoint_interval == 0:
            table.update_incremental()
            table.create_checkpoint()

    def _locate(self, keys: np.ndarray
                ) -> tuple[dict[str, BitMap], dict[Any, tuple[str, int]]]:
        """Where the current versions of `keys` are: the rows to mark per file, and each
        found key's (file, row)."""
        marked: dict[str, BitMap] = {}
        live: dict[Any, tuple[str, int]] = {}
        for path, (positions, found) in self.index.find(keys).items():
            dead = self._deleted(path)
            for position, key in zip(positions.tolist(), found.tolist(), strict=True):
                if position not in dead:
                    marked.setdefault(path, BitMap()).add(position)
                    live[key] = (path, position)
        return marked, live

    def _mark(self, vectors: Mapping[str, BitMap], files: dict[str, Any]
              ) -> list[dict[str, Any]]:
        """The actions that give each file its new deletion vector: the file removed with
        its old vector, added again with the new one, all new vectors in one vector file
        (engine.sinks.deletion_vectors), which is added to `files` (to write)."""
        if not vectors:
            return []
        file_id = uuid.uuid4()
        data, places = dv.vector_file(list(vectors.values()))
        files[dv.file_name(file_id)] = data
        actions: list[dict[str, Any]] = []
        for (path, rows), (offset, size) in zip(vectors.items(), places, strict=True):
            old = self.files.files[path]
            # No deletionTimestamp (optional in the protocol): the file is not deleted, only
            # its old vector is, so nothing must keep this tombstone; log checkpoints drop it
            # at once instead of carrying one a touched file a batch for the whole history.
            # (The old vector's file is kept as long as the history needs it:
            # delete_released_vectors.)
            remove = {"path": path, "dataChange": True, "extendedFileMetadata": True,
                      "partitionValues": {}, "size": old["size"]}
            if old.get("deletionVector"):
                remove["deletionVector"] = old["deletionVector"]
            actions.append({"remove": remove})
            actions.append({"add": {**old, "dataChange": True, "stats": _loose(old.get("stats")),
                                    "deletionVector": dv.in_file(file_id, offset, size,
                                                                 len(rows))}})
        return actions

    def delete(self, names: Sequence[str]) -> None:
        """Delete files written and never committed (names relative to the root)."""
        for name in names:
            fs, path = filesystem(f"{self.root}/{name}")
            try:
                fs.delete_file(path)
            except FileNotFoundError:
                pass

    def _changes(self, schema: pa.Schema, upserts: pa.Table, upsert_keys: np.ndarray,
                 gone: pa.Table, gone_keys: np.ndarray, live: Mapping[Any, tuple[str, int]],
                 previous: Callable[[str], Mapping[str, Any] | bytes | None]) -> pa.Table:
        """The commit's change data: inserts, updates as pre- and post-images, deletes with
        the deleted row, as Delta's change data feed has them."""
        updated = [k in live for k in upsert_keys.tolist()]
        removed = [k for k in gone_keys.tolist() if k in live]
        old_keys = [k for k, is_update in zip(upsert_keys.tolist(), updated, strict=True)
                    if is_update] + removed
        old_names = (self._key_texts(upserts.filter(pa.array(updated, pa.bool_())))
                     + self._key_texts(gone.filter(pa.array(
                         [k in live for k in gone_keys.tolist()], pa.bool_()))))
        olds = self._previous_rows(schema, old_keys, old_names, live, previous)
        return change_rows(upserts, updated, olds, len(old_keys) - len(removed))

    def _key_texts(self, rows: pa.Table) -> list[str]:
        """key_of of each row: of one text column, the column's values themselves."""
        if len(self.key) == 1 and pa.types.is_string(rows.schema.field(self.key[0]).type):
            return rows.column(self.key[0]).to_pylist()
        return [key_of(r, self.key) for r in rows.select(self.key).to_pylist()]

    def _previous_rows(self, schema: pa.Schema, keys: Sequence[Any], names: Sequence[str],
                       live: Mapping[Any, tuple[str, int]],
                       previous: Callable[[str], Mapping[str, Any] | bytes | None]) -> pa.Table:
        """The current rows of `keys` (key_of names alike): from `previous` (what Redis
        held), the others read from their files (Redis lost them: rare)."""
        rows: list[Mapping[str, Any] | bytes | None] = [previous(name) for name in names]
        unknown: dict[str, list[int]] = {}
        for i, row in enumerate(rows):
            if row is None:
                unknown.setdefault(live[keys[i]][0], []).append(i)
        for path, indexes in unknown.items():
            fs, file = filesystem(f"{self.root}/{path}")
            stored = arrow_rows(pq.read_table(file, filesystem=fs, schema=schema).take(
                [live[keys[i]][1] for i in indexes]))
            for i, row in zip(indexes, stored, strict=True):
                rows[i] = row
        return rows_table(rows, schema)

    def _deleted(self, path: str) -> BitMap:
        entry = self._vectors.get(path)
        return entry[1] if entry is not None else BitMap()

    def _catch_up(self, version: int) -> None:
        """Follow commits others made (maintenance's OPTIMIZE, a metadata change) and learn
        the keys and deletion vectors of files not seen yet. The writer's own commits are
        applied as it makes them: with none from others, nothing to do."""
        if version == self.files.version:
            return
        if version < self.files.version or self.files.version < 0:
            self.files.load(version)
        else:
            try:
                self.files.advance(version)
            except FileNotFoundError:  # log entries cleaned up behind a checkpoint
                self.files.load(version)
        live = self.files.files
        self.index.keep_only(live)
        vector_files: dict[str, bytes] = {}
        for path, add in live.items():
            if path not in self.index:
                fs, file = filesystem(f"{self.root}/{path}")
                keys = pq.read_table(file, columns=list(self.key), filesystem=fs)
                self.index.add(path, encode_keys(keys, self.key))
            vector = add.get("deletionVector")
            known = self._vectors.get(path)
            if not vector:
                self._vectors.pop(path, None)
            elif known is None or known[0] != dv.unique_id(vector):
                self._vectors[path] = (dv.unique_id(vector),
                                       self._read_vector(vector, vector_files))
        self.index.settle()
        self._vectors = {p: v for p, v in self._vectors.items() if p in live}

    def _read_vector(self, vector: Mapping[str, Any], cache: dict[str, bytes]) -> BitMap:
        if vector["storageType"] == "i":
            return dv.read_inline(vector)
        name = dv.descriptor_file(vector)
        if name not in cache:
            cache[name] = read_bytes(f"{self.root}/{name}")
        return dv.decode_at(cache[name], vector["offset"], vector["sizeInBytes"])

    def rewrite(self, table: DeltaTable, target_bytes: int) -> tuple[int, int]:
        """Compaction: the small files (a batch writes one) and the files with PURGE_SHARE
        of their rows deleted, rewritten without the deleted rows into files of about
        `target_bytes`, ordered by key, in one commit (dataChange false: readers of changes
        skip it). Costs those files' rows, never the table's. (files removed, added)."""
        self._catch_up(table.version())
        chosen = self._due_for_rewrite(target_bytes)
        if len(chosen) < 2 and not any(self._deleted(p) for p in chosen):
            return 0, 0
        schema = plain_schema(table)
        rows = pa.concat_tables([self._live_rows(path, schema) for path in chosen])
        rows = rows.sort_by([(c, "ascending") for c in self.key])

        now = int(time.time() * 1000)
        actions: list[dict[str, Any]] = [{"commitInfo": {
            "timestamp": now, "operation": "OPTIMIZE", "clientVersion": "viewgate",
            "operationParameters": {"targetSize": str(target_bytes)}, "isBlindAppend": False}}]
        for path in chosen:
            old = self.files.files[path]
            remove = {"path": path, "dataChange": False, "deletionTimestamp": now,
                      "extendedFileMetadata": True, "partitionValues": {},
                      "size": old["size"]}
            if old.get("deletionVector"):
                remove["deletionVector"] = old["deletionVector"]
            actions.append({"remove": remove})
        added: list[tuple[str, np.ndarray]] = []
        files: dict[str, Any] = {}
        for piece in self._pieces(rows, chosen, target_bytes):
            name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
            actions.append({"add": {**encode_file(name, piece, files), "modificationTime": now,
                                    "dataChange": False, "stats": file_stats(piece)}})
            added.append((name, encode_keys(piece, self.key)))
        upload(self.root, files)
        version = self.files.version + 1
        commit(self.root, version, actions)

        self.files.apply(actions)
        self.files.version = version
        self.index.keep_only(self.files.files)
        for name, keys in added:
            self.index.add(name, keys)
        self.index.settle()
        self._vectors = {p: v for p, v in self._vectors.items() if p in self.files.files}
        return len(chosen), len(added)

    def _live_rows(self, path: str, schema: pa.Schema) -> pa.Table:
        """A file's rows without those its deletion vector marks."""
        fs, file = filesystem(f"{self.root}/{path}")
        data = pq.read_table(file, filesystem=fs, schema=schema)
        dead = self._deleted(path)
        if not dead:
            return data
        keep = np.ones(data.num_rows, dtype=bool)
        keep[np.asarray(dead.to_array(), dtype=np.int64)] = False
        return data.filter(pa.array(keep))

    def _pieces(self, rows: pa.Table, files: Sequence[str], target_bytes: int
                ) -> list[pa.Table]:
        """`rows` cut into files of about `target_bytes`, by the bytes a row took in
        `files`, all pieces alike in size."""
        if not rows.num_rows:
            return []
        stored = sum(self.files.files[p]["size"] for p in files)
        written = max(1, sum(_row_count(self.files.files[p]) for p in files))
        per_file = max(1, int(target_bytes / max(stored / written, 1.0)))
        size = math.ceil(rows.num_rows / math.ceil(rows.num_rows / per_file))
        return [rows.slice(start, size) for start in range(0, rows.num_rows, size)]

    def _due_for_rewrite(self, target_bytes: int) -> list[str]:
        """The files compaction rewrites: every small one (under half the target), then
        the ones with PURGE_SHARE of their rows deleted, most deleted first, within
        REWRITE_BUDGET_FILES target files' worth."""
        small, heavy = [], []
        for path, add in self.files.files.items():
            deleted = len(self._deleted(path))
            if add["size"] < target_bytes // 2:
                small.append(path)
            elif deleted and deleted >= PURGE_SHARE * _row_count(add):
                heavy.append((deleted / max(_row_count(add), 1), path))
        budget = REWRITE_BUDGET_FILES * target_bytes - sum(
            self.files.files[p]["size"] for p in small)
        chosen = list(small)
        for _, path in sorted(heavy, reverse=True):
            size = self.files.files[path]["size"]
            if size > budget:
                break
            chosen.append(path)
            budget -= size
        return chosen

    def delete_released_vectors(self, table: DeltaTable, retention_s: float,
                                clock: Callable[[], float] = time.time) -> list[str]:
        """Delete the vector files no version within `retention_s` uses. A file the latest
        version does not use was released at the latest when this first saw it unused (a
        restart starts counting again: late, never early); kept `retention_s` after that,
        as long as `asOf` can reach a version that used it."""
        self._catch_up(table.version())
        used = {dv.descriptor_file(add["deletionVector"]) for add in self.files.files.values()
                if (add.get("deletionVector") or {}).get("storageType") == "u"}
        fs, folder = filesystem(self.root)
        now = clock()
        present = set()
        deleted = []
        for info in fs.get_file_info(pyarrow.fs.FileSelector(folder)):
            name = info.base_name
            if info.type != pyarrow.fs.FileType.File or not _VECTOR_FILE.fullmatch(name):
                continue
            present.add(name)
            if name in used:
                self._released.pop(name, None)
                continue
            released = self._released.setdefault(name, now)
            if now - released >= retention_s:
                fs.delete_file(info.path)
                deleted.append(name)
        self._released = {n: t for n, t in self._released.items()
                          if n in present and n not in deleted}
        return deleted


def change_rows(upserts: pa.Table, updated: Sequence[bool], olds: pa.Table,
                preimages: int) -> pa.Table:
    """A commit's change data, as Delta's change data feed has it: the upserted rows
    (post-images where `updated`, else inserts), then the previous rows `olds` (their first
    `preimages` the updated rows' pre-images, the rest the deleted rows)."""
    return pa.concat_tables([
        upserts.append_column("_change_type", pa.array(
            ["update_postimage" if u else "insert" for u in updated], pa.string())),
        olds.append_column("_change_type", pa.array(
            ["update_preimage"] * preimages + ["delete"] * (olds.num_rows - preimages),
            pa.string()))])


def upload(root: str, files: Mapping[str, Any]) -> None:
    """Write a commit's files (name relative to the table's `root` -> bytes) into the
    table's folder, one request each on object storage: a bucket has no folders to make."""
    for name, data in files.items():
        fs, path = filesystem(f"{root.rstrip('/')}/{name}")
        if "/" in name and not is_remote(root):
            fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        with fs.open_output_stream(path, compression=None) as out:
            out.write(data)


def encode_file(name: str, data: pa.Table, files: dict[str, Any]) -> dict[str, Any]:
    """A Parquet file of `data`, encoded in memory into `files` under `name` (to write):
    its add (or cdc) action's fields. Its size is known without asking the store."""
    buffer = pa.BufferOutputStream()
    pq.write_table(data, buffer, compression="snappy")
    files[name] = buffer.getvalue()
    return {"path": name, "partitionValues": {}, "size": files[name].size}


def _row_count(add: Mapping[str, Any]) -> int:
    """A file's rows (deleted ones included), from its statistics."""
    stats = add.get("stats")
    return int(json.loads(stats).get("numRecords", 0)) if stats else 0


def _loose(stats: str | None) -> str | None:
    """A file's statistics once rows of it are deleted: its bounds may no longer be tight."""
    if not stats or '"tightBounds":false' in stats:
        return stats
    parsed = json.loads(stats)
    parsed["tightBounds"] = False
    return json.dumps(parsed, separators=(",", ":"))


def file_stats(data: pa.Table) -> str:
    """Delta statistics of a new file: rows, nulls, and min/max where they are exact."""
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name in data.column_names:
        column = data.column(name)
        kind = column.type
        if pa.types.is_nested(kind):
            continue
        nulls[name] = column.null_count
        if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)
                or pa.types.is_string(kind) or pa.types.is_date(kind)):
            continue
        bounds = pc.min_max(column)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if low is None or high is None:
            continue
        if isinstance(low, float) and not (math.isfinite(low) and math.isfinite(high)):
            continue
        if isinstance(low, str) and max(len(low), len(high)) > _STRING_STATS_MAX:
            continue
        if pa.types.is_date(kind):
            low, high = low.isoformat(), high.isoformat()
        mins[name], maxs[name] = low, high
    return json.dumps({"numRecords": data.num_rows, "minValues": mins, "maxValues": maxs,
                       "nullCount": nulls, "tightBounds": True}, separators=(",", ":"))
