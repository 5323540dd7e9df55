"""The engine's Delta sink: it reads rows back by key (the previous rows of a batch when
Redis lost them), in the JSON form Redis stores: composite keys, timestamps, absent keys;
and it records every batch id, a batch that changes no row included."""

from __future__ import annotations

import datetime

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from engine.sinks.delta_sink import DeltaSink
from gateway.reads.delta_store import AsOf, DeltaStore
from schema import demo
from schema.delta_read import live_rows
from schema.storage import delta_app_id, delta_table_path, key_of

SCHEMA = pa.schema([
    ("product_id", pa.string()),
    ("window_start", pa.timestamp("us", tz="UTC")),
    ("window_end", pa.timestamp("us", tz="UTC")),
    ("order_count", pa.int64()),
    ("revenue", pa.float64()),
])


def _window(minute: int) -> dict:
    start = datetime.datetime(2024, 1, 1, 0, minute)  # naive UTC, as Spark hands rows over
    return {"window_start": start, "window_end": start + datetime.timedelta(minutes=1)}


def test_rows_by_key_after_merges(tmp_path):
    view = demo.PRODUCT_SALES
    path = str(tmp_path / "ProductSales")
    write_deltalake(path, pa.Table.from_pylist([], schema=SCHEMA))
    sink = DeltaSink(path, view, delta_app_id(view.name, 0))
    first = [{"product_id": "P1", **_window(0), "order_count": 2, "revenue": 10.5},
             {"product_id": "P1", **_window(1), "order_count": 1, "revenue": 3.0},
             {"product_id": "P2", **_window(0), "order_count": 4, "revenue": 8.0}]
    assert sink.merge(0, first, [], view.key, metadata={"batch_id": 0})
    update = dict(first[0], order_count=3, revenue=12.0)
    assert sink.merge(1, [update], [], view.key, metadata={"batch_id": 1})

    keys = [key_of(r, view.key) for r in first]
    absent = key_of({"product_id": "P1", **_window(7)}, view.key)
    got = sink.rows([keys[0], keys[2], absent])
    assert set(got) == {keys[0], keys[2]}
    assert got[keys[0]] == {"product_id": "P1", "window_start": "2024-01-01T00:00:00Z",
                            "window_end": "2024-01-01T00:01:00Z", "order_count": 3,
                            "revenue": 12.0}
    assert got[keys[2]]["order_count"] == 4
    assert sink.rows([]) == {}
    assert sink.rows([absent]) == {}


def test_a_batch_without_rows_is_recorded_once(tmp_path):
    # Redis records every batch id; a re-warm waits until Delta's equals it, so Delta must
    # record the batches that changed nothing too (a watermark's no-data batch).
    view = demo.PRODUCT_SALES
    path = delta_table_path(str(tmp_path), view.name, 0)
    write_deltalake(path, pa.Table.from_pylist([], schema=SCHEMA))
    app_id = delta_app_id(view.name, 0)
    sink = DeltaSink(path, view, app_id)
    row = {"product_id": "P1", **_window(0), "order_count": 2, "revenue": 10.5}
    assert sink.merge(0, [row], [], view.key, metadata={"batch_id": 0})
    assert sink.merge(1, [], [], view.key, metadata={"batch_id": 1})
    assert not sink.merge(1, [], [], view.key, metadata={"batch_id": 1})  # a replay

    table = DeltaTable(path)
    assert table.transaction_version(app_id) == 1
    assert table.history(1)[0]["userMetadata"] == '{"batch_id": 1}'
    assert live_rows(table).num_rows == 1
    assert sink.rows([key_of(row, view.key)])[key_of(row, view.key)]["order_count"] == 2
    # What batches after a given one changed, from the change data feed: nothing after 0.
    assert sink.keys_changed_after(0) == set()
    assert sink.keys_changed_after(-1) == {key_of(row, view.key)}

    # The gateway reads that version (a query reported it from Redis) as of its batch id.
    rows, snapshot = DeltaStore(str(tmp_path)).read(view, as_of=AsOf(version=1))
    assert snapshot.batch == 1 and [r["order_count"] for r in rows] == [2]


def test_a_row_is_deleted_from_a_table_with_non_nullable_columns(tmp_path):
    # A view over views whose group disappears (every order of a customer cancelled):
    # CustomerStats declares count(*) non-nullable, and the deleted row carries its key only.
    view = demo.CATALOG.views["CustomerStats"]
    schema = pa.schema([pa.field("customer_id", pa.string(), nullable=False),
                        pa.field("order_count", pa.int64(), nullable=False),
                        pa.field("total_spent", pa.float64())])
    path = str(tmp_path / "CustomerStats")
    write_deltalake(path, pa.Table.from_pylist([], schema=schema))
    sink = DeltaSink(path, view, delta_app_id(view.name, 0))
    assert sink.merge(0, [{"customer_id": "C1", "order_count": 2, "total_spent": 5.0},
                          {"customer_id": "C2", "order_count": 1, "total_spent": 1.0}],
                      [], view.key, metadata={"batch_id": 0})
    assert sink.merge(1, [{"customer_id": "C2", "order_count": 2, "total_spent": 3.0}],
                      [{"customer_id": "C1"}], view.key, metadata={"batch_id": 1})
    rows = live_rows(DeltaTable(path)).to_pylist()
    assert rows == [{"customer_id": "C2", "order_count": 2, "total_spent": 3.0}]
