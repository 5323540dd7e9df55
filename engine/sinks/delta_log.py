"""The files of a Delta table's latest version, replayed from its log, and new log entries.

A writer of deletion vectors must name, for each file it marks, the file's current
deletion vector and statistics exactly as the log holds them (the protocol identifies a
file by its path and its vector's id); delta-rs does not expose those, so this module reads
the log itself: the last checkpoint (Parquet), then the JSON commits after it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow.parquet as pq

from engine.sinks.deletion_vectors import unique_id
from schema.object_store import filesystem, read_bytes, read_text, write_new

# The add action's fields (a checkpoint's `add` struct may carry more, e.g. parsed stats).
ADD_FIELDS = ("path", "partitionValues", "size", "modificationTime", "dataChange", "stats",
              "tags", "deletionVector", "baseRowId", "defaultRowCommitVersion",
              "clusteringProvider")


def log_entry(root: str, version: int) -> str:
    return f"{root.rstrip('/')}/_delta_log/{version:020d}.json"


class ActiveFiles:
    """path -> the add action of each file in the table's version `version`."""

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")
        self.version = -1
        self.files: dict[str, dict[str, Any]] = {}

    def load(self, version: int) -> None:
        """Replay the log up to `version`, from its last checkpoint at or before it."""
        self.files = {}
        self.version = -1
        last = read_text(f"{self.root}/_delta_log/_last_checkpoint")
        checkpoint = json.loads(last) if last else None
        if checkpoint is not None and checkpoint["version"] <= version:
            self._read_checkpoint(checkpoint)
            self.version = checkpoint["version"]
        self.advance(version)

    def advance(self, version: int) -> None:
        """Apply the commits after the one replayed last, up to `version`."""
        for v in range(self.version + 1, version + 1):
            text = read_bytes(log_entry(self.root, v)).decode()
            self.apply(json.loads(line) for line in text.splitlines() if line.strip())
            self.version = v

    def apply(self, actions: Iterable[Mapping[str, Any]]) -> None:
        """One commit's actions. Its removes go first: a commit that gives a file a new
        deletion vector removes (path, old vector) and adds (path, new vector)."""
        actions = list(actions)
        for action in actions:
            remove = action.get("remove")
            if remove is None:
                continue
            current = self.files.get(remove["path"])
            if current is not None and (unique_id(current.get("deletionVector"))
                                        == unique_id(remove.get("deletionVector"))):
                del self.files[remove["path"]]
        for action in actions:
            add = action.get("add")
            if add is not None:
                self.files[add["path"]] = dict(add)

    def _read_checkpoint(self, checkpoint: Mapping[str, Any]) -> None:
        version, parts = checkpoint["version"], checkpoint.get("parts")
        names = ([f"{version:020d}.checkpoint.parquet"] if not parts else
                 [f"{version:020d}.checkpoint.{i:010d}.{parts:010d}.parquet"
                  for i in range(1, parts + 1)])
        for name in names:
            fs, path = filesystem(f"{self.root}/_delta_log/{name}")
            adds = pq.read_table(path, columns=["add"], filesystem=fs).column("add")
            for add in adds.filter(adds.is_valid()).to_pylist():
                self.files[add["path"]] = _plain_add(add)


def _plain_add(add: Mapping[str, Any]) -> dict[str, Any]:
    """A checkpoint's add struct in the JSON form of the log."""
    plain = {k: add[k] for k in ADD_FIELDS if add.get(k) is not None}
    values = plain.get("partitionValues")
    plain["partitionValues"] = dict(values) if values else {}
    if "deletionVector" in plain:
        plain["deletionVector"] = {k: v for k, v in plain["deletionVector"].items()
                                   if v is not None}
    return plain


def commit(root: str, version: int, actions: Iterable[Mapping[str, Any]]) -> None:
    """Write version `version` of the log; FileExistsError if another writer took it."""
    body = "\n".join(json.dumps(a, separators=(",", ":")) for a in actions) + "\n"
    write_new(log_entry(root, version), body.encode())
