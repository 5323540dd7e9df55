"""Reading a Delta table's rows with delta-rs, deletion vectors applied.

The engine writes deletion vectors (engine.sinks.dv_merge); delta-rs's pyarrow dataset
refuses tables that have them, its DataFusion query engine reads them. Shared by the
gateway (fallback reads, `asOf`) and the engine (dimensions, rows Redis missed).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder


def live_rows(table: DeltaTable, where: str | None = None) -> pa.Table:
    """Every live row of the version `table` has loaded (those meeting the SQL condition
    `where`, if given), strings as plain strings. FileNotFoundError if a file of that
    version is gone (vacuumed)."""
    sql = "SELECT * FROM t" + (f" WHERE {where}" if where else "")
    try:
        reader = QueryBuilder().register("t", table).execute(sql)
        data = pa.table(reader.read_all())
    except Exception as error:  # DataFusion's errors carry the object store's message
        if "not found" in str(error).lower() or "no such file" in str(error).lower():
            raise FileNotFoundError(str(error)) from error
        raise
    return plain_strings(data)


def plain_strings(data: pa.Table) -> pa.Table:
    """delta-rs reads strings as string_view, which pyarrow's compute kernels and Spark's
    Arrow conversion do not take everywhere."""
    return data.cast(_plain(data.schema))


def plain_schema(table: DeltaTable) -> pa.Schema:
    """The table's columns as Arrow types, strings as plain strings (what Parquet stores)."""
    return _plain(pa.schema(table.schema().to_arrow()))


def _plain(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, pa.string(), f.nullable)
                      if f.type in (pa.string_view(), pa.large_string()) else f
                      for f in schema])


def live_row_count(table: DeltaTable) -> int:
    """The number of live rows (file statistics count rows their deletion vectors mark)."""
    reader = QueryBuilder().register("t", table).execute("SELECT count(*) AS n FROM t")
    return int(pa.table(reader.read_all()).column("n")[0].as_py())


def values_filter(column: str, kind: pa.DataType, values: Iterable[Any]) -> str | None:
    """A SQL condition for `live_rows` that narrows a read to the rows whose `column` is
    one of `values` (None: is null), so that delta-rs skips the files whose statistics
    rule them out: text values against a text column, numbers against a numeric one. None
    (read everything) for other types; callers check the rows they get either way."""
    name = '"' + column.replace('"', '""') + '"'
    texts = pa.types.is_string(kind)  # plain_schema's types: no string_view here
    numbers = pa.types.is_integer(kind) or pa.types.is_floating(kind)
    literals = []
    nulls = False
    for value in values:
        if value is None:
            nulls = True
        elif texts and isinstance(value, str):
            literals.append("'" + value.replace("'", "''") + "'")
        elif numbers and isinstance(value, int | float) and not isinstance(value, bool):
            literals.append(repr(value))
        else:
            return None
    parts = [f"{name} IN ({', '.join(literals)})"] if literals else []
    if nulls:
        parts.append(f"{name} IS NULL")
    return " OR ".join(parts) or None
