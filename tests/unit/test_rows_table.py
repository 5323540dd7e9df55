"""Rows to Arrow for Delta's MERGE (engine.sinks.rows_table): through JSON, which releases the
interpreter's lock, the same table as pyarrow's from_pylist for typed rows, and for rows in
the JSON form Redis stores; from_pylist kept for the columns JSON cannot carry exactly."""

from __future__ import annotations

import datetime
import decimal
import math
import zoneinfo

import pyarrow as pa
import pytest
import strawberry
from deltalake import DeltaTable, write_deltalake

from engine.maintenance import configure_table
from engine.sinks.delta_sink import DeltaSink
from engine.sinks.rows_table import json_exact, rows_table
from schema import demo
from schema.catalog import View, ViewKind
from schema.storage import decode_row, delta_app_id, encode_row, key_of

UTC = datetime.UTC
SCHEMA = pa.schema([
    pa.field("id", pa.string(), nullable=False),
    ("n", pa.int64()),
    ("small", pa.int32()),
    ("amount", pa.float64()),
    ("ratio", pa.float32()),
    ("flag", pa.bool_()),
    ("at", pa.timestamp("us", tz="UTC")),
    ("local", pa.timestamp("us")),
])


def _typed_rows() -> list[dict]:
    return [
        {"id": 'a "quoted" \\ line\nbreak \u00e9 \U0001F600', "n": 2**62, "small": -5,
         "amount": 1.5, "ratio": 0.25, "flag": True,
         "at": datetime.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC),
         "local": datetime.datetime(2026, 1, 2, 3, 4, 5, 1)},
        # naive times are UTC (as Spark hands them over); another offset is converted;
        # the tz pyarrow itself gives (arrow_rows) is UTC too
        {"id": "b", "n": None, "amount": 3, "flag": False, "at": datetime.datetime(2026, 1, 2),
         "local": datetime.datetime(2026, 1, 2, 5, tzinfo=datetime.timezone(
             datetime.timedelta(hours=2)))},
        {"id": "c", "amount": -0.0, "ratio": 1e30,
         "at": datetime.datetime(2026, 1, 2, tzinfo=zoneinfo.ZoneInfo("UTC")),
         "ignored": {"not": "a column"}},
        {"id": "d"},
    ]


def _expected(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def test_typed_rows_make_the_table_from_pylist_makes():
    rows = _typed_rows()
    assert json_exact(SCHEMA)
    made = rows_table(rows, SCHEMA)
    assert made.schema == SCHEMA
    assert made.equals(_expected(rows))


def test_rows_in_redis_json_form_make_the_same_table():
    rows = _typed_rows()
    in_redis = [decode_row(encode_row(r)) for r in rows]
    assert isinstance(in_redis[0]["at"], str)
    assert rows_table(in_redis, SCHEMA).equals(_expected(rows))
    # and as Redis stores them (text), mixed with rows of either form
    mixed = [encode_row(rows[0]), in_redis[1], rows[2], encode_row(rows[3])]
    assert rows_table(mixed, SCHEMA).equals(_expected(rows))


def test_no_rows_and_a_thousand_rows():
    assert rows_table([], SCHEMA).equals(SCHEMA.empty_table())
    rows = [{"id": f"k{i}", "n": i, "amount": i / 7,
             "at": datetime.datetime(2026, 1, 1, tzinfo=UTC) + datetime.timedelta(seconds=i)}
            for i in range(1000)]
    assert rows_table(rows, SCHEMA).equals(_expected(rows))


def test_a_value_the_column_cannot_hold_is_refused():
    with pytest.raises(pa.ArrowInvalid):
        rows_table([{"id": "a", "n": "not a number"}], SCHEMA)


def test_not_a_number_becomes_null_as_in_redis():
    made = rows_table([{"id": "a", "amount": math.nan}], SCHEMA)
    assert made.column("amount").to_pylist() == [None]
    assert decode_row(encode_row({"amount": math.nan})) == {"amount": None}


@pytest.mark.parametrize("column", [
    pa.field("day", pa.date32()),
    pa.field("price", pa.decimal128(20, 4)),
    pa.field("tags", pa.list_(pa.string())),
])
def test_columns_json_cannot_carry_exactly_keep_from_pylist(column):
    schema = pa.schema([("id", pa.string()), column])
    value = {"day": datetime.date(2026, 3, 4),
             "price": decimal.Decimal("12345678901234.5678"), "tags": ["x", "y"]}[column.name]
    assert not json_exact(schema)
    rows = [{"id": "a", column.name: value}, {"id": "b"}]
    made = rows_table(rows, schema)
    assert made.equals(pa.Table.from_pylist(rows, schema=schema))
    assert made.column(column.name)[0].as_py() == value


@pytest.mark.parametrize("as_text", [False, True])
def test_pre_images_in_redis_json_form_reach_the_change_data_feed_typed(tmp_path, as_text):
    # ProductSales: a key with times; what Redis held before the batch is handed over in
    # its JSON form, and the change data feed's pre-image has the table's types.
    view = demo.PRODUCT_SALES
    schema = pa.schema([("product_id", pa.string()),
                        ("window_start", pa.timestamp("us", tz="UTC")),
                        ("window_end", pa.timestamp("us", tz="UTC")),
                        ("order_count", pa.int64()), ("revenue", pa.float64())])
    path = str(tmp_path / "ProductSales")
    write_deltalake(path, schema.empty_table(),
                    configuration={"delta.enableChangeDataFeed": "true"})
    configure_table(path, view, target_file_bytes=64 * 1024)
    sink = DeltaSink(path, view, delta_app_id(view.name, 0))
    start = datetime.datetime(2024, 1, 1, 0, 5)  # naive UTC, as Spark hands rows over
    row = {"product_id": "P1", "window_start": start,
           "window_end": start + datetime.timedelta(minutes=1), "order_count": 2,
           "revenue": 10.5}
    assert sink.merge(0, [row], [], view.key, metadata={"batch_id": 0})
    held = encode_row(dict(row, revenue=99.25))  # what Redis held, as it stores it
    if not as_text:
        held = decode_row(held)
    assert sink.merge(1, [dict(row, order_count=3, revenue=12.0)], [], view.key,
                      metadata={"batch_id": 1}, previous={key_of(row, view.key): held})
    changes = pa.table(DeltaTable(path).load_cdf(starting_version=DeltaTable(path).version()))
    by_type = {c["_change_type"]: c for c in changes.to_pylist()}
    assert set(by_type) == {"update_preimage", "update_postimage"}
    pre = by_type["update_preimage"]
    assert pre["window_start"] == start.replace(tzinfo=UTC)
    assert (pre["order_count"], pre["revenue"]) == (2, 99.25)
    assert by_type["update_postimage"]["revenue"] == 12.0



@strawberry.type
class Shipment:
    shipment_id: str
    due: datetime.date


def test_a_pre_image_with_a_date_is_decoded_with_the_views_types(tmp_path):
    # A date column keeps from_pylist, so a pre-image Redis handed over as text is decoded
    # with the view's field types first.
    view = View("Shipment", "shipments", "SELECT * FROM shipments", ("shipment_id",),
                Shipment, ViewKind.UPSERT)
    schema = pa.schema([("shipment_id", pa.string()), ("due", pa.date32())])
    assert not json_exact(schema)
    path = str(tmp_path / "Shipment")
    write_deltalake(path, schema.empty_table(),
                    configuration={"delta.enableChangeDataFeed": "true"})
    configure_table(path, view, target_file_bytes=64 * 1024)
    sink = DeltaSink(path, view, delta_app_id(view.name, 0))
    row = {"shipment_id": "S1", "due": datetime.date(2026, 3, 4)}
    assert sink.merge(0, [row], [], view.key, metadata={"batch_id": 0})
    held = encode_row(dict(row, due=datetime.date(2026, 3, 1)))  # as Redis stores it
    assert sink.merge(1, [dict(row, due=datetime.date(2026, 3, 9))], [], view.key,
                      metadata={"batch_id": 1}, previous={"S1": held})
    changes = pa.table(DeltaTable(path).load_cdf(starting_version=DeltaTable(path).version()))
    by_type = {c["_change_type"]: c["due"] for c in changes.to_pylist()}
    assert by_type == {"update_preimage": datetime.date(2026, 3, 1),
                       "update_postimage": datetime.date(2026, 3, 9)}
