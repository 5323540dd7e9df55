"""A view over views reads its inputs' current rows from Redis by key or by an indexed text
column (the view's arrangements), and from Delta otherwise or when Redis lost rows
(engine.current_rows). Real Redis and Delta, written by the engine's own committer."""

from __future__ import annotations

import datetime

import pytest
import redis
from shop_views import catalog_on, isolated

from engine.commit import ViewCommitter
from engine.current_rows import DeltaRows, RedisRows
from engine.runner import prepare
from schema.storage import complete_field, delta_table_path, meta_key

pytestmark = pytest.mark.integration

WHEN = datetime.datetime(2026, 1, 1, 12, tzinfo=datetime.UTC)


def order(order_id: str, customer_id: str) -> dict:
    return {"order_id": order_id, "customer_id": customer_id, "product_id": "P1",
            "amount": 10.0, "status": "placed", "ts": WHEN}


class CountingDelta(DeltaRows):
    def __init__(self, path_of) -> None:
        super().__init__(path_of)
        self.calls: list[tuple[str, str]] = []

    def rows_where(self, table, column, values):
        self.calls.append((table, column))
        return super().rows_where(table, column, values)


def _mget_calls(client) -> int:
    return client.info("commandstats").get("cmdstat_mget", {}).get("calls", 0)


def test_rows_come_from_redis_by_key_and_index_and_from_delta_otherwise(
        spark, settings, tmp_path):
    settings = isolated(settings, tmp_path, redis_db=22)
    client = redis.Redis.from_url(settings.redis_url)
    client.flushdb()
    catalog = catalog_on("current-rows")
    generations, _ = prepare(spark, settings, catalog)
    view = catalog.view("OrderRecord")
    ViewCommitter(settings, view, 0).commit(
        0, [order("O1", "C1"), order("O2", "C1"), order("O3", "C2")])
    delta = CountingDelta(lambda name: delta_table_path(settings.delta_location, name, 0))
    reader = RedisRows.for_views(settings.redis_url, catalog.views, generations, delta)

    by_index = reader.rows_where("OrderRecord", "customer_id", {"C1"})
    assert sorted(r["order_id"] for r in by_index) == ["O1", "O2"]
    assert by_index[0]["ts"] == "2026-01-01T12:00:00Z"  # JSON form, as Redis holds it
    assert [r["order_id"] for r in reader.rows_where("OrderRecord", "order_id", {"O3"})] \
        == ["O3"]
    assert reader.rows_where("OrderRecord", "customer_id", {"C9"}) == []
    assert delta.calls == []

    # Within a batch a row is read from Redis once: the next batch's rows after start_batch.
    ViewCommitter(settings, view, 0).commit(1, [{**order("O1", "C1"), "status": "paid"}])
    assert [r["status"] for r in reader.rows_where("OrderRecord", "order_id", {"O1"})] \
        == ["placed"]
    reader.start_batch({})
    assert [r["status"] for r in reader.rows_where("OrderRecord", "order_id", {"O1"})] \
        == ["paid"]

    # The batch's changes lie over what Redis holds: O1 moved to C2, O2 deleted, O9 new.
    reader.start_batch({"OrderRecord": {"O1": {**order("O1", "C2"), "status": "paid"},
                                        "O2": None, "O9": order("O9", "C1")}})
    assert [r["order_id"] for r in reader.rows_where("OrderRecord", "customer_id", {"C1"})] \
        == ["O9"]
    assert sorted(r["order_id"] for r in reader.rows_where("OrderRecord", "customer_id",
                                                           {"C2"})) == ["O1", "O3"]
    reads = _mget_calls(client)
    assert reader.rows_where("OrderRecord", "order_id", {"O1", "O2"}) == [
        {**order("O1", "C2"), "status": "paid"}]
    assert _mget_calls(client) == reads, "keys the batch changed are answered, not read"
    assert [r["order_id"] for r in reader.rows_where(
        "OrderRecord", "order_id", {"O1", "O4"})] == ["O1"]
    assert _mget_calls(client) == reads + 1, "O4 (never written) is read, O1 is not"
    reader.start_batch({})

    # Not indexed: Delta, with the same answer Redis would give.
    assert [r["order_id"] for r in reader.rows_where("OrderRecord", "product_id", {"P1"})] \
        and delta.calls == [("OrderRecord", "product_id")]
    # Redis lost its complete mark (a flush, not yet re-warmed): Delta for everything.
    client.hdel(meta_key("OrderRecord"), complete_field(0))
    again = reader.rows_where("OrderRecord", "customer_id", {"C1"})
    assert sorted(r["order_id"] for r in again) == ["O1", "O2"]
    assert delta.calls[-1] == ("OrderRecord", "customer_id")
    client.close()
