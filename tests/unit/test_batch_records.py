"""A graph batch's records per source (engine.batch_records): Spark's read taken column by
column from its Arrow table must give what the same records give as rows."""

from __future__ import annotations

import copy
import datetime

import pyarrow as pa
import pytest

from engine.batch_records import SourceRecords, take_rows, take_table
from engine.task_read import TopicLayout
from schema.arrow_rows import arrow_rows

UTC = pa.timestamp("us", tz="UTC")
ORDER = pa.struct([("order_id", pa.string()), ("customer_id", pa.string()),
                   ("amount", pa.float64()), ("ts", UTC), ("_corrupt", pa.string())])
# Its columns in another order than the source's: the event picks them (layout not `same`).
CUSTOMER = pa.struct([("tier", pa.string()), ("customer_id", pa.string()),
                      ("name", pa.string())])
BATCH = pa.schema([("_kafka_key", pa.string()), ("_raw", pa.binary()),
                   ("_topic", pa.string()), ("_partition", pa.int32()),
                   ("_offset", pa.int64()), ("_tombstone", pa.bool_()),
                   ("_error", pa.string()), ("_v0", ORDER), ("_v1", CUSTOMER)])
LAYOUT = {"orders": (TopicLayout("orders", "_v0", ("order_id", "customer_id", "amount", "ts"),
                                 True, "order_id"), True),
          "customers": (TopicLayout("customers", "_v1", ("customer_id", "name", "tier"),
                                    False, "customer_id"), False)}
T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def record(offset: int, topic: str, key: str | None, value: dict | None = None, *,
           error: str | None = None) -> dict:
    column = "_v0" if topic == "orders" else "_v1"
    return {"_kafka_key": key, "_raw": b"{oops" if error else None, "_topic": topic,
            "_partition": offset % 2, "_offset": offset, "_tombstone": value is None,
            "_error": error, "_v0": None, "_v1": None, column: value}


def order(key: str, amount: float, customer: str = "C1") -> dict:
    return {"order_id": key, "customer_id": customer, "amount": amount,
            "ts": T0 + datetime.timedelta(seconds=amount), "_corrupt": None}


BATCH_ROWS = [
    record(0, "orders", "O1", order("O1", 1.0)),
    record(1, "customers", "C1", {"tier": "gold", "customer_id": "C1", "name": "Ann"}),
    record(2, "orders", "O2", order("O2", 2.0)),
    record(3, "orders", None, order("O3", 3.0)),  # no Kafka key: its value's key field
    record(4, "orders", "O1", order("O1", 4.0, "C2")),  # the last record of O1 wins
    record(5, "orders", "O9", None, error="malformed JSON or a wrong type"),
    record(6, "orders", "O2", None),  # a tombstone
    record(7, "customers", "C2", None, error="missing key field customer_id"),
    record(8, "customers", "C1", {"tier": "silver", "customer_id": "C1", "name": "Ann"}),
]


def taken(take, batch) -> dict[str, SourceRecords]:
    records = {"orders": SourceRecords({}, []), "customers": SourceRecords({}, [])}
    by_topic = {topic: (records[layout.source], layout, stream)
                for topic, (layout, stream) in LAYOUT.items()}
    take(batch, by_topic)
    return records


def test_the_arrow_table_gives_what_its_rows_give():
    table = pa.Table.from_pylist(BATCH_ROWS, schema=BATCH)
    from_table = taken(take_table, table)
    assert from_table == taken(take_rows, arrow_rows(table))
    orders, customers = from_table["orders"], from_table["customers"]
    assert orders.latest == {"O1": {"order_id": "O1", "customer_id": "C2", "amount": 4.0,
                                    "ts": T0 + datetime.timedelta(seconds=4)},
                             "O2": None,
                             "O3": {"order_id": "O3", "customer_id": "C1", "amount": 3.0,
                                    "ts": T0 + datetime.timedelta(seconds=3)}}
    assert [e["amount"] for e in orders.events] == [1.0, 2.0, 3.0, 4.0]  # in order, no tombstone
    assert customers.latest == {"C1": {"customer_id": "C1", "name": "Ann", "tier": "silver"}}
    assert customers.events == []  # no stream aggregate reads customers
    # The bad records whole, every column, for the dead-letter topics.
    assert [(r["_offset"], r["_raw"], r["_error"]) for r in orders.bad] == [
        (5, b"{oops", "malformed JSON or a wrong type")]
    assert customers.bad == [arrow_rows(table)[7]]


def test_a_batch_of_one_topic_and_an_empty_batch():
    only_orders = [r for r in BATCH_ROWS if r["_topic"] == "orders"]
    table = pa.Table.from_pylist(only_orders, schema=BATCH)
    assert taken(take_table, table) == taken(take_rows, arrow_rows(table))
    empty = taken(take_table, BATCH.empty_table())
    assert empty["orders"] == SourceRecords({}, []) == empty["customers"]


def test_a_key_that_is_not_utf8_fails_before_anything_is_taken():
    rows = copy.deepcopy(BATCH_ROWS)
    table = pa.Table.from_pylist(rows, schema=BATCH)
    keys = table.column("_kafka_key").cast(pa.binary()).to_pylist()
    keys[8] = b"\xff\xfe"  # the last record: every source before it would be taken first
    table = table.set_column(0, "_kafka_key", pa.array(keys, pa.binary()).view(pa.string()))
    with pytest.raises(UnicodeDecodeError):
        taken(take_table, table)
    records = {"orders": SourceRecords({}, []), "customers": SourceRecords({}, [])}
    by_topic = {topic: (records[layout.source], layout, stream)
                for topic, (layout, stream) in LAYOUT.items()}
    with pytest.raises(UnicodeDecodeError):
        take_table(table, by_topic)
    assert records == {"orders": SourceRecords({}, []), "customers": SourceRecords({}, [])}
