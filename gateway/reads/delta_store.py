"""Reading views from their Delta tables with delta-rs (no JVM): the fallback when Redis
misses, is empty or is down, and the source of time travel (`asOf`).

Reads are blocking; callers run them in a worker thread. Rows come back in the stored
JSON form (schema.storage.encode_row), the same as Redis rows.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from gateway.reads.filters import Condition, QueryError
from schema.arrow_rows import arrow_rows
from schema.catalog import View
from schema.delta_read import live_rows, plain_schema, values_filter
from schema.storage import (
    commit_batch_id,
    delta_app_id,
    delta_table_path,
    encode_row,
    key_of,
    parse_key,
    read_current_generation,
)


@dataclass(frozen=True)
class AsOf:
    """A point in a view's history: its version (batch id), a Delta version or a time."""

    version: int | None = None
    delta_version: int | None = None
    timestamp: datetime.datetime | None = None


@dataclass(frozen=True)
class Snapshot:
    """The Delta table version a read saw."""

    generation: int
    delta_version: int
    batch: int  # the view version (engine batch id) it holds; -1 before the first batch
    committed_at_ms: int


class DeltaStore:
    def __init__(self, delta_root: str) -> None:
        self.delta_root = delta_root
        self._tables: dict[tuple[str, int], DeltaTable] = {}
        self._lock = threading.Lock()

    def generation(self, view: str) -> int:
        return read_current_generation(self.delta_root, view)

    def _latest(self, view: str) -> tuple[DeltaTable, int]:
        generation = self.generation(view)
        key = (view, generation)
        table = self._tables.get(key)
        try:
            if table is None:
                table = DeltaTable(delta_table_path(self.delta_root, view, generation))
                self._tables[key] = table
            else:
                table.update_incremental()
        except TableNotFoundError:
            raise QueryError(f"view {view} has no Delta table yet: the engine has not "
                             f"created it", "VIEW_NOT_READY", view=view) from None
        return table, generation

    def _at(self, view: View, as_of: AsOf) -> tuple[DeltaTable, int]:
        """The view's table loaded at `as_of`. A point older than what the table still
        holds (maintenance removes log entries and files older than the view's `history`)
        is BAD_AS_OF naming that setting (beyond_history)."""
        name = view.name
        generation = self.generation(name)
        path = delta_table_path(self.delta_root, name, generation)
        try:
            table = DeltaTable(path)
        except TableNotFoundError:
            raise QueryError(f"view {name} has no Delta table yet", "VIEW_NOT_READY",
                             view=name) from None
        try:
            if as_of.delta_version is not None:
                if not 0 <= as_of.delta_version <= table.version():
                    raise QueryError(
                        f"{name} has Delta versions 0 to {table.version()}, not "
                        f"{as_of.delta_version}", "BAD_AS_OF", view=name)
                table.load_as_version(as_of.delta_version)
            elif as_of.timestamp is not None:
                # delta-rs loads the oldest version it still has for an earlier time.
                oldest = min(table.history(), key=lambda c: c["version"])
                if oldest["version"] > 0 and _millis(as_of.timestamp) < int(
                        oldest.get("timestamp") or 0):
                    raise beyond_history(view, as_of)
                table.load_as_version(as_of.timestamp)
            else:
                assert as_of.version is not None
                table.load_as_version(self._delta_version_of_batch(view, table, as_of.version))
        except DeltaError:  # its log entries are gone ("No files in log segment")
            raise beyond_history(view, as_of) from None
        return table, generation

    def _delta_version_of_batch(self, view: View, table: DeltaTable, batch: int) -> int:
        """The last Delta version holding batches up to `batch` (the engine records the
        batch id in each commit's userMetadata)."""
        best, newest, oldest = None, -1, None
        for commit in table.history():
            oldest = commit["version"] if oldest is None else min(oldest, commit["version"])
            batch_id = commit_batch_id(commit)
            if batch_id is None:
                continue
            newest = max(newest, batch_id)
            if batch_id <= batch and (best is None or commit["version"] > best):
                best = commit["version"]
        if batch > newest:
            raise QueryError(
                f"{view.name} has no version {batch} in Delta: it holds versions up to "
                f"{newest} (the newest versions reach Delta moments after Redis)", "BAD_AS_OF",
                view=view.name, newest=newest)
        if best is None:
            if oldest:  # the log no longer starts at Delta version 0: older ones were removed
                raise beyond_history(view, AsOf(version=batch))
            raise QueryError(f"{view.name} has no version {batch}: it was created later",
                             "BAD_AS_OF", view=view.name)
        return best

    def _snapshot(self, view: str, table: DeltaTable, generation: int) -> Snapshot:
        version = table.version()
        batch = table.transaction_version(delta_app_id(view, generation))
        latest = table.history(1)[0]["version"]
        commit = table.history(latest - version + 1)[-1]
        return Snapshot(generation, version, -1 if batch is None else int(batch),
                        int(commit.get("timestamp") or 0))

    def read(self, view: View, conditions: Sequence[Condition] = (),
             keys: Sequence[str] | None = None,
             as_of: AsOf | None = None) -> tuple[list[dict[str, Any]], Snapshot]:
        """Rows meeting `conditions` (the caller re-checks them exactly), or with the
        given keys; at `as_of` or the latest version."""
        with self._lock:  # one DeltaTable object per table, shared: update it alone
            table, generation = (self._at(view, as_of) if as_of is not None
                                 else self._latest(view.name))
            snapshot = self._snapshot(view.name, table, generation)
            where = None
            if keys is not None and len(view.key) == 1:  # pushed down: files pruned
                kind = plain_schema(table).field(view.key[0]).type
                where = values_filter(view.key[0], kind, [parse_key(view, k)[0] for k in keys])
            try:
                data = live_rows(table, where)
            except FileNotFoundError:
                if as_of is None:
                    raise
                raise beyond_history(view, as_of) from None  # an old version's files vacuumed
        schema = data.schema
        expression = _keys_expression(view, keys, schema) if keys is not None else None
        for c in conditions:
            part = _condition_expression(c, schema)
            expression = part if expression is None else expression & part
        # Filtered after the read: deletion vectors apply by row position, before any filter.
        if expression is not None:
            data = data.filter(expression)
        rows = [orjson.loads(encode_row(r)) for r in arrow_rows(data)]
        if keys is not None:
            wanted = set(keys)
            rows = [r for r in rows if key_of(r, view.key) in wanted]
        return rows, snapshot


def beyond_history(view: View, as_of: AsOf) -> QueryError:
    return QueryError(
        f"{view.name} keeps {view.history} of history (the view's `history` setting): "
        f"{_describe(as_of)} is older than the oldest version its Delta table still holds. "
        f"To reach further back, declare a longer history on the view "
        f"(View(..., history=\"7 days\")); what is already gone stays gone",
        "BAD_AS_OF", view=view.name, history=view.history)


def _millis(moment: datetime.datetime) -> float:
    """Epoch milliseconds of a time (one without a zone is UTC)."""
    return (moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)).timestamp() * 1000


def _describe(as_of: AsOf) -> str:
    if as_of.delta_version is not None:
        return f"Delta version {as_of.delta_version}"
    if as_of.timestamp is not None:
        return as_of.timestamp.isoformat()
    return f"version {as_of.version}"


def _scalar(value: Any, column: str, schema: pa.Schema) -> pa.Scalar:
    return pa.scalar(value, type=schema.field(column).type)


def _condition_expression(c: Condition, schema: pa.Schema) -> pc.Expression:
    column = pc.field(c.field)
    if c.op == "in":
        return column.isin(pa.array(list(c.value), type=schema.field(c.field).type))
    if c.op == "prefix":
        return pc.starts_with(column, pattern=c.value)
    value = _scalar(c.value, c.field, schema)
    return {"eq": column == value, "lt": column < value, "lte": column <= value,
            "gt": column > value, "gte": column >= value}[c.op]


def _keys_expression(view: View, keys: Sequence[str], schema: pa.Schema) -> pc.Expression:
    values = [parse_key(view, k) for k in keys]
    expression = None
    for i, column in enumerate(view.key):
        part = pc.field(column).isin(pa.array([v[i] for v in values],
                                              type=schema.field(column).type))
        expression = part if expression is None else expression & part
    return expression
