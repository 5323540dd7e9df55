"""The current rows of the views a view over views reads, from their Delta tables.

The incremental step (engine.incremental) asks for an input's rows by one column's values:
the driving input by the view's key, the others by their join columns. Only the files
whose statistics (each file's min and max of the column, in the Delta log) can hold one of
the values are read, so a read by key costs the files the keys fall in, not the table
(maintenance keeps files ordered by key, engine.maintenance). A read by another column
prunes what the statistics allow, which for a column unrelated to the key is often little.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable

from engine.incremental import json_form

Row = dict[str, Any]


class DeltaRows:
    """`path_of(view)` gives the Delta table a view's rows are read from (its current
    generation). Each read sees the table's latest version: the views a batch reads were
    committed earlier in the same batch (engine.graph)."""

    def __init__(self, path_of: Callable[[str], str]) -> None:
        self.path_of = path_of
        self._tables: dict[str, DeltaTable] = {}

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
        wanted = {json_form({column: v})[column] for v in values}
        files = _files_that_may_hold(delta, column, wanted)
        if not files:
            return []
        root = delta.table_uri.removeprefix("file://").rstrip("/")
        schema = pa.schema(delta.schema().to_arrow())
        data = pa.concat_tables(
            [_plain(pq.read_table(f"{root}/{path}", schema=_plain_schema(schema)))
             for path in files])
        return list(_matching(data, column, wanted))


def _files_that_may_hold(table: DeltaTable, column: str, wanted: set[Any]) -> list[str]:
    """The live files whose [min, max] of `column` contains one of `wanted` (files
    without statistics for it are always read)."""
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    low, high = f"min.{column}", f"max.{column}"
    out = []
    for action in actions:
        lo, hi = action.get(low), action.get(high)
        if _comparable(lo, hi, wanted) and not any(lo <= v <= hi for v in wanted):
            continue
        out.append(action["path"])
    return out


def _comparable(low: Any, high: Any, wanted: set[Any]) -> bool:
    """Whether the statistics can rule a file out: only text against text and numbers
    against numbers (other types, or missing statistics, read the file)."""
    for kind in (str, (int, float)):
        if all(isinstance(v, kind) and not isinstance(v, bool) for v in (low, high, *wanted)):
            return True
    return False


def _plain_schema(schema: pa.Schema) -> pa.Schema:
    """delta-rs writes strings as string_view, which pyarrow's kernels cannot compare."""
    return pa.schema([pa.field(f.name, pa.string(), f.nullable)
                      if f.type in (pa.string_view(), pa.large_string()) else f
                      for f in schema])


def _plain(data: pa.Table) -> pa.Table:
    return data.cast(_plain_schema(data.schema))


def _matching(data: pa.Table, column: str, wanted: set[Any]) -> Iterable[Row]:
    """The rows whose `column` is one of `wanted` (None among them: the nulls too, as a
    GROUP BY groups them)."""
    if pa.types.is_string(data.schema.field(column).type):
        texts = pa.array([v for v in wanted if isinstance(v, str)], type=pa.string())
        found = pc.is_in(data[column], value_set=texts)
        if None in wanted:
            found = pc.or_(found, pc.is_null(data[column]))
        return data.filter(found).to_pylist()
    return (row for row in data.to_pylist() if json_form({column: row[column]})[column] in wanted)

