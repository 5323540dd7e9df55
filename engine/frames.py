"""Rows between Python and Spark through Arrow.

The graph query moves a batch's rows between the driver and Spark several times (the
batch itself, each view's input and output). Into Spark, Arrow costs a third of what
Python rows do (7,000 orders there and back: 170 ms against 530 ms, measured on 2 cores).
Out of Spark, Arrow wins for many rows only: collecting through Arrow runs the query as a
Spark job of its own, where collecting Spark's rows lets a query over local rows that
needs no shuffle (a projection, a filter) be answered by the optimizer with no job at all,
but costs more per row (a projection of 300 local rows: 43 ms collected, 63 ms through
Arrow; of 2,500 rows: 95 against 75 ms; measured on 2 cores, loaded).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType, TimestampType

from schema.arrow_rows import arrow_rows
from schema.storage import iso_utc

Row = dict[str, Any]


def frame_of(session: SparkSession, rows: Sequence[Mapping[str, Any]],
             schema: StructType) -> DataFrame:
    """`rows` as a DataFrame of `schema` (Spark runs in UTC: engine.spark). Rows may hold
    their values as Python types or in JSON form (times as ISO-8601 text, as Redis holds
    them): Arrow parses the text."""
    if not rows:
        return session.createDataFrame([], schema)
    arrow = to_arrow_schema(schema, timezone="UTC")
    columns = [_column([r.get(f.name) for r in rows], f.type) for f in arrow]
    return session.createDataFrame(pa.Table.from_arrays(columns, schema=arrow))


def _column(values: list[Any], kind: pa.DataType) -> pa.Array:
    if (pa.types.is_timestamp(kind) or pa.types.is_date(kind)) and any(
            isinstance(v, str) for v in values):
        # Text, or text and Python values mixed (an aggregate's previous rows are in JSON
        # form, its new ones as Spark gave them): all as text, which Arrow parses.
        return pa.array([_text(v) for v in values], pa.string()).cast(kind)
    return pa.array(values, kind)


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return iso_utc(value) if isinstance(value, datetime.datetime) else value.isoformat()


# Below this many input rows a query's answer is collected as Spark's rows, not Arrow's.
COLLECT_BELOW = 1_000


def rows_of(frame: DataFrame, rows_in: int | None = None) -> list[Row]:
    """The frame's rows as dicts (structs as dicts too). `rows_in`: how many rows the
    query reads, when known (its local relations): fewer than COLLECT_BELOW are collected
    as Spark's rows (see the module docstring), else through Arrow. Times come back in UTC
    either way (Spark's session and the engine's process run in UTC, engine.spark). Text
    that is not UTF-8 (a Kafka key of raw bytes) cannot become a Python str through Arrow;
    such a batch is collected again as Spark's rows, which decode it leniently."""
    if rows_in is not None and rows_in < COLLECT_BELOW:
        return spark_rows(frame)
    try:
        return arrow_rows(frame.toArrow())
    except UnicodeDecodeError:
        return spark_rows(frame)


def spark_rows(frame: DataFrame) -> list[Row]:
    """The frame's rows collected as Spark's rows, with times in UTC as Arrow gives them
    (PySpark hands a TIMESTAMP over naive, in the process's time zone: UTC here)."""
    zoned = [f.name for f in frame.schema.fields if isinstance(f.dataType, TimestampType)]
    rows = [row.asDict(recursive=True) for row in frame.collect()]
    for row in rows:
        for name in zoned:
            value = row[name]
            if value is not None:
                row[name] = value.replace(tzinfo=datetime.UTC)
    return rows
