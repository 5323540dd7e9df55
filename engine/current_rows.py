"""The current rows of the views a view over views reads: from Redis, else from Delta.

The incremental step (engine.incremental) asks for an input's rows by one column's values:
the driving input by the view's key, the others by their join columns. Redis holds the
inputs' rows as the previous batch left them (the graph applies a batch to Redis once
every view of it is computed, engine.graph), with an index per declared `indexes` field
(the sorted sets the gateway filters with): a read by the key is one MGET, a read by an
indexed text column one ZRANGEBYLEX per value, then one MGET. These are the view's
arrangements: a read costs the rows it returns, however large the view. Over what Redis
(or Delta) answers lies the input's changes of this batch: a changed key's new row
replaces its stored one, a deleted key's row is gone.

Anything else (another column, a null value, a Redis that lost rows and has not been
re-warmed yet) is read from the view's Delta table through delta-rs's query engine, which
skips the files whose statistics (each file's min and max of the column) rule the values
out and applies deletion vectors: cheap by key (compaction writes files ordered by key,
engine.maintenance), often the whole table by another column.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from engine.incremental import json_value
from schema.arrow_rows import arrow_rows
from schema.catalog import View, graphql_fields
from schema.delta_read import live_rows, plain_schema, values_filter
from schema.redis_client import connect as connect_redis
from schema.storage import (
    INDEX_SEPARATOR,
    complete_field,
    decode_row,
    index_key,
    key_of,
    meta_key,
    row_key,
)

Row = dict[str, Any]


class DeltaRows:
    """`path_of(view)` gives the Delta table a view's rows are read from (its current
    generation). Each read sees the table's latest version, the previous batch's: the
    reader over it (RedisRows) lays the batch's changes over what it answers."""

    def __init__(self, path_of: Callable[[str], str]) -> None:
        self.path_of = path_of
        self._tables: dict[str, DeltaTable] = {}

    def close(self) -> None:
        self._tables.clear()

    def _table(self, view: str) -> DeltaTable:
        path = self.path_of(view)
        table = self._tables.get(path)
        if table is None:
            table = self._tables[path] = DeltaTable(path)
        else:
            table.update_incremental()
        return table

    def rows_where(self, table: str, column: str, values: set[Any]) -> list[Row]:
        if not values:
            return []
        delta = self._table(table)
        wanted = {json_value(v) for v in values}
        kind = plain_schema(delta).field(column).type
        data = live_rows(delta, values_filter(column, kind, wanted))
        return list(_matching(data, column, wanted))


def _matching(data: pa.Table, column: str, wanted: set[Any]) -> Iterable[Row]:
    """The rows whose `column` is one of `wanted` (None among them: the nulls too, as a
    GROUP BY groups them)."""
    if pa.types.is_string(data.schema.field(column).type):
        texts = pa.array([v for v in wanted if isinstance(v, str)], type=pa.string())
        found = pc.is_in(data[column], value_set=texts)
        if None in wanted:
            found = pc.or_(found, pc.is_null(data[column]))
        return arrow_rows(data.filter(found))
    return (row for row in arrow_rows(data) if json_value(row[column]) in wanted)


def redis_serves(view: View, column: str) -> bool:
    """Whether RedisRows reads `view`'s rows by `column` from Redis: its key, or an index
    of a text column (the sorted sets order members by text). Else Delta answers."""
    if view.key == (column,):
        return True
    info = graphql_fields(view).get(column)
    return column in view.indexes and info is not None and info.python_type is str


@dataclass(frozen=True)
class StoredTable:
    """What RedisRows needs of one view: its generation, key, and the columns Redis
    answers reads by (redis_serves). Picklable, with no GraphQL class, for Spark's tasks
    (engine.task_tables)."""

    generation: int
    key: tuple[str, ...]
    served: frozenset[str]

    @classmethod
    def of(cls, view: View, generation: int) -> StoredTable:
        return cls(generation, view.key,
                   frozenset(c for c in graphql_fields(view) if redis_serves(view, c)))


class Fallback(Protocol):
    """Where the rows Redis cannot answer come from (DeltaRows in the driver)."""

    def rows_where(self, table: str, column: str, values: set[Any]) -> list[Row]: ...

    def close(self) -> None: ...


Changes = Mapping[str, Mapping[str, Row | None]]  # view -> key text -> new row (None: gone)


class RedisRows:
    """Reads by the key or by an indexed text column from Redis (`client`, the `tables`
    it holds), the rest from `fallback`, with the batch's changes laid over them.
    Rows read from Redis are kept until the next `start_batch`: within one batch an
    input's rows do not change, and the incremental step reads some twice (found by a
    join column, then gathered by key)."""

    def __init__(self, client: Any, tables: Mapping[str, StoredTable],
                 fallback: Fallback) -> None:
        self.client = client
        self.tables = tables
        self.fallback = fallback
        self._read: dict[tuple[str, str], Row | None] = {}  # (view, key) -> row or absent
        self.changes: Changes = {}

    @classmethod
    def for_views(cls, redis_url: str, views: Mapping[str, View],
                  generations: Mapping[str, int], fallback: Fallback) -> RedisRows:
        """A reader with a client of its own, for the views of `generations`."""
        return cls(connect_redis(redis_url),
                   {n: StoredTable.of(views[n], g) for n, g in generations.items()
                    if n in views}, fallback)

    def close(self) -> None:
        self.client.close()
        self._read.clear()
        self.fallback.close()

    def start_batch(self, changes: Changes) -> None:
        """A new batch: drop the rows read so far, and lay `changes` (the inputs' changes
        of the batch, by key text, in any form key_of reads) over what is read from now."""
        self._read = {}
        self.changes = changes

    def rows_where(self, table: str, column: str, values: set[Any]) -> list[Row]:
        changed = self.changes.get(table)
        if not changed:
            return self._stored_where(table, column, values)
        key = self.tables[table].key
        unread = values
        if key == (column,):
            # By key: a key the batch changed is answered by its change, not read (a
            # throughput batch's orders: 13,500 rows not read from Redis).
            unread = {v for v in values if key_of({column: v}, key) not in changed}
        stored = [r for r in self._stored_where(table, column, unread)
                  if key_of(r, key) not in changed]
        wanted = {json_value(v) for v in values}
        return [*stored, *(r for r in changed.values()
                           if r is not None and json_value(r.get(column)) in wanted)]

    def _stored_where(self, table: str, column: str, values: set[Any]) -> list[Row]:
        """The rows the previous batch left (Redis, or the fallback)."""
        if not values:
            return []
        info = self.tables[table]
        generation = info.generation
        if (None in values or column not in info.served
                or not self.client.hexists(meta_key(table), complete_field(generation))):
            return self.fallback.rows_where(table, column, values)
        if info.key == (column,):
            keys = [key_of({column: v}, info.key) for v in values]
        else:
            keys = self._indexed_keys(table, generation, column, values)
        unread = [k for k in keys if (table, k) not in self._read]
        if unread:
            stored = self.client.mget([row_key(table, generation, k) for k in unread])
            # In JSON form, as Redis holds them: engine.frames parses times for Spark.
            self._read.update(((table, k), None if raw is None else decode_row(raw))
                              for k, raw in zip(unread, stored, strict=True))
        return [row for k in keys if (row := self._read[table, k]) is not None]

    def _indexed_keys(self, table: str, generation: int, column: str,
                      values: set[Any]) -> list[str]:
        index = index_key(table, generation, column)
        pipe = self.client.pipeline(transaction=False)
        for value in values:
            text = str(value).encode() + INDEX_SEPARATOR.encode()
            pipe.zrangebylex(index, b"[" + text, b"(" + text[:-1] + b"\x01")
        members = [m for found in pipe.execute() for m in found]
        return [m.decode().partition(INDEX_SEPARATOR)[2] for m in members]
