"""Reading a Delta table's rows with delta-rs, deletion vectors applied.

The engine writes deletion vectors (engine.sinks.dv_merge); delta-rs's pyarrow dataset
refuses tables that have them, its DataFusion query engine reads them. Shared by the
gateway (fallback reads, `asOf`) and the engine (dimensions, rows Redis missed).
"""

from __future__ import annotations

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
    fields = [pa.field(f.name, pa.string(), f.nullable)
              if f.type in (pa.string_view(), pa.large_string()) else f
              for f in data.schema]
    return data.cast(pa.schema(fields))


def live_row_count(table: DeltaTable) -> int:
    """The number of live rows (file statistics count rows their deletion vectors mark)."""
    reader = QueryBuilder().register("t", table).execute("SELECT count(*) AS n FROM t")
    return int(pa.table(reader.read_all()).column("n")[0].as_py())
