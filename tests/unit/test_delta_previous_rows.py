"""The engine's Delta sink reads rows back by key (the previous rows of a batch when Redis
lost them), in the JSON form Redis stores: composite keys, timestamps, absent keys."""

from __future__ import annotations

import datetime

import pyarrow as pa
from deltalake import write_deltalake

from engine.sinks.delta_sink import DeltaSink
from schema import demo
from schema.storage import delta_app_id, key_of

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
