"""The graph's read folded in Spark's tasks (engine.task_read), over Arrow batches shaped as
the graph query's (engine.sources.classify_sources), without Spark: what the tasks hand the
driver must be what the driver would have made of every record itself."""

from __future__ import annotations

import datetime

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from engine.driver_sql import OutsideSubset
from engine.sinks.redis_sink import Before
from engine.sources import record_key
from engine.stream_aggregates import EventFold, Seen, StreamAggregate
from engine.task_read import EVENT, TaskFold, TaskRead, TopicLayout
from engine.task_upsert import TaskUpsert
from schema.demo import CATALOG

ORDERS = StructType([StructField("order_id", StringType()),
                     StructField("customer_id", StringType()),
                     StructField("product_id", StringType()),
                     StructField("amount", DoubleType()),
                     StructField("status", StringType()),
                     StructField("ts", TimestampType())])
CUSTOMERS = StructType([StructField(c, StringType())
                        for c in ("customer_id", "name", "tier", "country")])
BATCH = StructType([StructField("_kafka_key", StringType()),
                    StructField("_raw", BinaryType()),
                    StructField("_topic", StringType(), False),
                    StructField("_partition", IntegerType(), False),
                    StructField("_offset", LongType(), False),
                    StructField("_tombstone", BooleanType(), False),
                    StructField("_error", StringType()),
                    StructField("_v0", ORDERS), StructField("_v1", CUSTOMERS)])
SALES = StructType([StructField("product_id", StringType()),
                    StructField("window_start", TimestampType()),
                    StructField("window_end", TimestampType()),
                    StructField("order_count", LongType()),
                    StructField("revenue", DoubleType())])
LAYOUT = {"orders": TopicLayout("orders", "_v0", tuple(ORDERS.fieldNames()), True, "order_id"),
          "customers": TopicLayout("customers", "_v1", tuple(CUSTOMERS.fieldNames()), True,
                                   "customer_id")}
T0 = datetime.datetime(2024, 1, 1, 0, 10, tzinfo=datetime.UTC)


def _stream() -> StreamAggregate:
    view = CATALOG.views["ProductSales"]
    return StreamAggregate(view, CATALOG.sources["orders"], ORDERS)


def _order(offset: int, key: str, product: str, amount: float, seconds: int,
           status: str = "placed") -> dict:
    return {"_kafka_key": key, "_raw": None, "_topic": "orders", "_partition": 0,
            "_offset": offset, "_tombstone": False, "_error": None,
            "_v0": {"order_id": key, "customer_id": "C1", "product_id": product,
                    "amount": amount, "status": status,
                    "ts": T0 + datetime.timedelta(seconds=seconds)},
            "_v1": None}


def _other(offset: int, key: str | None, topic: str, *, tombstone: bool = False,
           error: str | None = None) -> dict:
    return {"_kafka_key": key, "_raw": b"not json" if error else None, "_topic": topic,
            "_partition": 0, "_offset": offset, "_tombstone": tombstone, "_error": error,
            "_v0": None, "_v1": None}


def _fold(read: TaskRead, tasks: list[list[dict]], seen: datetime.datetime | None):
    """Each list of rows folded as one task would, their outputs collected together."""
    output = to_arrow_schema(read.output_schema(BATCH), timezone="UTC")
    fold = TaskFold(LAYOUT, [("orders", s.fold, seen) for s in read.streams], output)
    batches = []
    for rows in tasks:
        table = pa.Table.from_pylist(rows, schema=to_arrow_schema(BATCH, timezone="UTC"))
        batches += list(fold(iter(table.to_batches())))
    return read.collected(pa.Table.from_batches(batches, schema=output), len(BATCH.fields))


def _stored(keys: list[str]) -> Before:
    return Before({}, None, True)


def test_a_task_keeps_each_keys_last_record_and_every_bad_one_in_order():
    read = TaskRead([_stream()], {"ProductSales": SALES})
    rows = [_order(0, "O1", "P1", 1.0, 0), _order(1, "O2", "P1", 2.0, 1),
            _other(2, "O1", "orders", tombstone=True), _other(3, None, "orders", error="bad"),
            _order(4, "O2", "P2", 5.0, 2), _other(5, "C1", "customers", error="malformed")]
    folded = _fold(read, [rows], None)
    got = [(r["_offset"], r["_kafka_key"], r["_tombstone"], r["_error"], r[EVENT])
           for r in folded.records]
    assert got == [(2, "O1", True, None, False), (3, None, False, "bad", False),
                   (4, "O2", False, None, False), (5, "C1", False, "malformed", False)]
    assert folded.records[2]["_v0"]["product_id"] == "P2"


def test_what_the_tasks_fold_is_what_the_driver_computes_from_every_event():
    stream = _stream()
    read = TaskRead([stream], {"ProductSales": SALES})
    first = [_order(0, "O1", "P1", 1.5, 0), _order(1, "O2", "P2", 2.0, 10),
             _order(2, "O3", "P1", 4.0, 70), _order(3, "O4", "P1", 9.0, 5, "cancelled")]
    second = [_order(0, "O5", "P1", 3.0, 20), _order(1, "O6", "P2", 7.0, 15),
              _order(2, "O5", "P1", 3.0, 80)]  # the same order again: an event each time
    seen = Seen(None, 0)
    folded = _fold(read, [first, second], seen.max_event_time)
    tasks = stream.finish(folded.partials["ProductSales"], seen, _stored)
    events = [r["_v0"] for r in first + second]
    driver = stream.batch(None, events, seen, _stored)  # the driver's own path (no Spark)

    def by_key(rows):
        return sorted((r["product_id"], r["window_start"], r["order_count"], r["revenue"])
                      for r in rows)
    assert by_key(tasks.rows) == by_key(driver.rows)
    assert ("P1", T0, 2, 4.5) in by_key(tasks.rows)  # O1 and O5, from two tasks
    assert tasks.meta == driver.meta


def test_late_events_are_counted_by_the_tasks_against_the_watermark_before_the_batch():
    stream = _stream()
    read = TaskRead([stream], {"ProductSales": SALES})
    seen = Seen(T0 + datetime.timedelta(minutes=5), 3)  # watermark: T0 + 4m30s
    on_time = _order(0, "O1", "P1", 1.0, 300)
    late = _order(1, "O2", "P1", 2.0, 0)
    newest = _order(0, "O3", "P2", 4.0, 400)
    folded = _fold(read, [[on_time, late], [newest]], seen.max_event_time)
    done = stream.finish(folded.partials["ProductSales"], seen, _stored)
    assert done.late == 1
    assert done.meta["late_events"] == 4
    assert done.meta["max_event_time"] == "2024-01-01T00:16:40Z"
    assert sorted(r["product_id"] for r in done.rows) == ["P1", "P2"]


def test_a_task_that_needs_spark_hands_its_events_to_the_driver(monkeypatch):
    stream = _stream()
    read = TaskRead([stream], {"ProductSales": SALES})

    def refuse(self, events, seen):
        raise OutsideSubset("BIGINT overflow")
    monkeypatch.setattr(EventFold, "partial", refuse)
    rows = [_order(0, "O1", "P1", 1.0, 0), _order(1, "O1", "P1", 2.0, 1),
            _order(2, "O2", "P1", 3.0, 2)]
    folded = _fold(read, [rows], None)
    assert [(r["_offset"], r[EVENT]) for r in folded.records] == [(0, True), (1, True),
                                                                 (2, True)]
    assert folded.partials["ProductSales"] == []  # no task folded: the driver does it all


def test_a_kafka_key_that_is_not_utf8_is_one_key_decoded_leniently():
    read = TaskRead([_stream()], {"ProductSales": SALES})
    rows = [_order(0, "K", "P1", 1.0, 0), _order(1, "K", "P1", 2.0, 1)]
    schema = to_arrow_schema(BATCH, timezone="UTC")
    table = pa.Table.from_pylist(rows, schema=schema)
    raw = pa.array([b"\xff\xfe", b"\xff\xfe"], pa.binary()).view(pa.string())
    table = table.set_column(schema.get_field_index("_kafka_key"), schema.field("_kafka_key"),
                             raw)
    output = to_arrow_schema(read.output_schema(BATCH), timezone="UTC")
    fold = TaskFold(LAYOUT, [("orders", s.fold, None) for s in read.streams], output)
    folded = read.collected(pa.Table.from_batches(list(fold(iter(table.to_batches()))),
                                                  schema=output), len(BATCH.fields))
    assert [(r["_offset"], r["_kafka_key"]) for r in folded.records] == [(1, "\ufffd\ufffd")]


def test_a_batch_is_folded_by_its_tasks_only_when_it_is_large(tmp_path):
    """GraphBatch._by_tasks: its size from its end offsets and where it starts (the previous
    batch's ends, GraphBatch._starts: read from the checkpoint, then kept); a batch of
    unknown size is folded."""
    from types import SimpleNamespace

    from engine.graph import GraphBatch

    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "4").write_text('v1\n{}\n{"orders":{"0":100,"1":100}}\n')
    graph = SimpleNamespace(task_read=object(), task_read_min_records=50, _ends=None,
                            checkpoint=str(tmp_path))

    def by_tasks(batch_id, ends):
        return GraphBatch._by_tasks(graph, GraphBatch._starts(graph, batch_id, ends), ends)
    assert by_tasks(5, {"orders": {"0": 130, "1": 130}})  # 60 records, from the file
    assert not by_tasks(6, {"orders": {"0": 150, "1": 150}})  # 40, from batch 5's ends
    assert by_tasks(7, None)  # no offsets known (a batch run outside a query)
    assert by_tasks(9, {"orders": {"0": 151, "1": 151}})  # batch 8 not in the checkpoint
    graph.task_read = None
    assert not by_tasks(10, {"orders": {"0": 999, "1": 999}})  # the setting is off


def test_records_without_a_kafka_key_are_told_apart_by_their_values_key():
    read = TaskRead([_stream()], {"ProductSales": SALES})
    keyless = [_order(0, "O1", "P1", 1.0, 0), _order(1, "O2", "P1", 2.0, 1),
               _order(2, "O1", "P1", 3.0, 2), _order(3, "O3", "P1", 4.0, 3)]
    for row in keyless[:3]:
        row["_kafka_key"] = None
    folded = _fold(read, [keyless], None)
    # O1's second keyless record wins over its first; O2 is kept; O3 is keyed.
    assert [(r["_offset"], r["_v0"]["order_id"]) for r in folded.records] == [
        (1, "O2"), (2, "O1"), (3, "O3")]
    assert [record_key(r["_kafka_key"], r["_v0"], "order_id") for r in folded.records] == [
        "O2", "O1", "O3"]



class _Upsert:
    """An upsert view's step as a task runs it (engine.task_upsert.UpsertInTask), answering
    as told: the routing of the records is under test here, not the view."""

    def __init__(self, ok: bool) -> None:
        self.view, self.ok, self.seen = "Customer", ok, []

    def compute(self, latest, batch_id, now_ms, routed=False):
        self.seen.append(dict(latest))
        return TaskUpsert(self.ok, b"[]", (b"{}",) if self.ok else ())


def _fold_upserts(upsert: _Upsert, needed=()):
    read = TaskRead([_stream()], {"ProductSales": SALES}, [("customers", upsert)])
    output = to_arrow_schema(read.output_schema(BATCH), timezone="UTC")
    fold = TaskFold(LAYOUT, [("orders", s.fold, None) for s in read.streams], output,
                    [("customers", upsert, True)], 7, 0, needed)
    rows = [_order(0, "O1", "P1", 1.0, 0), _other(1, "C1", "customers", tombstone=True),
            _other(2, None, "customers", error="bad"), _other(3, "C2", "customers",
                                                             tombstone=True)]
    table = pa.Table.from_pylist(rows, schema=to_arrow_schema(BATCH, timezone="UTC"))
    return read.collected(pa.Table.from_batches(list(fold(iter(table.to_batches()))),
                                                schema=output), len(BATCH.fields))


def test_a_task_keeps_back_the_records_of_the_views_it_computed():
    upsert = _Upsert(ok=True)
    folded = _fold_upserts(upsert)
    assert upsert.seen == [{"C1": None, "C2": None}]  # the last record per key, as keyed
    assert [r["_offset"] for r in folded.records] == [0, 2]  # the bad one still goes
    assert [(s.ok, s.events) for s in folded.upserts["Customer"]] == [(True, (b"{}",))]
    # The driver computes a view of the topic too: its records go to the driver.
    assert [r["_offset"] for r in _fold_upserts(_Upsert(True), {"customers"}).records] \
        == [0, 1, 2, 3]


def test_a_task_that_hands_a_view_back_returns_its_records():
    folded = _fold_upserts(_Upsert(ok=False))
    assert [r["_offset"] for r in folded.records] == [0, 1, 2, 3]
    assert [s.ok for s in folded.upserts["Customer"]] == [False]
