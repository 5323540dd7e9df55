"""Python rows to an Arrow table, with the interpreter's lock held as little as possible.

`pa.Table.from_pylist` converts every value in C without releasing the lock: for one view's
13,500 rows, 12 to 100 ms in which no other thread of the engine runs. The MERGEs run
beside the Redis apply and the change feeds, whose threads then wait for the lock (a probe
on 2 cores: a thread waking every 2 ms beside it woke 5 ms late at the median, 46 ms at
worst; beside the JSON path below, 0.07 and 5 ms).

So a table whose columns JSON carries exactly is made from the rows as JSON lines, one
schema.storage.encode_row a row in a Python loop (other threads run between rows), parsed
by Arrow's JSON reader, which releases the lock. A row may be typed (datetimes), in Redis's
JSON form (ISO-8601 text), or Redis's text itself: all give the same table, so Delta's
pre-images are parsed from the bytes Redis returned, never decoded and encoded again.
Other columns (dates, decimals, binary, nested) go through `from_pylist`, whose rows must
then be typed.

One difference: JSON has no NaN or infinity, so a float that is one becomes null, as it
already is in Redis (schema.storage.encode_row).
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.json as pa_json

from schema.storage import encode_row


def _json_exact(kind: pa.DataType) -> bool:
    """Whether Arrow's JSON reader gives a column of this type the value from_pylist
    would (it reads dates only as day numbers, and decimals would pass through floats)."""
    return (pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or pa.types.is_boolean(kind) or pa.types.is_integer(kind)
            or pa.types.is_float32(kind) or pa.types.is_float64(kind)
            or (pa.types.is_timestamp(kind) and kind.unit == "us"))


def json_exact(schema: pa.Schema) -> bool:
    """Whether rows_table makes tables of `schema` from JSON (and so takes rows in JSON
    form as well as typed ones)."""
    return all(_json_exact(field.type) for field in schema)


def rows_table(rows: Iterable[Mapping[str, Any] | bytes], schema: pa.Schema) -> pa.Table:
    """The rows as a table of `schema`; fields the schema lacks are ignored, columns a row
    lacks are null. Raises pa.ArrowInvalid for a value the column's type cannot hold.
    Where json_exact(schema), a row may also be given as its JSON text (bytes, as Redis
    stores it)."""
    if not json_exact(schema):
        return pa.Table.from_pylist(list(rows), schema=schema)
    data = b"\n".join([row if type(row) is bytes else encode_row(row) for row in rows])
    if not data:
        return schema.empty_table()
    options = pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    # One block: the reader refuses a row longer than its block (13,500 rows are parsed
    # in about 15 ms).
    table = pa_json.read_json(io.BytesIO(data), parse_options=options,
                              read_options=pa_json.ReadOptions(block_size=len(data) + 1))
    return table.cast(schema)  # the reader's columns are all nullable; the schema's may not be
