"""A view over views reads its inputs' current rows from Delta by a column's values, reading
only the files whose statistics can hold them (engine.current_rows, through delta-rs's
query engine)."""

from __future__ import annotations

import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

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


def test_rows_by_key_read_only_the_files_that_can_hold_them(table):
    # The files of orders 0-99 and 200-299 are gone from disk: a read that opened them
    # would fail, so the read below proves they were skipped by their statistics.
    files = {f"O{first:05d}": uri for first, uri in zip(
        (0, 100, 200), sorted(DeltaTable(table).file_uris(),
                              key=lambda u: _first_order(u)), strict=True)}
    for first in ("O00000", "O00200"):
        Path(files[first].removeprefix("file://")).unlink()
    rows = DeltaRows(lambda _: table).rows_where("Order", "order_id", {"O00150", "O00151"})
    assert sorted(r["order_id"] for r in rows) == ["O00150", "O00151"]
    assert rows[0]["ts"] == WHEN and rows[0]["customer_id"] == "C2"


def _first_order(uri: str) -> str:
    return pq.read_table(uri.removeprefix("file://"), columns=["order_id"])["order_id"][0].as_py()


def test_rows_by_another_column_and_by_numbers(table):
    reader = DeltaRows(lambda _: table)
    assert len(reader.rows_where("Order", "customer_id", {"C3"})) == 100
    assert {r["order_id"] for r in reader.rows_where("Order", "amount", {5.0, 205})} == {
        "O00005", "O00205"}
    assert reader.rows_where("Order", "order_id", {"nope"}) == []
    # A table written since is seen by the next read.
    write_deltalake(table, _orders(300, 1, "C1"), mode="append")
    assert len(reader.rows_where("Order", "customer_id", {"C1"})) == 101
