"""A view over views reads its inputs' current rows from Delta by a column's values, reading
only the files whose statistics can hold them (engine.current_rows)."""

from __future__ import annotations

import datetime

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from engine import current_rows
from engine.current_rows import DeltaRows

SCHEMA = pa.schema([("order_id", pa.string()), ("customer_id", pa.string()),
                    ("amount", pa.float64()), ("ts", pa.timestamp("us", tz="UTC"))])
WHEN = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def _orders(first: int, count: int, customer: str) -> pa.Table:
    ids = range(first, first + count)
    return pa.table({"order_id": [f"O{i:05d}" for i in ids],
                     "customer_id": [customer] * count,
                     "amount": [float(i) for i in ids],
                     "ts": [WHEN] * count}, schema=SCHEMA)


@pytest.fixture
def table(tmp_path) -> str:
    path = str(tmp_path / "Order")
    # Three files, each its own range of order ids and one customer.
    for first, customer in ((0, "C1"), (100, "C2"), (200, "C3")):
        write_deltalake(path, _orders(first, 100, customer), mode="append")
    assert len(DeltaTable(path).file_uris()) == 3
    return path


def test_rows_by_key_read_only_the_files_that_can_hold_them(table, monkeypatch):
    read: list[str] = []
    real = current_rows.pq.read_table
    monkeypatch.setattr(current_rows.pq, "read_table",
                        lambda path, **kw: read.append(path) or real(path, **kw))
    rows = DeltaRows(lambda _: table).rows_where("Order", "order_id", {"O00150", "O00151"})
    assert sorted(r["order_id"] for r in rows) == ["O00150", "O00151"]
    assert len(read) == 1  # the file of orders 100-199 only
    assert rows[0]["ts"] == WHEN and rows[0]["customer_id"] == "C2"


def test_rows_by_another_column_and_by_numbers(table):
    reader = DeltaRows(lambda _: table)
    assert len(reader.rows_where("Order", "customer_id", {"C3"})) == 100
    assert {r["order_id"] for r in reader.rows_where("Order", "amount", {5.0, 205})} == {
        "O00005", "O00205"}
    assert reader.rows_where("Order", "order_id", {"nope"}) == []
    # A table written since is seen by the next read.
    write_deltalake(table, _orders(300, 1, "C1"), mode="append")
    assert len(reader.rows_where("Order", "customer_id", {"C1"})) == 101
